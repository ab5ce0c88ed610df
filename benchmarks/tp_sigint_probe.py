"""The TP Ctrl-C test's script (tests/worker/test_tensor_parallel.py, ending "uncaught") run
once with its whole stderr and exit status shown: what a user sees when Ctrl-C ends a
tensor-parallel generate() they did not catch. Usage: python benchmarks/tp_sigint_probe.py"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from enginespec.testing.checkpoints import make_checkpoint
from tests.worker.test_tensor_parallel import INTERRUPTED_SCRIPT


def main() -> int:
    tmp = Path(tempfile.mkdtemp())
    path = make_checkpoint("qwen3", tmp / "qwen3")
    script = tmp / "interrupted.py"
    script.write_text(INTERRUPTED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    ending = sys.argv[1] if len(sys.argv) > 1 else "uncaught"
    proc = subprocess.Popen([sys.executable, str(script), str(path), ending], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    print(proc.stdout.readline().strip())
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    print(f"exit status {proc.returncode}\n--- stdout\n{out}--- stderr\n{err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
