"""End-to-end throughput benchmark: a thin script over `benchmarks.harness.main`.

Run from the repository root (no install needed):
    python benchmarks/throughput.py --out throughput.json
Smoke run on a CPU in seconds:
    python benchmarks/throughput.py --shape tiny --device cpu --num-requests 4 \
        --max-input-len 32 --max-output-len 16
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.harness import main

    sys.exit(main())
