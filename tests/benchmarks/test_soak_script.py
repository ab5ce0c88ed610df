"""benchmarks/soak.py as RESULTS.md runs it (`python benchmarks/soak.py ...`, a process of its
own, on a small count): it builds its own tiny checkpoint under a cache root of its own and
prints the soak's figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_soak_script_runs_standalone():
    cmd = [sys.executable, "benchmarks/soak.py", "--impl", "fast", "--requests", "24", "--seed", "3"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "soak: impl=fast seed=3" in done.stdout and len(done.stdout.splitlines()) > 2
