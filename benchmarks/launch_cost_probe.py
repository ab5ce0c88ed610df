"""Host time of one launch of a prefill step's projections, with the device idle and busy (issue 19).

The thirty-seventh session's profile of the workload's prefill steps gave `aten::mm` 320 us of
CPU a call (the q|k|v and gate|up projections at 16,384 rows) against 40 us for the in-place
`addmm_` of the o and down projections, with the host launching about as long as the device
ran. This probe times the launches alone, outside the engine, to say whether that cost is the
BLAS library's own host work (the same with the device idle and busy), a wait for the device
(only when it is busy), or the profiler's:

- for each op, CALLS launches back to back, the host's wall per launch with the device idle
  (synced before), and behind a busy device (a sleep kernel of about 50 ms queued first);
- the device's time per call (events around the CALLS launches);
- with --blas cublaslt, torch's preferred BLAS library switched first.

    python3 benchmarks/launch_cost_probe.py [--rows 16384] [--blas cublaslt] [--out F.json]

On a CPU (no CUDA, or --device cpu) it runs the same ops at --rows on the CPU, with no busy case:
a smoke run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cli_types import at_least_one  # noqa: E402

# (name, N, K) of the Qwen3-0.6B shape's projections: the merged q|k|v and gate|up (F.linear),
# and the o and down projections added into the residual in place (addmm_).
SHAPES = [("qkv", 4096, 1024), ("gate_up", 6144, 1024), ("o", 1024, 2048), ("down", 1024, 3072)]
BUSY_CYCLES = 100_000_000  # torch.cuda._sleep's spin: tens of ms on a Hopper clock


def make_ops(rows: int, device, dtype):
    """name -> a callable that launches the op once (its inputs made here, once)."""
    ops = {}
    hidden = torch.randn(rows, 1024, device=device, dtype=dtype)
    for name, n, k in SHAPES:
        x = torch.randn(rows, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype) / k**0.5
        if name in ("o", "down"):
            ops[name] = lambda x=x, w=w: hidden.addmm_(x, w.t())
        else:
            ops[name] = lambda x=x, w=w: F.linear(x, w)
    return ops


def host_us_per_call(op, calls: int, busy: bool, device) -> float:
    """The host's wall per launch over `calls` launches (device idle, or behind a sleep)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        if busy:
            torch.cuda._sleep(BUSY_CYCLES)
    start = time.perf_counter()
    for _ in range(calls):
        op()
    took = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return took / calls * 1e6


def device_us_per_call(op, calls: int, device) -> float | None:
    if device.type != "cuda":
        return None
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    begin.record()
    for _ in range(calls):
        op()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / calls * 1e3


def probe(rows: int, calls: int, repeats: int, device) -> list[dict]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ops = make_ops(rows, device, dtype)
    results = []
    for name, op in ops.items():
        for _ in range(3):  # warm: cuBLAS's handle, its heuristics for this shape, the allocator
            op()
        row = {"op": name, "rows": rows}
        cases = [("idle", False)] + ([("busy", True)] if device.type == "cuda" else [])
        for case, busy in cases:
            row[f"host_us_{case}"] = statistics.median(
                host_us_per_call(op, calls, busy, device) for _ in range(repeats)
            )
        row["device_us"] = device_us_per_call(op, calls, device)
        results.append(row)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=at_least_one, default=16384, help="rows of x (a prefill step's tokens)"
    )
    parser.add_argument("--calls", type=at_least_one, default=20, help="launches a timing")
    parser.add_argument("--repeats", type=at_least_one, default=3, help="timings a case (median)")
    parser.add_argument("--blas", choices=["default", "cublas", "cublaslt"], default="default")
    parser.add_argument("--device", default="auto", help="auto (cuda when there is one), cuda or cpu")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    if args.blas != "default" and device.type == "cuda":
        torch.backends.cuda.preferred_blas_library(args.blas)
    with torch.inference_mode():
        results = probe(args.rows, args.calls, args.repeats, device)
    print(f"| op | rows | host us idle | host us busy | device us | ({args.blas}, {device})")
    for r in results:
        busy, dev = r.get("host_us_busy"), r["device_us"]
        print(f"| {r['op']} | {r['rows']} | {r['host_us_idle']:.1f} | "
              f"{'-' if busy is None else f'{busy:.1f}'} | {'-' if dev is None else f'{dev:.1f}'} |")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"blas": args.blas, "device": str(device), "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
