"""Do the host's CUDA calls cost more while the GPU is busy? (issue 19, batch-1 host time)

On the H200 a batch-1 step's host phases took 0.96-1.05 ms beside the 0.6B model, whose graph
keeps the GPU busy while the host runs a step ahead, and 0.57 ms beside the 8B model, where the
host waits for each step's ids and issues its calls to an idle GPU (benchmarks/RESULTS.md,
seventh session). This times the calls a decode step makes, each N times in a row, once with the
GPU idle and once behind a long kernel (a loop of big matmuls queued first), with perf_counter:

- torch.empty on the device; a small pinned host-to-device copy (non_blocking); an event record;
- a small index kernel (hidden[idx]); a [1, 1024] x [1024, 151936] F.linear (the logits launch);
- a CUDA graph replay of a few small kernels.

    python3 benchmarks/host_contention_probe.py [--reps 200] [--out probe.json]
    python3 benchmarks/host_contention_probe.py --dry-run    # CPU: the same calls, no GPU

Prints us per call, idle and busy, and their ratio. A ratio well above 1 names the call that
waits on the driver while the GPU works.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def _calls(dev: torch.device) -> dict:
    cuda = dev.type == "cuda"
    host = torch.zeros(4096, dtype=torch.uint8, pin_memory=cuda)
    hidden = torch.randn(8, 1024, device=dev, dtype=torch.bfloat16 if cuda else torch.float32)
    head = torch.randn(151936 if cuda else 4096, 1024, device=dev, dtype=hidden.dtype)
    idx = torch.arange(1, device=dev)
    calls = {
        "empty": lambda: torch.empty(4096, dtype=torch.uint8, device=dev),
        "h2d_copy_4k": lambda: torch.empty(4096, dtype=torch.uint8, device=dev).copy_(
            host, non_blocking=True
        ),
        "index_row": lambda: hidden[idx],
        "slice_row": lambda: hidden[:1],
        "logits_linear": lambda: F.linear(hidden[:1], head),
    }
    if cuda:
        stream = torch.cuda.current_stream(dev)
        calls["event_record"] = lambda: torch.cuda.Event().record(stream)
        graph, static = torch.cuda.CUDAGraph(), hidden.clone()
        side = torch.cuda.Stream(dev)
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            for _ in range(3):
                static.mul_(1.0).add_(0.0)
        stream.wait_stream(side)
        with torch.cuda.graph(graph):
            for _ in range(16):
                static.mul_(1.0).add_(0.0)
        calls["graph_replay_32_kernels"] = graph.replay
    return calls


def _busy(dev: torch.device, ms: float) -> None:
    """Queue about `ms` of GPU work (big matmuls) and return at once."""
    if dev.type != "cuda":
        return
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(max(1, int(ms / 0.6))):  # ~0.6 ms an 8k matmul on an H200
        a @ a


def _time(fn, reps: int) -> float:
    """Median us of fn over reps calls, each timed alone."""
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1e6)
    return statistics.median(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--out")
    p.add_argument("--dry-run", action="store_true", help="CPU tensors, no GPU (a smoke test)")
    args = p.parse_args(argv)
    dev = torch.device("cpu" if args.dry_run else "cuda")
    calls = _calls(dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows = {}
    for name, fn in calls.items():
        for _ in range(10):  # warm: allocator, kernels, cuBLAS handles
            fn()
        sync()
        idle = _time(fn, args.reps)
        sync()
        _busy(dev, 0.02 * args.reps + 20)  # outlasts the reps below
        busy = _time(fn, args.reps)
        sync()
        rows[name] = {"idle_us": idle, "busy_us": busy, "ratio": busy / idle if idle else None}
        print(f"{name:26s} idle {idle:7.1f} us   busy {busy:7.1f} us   x{busy / idle:5.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": str(dev), "reps": args.reps, "calls": rows}, f, indent=1)


if __name__ == "__main__":
    main()
