"""The plugin as an outsider meets it: canonical xfail ids, --backend-only, the conformance
report, and Hypothesis profiles that stay inside enginespec's own tests.

Each check is a fresh `python -m pytest` process (the plugin's options act at collection and
session end), run from the repo and, where the invocation matters, from an unrelated directory
with `--pyargs`.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import settings

import enginespec
from enginespec.conformance import test_block_manager
from enginespec.conformance.plugin import _PROFILE_KEY, ENV_PROFILE, PROFILES, needs_installed_plugin
from enginespec.conformance.points import CAPABILITIES, POINTS
from enginespec.conformance.report import ReportPlugin, point_status
from enginespec.spec import load_impl

REPO = Path(__file__).resolve().parents[1]
IN_REPO = (REPO / "pyproject.toml").is_file()
BM = "conformance/test_block_manager.py"


def pytest_run(
    args: list[str],
    cwd: Path,
    pythonpath: Path | None = None,
    extra_env: dict | None = None,
    unset: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    drop = ("ENGINESPEC_IMPL", "PYTEST_ADDOPTS", *unset)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.pop("ENGINESPEC_HYPOTHESIS_PROFILE", None)
    env.update(extra_env or {})
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def describe(proc) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"


def test_our_items_run_under_our_profile(request):
    """An enginespec test sees the plugin's profile (enginespec-ci unless the user asked for another)."""
    assert settings.get_current_profile_name() == request.config.stash[_PROFILE_KEY]


@pytest.mark.skipif(not IN_REPO, reason="needs the repo's layout (runs from a checkout)")
@needs_installed_plugin
def test_xfail_ids_are_the_same_from_the_repo_and_with_pyargs(tmp_path):
    """One canonical id matches in both invocations; a line matching nothing is warned about."""
    xfails = tmp_path / "xfails.txt"
    xfails.write_text(f"{BM}::test_lru_order  # example gap\nconformance/test_nothing.py::test_gone\n")
    common = ["-k", "lru_order", f"--xfails-file={xfails}"]
    from_repo = pytest_run([BM, *common], REPO)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with_pyargs = pytest_run(["--pyargs", "enginespec.conformance.test_block_manager", *common], outside)
    for proc in (from_repo, with_pyargs):
        assert proc.returncode == 0, describe(proc)
        assert "1 xpassed" in proc.stdout, describe(proc)  # the reference passes: XPASS, not strict
        assert "'conformance/test_nothing.py::test_gone' matches no collected test" in proc.stdout, describe(
            proc
        )


@needs_installed_plugin
def test_backend_only_keeps_exactly_the_tests_that_take_impl(tmp_path):
    proc = pytest_run(
        ["--pyargs", "enginespec.conformance.test_strategies", "--backend-only", "--collect-only"], tmp_path
    )
    assert proc.returncode == 0, describe(proc)
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert ids and all("test_limits_match_add" in line for line in ids), describe(proc)
    assert "deselected" in proc.stdout, describe(proc)


@needs_installed_plugin
def test_conformance_report(tmp_path):
    """The report names the impl and enginespec versions and has one entry per spec point and
    capability; points the run covered carry their tests' outcome, the others say not-run."""
    report = tmp_path / "out" / "report.json"
    proc = pytest_run(
        [
            "--pyargs",
            "enginespec.conformance.test_block_manager",
            "-k",
            "lru_order or reset_prefix",
            "--impl=reference",
            f"--conformance-report={report}",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, describe(proc)
    data = json.loads(report.read_text())
    assert data["enginespec_version"] == enginespec.__version__
    assert data["impl"]["name"] == "reference" and data["impl"]["version"] == enginespec.__version__
    assert data["impl"]["capabilities"] == ["swap"]
    points = {p["key"]: p for p in data["points"]}
    assert list(points) == [p.key for p in POINTS]
    assert [c["key"] for c in data["capabilities"]] == [c.key for c in CAPABILITIES]
    assert points["4-lru-order"]["status"] == "pass" and points["4-lru-order"]["counts"]["pass"] == 1
    assert points["3-prefix-cache-rules"]["status"] == "pass"
    assert points["8-greedy-parity-and-engine"]["status"] == "not-run"
    assert set(data["tests"]) == {
        "conformance/test_block_manager.py::test_lru_order",
        "conformance/test_block_manager.py::test_reset_prefix_cache_refused_while_in_use",
    }
    assert data["exit_status"] == 0


@needs_installed_plugin
def test_report_records_a_failure_and_an_xfail(tmp_path):
    """A planted bug fails its point; the same test listed as a known gap makes it xfail."""
    bug = "--impl=enginespec.conformance.planted.bugs:HEAD_FIRST_FREE"
    args = ["--pyargs", "enginespec.conformance.test_block_manager", "-k", "lru_order", bug]
    failed = pytest_run([*args, f"--conformance-report={tmp_path / 'f.json'}"], tmp_path)
    assert failed.returncode == 1, describe(failed)
    lru = json.loads((tmp_path / "f.json").read_text())["points"][3]
    assert lru["status"] == "fail" and lru["failing"] == ["conformance/test_block_manager.py::test_lru_order"]
    (tmp_path / "x.txt").write_text("conformance/test_block_manager.py::test_lru_order  # planted\n")
    known = pytest_run(
        [*args, f"--xfails-file={tmp_path / 'x.txt'}", f"--conformance-report={tmp_path / 'x.json'}"],
        tmp_path,
    )
    assert known.returncode == 0, describe(known)
    assert json.loads((tmp_path / "x.json").read_text())["points"][3]["status"] == "xfail"


NO_REPLACE_MODULE = '''
"""A backend whose requests lack the OPTIONAL replace_last_token (SupportsAsyncScheduling):
the reference's parts otherwise, and no swap capability."""
from enginespec.spec import load_impl

_reference = load_impl("reference")
_SKIP = ("replace_last_token", "__dict__", "__weakref__")
Request = type("Request", (), {k: v for k, v in vars(_reference.request_cls).items() if k not in _SKIP})


class NoReplaceImpl(type(_reference)):
    name = "no-replace-last-token"
    capabilities = frozenset()
    request_cls = Request


IMPL = NoReplaceImpl()
'''


def write_no_replace_impl(directory: Path) -> str:
    """Write the module above into `directory` (to put on PYTHONPATH); returns its --impl value."""
    (directory / "no_replace_backend.py").write_text(NO_REPLACE_MODULE)
    return "--impl=no_replace_backend:IMPL"


@needs_installed_plugin
def test_async_suite_without_the_optional_replace_last_token(tmp_path):
    """Requests without replace_last_token make the engine run serially: the async-scheduling
    tests check that (0 async steps, outputs of the serial run) and pass; only the test whose
    subject is a pending placeholder skips, naming the missing method. The report says the
    optional method and the swap capability are not declared (the engine runner's own swap
    test passing does not make swap "pass")."""
    impl = write_no_replace_impl(tmp_path)
    report = tmp_path / "report.json"
    modules = ["enginespec.conformance.test_async_scheduling", "enginespec.conformance.test_engine"]
    proc = pytest_run(
        ["--pyargs", *modules, "-k", "test_async_scheduling or runner_swap", impl, "--backend-only"]
        + [f"--conformance-report={report}"],
        tmp_path,
        pythonpath=tmp_path,
    )
    assert proc.returncode == 0, describe(proc)
    data = json.loads(report.read_text())
    assert data["tests"]["conformance/test_engine.py::test_runner_swap_round_trip_and_drop"] == "pass"
    caps = {c["key"]: c for c in data["capabilities"]}
    assert {k: (c["status"], c["declared"]) for k, c in caps.items()} == {
        "capability:swap": ("not-declared", False),
        "capability:cuda_graphs": ("not-declared", False),
        "optional:build_batch": ("not-declared", False),
        "optional:replace_last_token": ("not-declared", False),
    }, caps
    assert caps["capability:swap"]["counts"]["pass"] == 0, "the runner's swap test is not the impl's"
    assert {p["key"]: p["status"] for p in data["points"]}["8-greedy-parity-and-engine"] == "pass"
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    reasons = ("requests have no replace_last_token", "has no swap capability", "needs a CUDA device")
    assert sum(reasons[0] in line for line in skipped) == 1, describe(proc)
    assert all(any(r in line for r in reasons) for line in skipped), describe(proc)
    passed = " ".join(line for line in proc.stdout.splitlines() if line.startswith("PASSED"))
    for name in (
        "with_stops_and_preemption[recompute]",
        "when_sampling[True]",
        "for_every_setting[recompute]",
    ):
        assert f"test_async_equals_serial_{name}" in passed, describe(proc)


@needs_installed_plugin
def test_hostile_input_without_the_optional_replace_last_token(tmp_path):
    """The token-id tests check replace_last_token only where the requests have it."""
    impl = write_no_replace_impl(tmp_path)
    proc = pytest_run(
        ["--pyargs", "enginespec.conformance.test_hostile_input", "-k", "token_id or non_token", impl],
        tmp_path,
        pythonpath=tmp_path,
    )
    assert proc.returncode == 0, describe(proc)


@needs_installed_plugin
def test_rule_tests_are_collected_before_engine_level_ones(tmp_path):
    """The hook's order as a user sees it (unit test: test_meta.py's layers test): with an
    engine-level module first on the command line, the block manager's rule tests still come
    first; an unrelated test file given between them keeps its place in the session."""
    (tmp_path / "test_theirs.py").write_text("def test_mine():\n    pass\n")
    args = ["--pyargs", "enginespec.conformance.test_async_scheduling", "test_theirs.py"]
    proc = pytest_run([*args, "enginespec.conformance.test_block_manager", "--collect-only"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    names = [line.partition("::")[2] for line in proc.stdout.splitlines() if "::" in line]
    rules = {n for n in dir(test_block_manager) if n.startswith("test_")}
    num_rules = sum(n in rules for n in names)
    num_engine = len(names) - num_rules - 1
    assert num_rules and num_engine and names.index("test_mine") == num_engine, describe(proc)
    assert set(names[:num_rules]) <= rules and not rules & set(names[num_rules:]), describe(proc)


@needs_installed_plugin
def test_every_backend_test_counts_for_a_conformance_point(tmp_path):
    """A published report must not say "pass" for every point while a backend test failed: each
    test that calls the backend counts for at least one of the eight points, and each test-id
    prefix a point names still matches a collected test (a renamed or moved test would otherwise
    drop out of its point silently)."""
    proc = pytest_run(["--pyargs", "enginespec.conformance", "--backend-only", "--collect-only"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    ids = [f"conformance/{line.strip()}" for line in proc.stdout.splitlines() if "::" in line]
    assert len(ids) > 100, describe(proc)
    uncounted = [tid for tid in ids if not any(p.covers(tid) for p in POINTS)]
    assert not uncounted, f"{len(uncounted)} backend tests count for no point, e.g. {uncounted[:5]}"
    for point in (*POINTS, *CAPABILITIES):
        dead = [pre for pre in point.prefixes if not any(tid.startswith(pre) for tid in ids)]
        assert not dead, f"{point.key} names tests that are not collected: {dead}"


def test_capability_points_count_only_for_what_the_impl_declares():
    """capability:swap is judged by the tests that exercise the impl's swap (they skip without
    it), not by the engine runner's own swap test, and an impl that does not declare swap gets
    "not-declared", never "pass"; the optional methods likewise, by what the impl (or its
    requests) has."""
    points = {p.key: p for p in CAPABILITIES}
    swap = points["capability:swap"]
    runner = "conformance/test_engine.py::test_runner_swap_round_trip_and_drop"
    lockstep = "conformance/test_stateful.py::test_lockstep_with_reference[swap]"
    faults = "conformance/test_faults.py::test_faults_under_preemption[async-swap]"
    edge = "conformance/test_schedule_edges.py::test_swap_in_stops_when_the_seats_are_taken"
    no_swap, has_swap = (SimpleNamespace(capabilities=frozenset(c)) for c in ((), {"swap"}))

    entry = point_status({runner: "pass", lockstep: "skip", faults: "skip", edge: "skip"}, swap, no_swap)
    assert (entry["status"], entry["declared"]) == ("not-declared", False)
    assert entry["counts"] == {"fail": 0, "xfail": 0, "pass": 0, "skip": 3}
    failed = point_status({runner: "pass", lockstep: "pass", faults: "fail", edge: "pass"}, swap, has_swap)
    assert (failed["status"], failed["failing"], failed["declared"]) == ("fail", [faults], True)
    assert point_status({runner: "pass", lockstep: "pass"}, swap, has_swap)["status"] == "pass"
    assert point_status({runner: "pass"}, swap, has_swap)["status"] == "not-run"

    rlt = points["optional:replace_last_token"]
    tid = "conformance/test_async_scheduling.py::test_stream_never_shows_a_placeholder"

    def impl_whose_requests(**methods):
        return SimpleNamespace(new_request=lambda *a, **k: SimpleNamespace(**methods))

    assert point_status({tid: "pass"}, rlt, impl_whose_requests())["status"] == "not-declared"
    assert point_status({tid: "pass"}, rlt, impl_whose_requests(replace_last_token=print))["status"] == "pass"
    batch = points["optional:build_batch"]
    tid = "conformance/test_batch_parity.py::test_build_batch_matches_plain_builder[cpu]"
    assert point_status({tid: "skip"}, batch, SimpleNamespace())["status"] == "not-declared"
    assert point_status({tid: "pass"}, batch, SimpleNamespace(build_batch=print))["status"] == "pass"
    # no impl to ask (it did not load): the tests decide, as for the eight points
    assert point_status({tid: "pass"}, batch, None)["status"] == "pass"
    # the report's impl entry lists the optional methods its points find declared, both kinds
    from enginespec.conformance.report import impl_info

    both = SimpleNamespace(build_batch=print, **vars(impl_whose_requests(replace_last_token=print)))
    assert impl_info("x", both, None)["optional"] == ["build_batch", "replace_last_token"]
    assert impl_info("x", impl_whose_requests(replace_last_token=print), None)["optional"] == [
        "replace_last_token"
    ]
    assert impl_info("x", impl_whose_requests(), None)["optional"] == []


@needs_installed_plugin
def test_a_mistyped_profile_variable_is_a_usage_error_only_where_our_tests_run(tmp_path):
    """$ENGINESPEC_HYPOTHESIS_PROFILE naming no profile: an unrelated project's run (the plugin
    is loaded there too) is unaffected; a run that collects our tests stops with a usage error
    naming the variable and the valid profiles (exit 4), not an INTERNALERROR."""
    bogus = {ENV_PROFILE: "enginespec-bogus"}
    other = tmp_path / "other"
    other.mkdir()
    (other / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    theirs = pytest_run(["test_plain.py"], other, extra_env=bogus)
    assert theirs.returncode == 0 and "1 passed" in theirs.stdout, describe(theirs)
    ours = pytest_run(
        ["--pyargs", "enginespec.conformance.test_block_manager", "-k", "lru_order"],
        tmp_path,
        extra_env=bogus,
    )
    out = ours.stdout + ours.stderr
    assert ours.returncode == pytest.ExitCode.USAGE_ERROR and "INTERNALERROR" not in out, describe(ours)
    assert f"ERROR: ${ENV_PROFILE}='enginespec-bogus' is not a registered Hypothesis profile" in out
    assert all(name in out for name in PROFILES), describe(ours)


@needs_installed_plugin
@pytest.mark.parametrize(
    "args, env, says",
    [
        (
            ["--impl=es_no_such_backend"],
            {},
            "(--impl='es_no_such_backend'): unknown impl 'es_no_such_backend'",
        ),
        (["--impl=enginespec.impls.reference:NOPE"], {}, "has no attribute 'NOPE'"),
        (
            [],
            {"ENGINESPEC_IMPL": "es_no_such_backend"},
            "($ENGINESPEC_IMPL='es_no_such_backend'): unknown impl",
        ),
        (["--impl="], {}, "--impl is empty"),
    ],
    ids=["unknown-name", "missing-attr", "env-var", "empty"],
)
def test_an_impl_that_does_not_load_is_one_usage_error(tmp_path, args, env, says):
    """A bad --impl / $ENGINESPEC_IMPL stops the run before any test with one usage error naming
    the target (exit 4), not the same ValueError at the setup of every test; an empty `--impl=`
    (an unset shell variable) is refused, not run as the reference. A run that collects no
    test calling the backend is unaffected."""
    selection = ["--pyargs", "enginespec.conformance.test_block_manager", "-k", "lru_order or first_miss"]
    proc = pytest_run([*selection, *args], tmp_path, extra_env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, describe(proc)
    assert "ERROR: " in out and says in out and "INTERNALERROR" not in out, describe(proc)
    assert "passed" not in out and "ERROR at setup" not in out, describe(proc)
    no_backend = pytest_run(["--pyargs", "enginespec.conformance.test_rules", *args], tmp_path, extra_env=env)
    assert no_backend.returncode == 0 and "passed" in no_backend.stdout, describe(no_backend)


@needs_installed_plugin
def test_the_suite_without_hypothesis_names_the_test_extra(tmp_path):
    """Run on an install without the `test` extra (no hypothesis: the stand-in on the path fails
    to import as a missing one does, and hypothesis' own pytest plugin is off), the suite stops
    with one collection error naming the extra. It gave one "No module named 'hypothesis'" error
    per conformance module (17), the extra unnamed."""
    (tmp_path / "hypothesis").mkdir()
    (tmp_path / "hypothesis" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'hypothesis'\", name='hypothesis')\n"
    )
    args = ["-p", "no:hypothesispytest", "--pyargs", "enginespec.conformance", "--impl=reference"]
    proc = pytest_run(args, tmp_path, pythonpath=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.INTERRUPTED and "1 error" in out, describe(proc)
    assert "pip install 'enginespec[test]'" in out and "No module named" not in out, describe(proc)


def hypothesis_baseline() -> tuple[str, int, bool]:
    """Hypothesis' own choice in this environment, with no plugin loaded: profile name,
    max_examples, derandomize. (Hypothesis picks its built-in `ci` profile where `CI` is set.)"""
    code = (
        "from hypothesis import settings as s; d = s.default\n"
        "print(s.get_current_profile_name(), d.max_examples, d.derandomize)"
    )
    env = {k: v for k, v in os.environ.items() if k != "ENGINESPEC_HYPOTHESIS_PROFILE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    name, num_examples, derandomize = out.stdout.split()
    return name, int(num_examples), derandomize == "True"


@needs_installed_plugin
def test_other_projects_keep_their_hypothesis_settings(tmp_path):
    """An unrelated project's tests, run in the same session as ours, see what Hypothesis
    alone would give them (the `default` profile, or Hypothesis' `ci` one where `CI` is set)."""
    name, num_examples, derandomize = hypothesis_baseline()
    assert not name.startswith("enginespec"), name
    other = tmp_path / "other"
    other.mkdir()
    (other / "test_theirs.py").write_text(
        "from hypothesis import given, settings, strategies as st\n"
        "def test_default_profile():\n"
        f"    assert settings.get_current_profile_name() == {name!r}\n"
        f"    assert settings.default.max_examples == {num_examples}\n"
        f"    assert settings.default.derandomize is {derandomize}\n"
        "@given(st.integers())\n"
        "def test_given_runs(x):\n"
        f"    assert settings.default.max_examples == {num_examples}\n"
    )
    proc = pytest_run(
        [
            "test_theirs.py",
            "--pyargs",
            "enginespec.conformance.test_plugin",
            "-k",
            "default or given or our_items",
        ],
        other,
    )
    assert proc.returncode == 0 and "3 passed" in proc.stdout, describe(proc)


@needs_installed_plugin
@pytest.mark.skipif(
    Path("/dev/nvidiactl").exists(), reason="with an NVIDIA device no run gets TRITON_INTERPRET"
)
def test_only_our_runs_get_the_triton_interpreter(tmp_path):
    """Without an NVIDIA device our kernel tests run under Triton's interpreter, so the plugin
    sets TRITON_INTERPRET=1 before any conftest imports triton, but only in a run about
    enginespec: an unrelated project's run (its Triton kernels on an AMD or Intel GPU, say) keeps
    compiling them."""
    (tmp_path / "test_theirs.py").write_text(
        "import os\n"
        "def test_env():\n"
        "    print('TRITON_INTERPRET=' + str(os.environ.get('TRITON_INTERPRET')))\n"
    )
    theirs = pytest_run(["-s", "test_theirs.py"], tmp_path, unset=("TRITON_INTERPRET",))
    assert theirs.returncode == 0 and "TRITON_INTERPRET=None" in theirs.stdout, describe(theirs)
    ours = pytest_run(["-s", "test_theirs.py", "--impl=reference"], tmp_path, unset=("TRITON_INTERPRET",))
    assert ours.returncode == 0 and "TRITON_INTERPRET=1" in ours.stdout, describe(ours)


#: Stands in for pytest-xdist's controller where xdist is not installed (CI): registered under
#: xdist's name for it, and, like it, collecting nothing (the workers collect and run the tests).
FAKE_CONTROLLER = '''
class Controller:
    def pytest_collection(self):
        return True


def pytest_configure(config):
    config.pluginmanager.register(Controller(), "dsession")
'''


def controller_args(controller: str, directory: Path) -> list[str]:
    """pytest arguments that run the session as an xdist controller: `-n 2` with pytest-xdist
    (skipped where it is not installed), or the stand-in above, written into `directory`."""
    if controller == "xdist":
        pytest.importorskip("xdist")
        return ["-n", "2"]
    (directory / "fake_controller.py").write_text(FAKE_CONTROLLER)
    return ["-p", "fake_controller"]


@needs_installed_plugin
@pytest.mark.parametrize("controller", ["stand-in", "xdist"])
@pytest.mark.parametrize(
    "args, env, says",
    [
        (["--impl=es_no_such_backend"], {}, "(--impl='es_no_such_backend'): unknown impl"),
        ([], {ENV_PROFILE: "enginespec-bogus"}, "='enginespec-bogus' is not a registered Hypothesis profile"),
    ],
    ids=["impl", "profile"],
)
def test_usage_errors_reach_the_user_under_xdist(tmp_path, controller, args, env, says):
    """With `-n N` the controller collects nothing, and a worker's usage error was lost in an
    INTERNALERROR naming only a test id: the controller itself refuses a bad impl or profile
    (exit 4, "ERROR: ..."), before any worker starts."""
    extra = controller_args(controller, tmp_path)
    selection = ["--pyargs", "enginespec.conformance.test_block_manager", "-k", "lru_order"]
    proc = pytest_run([*extra, *selection, *args], tmp_path, pythonpath=tmp_path, extra_env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, describe(proc)
    assert "ERROR: " in out and says in out and "INTERNALERROR" not in out, describe(proc)


@needs_installed_plugin
def test_conformance_report_under_xdist(tmp_path):
    """With `-n 2` the workers run the tests and the controller writes the report: it has the
    same canonical ids and point statuses as a serial run (it had every point not-run, its
    tests keyed by bare node ids)."""
    pytest.importorskip("xdist")
    bug = "--impl=enginespec.conformance.planted.bugs:HEAD_FIRST_FREE"
    args = ["--pyargs", "enginespec.conformance.test_block_manager", "-k", "lru_order or reset_prefix", bug]
    proc = pytest_run(["-n", "2", *args, f"--conformance-report={tmp_path / 'r.json'}"], tmp_path)
    assert proc.returncode == 1, describe(proc)
    data = json.loads((tmp_path / "r.json").read_text())
    assert set(data["tests"]) == {
        f"{BM}::test_lru_order",
        f"{BM}::test_reset_prefix_cache_refused_while_in_use",
    }
    points = {p["key"]: p for p in data["points"]}
    assert points["4-lru-order"]["status"] == "fail", points["4-lru-order"]
    assert points["4-lru-order"]["failing"] == [f"{BM}::test_lru_order"]


def test_report_ids_survive_a_workers_serialization(request, tmp_path):
    """What xdist does with a report (made in a worker, serialized, rebuilt in the controller,
    which never collected the item) keeps its canonical id; a worker writes no file."""
    config = request.config
    worker_side = ReportPlugin(config, str(tmp_path / "worker.json"))
    config.pluginmanager.register(worker_side, "test-report-worker-side")
    try:
        call = pytest.CallInfo.from_call(lambda: None, "call")
        made = config.hook.pytest_runtest_makereport(item=request.node, call=call)
    finally:
        config.pluginmanager.unregister(worker_side)
    made.nodeid = f"::{request.node.name}"  # its node id with --pyargs from another directory
    data = config.hook.pytest_report_to_serializable(config=config, report=made)
    rebuilt = config.hook.pytest_report_from_serializable(config=config, data=json.loads(json.dumps(data)))
    controller = ReportPlugin(config, str(tmp_path / "controller.json"))
    controller.pytest_runtest_logreport(rebuilt)
    name = request.node.name
    assert controller.outcomes == {f"conformance/test_plugin.py::{name}": "pass"}
    worker_side.config = SimpleNamespace(workerinput={"workerid": "gw0"})
    worker_side.pytest_sessionfinish(request.session, 0)
    assert not (tmp_path / "worker.json").exists()


REPLAY_HEADER = "enginespec: to reproduce this failure"


def replay_commands(out: str) -> list[str]:
    """The replay commands the notes print (the indented line after each header), each once: with
    $CI set, pytest's short summary repeats each failure's whole message, notes included."""
    lines = out.splitlines()
    found = [lines[i + 1].removeprefix("E").strip() for i, line in enumerate(lines) if REPLAY_HEADER in line]
    return list(dict.fromkeys(found))


def falsifying_examples(out: str) -> list[str]:
    """Each failure's falsifying example, as Hypothesis prints it (up to the replay note), each
    once (see replay_commands), its lines without pytest's "E" margin."""
    blocks, block = [], None
    for line in out.splitlines():
        if "Falsifying example" in line:
            block = []
        elif REPLAY_HEADER in line and block is not None:
            blocks.append("\n".join(block))
            block = None
        if block is not None:
            block.append(line.removeprefix("E").strip())
    return list(dict.fromkeys(blocks))


@needs_installed_plugin
def test_a_hypothesis_failure_prints_the_command_that_replays_it_from_anywhere(tmp_path):
    """A planted bug fails a @given test and the pool lockstep under the default (derandomized)
    profile: each failure prints the command that reproduces it from outside the repo (its node
    id with --pyargs, and the impl), never Hypothesis' '@reproduce_failure(...) as a decorator
    on your test case' (the test is in site-packages); that exact command, run from another
    directory, fails with the same falsifying example."""
    target = "enginespec.conformance.planted.bugs:HEAD_FIRST_FREE"
    nodes = [
        f"enginespec.conformance.test_block_manager::{name}"
        for name in ("test_lru_order", "test_pool_lockstep")
    ]
    proc = pytest_run(["--pyargs", *nodes, f"--impl={target}"], tmp_path)
    assert proc.returncode == 1 and "2 failed" in proc.stdout, describe(proc)
    assert "reproduce_failure" not in proc.stdout and "decorator on your test" not in proc.stdout, describe(
        proc
    )
    commands = replay_commands(proc.stdout)
    assert commands == [f"python -m pytest --pyargs {node} --impl={target}" for node in nodes], describe(proc)
    examples = falsifying_examples(proc.stdout)
    assert len(examples) == 2 and "state.setup(" in examples[1], describe(proc)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    replayed = pytest_run(shlex.split(commands[1])[3:], elsewhere)
    assert replayed.returncode == 1 and "1 failed" in replayed.stdout, describe(replayed)
    assert falsifying_examples(replayed.stdout) == examples[1:], describe(replayed)


RefImpl = type(load_impl("reference"))


class _OwnPool(RefImpl.block_manager_cls):
    """An outside author's block manager (subclassing the reference's changes nothing here)."""


class _OnePartSwapped(RefImpl):
    name = "one-part"
    block_manager_cls = _OwnPool


def test_the_header_and_report_say_which_parts_are_the_authors():
    """An impl that replaces one part and keeps the rest from the reference passes points 6-8 on
    parts it did not write: the header and the report name the class that builds each part and
    whether it is enginespec's own, so a published report says what its author's code is."""
    from enginespec.conformance.parts import parts_line
    from enginespec.conformance.report import impl_info

    parts = impl_info("x", _OnePartSwapped(), None)["parts"]
    assert parts["block_manager"] == {"by": f"{__name__}._OwnPool", "enginespec": False}
    assert parts["scheduler"] == {"by": "enginespec.impls.reference.scheduler.Scheduler", "enginespec": True}
    assert parts["request"]["enginespec"] and parts["attention"]["enginespec"]
    assert parts["attention"]["by"] == "enginespec.impls.reference.ReferenceImpl.attention_backend"
    assert parts["build_batch"] == {"by": "enginespec.spec.build_batch (none of its own)", "enginespec": True}
    line = parts_line(_OnePartSwapped())
    assert line.startswith(f"parts of the impl under test: yours: block_manager={__name__}._OwnPool; ")
    assert "enginespec's own: request=enginespec.impls.reference.request.Request, scheduler=" in line
    # an impl that is not a PartsImpl: each factory names itself
    bare = SimpleNamespace(new_request=_OwnPool, new_block_manager=_OwnPool, new_scheduler=print)
    assert impl_info("x", bare, None)["parts"]["scheduler"] == {"by": "builtins.print", "enginespec": False}


@needs_installed_plugin
def test_the_shrink_command_replays_the_failing_examples_with_shrinking_on(tmp_path):
    """The note's second command used to search again at random (enginespec-dev): for an outside
    scheduler whose budget overran by one token it passed on a first try while the default run
    failed, and for a wrong victim it took 219 s. It now replays the default profile's own
    (derandomized) examples with shrinking on, enginespec-shrink: the same failure, on any
    machine, shrunk, from outside the repo."""
    from hypothesis import Phase

    ci, shrink = settings.get_profile("enginespec-ci"), settings.get_profile("enginespec-shrink")
    assert shrink.derandomize and Phase.shrink in shrink.phases and shrink.database is None
    assert (shrink.max_examples, shrink.stateful_step_count) == (ci.max_examples, ci.stateful_step_count)
    target = "enginespec.conformance.planted.bugs:HEAD_FIRST_FREE"
    node = "enginespec.conformance.test_block_manager::test_pool_lockstep"
    proc = pytest_run(["--pyargs", node, f"--impl={target}"], tmp_path)
    assert proc.returncode == 1, describe(proc)
    command = f"python -m pytest --pyargs {node} --impl={target} --hypothesis-profile=enginespec-shrink"
    lines = proc.stdout.splitlines()
    # the note's first print (the traceback's E lines); under CI=1 pytest prints the summary's
    # message whole, so the same note follows again there
    headers = [i for i, line in enumerate(lines) if "for the shortest failing example" in line]
    assert headers, describe(proc)
    header = headers[0]
    assert "replay the same examples with shrinking on" in lines[header], describe(proc)
    assert lines[header + 1].removeprefix("E").strip() == command, describe(proc)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shrunk = pytest_run(shlex.split(command)[3:], elsewhere)
    assert shrunk.returncode == 1 and "1 failed" in shrunk.stdout, describe(shrunk)
    # the first print of each (under CI=1 the summary repeats the message, margins differing)
    before, after = falsifying_examples(proc.stdout)[0], falsifying_examples(shrunk.stdout)[0]
    assert after.count("\n") <= before.count("\n"), describe(shrunk)


def test_several_distinct_failures_still_get_the_replay_note():
    """Under a shrinking profile Hypothesis reports each distinct failure it shrank (a wrong victim
    in an outside scheduler gave four) as one ExceptionGroup, whose own notes name no falsifying
    example: the run ended with no command to replay it. Such a group counts as Hypothesis'."""
    import builtins
    import importlib

    from enginespec.conformance.plugin import add_note, found_by_hypothesis

    # a builtin from 3.11; on 3.10 the backport Hypothesis depends on and raises
    Group = (
        getattr(builtins, "BaseExceptionGroup", None)
        or importlib.import_module("exceptiongroup").BaseExceptionGroup
    )
    found = AssertionError("victims ['r3'] are not the back of the running queue")
    add_note(found, "Falsifying example: state = Lockstep_recompute()")
    group = Group("Hypothesis found 2 distinct failures.", [found, ValueError("x")])
    assert found_by_hypothesis(group)
    assert not found_by_hypothesis(Group("plain", [ValueError("x")]))


class _WrappingScheduler(RefImpl):
    """An author who keeps the reference's scheduler_cls but builds the scheduler in their own
    new_scheduler (wrapping it, say): that override is what builds the part."""

    name = "wraps"

    def new_scheduler(self, config, block_manager):
        return super().new_scheduler(config, block_manager)


def test_a_part_built_by_the_authors_own_factory_is_named_by_that_factory():
    """PartsImpl's factories only construct the `*_cls` class, so the class is named; a factory
    the author overrides is named itself (it may build anything), even where a `*_cls` is still
    set. An impl's own build_batch (the fast impl's) is named, not the spec's plain builder."""
    from enginespec.conformance.parts import impl_parts

    parts = impl_parts(_WrappingScheduler())
    assert parts["scheduler"] == {"by": f"{__name__}._WrappingScheduler.new_scheduler", "enginespec": False}
    fast = impl_parts(load_impl("fast"))
    assert fast["build_batch"] == {"by": "enginespec.impls.fast.FastImpl.build_batch", "enginespec": True}
    assert fast["scheduler"]["by"] == "enginespec.impls.fast.scheduler.FastScheduler"


def test_the_report_names_the_version_and_optional_points_of_the_impl():
    """impl_info's version falls back to the impl's top-level package's __version__, and its
    optional list holds exactly the optional capabilities the impl declares."""
    from enginespec.conformance.report import impl_info

    info = impl_info("fast", load_impl("fast"), None)
    assert info["version"] == enginespec.__version__
    assert info["optional"] == ["build_batch", "replace_last_token"]
    assert impl_info("x", SimpleNamespace(name="bare"), None)["optional"] == []
    versioned = type("Versioned", (RefImpl,), {"version": "9.9"})()
    assert impl_info("x", versioned, None)["version"] == "9.9"


def test_the_profiles_replay_and_keep_blobs_out():
    """enginespec-ci is derandomized, saves nothing and does not shrink (so its failures replay
    on any machine); enginespec-shrink is the same examples with shrinking; no profile prints a
    @reproduce_failure blob (it asks to edit a test living in site-packages). Without hypothesis
    register_profiles says so and registers nothing."""
    from hypothesis import Phase

    ci, shrink = settings.get_profile("enginespec-ci"), settings.get_profile("enginespec-shrink")
    assert ci.derandomize and ci.database is None and Phase.shrink not in ci.phases
    assert shrink.derandomize and shrink.database is None and Phase.shrink in shrink.phases
    assert not any(settings.get_profile(name).print_blob for name in PROFILES)

    # docs/writing-a-backend.md's table: few examples, more, then 1000 with long stateful runs
    ci, dev, thorough = (
        settings.get_profile(n) for n in ("enginespec-ci", "enginespec-dev", "enginespec-thorough")
    )
    assert ci.max_examples < dev.max_examples < thorough.max_examples == 1000
    assert ci.stateful_step_count < dev.stateful_step_count < thorough.stateful_step_count


def test_without_hypothesis_no_profile_is_registered(monkeypatch):
    from enginespec.conformance.plugin import register_profiles

    monkeypatch.setitem(sys.modules, "hypothesis", None)  # its import raises ImportError
    assert register_profiles() is False


def test_the_header_names_the_impl_the_profile_and_the_parts(request):
    from enginespec.conformance.plugin import pytest_report_header

    lines = pytest_report_header(request.config)
    assert lines[0].startswith("enginespec impl under test: ")
    assert lines[1].startswith("parts of the impl under test: ")


def _replay_item(profile: str, seed):
    """A stand-in item of the shipped suite run under `profile` (its stash) and `seed`."""
    options = {"--hypothesis-seed": seed, "--impl": "fast"}
    config = SimpleNamespace(
        getoption=lambda name, default=None: options.get(name, default), stash={_PROFILE_KEY: profile}
    )
    path = Path(test_block_manager.__file__)
    return SimpleNamespace(nodeid=f"{path.name}::test_pool_lockstep", path=path, config=config)


@pytest.mark.parametrize(
    "profile, seed, why, then",
    [
        (
            "enginespec-ci",
            None,
            "the enginespec-ci profile is derandomized",
            "--hypothesis-profile=enginespec-shrink",
        ),
        ("enginespec-shrink", None, "the enginespec-shrink profile is derandomized", None),
        ("enginespec-dev", 7, "--hypothesis-seed fixes the examples", None),
        ("enginespec-dev", None, "Hypothesis saved the failing example in .hypothesis/", None),
        ("enginespec-test-unsaved", None, "draws new examples each run and saves none", "search again"),
    ],
)
def test_the_replay_note_follows_the_profile(profile, seed, why, then):
    """replay_note's reasons and second command, per profile: a derandomized one replays from any
    directory (and one that does not shrink points to enginespec-shrink), a seed fixes the
    examples, a database replays from here, and a random profile that saves nothing says to add a
    seed and points to enginespec-dev's search (saved in .hypothesis/ where dev has a database)."""
    from hypothesis import Phase

    from enginespec.conformance.plugin import replay_note

    settings.register_profile(
        "enginespec-test-unsaved", derandomize=False, database=None, phases=[Phase.generate]
    )
    before = settings.get_current_profile_name()
    settings.load_profile(profile)
    try:
        lines = replay_note(_replay_item(profile, seed)).splitlines()
    finally:
        settings.load_profile(before)
    assert why in lines[0]
    command = (
        "python -m pytest --pyargs enginespec.conformance.test_block_manager::test_pool_lockstep --impl=fast"
    )
    assert lines[1].strip().startswith(command)
    assert (f"--hypothesis-seed={seed}" in lines[1]) == (seed is not None)
    if then is None:
        assert len(lines) == 2, lines
    else:
        assert then in "\n".join(lines[2:])
    if profile == "enginespec-test-unsaved":
        saved = settings.get_profile("enginespec-dev").database is not None
        assert ("what it finds is saved in .hypothesis/ here" in lines[2]) == saved
        assert lines[3].strip().endswith("--hypothesis-profile=enginespec-dev")


def test_our_profiles_keep_their_settings_whatever_profile_is_loaded_when_they_register():
    """pytest_configure registers the profiles again after hypothesis loaded --hypothesis-profile
    and after the conftests ran, and a profile registered without a parent inherits whatever
    profile is loaded then: a host project whose conftest loads its own profile without the
    shrink phase got an enginespec-shrink that never shrank (the replay note's shortest-example
    command replayed the failure unshrunk) and an enginespec-dev that saved nothing, and under
    $CI (hypothesis' own 'ci' profile) enginespec-dev, 'a new random search', was derandomized."""
    from hypothesis import Phase

    from enginespec.conformance.plugin import register_profiles

    settings.register_profile(
        "enginespec-test-host", phases=[Phase.explicit, Phase.generate], derandomize=True, database=None
    )
    before = settings.get_current_profile_name()
    settings.load_profile("enginespec-test-host")
    try:
        register_profiles()
    finally:
        settings.load_profile(before)
    try:
        shrink, dev = settings.get_profile("enginespec-shrink"), settings.get_profile("enginespec-dev")
        assert Phase.shrink in shrink.phases and shrink.derandomize
        for name in ("enginespec-dev", "enginespec-thorough"):
            profile = settings.get_profile(name)
            assert Phase.shrink in profile.phases and not profile.derandomize, name
        assert dev.database is not None  # the note's dev search: 'saved in .hypothesis/ here'
    finally:
        register_profiles()
