"""Session fixtures shared with the other test tree (defined once, in enginespec.testing.fixtures)."""

import signal

from enginespec.testing.fixtures import (  # noqa: F401 - fixtures
    ctrl_c,
    enginespec_cache,
    release_cuda_cache,
    tiny_checkpoint_root,
    torch_compile_cache,
)


def pytest_configure(config):
    """The Ctrl-C tests (tests/entrypoints/test_cli*.py, tests/worker/test_tensor_parallel.py)
    send SIGINT as a user's terminal does, to this process or to a command it starts, and
    expect Python's KeyboardInterrupt. A suite started in the background of a non-interactive
    shell (`bash tools/check.sh &`, some CI runners) inherits SIGINT ignored, and Python then
    installs no handler: its own and every child's SIGINT did nothing, so eight of those tests
    failed (a command exiting 0, or timing out) for a reason outside the code. Python's handler
    again here (in the main process and in each xdist worker); a child resets a handled signal
    to its default on exec, so the commands these tests start get theirs too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
