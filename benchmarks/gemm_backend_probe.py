"""Which GEMM implementation wins the decode projections at 64-256 rows (issue 16): cuBLAS as
the engine calls it (F.linear), cuBLASLt (torch's preferred BLAS library switched), and
inductor's max-autotune choice (Triton templates benchmarked against cuBLAS per shape), each
timed as the engine's startup tuning times a GEMM (`worker.gemm_tuning.graph_us`: one CUDA
graph over num_layers distinct weights, so L2 holds none of them), beside the weight-read
floor at 4.2 TB/s. CUDA only; inductor prints its own autotune table (stderr) per shape.

    python3 benchmarks/gemm_backend_probe.py --rows 64,128,256 --out gemm_backends.json

Nothing asserts speed; the JSON keeps every (rows, projection, backend) time in us a GEMM.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.skinny_gemm_table import projection_shapes  # noqa: E402
from enginespec.testing import checkpoints  # noqa: E402
from enginespec.worker.gemm_tuning import graph_us  # noqa: E402


def _linear(x, w):
    return F.linear(x, w)


def backends() -> dict:
    """name -> (a function of (x, w), a context setter run before timing it)."""
    compiled = torch.compile(_linear, mode="max-autotune-no-cudagraphs", dynamic=False)
    return {
        "cublas": (_linear, lambda: torch.backends.cuda.preferred_blas_library("cublas")),
        "cublaslt": (_linear, lambda: torch.backends.cuda.preferred_blas_library("cublaslt")),
        "inductor_autotune": (compiled, lambda: torch.backends.cuda.preferred_blas_library("cublas")),
    }


def time_backend(fn, rows: int, n: int, k: int, num_layers: int) -> tuple[float, float]:
    """(us a GEMM over num_layers distinct weights in one graph, max abs error against cuBLAS)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    ws = [
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5
        for _ in range(num_layers)
    ]
    fn(x, ws[0])  # compile and autotune outside the graph
    torch.cuda.synchronize()
    us, outs = graph_us(lambda: [fn(x, w) for w in ws], num_layers)
    err = (outs[0] - F.linear(x, ws[0]).float()).abs().max().item()
    return us, err


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(checkpoints.SHAPES))
    ap.add_argument("--rows", default="64,128,256")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    num_layers = checkpoints.SHAPES[args.shape]["num_hidden_layers"]
    table, results = backends(), []
    print("| rows | projection | floor us | " + " | ".join(table) + " |")
    for rows in [int(r) for r in args.rows.split(",")]:
        for name, (n, k) in projection_shapes(args.shape).items():
            floor = n * k * 2 / 4.2e12 * 1e6
            cells = []
            for backend, (fn, setup) in table.items():
                setup()
                us, err = time_backend(fn, rows, n, k, num_layers)
                results.append(
                    dict(rows=rows, projection=name, n=n, k=k, backend=backend, us=us, max_err=err)
                )
                cells.append(f"{us:.2f}")
            print(f"| {rows} | {name} {n}x{k} | {floor:.2f} | " + " | ".join(cells) + " |", flush=True)
    torch.backends.cuda.preferred_blas_library("cublas")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(shape=args.shape, device=torch.cuda.get_device_name(), results=results), f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
