"""Before/after table of the decode projections (issue 19): for each projection of a shape
(q|k|v, o, gate|up, down) and each row count, cuBLAS against the skinny GEMM's best launch
shape, both timed exactly as the engine's startup tuning times them (worker/skinny_linear.py:
inside a CUDA graph over num_layers distinct random weights, so L2 is cold as in a real step),
beside the weight-read time at the copy bandwidth measured in the same run. Needs a CUDA device.

    python3 benchmarks/skinny_gemm_table.py --out $OUT/skinny_table.json
    python3 benchmarks/skinny_gemm_table.py --shape qwen3-8b --out $OUT/skinny_table_8b.json

The baseline is cuBLAS for the plain GEMMs; a fused variant's (norm before, SiLU * up or the
residual add after: worker/skinny_linear.py) is the separate kernels. The JSON keeps
every candidate's time (`measured`) and the ones rejected (build failure or a result off the
baseline's), so a loss can be read candidate by candidate. The per-step line sums the four
unfused projections over the layers: what the choice saves in one decode step at that row count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import roofline as rl  # noqa: E402
from enginespec.testing import checkpoints  # noqa: E402


def projection_shapes(shape: str) -> dict[str, tuple[int, int]]:
    """name -> (N, K) of the merged decoder's four GEMMs for a named shape."""
    c = checkpoints.SHAPES[shape]
    hidden, head_dim = c["hidden_size"], c["head_dim"]
    q, kv, inter = (
        c["num_attention_heads"] * head_dim,
        c["num_key_value_heads"] * head_dim,
        c["intermediate_size"],
    )
    return {
        "qkv": (q + 2 * kv, hidden),
        "o": (hidden, q),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
    }


# The variants each projection runs in the fused decoder layer (worker/skinny_linear.py), beside
# the plain GEMM: q|k|v after the input norm, o and down with the residual add, gate|up with
# SiLU * up (alone, and after the post-attention norm); with the norms folded (the engine's
# default on CUDA), q|k|v and gate|up with the row scale in place of the norm.
FUSED_VARIANTS = {
    "qkv": ("norm", "rscale"),
    "o": ("residual",),
    "gate_up": ("silu", "norm_silu", "rscale_silu"),
    "down": ("residual",),
}
# A decoder layer's four fused calls, unfolded and folded: the per-step lines sum each.
LAYER_CALLS = {
    "the fused layer calls": ("qkv (norm)", "o (residual)", "gate_up (norm_silu)", "down (residual)"),
    "folded": ("qkv (rscale)", "o (residual)", "gate_up (rscale_silu)", "down (residual)"),
}


def variant_calls(layers: list[dict], variant: str) -> list[dict]:
    """One tuning call a layer for `variant`: the norm variants with each layer's norm, the
    row-scale ones with a unit norm (what a folded layer holds: its norm's weight is in the
    GEMM's), the others the weight alone."""
    if variant.startswith("norm"):
        return layers
    if variant.startswith("rscale"):
        return [dict(a, norm_weight=torch.ones_like(a["norm_weight"]), row_scale=True) for a in layers]
    return [{"weight": a["weight"], "bias": None} for a in layers]


def run(args) -> dict:
    from enginespec.worker.skinny_linear import VARIANTS, LinearTable

    rows = sorted({int(r) for r in args.rows.split(",")})
    num_layers = checkpoints.SHAPES[args.shape]["num_hidden_layers"]
    copy = rl.measure_copy_bandwidth("cuda", 1 << 30, iters=20)
    table = LinearTable("cuda", max_rows=max(rows))
    gen = torch.Generator(device="cuda").manual_seed(0)
    out: dict = {"shape": args.shape, "num_layers": num_layers, "copy_bytes_per_s": copy, "rows": []}
    names = {}
    started = time.perf_counter()
    for name, (n, k) in projection_shapes(args.shape).items():
        layers = [
            {
                "weight": torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5,
                "bias": None,
                "norm_weight": 1 + 0.1 * torch.randn(k, device="cuda", dtype=torch.bfloat16, generator=gen),
                "eps": 1e-6,
            }
            for _ in range(num_layers)
        ]
        key = (n, k, torch.bfloat16, False)
        for variant in [v for v in VARIANTS if v == "plain" or v in FUSED_VARIANTS[name]]:
            table.tune({key: variant_calls(layers, variant)}, variant, buckets=rows)
        names[(n, k)] = name
        del layers
        torch.cuda.empty_cache()
    for r in table.report():
        weight_us = r["n"] * r["k"] * 2 / copy * 1e6
        proj = names[(r["n"], r["k"])] + ("" if r["variant"] == "plain" else f" ({r['variant']})")
        out["rows"].append({"proj": proj, **r, "weight_us": weight_us})
    out["measured"], out["rejected"] = table.measured, table.rejected
    out["tune_s"] = time.perf_counter() - started
    return out


def markdown(out: dict) -> str:
    lines = [
        "| proj | N x K | rows | baseline us | chosen us | chosen | weight read us |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['proj']} | {r['n']}x{r['k']} | {r['rows']} | {r['baseline_us']:.2f} | {r['us']:.2f} "
            f"| {r['choice']} | {r['weight_us']:.2f} |"
        )
    layers = out["num_layers"]
    for rows in sorted({r["rows"] for r in out["rows"]}):
        plain = [r for r in out["rows"] if r["rows"] == rows and r["variant"] == "plain"]
        line = (
            f"\nrows {rows}: the four GEMMs {layers * sum(r['baseline_us'] for r in plain) / 1e3:.3f} ms a step "
            f"with cuBLAS -> {layers * sum(r['us'] for r in plain) / 1e3:.3f} ms chosen"
        )
        for name, calls in LAYER_CALLS.items():
            layer = [r for r in out["rows"] if r["rows"] == rows and r["proj"] in calls]
            if layer:
                line += (
                    f"; {name} {layers * sum(r['us'] for r in layer) / 1e3:.3f} ms against "
                    f"{layers * sum(r['baseline_us'] for r in layer) / 1e3:.3f} ms as separate kernels"
                )
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/skinny_gemm_table.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(checkpoints.SHAPES), default="qwen3-0.6b")
    p.add_argument("--rows", default="1,4,16,64", help="comma-separated row counts (powers of two)")
    p.add_argument("--out", help="JSON path")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/skinny_gemm_table.py needs a CUDA device", file=sys.stderr)
        return 2
    out = run(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    print(markdown(out))
    print(f"rejected candidates: {len(out['rejected'])}; tuning took {out['tune_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
