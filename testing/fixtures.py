"""Pytest fixtures shared by the conformance suite and the engine's own tests.

Imported by conformance/conftest.py and tests/conftest.py (this module needs pytest; nothing in
the product imports it).
"""

from __future__ import annotations

import gc
import os
import signal
import sys

import pytest

from enginespec.testing import checkpoints


@pytest.fixture(scope="session", autouse=True)
def tiny_checkpoint_root(tmp_path_factory):
    """Point `checkpoints.tiny_model_dir` into pytest's session temp dir (once per session), so
    the tiny checkpoints live where pytest cleans up, never loose in the system temp dir."""
    if checkpoints.cache_root() is None:
        checkpoints.use_cache_root(tmp_path_factory.mktemp("checkpoints"))
    return checkpoints.cache_root()


@pytest.fixture(scope="session", autouse=True)
def torch_compile_cache(tmp_path_factory):
    """torch.compile's on-disk cache (inductor) goes under pytest's session temp dir too, unless
    the user chose one (TORCHINDUCTOR_CACHE_DIR): by default inductor writes
    $TMPDIR/torchinductor_<user>, which a test run would leave behind."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        yield os.environ["TORCHINDUCTOR_CACHE_DIR"]
        return
    yield from _env_folder(tmp_path_factory, "TORCHINDUCTOR_CACHE_DIR", "torchinductor")


@pytest.fixture(scope="session", autouse=True)
def enginespec_cache(tmp_path_factory):
    """enginespec's own cache folder (ENGINESPEC_CACHE_DIR: the skinny GEMM's tuning table,
    worker/skinny_table_file.py) under the session temp dir too, unless the user chose one: a
    test run neither writes ~/.cache nor reads a table an earlier run left there."""
    yield from _env_folder(tmp_path_factory, "ENGINESPEC_CACHE_DIR", "enginespec_cache")


# A test holding more than this of CUDA memory in torch's cache hands it back when it ends.
CUDA_CACHE_RELEASE_BYTES = 1 << 30


@pytest.fixture(autouse=True)
def release_cuda_cache():
    """After a test that left over CUDA_CACHE_RELEASE_BYTES in torch's caching allocator (an
    engine whose KV pool took gpu_memory_utilization of the GPU, then stopped), collect its
    garbage and give the cached memory back to the driver: torch keeps freed blocks for this
    process, and a later test's engine in a subprocess (the README's AsyncLLM example) would
    find the GPU full and refuse to start. Cheap elsewhere: nothing runs unless CUDA is in use."""
    yield
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    if torch.cuda.memory_reserved() > CUDA_CACHE_RELEASE_BYTES:
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt, as in a terminal (a test runner's worker may ignore
    it); the handler before is restored after. Yields the function that delivers one Ctrl-C
    to this process now: Python runs the handler at once, on the main thread, at the line
    that called it, as it would where a real Ctrl-C landed."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield lambda: signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def _env_folder(tmp_path_factory, name: str, folder: str):
    """Yield os.environ[name], set to a new session temp folder for the session when unset."""
    if os.environ.get(name):
        yield os.environ[name]
        return
    path = str(tmp_path_factory.mktemp(folder))
    os.environ[name] = path
    try:
        yield path
    finally:
        os.environ.pop(name, None)
