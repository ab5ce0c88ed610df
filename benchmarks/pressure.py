"""Pressure run: the throughput workload with the KV pool capped at a fraction of what it needs,
once per preemption mode (recompute, swap), side by side behind one contract.

    python benchmarks/pressure.py --out pressure.json                 # H200: 0.6B shape, 1/4 pool
    python benchmarks/pressure.py --shape tiny --device cpu --num-requests 6 \
        --min-input-len 8 --max-input-len 32 --min-output-len 8 --max-output-len 24   # smoke

"What it needs" is every request's prompt + output at once, in blocks of the engine's block
size; the cap is --fraction of that (at least the largest single request, so every request can
run). Each mode gets a fresh LLM (num_gpu_blocks_override on CUDA, num_blocks elsewhere) and one
timed generate() after the engine's own warm-up; recorded per mode: wall seconds, output tok/s,
steps, preemptions, tokens recomputed (EngineStats.num_recomputed_tokens: positions computed a
second time after a preemption by recompute, prefix-cache hits excluded), bytes swapped
(EngineStats.num_swapped_bytes, out and in), and the token digest (greedy runs must agree
across modes). Any other flag is the throughput harness' (benchmarks/throughput.py: --shape,
--chat, --temperature, workload lengths, --engine-arg ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_runs import (
    checkpoint,
    engine_core,
    make_llm,
    own_args,
    release,
    shape_of,
    timed_generate,
    workload_for,
)  # noqa: E402
from benchmarks.throughput import parse_args  # noqa: E402


def pool_blocks(workload, block_size: int, fraction: float) -> tuple[int, int]:
    """(blocks the workload needs at once, the capped pool size)."""
    per_request = [-(-(p + o) // block_size) for p, o in zip(workload.prompt_lens, workload.output_lens)]
    need = sum(per_request)
    return need, max(max(per_request), int(need * fraction))


def run_mode(model_dir, workload, args, mode: str, num_blocks: int) -> dict:
    pool = {"num_gpu_blocks_override" if args.device.startswith("cuda") else "num_blocks": num_blocks}
    llm = make_llm(model_dir, args, preemption_mode=mode, **pool)
    out = timed_generate(llm, workload, args.device, args.temperature, use_tqdm=False, sampling=args.sampling)
    stats = engine_core(llm).stats
    out.update(
        mode=mode,
        num_blocks=num_blocks,
        startup_s=stats.startup_seconds,
        num_preemptions=stats.num_preemptions,
        num_recomputed_tokens=stats.num_recomputed_tokens,
        num_swapped_bytes=stats.num_swapped_bytes,
        swap_seconds=getattr(stats, "swap_seconds", None),
        num_scheduled_tokens=stats.num_scheduled_tokens,
    )
    del llm
    release()
    return out


def main(argv=None) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--fraction", type=float, default=0.25, help="pool size / what the workload needs")
    own.add_argument("--modes", default="recompute,swap")
    own.add_argument("--baseline", action="store_true", help="also a run with the whole pool (no pressure)")
    mine, rest = own_args(own, argv)
    args = parse_args(rest)
    model_dir = checkpoint(args.shape, args)
    workload = workload_for(args, args.num_requests, shape_of(model_dir, args).vocab_size)
    block_size = int(args.engine_args.get("block_size", 16))
    need, cap = pool_blocks(workload, block_size, mine.fraction)
    results = {"need_blocks": need, "cap_blocks": cap, "fraction": mine.fraction, "modes": {}}
    runs = [(mode, mode, cap) for mode in mine.modes.split(",")]
    runs += [("unpressured", "recompute", need)] if mine.baseline else []
    for name, mode, num_blocks in runs:
        run = run_mode(model_dir, workload, args, mode, num_blocks)
        results["modes"][name] = run
        print(
            f"pressure {name:11s}: {num_blocks} blocks, wall {run['wall_s']:.2f} s, {run['output_tok_s']:.0f} tok/s, "
            f"{run['num_steps']} steps, {run['num_preemptions']} preemptions, "
            f"{run['num_recomputed_tokens']} tokens recomputed, {run['num_swapped_bytes'] / 2**20:.0f} MiB swapped "
            f"({run['swap_seconds'] or 0:.2f} s of host time in swaps)",
            flush=True,
        )
        if args.out:  # after every mode, so a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    digests = {r["tokens_digest"] for r in results["modes"].values()}
    results["tokens_match_across_modes"] = len(digests) == 1
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
