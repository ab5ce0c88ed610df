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
    for name, edit in VARIANTS.items():
        if sys.argv[1:] and name not in sys.argv[1:]:
            continue
        script.write_text(edit(INTERRUPTED_SCRIPT))
        proc = subprocess.Popen([sys.executable, str(script), str(path), "uncaught"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
        proc.stdout.readline()
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        last = [line for line in err.splitlines() if not line.startswith("[rank0]:  ")]
        print(
            f"{name}: exit status {proc.returncode}; stdout {out.strip()!r}; stderr, frames left out: {last[-4:]}"
        )
    return 0


# The test's script as it is, and edits of its `raise` (what the uncaught path does at exit).
VARIANTS = {
    "as_is": lambda s: s,
    "fresh_raise": lambda s: s.replace(
        "            raise\n", "            raise KeyboardInterrupt from None\n"
    ),
    "closed_then_raise": lambda s: s.replace(
        "            raise\n", "            llm.close()\n            raise\n"
    ),
    "closed_fresh_raise": lambda s: s.replace(
        "            raise\n", "            llm.close()\n            raise KeyboardInterrupt from None\n"
    ),
}


if __name__ == "__main__":
    sys.exit(main())
