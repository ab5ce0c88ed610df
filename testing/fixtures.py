"""Pytest fixtures shared by the conformance suite and the engine's own tests.

Imported by conformance/conftest.py and tests/conftest.py (this module needs pytest; nothing in
the product imports it).
"""

from __future__ import annotations

import os

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
