"""pytest plugin of the conformance suite: picks the implementation under test.

Registered as a `pytest11` entry point (see pyproject.toml), so it is active in this repository
and in any outside project that installs enginespec: `pytest --pyargs conformance
--impl=mypkg.backend:IMPL` runs the suite against an outside backend. Never register it again
from a conftest (pytest would refuse the duplicate).

Options:
- `--impl NAME` (env fallback ENGINESPEC_IMPL, default "reference"): anything `spec.load_impl`
  accepts: "reference", "fast", an `enginespec.impls` entry point, or "pkg.module:attr".
- `--xfails-file PATH`: known gaps of the impl, one test node-id substring per line (text after
  `#` is a comment and becomes the reason); matching tests are marked xfail (not strict), as in
  array-api-tests.

Hypothesis profiles: `ci` (few examples, no deadline, derandomized so a failure reproduces on
every machine, and no shrinking: shrinking a failing stateful trace can take minutes, while the
derandomized failing example is reported at once and replays with the printed blob), `dev`
(more examples, shrinking, still no deadline), `thorough` (many examples and longer stateful
runs). `ci` is loaded unless `--hypothesis-profile` or $HYPOTHESIS_PROFILE names another.
"""

from __future__ import annotations

import os
from pathlib import Path

# Kernel tests run under Triton's interpreter where no NVIDIA GPU is present. The variable must be
# set before anything imports triton, so it is set when pytest loads this plugin; the check is a
# file test, not a torch import, so that other projects' test runs pay nothing for it.
if "TRITON_INTERPRET" not in os.environ and not Path("/dev/nvidiactl").exists():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest
from hypothesis import HealthCheck, Phase, settings

ENV_IMPL = "ENGINESPEC_IMPL"
ENV_PROFILE = "HYPOTHESIS_PROFILE"
DEFAULT_PROFILE = "ci"

settings.register_profile(
    "ci",
    max_examples=12,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.register_profile(
    "dev",
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=1000,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def pytest_addoption(parser):
    group = parser.getgroup("enginespec", "enginespec conformance")
    group.addoption(
        "--impl",
        default=None,
        help=f"implementation under test: reference, fast, an entry point or pkg.module:attr "
        f"(default: ${ENV_IMPL} or reference)",
    )
    group.addoption(
        "--xfails-file",
        default=None,
        help="file of test node-id substrings (one per line) to mark xfail for this impl",
    )


def impl_target(config) -> str:
    """The impl name given on the command line, else $ENGINESPEC_IMPL, else "reference"."""
    return config.getoption("--impl") or os.environ.get(ENV_IMPL) or "reference"


def pytest_configure(config):
    # Hypothesis' own plugin loads --hypothesis-profile; only pick ours when none was asked for.
    if not config.getoption("--hypothesis-profile", default=None):
        settings.load_profile(os.environ.get(ENV_PROFILE) or DEFAULT_PROFILE)


def pytest_report_header(config):
    target = impl_target(config)
    try:
        from enginespec.spec import load_impl

        name = getattr(load_impl(target), "name", "?")
    except Exception as e:  # the header must not hide the real error from the impl fixture
        name = f"<cannot load: {e}>"
    source = "--impl" if config.getoption("--impl") else ENV_IMPL if os.environ.get(ENV_IMPL) else "default"
    return [
        f"enginespec impl under test: {name} ({source}={target}); "
        f"hypothesis profile: {settings.get_current_profile_name()}"
    ]


def read_xfails(path: str) -> list[tuple[str, str]]:
    """(node-id substring, reason) per non-blank, non-comment line of the xfails file."""
    entries = []
    for line in Path(path).read_text().splitlines():
        pattern, _, reason = line.partition("#")
        pattern = pattern.strip()
        if pattern:
            entries.append((pattern, reason.strip() or f"listed in {path}"))
    return entries


def pytest_collection_modifyitems(config, items):
    path = config.getoption("--xfails-file")
    if not path:
        return
    if not Path(path).is_file():
        raise pytest.UsageError(f"--xfails-file {path!r}: no such file")
    entries = read_xfails(path)
    for item in items:
        for pattern, reason in entries:
            if pattern in item.nodeid:
                item.add_marker(pytest.mark.xfail(reason=f"known gap: {reason}", strict=False))
                break


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
