"""`--conformance-report=FILE`: one JSON entry per spec point (conformance/points.py).

Each test's outcome is one of pass / fail / xfail / skip (an unexpected pass of an xfail counts
as pass; an error in setup or teardown as fail). A point's status is the worst over its tests,
in the order fail > xfail > pass > skip; a point no collected test covers is "not-run". A
capability or optional-method point of something the impl does not declare is "not-declared"
whatever its tests did (its counts are kept): a point says "pass" only for what the impl claims.
The file also names the impl (name, version, declared capabilities, and which class builds each
part, the author's or enginespec's: conformance/parts.py) and the enginespec version,
so a backend can publish it as it is.
"""

from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from enginespec.conformance.parts import impl_parts
from enginespec.conformance.points import CAPABILITIES, POINTS

RANK = {"fail": 3, "xfail": 2, "pass": 1, "skip": 0}


def outcome(report) -> str | None:
    """pass / fail / xfail / skip for one phase's report, or None when the phase says nothing."""
    if hasattr(report, "wasxfail"):
        return "xfail" if report.skipped else "pass"
    if report.failed:
        return "fail"
    if report.skipped:
        return "skip"
    return "pass" if report.when == "call" else None


def declares(point, impl) -> bool | None:
    """Whether `impl` declares what `point` is about: True for the points every impl must meet;
    None where that cannot be told (no impl loaded, or its check raised), so the tests decide."""
    if point.declared_by is None:
        return True
    if impl is None:
        return None
    try:
        return bool(point.declared_by(impl))
    except Exception:  # a broken factory fails its own tests; the report must still be written
        return None


def point_status(outcomes: dict[str, str], point, impl=None) -> dict:
    """The point's entry: the worst outcome of its tests, or "not-declared" for a capability /
    optional method the impl does not declare (never "pass" for what it does not claim)."""
    mine = {tid: o for tid, o in outcomes.items() if point.covers(tid)}
    counts = {k: sum(o == k for o in mine.values()) for k in RANK}
    status = max(mine.values(), key=RANK.__getitem__) if mine else "not-run"
    declared = declares(point, impl)
    if declared is False:
        status = "not-declared"
    failing = sorted(tid for tid, o in mine.items() if o == "fail")
    entry = {"key": point.key, "title": point.title, "status": status, "counts": counts, "failing": failing}
    if point.declared_by is not None:
        entry["declared"] = declared
    return entry


def try_load(target: str):
    """(impl, None), or (None, the error) when `target` does not load."""
    from enginespec.spec import load_impl

    try:
        return load_impl(target), None
    except Exception as e:  # the report still says what was asked for
        return None, e


def impl_info(target: str, impl, error: Exception | None) -> dict:
    """What the report says about the impl under test (try_load's result for `target`)."""
    if impl is None:
        return {"target": target, "name": None, "version": None, "error": str(error)}
    module = sys.modules.get(type(impl).__module__.partition(".")[0])
    version = getattr(impl, "version", None) or getattr(module, "__version__", None)
    return {
        "target": target,
        "name": getattr(impl, "name", None),
        "version": version,
        "capabilities": sorted(getattr(impl, "capabilities", ())),
        "optional": sorted(
            p.key.partition(":")[2]
            for p in CAPABILITIES
            if p.key.startswith("optional:") and declares(p, impl)
        ),
        "parts": impl_parts(impl),
    }


#: The attribute of a test report that carries its test's canonical id (plugin.canonical_id).
ID_ATTR = "enginespec_canonical_id"


def is_xdist_worker(config) -> bool:
    """Whether this process is a pytest-xdist worker (its reports go to the controller)."""
    return hasattr(config, "workerinput")


class ReportPlugin:
    """Collects one outcome per canonical test id and writes the report at session end.

    Under pytest-xdist the workers run the tests and the controller, which collects nothing,
    receives their reports: so each report carries its canonical id (set where the item is
    known, in pytest_runtest_makereport; xdist serializes a report's plain attributes, as it
    does pytest's own `wasxfail`), and only the controller writes the file."""

    def __init__(self, config, path: str):
        self.config = config
        self.path = Path(path)
        self.outcomes: dict[str, str] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        from enginespec.conformance.plugin import canonical_id

        result = yield
        setattr(result.get_result(), ID_ATTR, canonical_id(item))

    def pytest_runtest_logreport(self, report):
        o = outcome(report)
        if o is None:
            return
        tid = getattr(report, ID_ATTR, None) or report.nodeid
        old = self.outcomes.get(tid)
        self.outcomes[tid] = o if old is None or RANK[o] > RANK[old] else old

    def pytest_sessionfinish(self, session, exitstatus):
        if is_xdist_worker(self.config):
            return  # the controller writes the report of the whole run
        import enginespec
        from enginespec.conformance.plugin import impl_target

        target = impl_target(self.config)
        impl, error = try_load(target)
        data = {
            "enginespec_version": enginespec.__version__,
            "impl": impl_info(target, impl, error),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "exit_status": int(exitstatus),
            "points": [point_status(self.outcomes, p) for p in POINTS],
            "capabilities": [point_status(self.outcomes, p, impl) for p in CAPABILITIES],
            "tests": dict(sorted(self.outcomes.items())),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data, indent=2) + "\n")
