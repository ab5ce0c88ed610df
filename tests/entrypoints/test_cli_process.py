"""The `enginespec` command line as a shell runs it: `python -m enginespec`, Ctrl-C, a reader
that closes the pipe early, pool sizes the host cannot hold, and the checkpoint's
generation_config.json under `generate`. Each case is one fresh process (or one in-process
call) on the tiny qwen3 checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("torch_one_thread")

CLI = [sys.executable, "-m", "enginespec.entrypoints.cli"]
CPU = ["--device", "cpu", "--dtype", "float32", "--no-tqdm"]


def _env() -> dict:
    """The test's environment for a child process: its sys.path (so the child imports this
    tree), one torch thread (the suite's CPUs are shared)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}


def run_cli(argv, capsys) -> tuple[int, str, str]:
    from enginespec.entrypoints.cli import main

    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_python_dash_m_enginespec_is_the_cli():
    """`python -m enginespec ...` (the package run as a module) is the `enginespec` script: it
    said "No module named enginespec.__main__" and exited 1."""
    from enginespec import __version__

    proc = subprocess.run(
        [sys.executable, "-m", "enginespec", "--version"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"enginespec {__version__}"
    proc = subprocess.run(
        [sys.executable, "-m", "enginespec", "generate"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 2 and "the following arguments are required: --model" in proc.stderr
