"""The one-launch decode attention's (kernels/decode_attention.py) launch config at 2-64 rows,
timed as a CUDA graph replays it (issue 19).

The eighteenth session's profiles put the decode attention at 8.5 us a layer at 4 rows and 19 at
16 (517-token contexts; the K/V's floor is 2 and 8): a third of those steps. Its config there
is choose_config's, chosen with the two-launch paged attention (attention_split_probe.py), not
with this kernel's q|k|v epilogue. This probe times, for the Qwen3-0.6B heads (16 q / 8 kv,
head_dim 128, bf16, block 16, q|k norms on) at each batch x context:

- "graph": the config decode_config gives a graph captured at --max-model-len (what runs now);
- every (tile, splits, stages) of the grid below at 4 warps, split merge included.

    python3 benchmarks/decode_attention_probe.py --out probe.json [--batches 2,4,8,16,32,64]
        [--contexts 517,2048] [--max-model-len 40960]

Each figure is the median of do_bench over a graph of rotating inputs (gpu_kernels.time_calls:
L2 holds none of the K/V read), in us a call. Smoke run: --dry-run (tiny shapes, untimed; the interpreter on a CPU-only machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from enginespec.kernels import paged_attention as pa  # noqa: E402
from enginespec.kernels.decode_attention import decode_attention, decode_config  # noqa: E402

HQ, HKV, HEAD, BLOCK = 16, 8, 128, 16
ROTATE_BYTES = 256 << 20  # > 4x the H200's L2
TILES, SPLITS, STAGES = (32, 64, 128), (1, 2, 4, 8, 16, 32), (1, 2)


def make_case(num_reqs: int, ctx: int, device, dtype):
    """Rotating input sets: each its own q|k|v rows and disjoint shuffled block tables."""
    kv_bytes = 2 * num_reqs * ctx * HKV * HEAD * 2
    n_sets = max(1, min(64, math.ceil(ROTATE_BYTES / kv_bytes)))
    per_req = math.ceil(ctx / BLOCK)
    total = n_sets * num_reqs * per_req
    cache = torch.randn(2, total + 1, BLOCK, HKV, HEAD, device=device, dtype=dtype)
    tables = torch.randperm(total, device=device).view(n_sets, num_reqs, per_req).int()
    qkv = torch.randn(n_sets, num_reqs, (HQ + 2 * HKV) * HEAD, device=device, dtype=dtype)
    angle = torch.rand(num_reqs, HEAD, device=device)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    norm = 1 + 0.1 * torch.randn(HQ + HKV, HEAD, device=device, dtype=dtype)
    seq_lens = torch.full((num_reqs,), ctx, device=device, dtype=torch.int32)
    pos = ctx - 1  # the new key's slot: its block of each set's table
    slots = [(tables[s, :, pos // BLOCK].long() * BLOCK + pos % BLOCK) for s in range(n_sets)]
    return dict(
        cache=cache, tables=tables, qkv=qkv, cos=cos, sin=sin, norm=norm, seq_lens=seq_lens, slots=slots
    )


def calls_of(case, max_seq_len: int, config, attention=None):
    """One call per input set of `attention` (default kernels.decode_attention.decode_attention;
    decode_attention_phases.py passes its stamped copy's)."""
    attention = attention or decode_attention
    return [
        lambda i=i: attention(
            case["qkv"][i],
            case["cos"],
            case["sin"],
            case["norm"],
            1e-6,
            case["cache"],
            case["slots"][i],
            case["seq_lens"],
            case["tables"][i],
            HQ,
            max_seq_len=max_seq_len,
            config=config,
        )  # fmt: skip
        for i in range(case["tables"].shape[0])
    ]


def grid(tiles=TILES, splits=SPLITS, stages=STAGES) -> list[pa.LaunchConfig]:
    return [pa.LaunchConfig(16, t, s, 4, st) for t in tiles for s in splits for st in stages]


def probe(batches, contexts, max_model_len: int, device, dtype, time_calls, configs) -> list[dict]:
    rows = []
    for b in batches:
        for ctx in contexts:
            case = make_case(b, ctx, device, dtype)
            graph_cfg = decode_config(b, HQ, HKV, HEAD, max_model_len, device)
            timed = {}
            for cfg in [graph_cfg] + configs:
                if cfg not in timed:
                    timed[cfg] = time_calls(calls_of(case, ctx, cfg)) * 1e3
            best = min(timed, key=timed.get)
            rows.append(
                dict(
                    batch=b,
                    context=ctx,
                    graph_us=timed[graph_cfg],
                    graph=dataclasses.asdict(graph_cfg),
                    best_us=timed[best],
                    best=dataclasses.asdict(best),
                    all=[
                        dict(tile=c.tile, splits=c.num_splits, stages=c.num_stages, us=us)
                        for c, us in timed.items()
                    ],
                )  # fmt: skip
            )
            print(
                f"b={b:3d} ctx={ctx:5d} graph {timed[graph_cfg]:6.1f} us (tile {graph_cfg.tile} x "
                f"{graph_cfg.num_splits}, {graph_cfg.num_stages} st) | best {timed[best]:6.1f} us "
                f"(tile {best.tile} x {best.num_splits}, {best.num_stages} st)",
                flush=True,
            )
            del case
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-model-len", type=int, default=40960)
    parser.add_argument("--batches", default="2,4,8,16,32,64")
    parser.add_argument("--contexts", default="517,2048")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny grid, untimed: on CUDA if present, else the CPU (interpreter)",
    )
    args = parser.parse_args(argv)
    batches, contexts = ([int(v) for v in a.split(",")] for a in (args.batches, args.contexts))
    if args.dry_run:  # on the CPU, TRITON_INTERPRET=1 must be set by the caller

        def time_calls(calls):
            for call in calls[:2]:
                call()
            return 0.0

        configs = grid((16,), (1, 2), (1,))
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        rows = probe(batches, contexts, args.max_model_len, device, torch.float32, time_calls, configs)
    else:
        import gpu_kernels as gk

        rows = probe(
            batches, contexts, args.max_model_len, torch.device("cuda"), torch.bfloat16, gk.time_calls, grid()
        )
    with open(args.out, "w") as f:
        json.dump(dict(max_model_len=args.max_model_len, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
