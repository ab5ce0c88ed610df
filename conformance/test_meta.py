"""Meta-tests: the suite catches planted bugs, passes the reference, and runs outside backends.

Each planted bug (conformance/planted/bugs.py) is run exactly as an outsider would run their own
backend: `python -m pytest <selection> --impl=enginespec.conformance.planted.bugs:<NAME>` in a fresh
process, and that run must FAIL (exit code 1: tests failed, not a usage or collection error).
The unmodified reference must pass a superset of the same selections, or the meta-test could
pass for the wrong reason. The runs are independent processes, so they are started together
(a few at a time) by one session fixture and each test checks its own result.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from enginespec.conformance.planted.bugs import BUGS
from enginespec.conformance.plugin import (
    CONFORMANCE_DIR,
    impl_target,
    mark_xfails,
    order_by_layer,
    read_xfails,
)

REPO = Path(__file__).resolve().parents[1]
BM, SCHED = "conformance/test_block_manager.py", "conformance/test_scheduler.py"

STATEFUL = "conformance/test_stateful.py"


def _bm(k: str) -> list[str]:
    """A directed block-pool property, with the pool lockstep as a second net."""
    return [BM, "-k", f"{k} or pool_lockstep"]


def _sched(k: str) -> list[str]:
    """A scheduler property, with the engine lockstep as a second net (-x stops at the first)."""
    return [SCHED, STATEFUL, "-k", f"{k} or lockstep_with_reference"]


#: A small selection that must catch each bug (the DESIGN point it breaks first).
SELECTIONS = {
    "ONE_TOKEN_LEFT_DROPPED": _bm("one_token_left"),
    "MATCH_PAST_MISS": [BM, "-k", "stop_at_first_miss"],
    "HALF_DONE_ALLOCATION": _bm("revived_cached_blocks"),
    "REVIVED_CACHED_BLOCKS_FREE": _bm("revived_cached_blocks"),
    "HEAD_FIRST_FREE": _bm("lru_order"),
    "NO_EVICTION": _bm("lru_order"),
    "HASH_IGNORES_PARENT": _bm("one_token_left"),
    "HASH_IGNORES_CACHE_KEY": _bm("cached_prefix_rules"),
    "ABORT_LEAKS_BLOCK": _sched("abort_from_any_state"),
    "STALE_COMPUTED_AFTER_RECOMPUTE": _sched("preemption_under_pressure"),
    "ADMIT_AFTER_PREEMPT": _sched("preemption_under_pressure"),
    "BUDGET_OVERRUN": _sched("every_step_invariants"),
    "WRONG_VICTIM": _sched("preemption_under_pressure"),
    "THRESHOLD_IGNORED": _sched("every_step_invariants"),
    "MIN_TOKENS_IGNORED": _sched("every_step_invariants"),
    # Neither is reached by the lockstep within the ci profile (a threshold below a decode's
    # 1 + drafts, a recompute victim holding drafts): test_scheduler's draft tests must catch them.
    "THRESHOLD_CAPS_DECODES": [SCHED, "-k", "draft"],
    "RECOMPUTE_KEEPS_DRAFTS": [SCHED, "-k", "draft"],
}

OUTSIDE_MODULE = '''
    """A backend shipped outside enginespec: here, the reference's parts under another name."""
    from enginespec.spec import load_impl

    _reference = load_impl("reference")


    class OutsideImpl(type(_reference)):
        name = "outside-backend"


    IMPL = OutsideImpl()
'''


def run_pytest(
    args: list[str], cwd: Path = REPO, pythonpath: Path | None = None
) -> subprocess.CompletedProcess:
    """A fresh `python -m pytest` under the ci profile, untouched by this run's impl settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ENGINESPEC_IMPL", "ENGINESPEC_HYPOTHESIS_PROFILE", "PYTEST_ADDOPTS")
    }
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "--hypothesis-profile=enginespec-ci",
        *args,
    ]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def jobs(tmp: Path) -> dict:
    """Every subprocess run this module checks, by name: () -> CompletedProcess."""
    out = {
        bug: (
            lambda bug=bug: run_pytest(
                [*SELECTIONS[bug], f"--impl=enginespec.conformance.planted.bugs:{bug}"]
            )
        )
        for bug in BUGS
    }
    out["reference"] = lambda: run_pytest([BM, SCHED, STATEFUL, "--impl=reference"])  # a superset
    (tmp / "outside_backend.py").write_text(textwrap.dedent(OUTSIDE_MODULE))
    out["outside"] = lambda: run_pytest(
        [
            "-v",
            "--pyargs",
            "enginespec.conformance.test_errors",
            "enginespec.conformance.test_scheduler",
            "--impl=outside_backend:IMPL",
        ],
        cwd=tmp,
        pythonpath=tmp,
    )
    xfails = tmp / "xfails.txt"
    xfails.write_text(
        "# known gaps of MATCH_PAST_MISS\n\n"
        "conformance/test_block_manager.py::test_stop_at_first_miss   # planted: matching skips a miss\n"
    )
    out["xfails"] = lambda: run_pytest(
        [
            *SELECTIONS["MATCH_PAST_MISS"],
            f"--xfails-file={xfails}",
            "--impl=enginespec.conformance.planted.bugs:MATCH_PAST_MISS",
        ]
    )
    return out


def job_of(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "bug" in callspec.params:
        return callspec.params["bug"]
    return {
        "test_reference_passes_the_same_selections": "reference",
        "test_outside_backend_module": "outside",
        "test_xfails_file_marks_known_gaps": "xfails",
    }.get(item.name)


@pytest.fixture(scope="session")
def meta_runs(request, tmp_path_factory):
    """Run the subprocesses of every selected meta-test, three at a time. They judge the suite,
    not the impl under test, so they run only in the reference run (the default)."""
    target = impl_target(request.config)
    if target != "reference":
        pytest.skip(f"meta-tests of the suite itself run only with --impl=reference (this run: {target})")
    wanted = {
        job_of(item)
        for item in request.session.items
        if getattr(getattr(item, "module", None), "__name__", None) == __name__
    } - {None}
    todo = {name: fn for name, fn in jobs(tmp_path_factory.mktemp("meta")).items() if name in wanted}
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(fn) for name, fn in todo.items()}
        return {name: future.result() for name, future in futures.items()}


def describe(proc: subprocess.CompletedProcess) -> str:
    return f"exit code {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-3000:]}\n--- stderr (tail)\n{proc.stderr[-2000:]}"


def test_every_bug_has_a_selection():
    assert len(BUGS) >= 10 and sorted(SELECTIONS) == BUGS


@pytest.mark.parametrize("bug", BUGS)
def test_planted_bug_is_caught(meta_runs, bug):
    proc = meta_runs[bug]
    assert proc.returncode == 1, f"the suite did not catch {bug} (exit 1 = tests failed)\n{describe(proc)}"
    assert " failed" in proc.stdout


def test_reference_passes_the_same_selections(meta_runs):
    proc = meta_runs["reference"]
    assert proc.returncode == 0 and " passed" in proc.stdout, describe(proc)


def test_outside_backend_module(meta_runs):
    """A module outside the repo, on PYTHONPATH, run with --impl=module:attr from its own directory
    (-v on top of -q brings the report header back, which names the impl under test)."""
    proc = meta_runs["outside"]
    assert "enginespec impl under test: outside-backend (--impl=outside_backend:IMPL)" in proc.stdout, (
        describe(proc)
    )
    assert proc.returncode == 0 and " passed" in proc.stdout, describe(proc)


def test_xfails_file_marks_known_gaps(meta_runs):
    proc = meta_runs["xfails"]
    assert proc.returncode == 0 and "1 xfailed" in proc.stdout, describe(proc)


def test_impl_target_precedence(monkeypatch):
    """--impl beats $ENGINESPEC_IMPL, which beats the default "reference"."""

    def config(option):
        return SimpleNamespace(getoption=lambda name: option if name == "--impl" else None)

    monkeypatch.delenv("ENGINESPEC_IMPL", raising=False)
    assert impl_target(config(None)) == "reference"
    monkeypatch.setenv("ENGINESPEC_IMPL", "fast")
    assert impl_target(config(None)) == "fast"
    assert impl_target(config("pkg.mod:IMPL")) == "pkg.mod:IMPL"


def test_read_xfails(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("# header\n\n  test_a.py::test_one  # reason one\ntest_b\n")
    assert read_xfails(str(path)) == [("test_a.py::test_one", "reason one"), ("test_b", f"listed in {path}")]


def test_conformance_modules_run_in_layers(tmp_path):
    """With -x the first failure should be a readable rule-tagged one: the block manager and
    scheduler rule tests, then the stateful lockstep, then attention and batch, then the engine-
    level modules. Within a module the order is kept; another project's items keep their exact
    positions, and only the shipped conformance package is reordered (not the repo's tests/)."""

    def item(path, name):
        return SimpleNamespace(path=path, nodeid=f"{path.name}::{name}")

    def ours(module, name):
        return item(CONFORMANCE_DIR / f"{module}.py", name)

    items = [
        ours("test_async_scheduling", "a1"),
        ours("test_async_scheduling", "a2"),
        item(tmp_path / "test_theirs.py", "t1"),
        ours("test_engine", "e1"),
        item(CONFORMANCE_DIR.parent / "tests" / "test_layout.py", "repo"),
        ours("test_stateful", "s1"),
        ours("test_attention", "att"),
        ours("test_scheduler", "sc1"),
        ours("test_scheduler", "sc2"),
        ours("test_block_manager", "b1"),
        item(tmp_path / "test_theirs.py", "t2"),
        ours("test_block_manager", "b2"),
    ]
    order_by_layer(items)
    assert [i.nodeid.partition("::")[2] for i in items] == [
        *("b1", "b2", "t1", "sc1", "repo", "sc2"),
        *("s1", "att", "a1", "a2", "t2", "e1"),
    ]


def test_xfails_marking(tmp_path):
    """Each item whose canonical id contains a listed substring gets one non-strict xfail marker;
    a line matching nothing is warned about; a missing file is a usage error, not a silent pass."""
    path = tmp_path / "x.txt"
    path.write_text("test_mod.py::test_a  # gap a\nno_such_test\n")
    marked = {}

    def item(nodeid):
        return SimpleNamespace(
            nodeid=nodeid,
            path=tmp_path / nodeid.partition("::")[0],
            add_marker=lambda mark: marked.setdefault(nodeid, []).append(mark),
        )

    config = SimpleNamespace(getoption=lambda name: str(path) if name == "--xfails-file" else None)
    with pytest.warns(pytest.PytestWarning, match="'no_such_test' matches no collected test"):
        mark_xfails(config, [item("pkg/test_mod.py::test_a[1]"), item("pkg/test_mod.py::test_b")])
    assert list(marked) == ["pkg/test_mod.py::test_a[1]"]
    (mark,) = marked["pkg/test_mod.py::test_a[1]"]
    assert mark.name == "xfail" and mark.kwargs["strict"] is False and "gap a" in mark.kwargs["reason"]
    missing = SimpleNamespace(
        getoption=lambda name: str(tmp_path / "nope") if name == "--xfails-file" else None
    )
    with pytest.raises(pytest.UsageError):
        mark_xfails(missing, [])
