"""Decode attention's split count, tile and warps, timed as a CUDA graph replays them (issue 19).

A decode graph is captured with max_seq_len = max_model_len, so its launch config is the one
choose_config gives for the longest context, whatever the context at replay. This probe times,
for the Qwen3-0.6B heads (16 q / 8 kv, head_dim 128, bf16, block 16), each batch x context:

- the config choose_config gives for the context itself ("eager") and for max_model_len
  ("graph"), and the previous rule's graph config (up to 2x past 3 programs per SM: at batch 1,
  64 splits of 128-key tiles);
- every split count 1-64 with 64- and 128-key tiles at each of --warps (4 and 8), so the rule
  can be checked against the best measured (8 warps were never timed before; neither count
  spills, by benchmarks/kernel_resources.py).

    python3 benchmarks/attention_split_probe.py --out probe.json [--max-model-len 40960]
        [--batches 1,4,16,64] [--contexts 512,2048,8192] [--warps 4,8]

Each figure is the median of do_bench over a graph of rotating inputs (gpu_kernels.time_calls),
so L2 holds none of the K/V read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from enginespec.kernels import paged_attention as pa  # noqa: E402

BATCHES = (1, 4, 16, 64)
CONTEXTS = (512, 2048, 8192)
HQ, HKV, HEAD = 16, 8, 128


def previous_graph_config(num_reqs: int, max_seq_len: int, device) -> pa.LaunchConfig:
    """The rule before the one-wave bound (b971081): split while programs x splits < 3 x SMs."""
    programs, target = num_reqs * HKV, 3 * pa._num_sms(device)
    splits, max_splits = 1, max(1, max_seq_len // pa.MIN_KEYS_PER_SPLIT)
    while splits * 2 <= min(max_splits, 64) and programs * splits < target:
        splits *= 2
    return pa.LaunchConfig(16, 128 if splits > 1 else 64, splits, 4, 2)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-model-len", type=int, default=40960)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    parser.add_argument("--warps", default="4,8", help="num_warps values of the sweep")
    parser.add_argument("--tiles", default="64,128", help="key tiles of the sweep")
    parser.add_argument("--stages", default="2", help="num_stages values of the sweep")
    parser.add_argument("--splits", default="1,2,4,8,16,32,64", help="split counts of the sweep")
    args = parser.parse_args(argv)
    batches, contexts, warps, tiles, stages, split_counts = (
        [int(v) for v in a.split(",")]
        for a in (args.batches, args.contexts, args.warps, args.tiles, args.stages, args.splits)
    )
    import gpu_kernels as gk

    device = torch.device("cuda")
    rows = []
    for b in batches:
        for ctx in contexts:
            case = gk.decode_case(b, ctx, HQ, HKV)
            named = {
                "eager": pa.choose_config(b, b, HQ, HKV, HEAD, 1, ctx, device),
                "graph": pa.choose_config(b, b, HQ, HKV, HEAD, 1, args.max_model_len, device),
                "graph_before": previous_graph_config(b, args.max_model_len, device),
            }
            sweep = [
                pa.LaunchConfig(16, t, s, w, st)
                for w in warps
                for t in tiles
                for st in stages
                for s in split_counts
            ]
            timed = {}
            for cfg in list(named.values()) + sweep:
                if cfg not in timed:
                    try:
                        timed[cfg] = gk.time_paged_decode(case, ctx, cfg) * 1e3
                    except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: skip it
                        print(f"  {cfg}: {type(e).__name__}", flush=True)
            best = min(timed, key=timed.get)
            kv_bytes = case[5]
            row = dict(
                batch=b,
                context=ctx,
                kv_bytes=kv_bytes,
                best_us=timed[best],
                best=dataclasses.asdict(best),
                best_tb_s=kv_bytes / timed[best] / 1e6,
            )
            for name, cfg in named.items():
                row[f"{name}_us"] = timed.get(cfg, float("nan"))  # (nan: it did not build)
                row[name] = f"tile {cfg.tile} x {cfg.num_splits} splits"
            row["all"] = [
                dict(tile=c.tile, splits=c.num_splits, warps=c.num_warps, stages=c.num_stages, us=us)
                for c, us in timed.items()
            ]
            rows.append(row)
            print(
                f"b={b:3d} ctx={ctx:5d} best {timed[best]:6.1f} us = {row['best_tb_s']:.2f} TB/s (tile "
                f"{best.tile} x {best.num_splits}, {best.num_warps} warps, {best.num_stages} stages) | "
                + " | ".join(f"{n} {row[n + '_us']:6.1f} us ({row[n]})" for n in named),
                flush=True,
            )
            del case
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(max_model_len=args.max_model_len, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
