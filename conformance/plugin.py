"""pytest plugin of the conformance suite: picks the implementation under test.

Registered as a `pytest11` entry point (see pyproject.toml), so it is loaded by EVERY pytest run
in an environment that has enginespec installed, including other projects' runs. It therefore
costs them nothing: it imports neither hypothesis nor torch at load time (hypothesis is only
imported when it is installed, to register and swap profiles), its Hypothesis profiles
apply only to enginespec's own test items, never to other projects' tests, and it sets
TRITON_INTERPRET=1 (no NVIDIA device) only in a run about enginespec.

Run the suite against a backend (from anywhere): `pytest --pyargs enginespec.conformance
--impl=mypkg.backend:IMPL --backend-only`. Never register the plugin again from a conftest.

Options:
- `--impl NAME` (env fallback ENGINESPEC_IMPL, default "reference"): anything `spec.load_impl`
  accepts: "reference", "fast", an `enginespec.impls` entry point, "pkg.module" or a top-level
  "module" (its IMPL), or "pkg.module:attr". A target that does not load, or an empty
  `--impl=`, is a usage error once a test that calls the backend is collected (check_impl).
- `--backend-only`: deselect every test that does not call the backend (see `backend` marker).
- `--xfails-file PATH`: known gaps of the impl, one canonical test id (or a substring of one)
  per line, text after `#` is the reason. Canonical ids read
  `conformance/test_block_manager.py::test_lru_order` however the suite was invoked (from the
  repo, or installed with --pyargs). A line that matches no collected test is warned about.
- `--conformance-report FILE`: JSON with one entry per spec point (conformance/points.py).

Hypothesis profiles (names prefixed so they cannot clash with another project's):
`enginespec-ci` (default: few examples, no deadline, derandomized so a failure reproduces on
every machine, and no shrinking: shrinking a failing stateful trace can take minutes),
`enginespec-shrink` (enginespec-ci's examples, then shrinking: the failure CI found, shortest),
`enginespec-dev` (more examples, shrinking: a new random search) and
`enginespec-thorough` (many examples, long stateful runs). `--hypothesis-profile NAME` (or
$ENGINESPEC_HYPOTHESIS_PROFILE) picks another for our tests. Our profile is loaded around the
collection of our modules (so `@settings` decorators there inherit it) and around each of our
items, and the previous profile is restored after. An unknown name in the variable is a usage
error once our tests are collected, so a run that collects none of them never sees it.
No profile prints Hypothesis' `@reproduce_failure` blob (it asks to edit a test that, for an
outside author, lives in site-packages): a failure Hypothesis found in one of our tests gets a
note instead with the `python -m pytest --pyargs <module>::<test>` command that replays it (and
the one that shrinks it), see replay_note.
"""

from __future__ import annotations

import os
import shlex
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

ENV_IMPL = "ENGINESPEC_IMPL"
ENV_PROFILE = "ENGINESPEC_HYPOTHESIS_PROFILE"
DEFAULT_PROFILE = "enginespec-ci"
SHRINK_PROFILE = "enginespec-shrink"
PROFILES = (DEFAULT_PROFILE, SHRINK_PROFILE, "enginespec-dev", "enginespec-thorough")
PROFILE_OPTION = "--hypothesis-profile"

#: enginespec's package directory of tests (installed or in the repo) and the tree around it
#: (the repo's tests/ and benchmarks/ in a checkout; only enginespec/ itself when installed).
CONFORMANCE_DIR = Path(__file__).resolve().parent
OUR_ROOT = CONFORMANCE_DIR.parent

MARKERS = (
    "gpu: needs a CUDA device",
    "slow: long-running (excluded from the ci profile runs by -m 'not slow')",
    "backend: calls the implementation under test (--backend-only keeps only these)",
)

_PROFILE_KEY = pytest.StashKey[str]()


def register_profiles() -> bool:
    """Register enginespec's profiles with hypothesis, if it is installed (idempotent)."""
    try:
        from hypothesis import HealthCheck, Phase, settings
    except ImportError:
        return False
    slow = [HealthCheck.too_slow]
    # Each profile on hypothesis' own defaults: registered without a parent, a profile inherits
    # the one loaded at the time, and pytest_configure registers them again after
    # --hypothesis-profile, a conftest's load_profile or $CI (hypothesis' 'ci') loaded another.
    base = settings.get_profile("default")
    ci = dict(
        parent=base,
        max_examples=12,
        stateful_step_count=25,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,  # its @reproduce_failure asks to edit a test that lives in site-packages
        suppress_health_check=slow,
    )
    settings.register_profile("enginespec-ci", phases=[Phase.explicit, Phase.reuse, Phase.generate], **ci)
    # The same derandomized examples as enginespec-ci, then shrinking: the replay of a CI
    # failure that prints its shortest form, on any machine (a new random search may miss it).
    settings.register_profile(SHRINK_PROFILE, **ci)
    settings.register_profile(
        "enginespec-dev",
        parent=base,
        max_examples=60,
        stateful_step_count=40,
        deadline=None,
        print_blob=False,  # explicit: hypothesis' own 'ci' profile prints blobs
        suppress_health_check=slow,
    )
    settings.register_profile(
        "enginespec-thorough",
        parent=base,
        max_examples=1000,
        stateful_step_count=100,
        deadline=None,
        print_blob=False,
        suppress_health_check=[*slow, HealthCheck.data_too_large],
    )
    return True


def pytest_addoption(parser):
    # Registered here, the earliest hook, so that hypothesis' own plugin can load
    # `--hypothesis-profile=enginespec-dev` in its pytest_configure.
    register_profiles()
    group = parser.getgroup("enginespec", "enginespec conformance")
    group.addoption(
        "--impl",
        default=None,
        help=f"implementation under test: reference, fast, an entry point, pkg.module (its IMPL) or "
        f"pkg.module:attr "
        f"(default: ${ENV_IMPL} or reference)",
    )
    group.addoption(
        "--backend-only",
        action="store_true",
        default=False,
        help="run only the tests that call the implementation under test (marker `backend`)",
    )
    group.addoption(
        "--xfails-file",
        default=None,
        help="file of canonical test ids (or substrings of them), one per line, to mark xfail",
    )
    group.addoption(
        "--conformance-report",
        default=None,
        metavar="FILE",
        help="write a JSON conformance report (one entry per spec point) to FILE",
    )


def impl_target(config) -> str:
    """The impl name given on the command line, else $ENGINESPEC_IMPL, else "reference"."""
    return config.getoption("--impl") or os.environ.get(ENV_IMPL) or "reference"


def use_triton_interpreter_without_a_gpu() -> None:
    """Kernel tests run under Triton's interpreter where no NVIDIA GPU is present (unless the user
    set TRITON_INTERPRET). The check is a file test, not a torch import, so it costs nothing."""
    if "TRITON_INTERPRET" not in os.environ and not Path("/dev/nvidiactl").exists():
        os.environ["TRITON_INTERPRET"] = "1"


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """TRITON_INTERPRET must be set before anything imports triton (our conftests do, through
    enginespec's modules), so it is set here, before pytest loads any conftest; and only for a
    run about enginespec: the variable is process-wide, and another project's run (its Triton
    kernels on an AMD or Intel GPU, where /dev/nvidiactl is absent) must keep compiling them."""
    impl_given = bool(getattr(early_config.known_args_namespace, "impl", None))
    if is_about_us(impl_given, early_config.rootpath, args):
        use_triton_interpreter_without_a_gpu()


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if register_profiles():
        from hypothesis import settings

        # After hypothesis' own configure: an explicit --hypothesis-profile (with any verbosity
        # derived from it, and checked by hypothesis) is the user's choice for our tests too.
        # $ENGINESPEC_HYPOTHESIS_PROFILE is checked once our tests are collected
        # (check_profile): an unrelated project's run must not fail on it.
        asked = config.getoption(PROFILE_OPTION, default=None)
        name = (
            settings.get_current_profile_name() if asked else os.environ.get(ENV_PROFILE) or DEFAULT_PROFILE
        )
        config.stash[_PROFILE_KEY] = name
    path = config.getoption("--conformance-report")
    if path:
        from enginespec.conformance.report import ReportPlugin

        config.pluginmanager.register(ReportPlugin(config, path), "enginespec-conformance-report")


def is_ours(path) -> bool:
    """Whether a collected file belongs to enginespec (the shipped suite or the repo's tests)."""
    if path is None:
        return False
    try:
        Path(os.path.realpath(path)).relative_to(OUR_ROOT)
    except ValueError:
        return False
    return True


def profile_is_registered(name: str) -> bool:
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    try:
        settings.get_profile(name)
    except InvalidArgument:
        return False
    return True


def check_profile(config, items) -> None:
    """Our profile must be registered once any of our tests is collected. Its name comes from
    $ENGINESPEC_HYPOTHESIS_PROFILE (an explicit --hypothesis-profile is checked by hypothesis),
    so an unknown one is a usage error naming the variable and the valid profiles. It is raised
    here, after collection (collection itself runs without the profile, see our_profile),
    because pytest reports a UsageError from this hook as "ERROR: ..." (exit code 4) and one
    from configure or collection as INTERNALERROR or a collection error; and only when our tests
    are collected, so another project's run never fails on our variable."""
    if any(is_ours(getattr(item, "path", None)) for item in items):
        refuse_unknown_profile(config)


def refuse_unknown_profile(config) -> None:
    """The UsageError of check_profile, raised when the profile of our tests is not registered."""
    name = config.stash.get(_PROFILE_KEY, None)
    if name is None or profile_is_registered(name):
        return
    raise pytest.UsageError(
        f"${ENV_PROFILE}={name!r} is not a registered Hypothesis profile: enginespec's profiles "
        f"are {', '.join(PROFILES)} (any other registered profile, e.g. hypothesis' 'default', "
        f"also works); unset the variable for the default {DEFAULT_PROFILE!r}"
    )


def check_impl(config, items) -> None:
    """The impl under test must load once any collected test calls it: a target that does not
    (an unknown name, a module without the attribute, an object missing a factory: the
    ValueErrors of `spec.load_impl`), or an explicitly empty `--impl=` (`--impl=$UNSET`, which
    would otherwise fall back to the reference and pass), is one usage error naming the target
    and its source, instead of the same error at the setup of every test. Anything else a
    backend raises while loading is left to the `impl` fixture, which reports it with its
    traceback. Like check_profile, it runs only when such tests are collected."""
    if any(calls_backend(item) for item in items):
        refuse_unloadable_impl(config)


def refuse_unloadable_impl(config) -> None:
    """The UsageError of check_impl, raised when the impl under test does not load."""
    given = config.getoption("--impl")
    if given is not None and not given.strip():
        raise pytest.UsageError(
            f"--impl is empty ({given!r}): name the implementation under test "
            f"(reference, fast, an entry point, pkg.module or pkg.module:attr)"
        )
    from enginespec.spec import load_impl

    target = impl_target(config)
    try:
        load_impl(target)
    except ValueError as e:
        source = "--impl" if given else f"${ENV_IMPL}" if os.environ.get(ENV_IMPL) else "the default"
        raise pytest.UsageError(f"cannot load the impl under test ({source}={target!r}): {e}") from None
    except Exception:  # noqa: BLE001 - the backend's own crash: the fixture shows its traceback
        return


def is_xdist_controller(config) -> bool:
    """Whether this process hands the tests to pytest-xdist workers (`-n N`) and collects none."""
    return config.pluginmanager.hasplugin("dsession")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Under pytest-xdist the controller collects nothing, so check_profile and check_impl run
    only in the workers, and a UsageError raised in a worker's collection never reaches the
    user: the run ends in an INTERNALERROR naming a test id. So the controller refuses an
    unknown profile or an impl that does not load itself, before any worker starts, whenever
    the run is about enginespec (runs_ours: --impl given, our tree, or our package named)."""
    config = session.config
    if is_xdist_controller(config) and runs_ours(config):
        refuse_unknown_profile(config)
        refuse_unloadable_impl(config)


@contextmanager
def our_profile(config, path):
    """Load enginespec's profile for the duration, when `path` is ours; restore the previous."""
    name = config.stash.get(_PROFILE_KEY, None)
    if name is None or not is_ours(path) or not profile_is_registered(name):
        yield  # an unknown name: collected without it, then refused by check_profile
        return
    from hypothesis import settings

    before = settings.get_current_profile_name()
    settings.load_profile(name)
    try:
        yield
    finally:
        settings.load_profile(before)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    with our_profile(collector.config, getattr(collector, "path", None)):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with our_profile(item.config, getattr(item, "path", None)):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A failure Hypothesis found in one of our tests ends with the command that replays it
    (replay_note): an outside author cannot follow Hypothesis' own advice to edit the test."""
    outcome = yield
    error = outcome.excinfo[1] if outcome.excinfo is not None else None
    if error is not None and is_ours(getattr(item, "path", None)) and found_by_hypothesis(error):
        add_note(error, replay_note(item))


def found_by_hypothesis(error: BaseException) -> bool:
    """Whether Hypothesis reported this failure: it notes a falsifying example on the error, or
    raised one of its own errors (flaky, health check, deadline), or grouped several distinct
    failures it found (an exception group, from a profile that shrinks) of which one is such."""
    group = getattr(error, "exceptions", None)
    if isinstance(group, tuple) and any(found_by_hypothesis(e) for e in group):
        return True
    notes = getattr(error, "__notes__", None) or ()
    return any("Falsifying" in str(note) for note in notes) or type(error).__module__.startswith("hypothesis")


def add_note(error: BaseException, note: str) -> None:
    """BaseException.add_note (3.11), or its __notes__ list on 3.10."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        error.__notes__ = [*getattr(error, "__notes__", ()), note]


def replay_note(item) -> str:
    """How to reproduce the failure: the command, and why it replays the same examples (a
    derandomized profile, a --hypothesis-seed, or the example database of the directory)."""
    from hypothesis import Phase, settings

    current = settings.default  # the profile our_profile loaded for this item
    seed = item.config.getoption("--hypothesis-seed", default=None)
    seed = None if current.derandomize else seed
    command = replay_command(item, seed)
    name = item.config.stash.get(_PROFILE_KEY, DEFAULT_PROFILE)
    if current.derandomize:
        why = f"from any directory: the {name} profile is derandomized, the same examples on every machine"
    elif seed is not None:
        why = "from any directory: --hypothesis-seed fixes the examples"
    elif current.database is not None:
        why = "from this directory: Hypothesis saved the failing example in .hypothesis/ and replays it first"
    else:
        why = f"the {name} profile draws new examples each run and saves none: add --hypothesis-seed=N"
    lines = [f"enginespec: to reproduce this failure ({why}):", f"  {command}"]
    if Phase.shrink not in current.phases and current.derandomize:
        lines += [
            "for the shortest failing example, replay the same examples with shrinking on "
            "(from any directory; a long stateful trace may take minutes to shrink):",
            f"  {replay_command(item, None, SHRINK_PROFILE)}",
        ]
    elif Phase.shrink not in current.phases:
        saved = settings.get_profile("enginespec-dev").database is not None
        tail = (
            "; what it finds is saved in .hypothesis/ here, and the same command replays it" if saved else ""
        )
        lines += [
            f"for the shortest failing example, search again with shrinking on (a new random search{tail}):",
            f"  {replay_command(item, None, 'enginespec-dev')}",
        ]
    return "\n".join(lines)


def replay_command(item, seed, profile: str | None = None) -> str:
    """`python -m pytest` of this one test, from anywhere for the shipped suite (`--pyargs` and
    its module's dotted name), with the impl and the profile of this run, and the seed if any."""
    config = item.config
    profile = profile or config.stash.get(_PROFILE_KEY, DEFAULT_PROFILE)
    path, sep, rest = canonical_id(item).partition("::")
    if path.startswith("conformance/"):
        module = path.removesuffix(".py").replace("/", ".")
        target = ["--pyargs", f"enginespec.{module}{sep}{rest}"]
    else:  # a test of the repository: its node id, from the repository's root
        target = [item.nodeid]
    args = ["python", "-m", "pytest", *target, f"--impl={impl_target(config)}"]
    if profile != DEFAULT_PROFILE:
        args.append(f"{PROFILE_OPTION}={profile}")
    if seed is not None:
        args.append(f"--hypothesis-seed={seed}")
    return " ".join(shlex.quote(arg) for arg in args)


def pytest_report_header(config):
    if not runs_ours(config):
        return None  # another project's run: no header, and no torch import for it
    target = impl_target(config)
    parts = []
    try:
        from enginespec.conformance.parts import parts_line
        from enginespec.spec import load_impl

        loaded = load_impl(target)
        name, parts = getattr(loaded, "name", "?"), [parts_line(loaded)]
    except Exception as e:  # the header must not hide the real error from the impl fixture
        name = f"<cannot load: {e}>"
    source = "--impl" if config.getoption("--impl") else ENV_IMPL if os.environ.get(ENV_IMPL) else "default"
    return [
        f"enginespec impl under test: {name} ({source}={target}); "
        f"hypothesis profile for enginespec's tests: {config.stash.get(_PROFILE_KEY, '(hypothesis absent)')}",
        *parts,
    ]


def runs_ours(config) -> bool:
    """Whether this session is (likely) about enginespec: --impl given, run from our tree, or
    our package named among the arguments."""
    return is_about_us(bool(config.getoption("--impl")), config.rootpath, config.args)


def is_about_us(impl_given: bool, rootpath, args) -> bool:
    """runs_ours from its parts, so that it can be asked before the arguments are final."""
    return impl_given or is_ours(rootpath) or "enginespec" in " ".join(str(a) for a in args)


def canonical_id(item) -> str:
    """The node id as seen from the repo root, whatever the rootdir or --pyargs:
    `conformance/<file>::<name>` for the shipped suite; the plain node id for anything else."""
    _, sep, rest = item.nodeid.partition("::")
    try:
        rel = Path(os.path.realpath(item.path)).relative_to(CONFORMANCE_DIR)
    except ValueError:
        return item.nodeid
    return f"conformance/{rel.as_posix()}{sep}{rest}"


def read_xfails(path: str) -> list[tuple[str, str]]:
    """(test id substring, reason) per non-blank, non-comment line of the xfails file."""
    entries = []
    for line in Path(path).read_text().splitlines():
        pattern, _, reason = line.partition("#")
        pattern = pattern.strip()
        if pattern:
            entries.append((pattern, reason.strip() or f"listed in {path}"))
    return entries


def calls_backend(item) -> bool:
    """A test calls the backend iff it takes this plugin's `impl` fixture (directly or through
    another fixture), or carries the `backend` marker explicitly."""
    if item.get_closest_marker("backend") is not None:
        return True
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.get("impl", ()) if info is not None else ()
    return bool(defs) and getattr(defs[-1].func, "__module__", "") == __name__


def mark_xfails(config, items) -> None:
    path = config.getoption("--xfails-file")
    if not path:
        return
    if not Path(path).is_file():
        raise pytest.UsageError(f"--xfails-file {path!r}: no such file")
    entries = read_xfails(path)
    used = set()
    for item in items:
        cid = canonical_id(item)
        for pattern, reason in entries:
            if pattern in cid:
                item.add_marker(pytest.mark.xfail(reason=f"known gap: {reason}", strict=False))
                used.add(pattern)
                break
    for pattern, _ in entries:
        if pattern not in used:
            warnings.warn(
                pytest.PytestWarning(
                    f"--xfails-file {path}: {pattern!r} matches no collected test "
                    f"(ids read like conformance/test_block_manager.py::test_lru_order)"
                ),
                stacklevel=1,
            )


#: The conformance modules that run first, in this order, cheapest-to-read failure first (so
#: `-x` stops at a "[spec rule ...]" failure, not an engine-level output diff): the block
#: manager's and scheduler's directed rule tests, then the stateful lockstep against the
#: reference, then attention and batch layout. Every other module (engine level: outputs through
#: the engine and a model) runs after them, in collection order.
RUN_FIRST = (
    "test_block_manager",
    "test_scheduler",
    "test_schedule_edges",
    "test_errors",
    "test_numeric_args",
    "test_stateful",
    "test_attention",
    "test_batch",
    "test_batch_parity",
)
_RANK = {module: rank for rank, module in enumerate(RUN_FIRST)}


def conformance_layer(item) -> int | None:
    """The item's rank (its module's index in RUN_FIRST, len(RUN_FIRST) for any other conformance
    module), or None for an item outside the shipped conformance package."""
    path = getattr(item, "path", None)
    if path is None:
        return None
    try:
        rel = Path(os.path.realpath(path)).relative_to(CONFORMANCE_DIR)
    except ValueError:
        return None
    return _RANK.get(rel.stem, len(RUN_FIRST)) if len(rel.parts) == 1 else len(RUN_FIRST)


def order_by_layer(items: list) -> None:
    """Reorder, in place, only the conformance package's items by rank: they are sorted among
    the positions they already hold (by rank, then collection index, so a module's tests keep
    their order and the engine-level modules keep collection order); every other item keeps its
    exact position."""
    ranked = sorted((rank, i) for i, rank in enumerate(map(conformance_layer, items)) if rank is not None)
    ours = [items[i] for _, i in ranked]
    for slot, item in zip(sorted(i for _, i in ranked), ours):
        items[slot] = item


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Runs before -k/-m deselection, so xfail lines are matched against the whole suite."""
    check_profile(config, items)
    check_impl(config, items)
    order_by_layer(items)
    for item in items:
        if calls_backend(item) and item.get_closest_marker("backend") is None:
            item.add_marker(pytest.mark.backend)
    mark_xfails(config, items)
    if config.getoption("--backend-only"):
        keep = [item for item in items if item.get_closest_marker("backend") is not None]
        dropped = [item for item in items if item.get_closest_marker("backend") is None]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep


@pytest.fixture(scope="session")
def impl(request):
    """The Implementation under test (spec.load_impl of --impl / $ENGINESPEC_IMPL)."""
    from enginespec.spec import load_impl

    return load_impl(impl_target(request.config))


@pytest.fixture(scope="session")
def reference_impl():
    """The oracle every other impl is compared with."""
    from enginespec.spec import load_impl

    return load_impl("reference")


@pytest.fixture(scope="module")
def torch_one_thread():
    """Run a module's tiny-model tests on one torch thread (restored after): on a small shared
    CPU box, tiny matmuls are many times slower with several threads fighting over two cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def plugin_is_installed() -> bool:
    """Whether an installed enginespec registers this plugin as a pytest11 entry point (false
    when it is imported from a bare tree, as on a machine that cannot build a wheel): tests that
    start a fresh pytest expect the plugin to load by itself."""
    from importlib.metadata import entry_points

    return any(ep.value == __name__ for ep in entry_points(group="pytest11"))


#: Marks a test that runs pytest in a subprocess and relies on the installed entry point.
needs_installed_plugin = pytest.mark.skipif(
    not plugin_is_installed(), reason="enginespec is not installed (no pytest11 entry point)"
)
