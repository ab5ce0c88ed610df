"""Startup time of LLM(...) in fresh processes: cold (empty compile caches), then warm caches.

    python benchmarks/startup.py --out startup.json          # H200, the 0.6B shape
    python benchmarks/startup.py --shape tiny --device cpu   # smoke

Each start is a new Python process that builds the LLM (loading, sizing with the profile run,
torch.compile, CUDA-graph capture, the engine's warm-up: engine/warmup.py) and prints
LLM.startup_seconds and the warm-up's share, plus the process wall time to that point (imports
included). The first start points TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR at new empty
folders (cold); the second reuses them (what a second start of a deployment costs: inductor's
FX-graph cache and Triton's kernel cache are on disk, dynamo still traces and graphs are
captured again). The checkpoint is made first, outside the timed processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHILD = r"""
import json, sys, time
start = time.perf_counter()
from enginespec.llm import LLM
kwargs = json.loads(sys.argv[2])
llm = LLM(sys.argv[1], **kwargs)
print("STARTUP " + json.dumps({"startup_s": llm.startup_seconds, "warmup_s": llm.engine.stats.warmup_seconds,
                               "phases": llm.engine.stats.startup_phases,
                               "process_s": time.perf_counter() - start}))
"""


def start_once(model_dir: str, kwargs: dict, env: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, model_dir, json.dumps(kwargs)], env=env, capture_output=True, text=True
    )
    for line in proc.stdout.splitlines():
        if line.startswith("STARTUP "):
            return json.loads(line[len("STARTUP ") :])
    return {"error": proc.stderr[-3000:]}


def main(argv=None) -> int:
    from benchmarks.engine_runs import checkpoint, own_args
    from benchmarks.throughput import parse_args

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--cache-root", help="where the fresh cache folders go (default: a new temp dir)")
    mine, rest = own_args(own, argv)
    args = parse_args(rest)
    model_dir = str(checkpoint(args.shape, args))
    root = Path(mine.cache_root or tempfile.mkdtemp(prefix="enginespec-startup-"))
    env = dict(
        os.environ, TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"), TRITON_CACHE_DIR=str(root / "triton")
    )
    kwargs = dict(impl=args.impl, dtype=args.dtype, seed=args.seed, device=args.device, **args.engine_args)
    results = {"cache_root": str(root)}
    for name in ("cold", "warm_cache"):
        results[name] = start_once(model_dir, kwargs, env)
        print(f"startup {name:10s}: {json.dumps(results[name])[:300]}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
