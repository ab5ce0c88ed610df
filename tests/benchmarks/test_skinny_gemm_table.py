"""benchmarks/skinny_gemm_table.py's CPU-side pieces: the projection shapes it times and the
per-step sums of its report (the timing itself needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.skinny_gemm_table import main, markdown, projection_shapes, variant_calls


def test_projection_shapes_are_the_merged_decoders_gemms():
    assert projection_shapes("qwen3-0.6b") == {
        "qkv": (4096, 1024),
        "o": (1024, 2048),
        "gate_up": (6144, 1024),
        "down": (1024, 3072),
    }


def test_report_sums_the_plain_gemms_and_the_fused_calls_per_step():
    def row(proj, variant, base, us):
        return dict(
            proj=proj, variant=variant, n=8, k=8, rows=4, baseline_us=base, us=us, choice="c", weight_us=1.0
        )

    rows = [
        row("qkv", "plain", 6.0, 4.0),
        row("o", "plain", 5.0, 5.0),
        row("o (residual)", "residual", 8.0, 5.0),
        row("qkv (norm)", "norm", 7.0, 6.0),
        row("qkv (rscale)", "rscale", 7.0, 4.5),
    ]
    text = markdown({"num_layers": 10, "rows": rows})
    assert "rows 4: the four GEMMs 0.110 ms a step with cuBLAS -> 0.090 ms chosen" in text
    assert "the fused layer calls 0.110 ms against 0.150 ms as separate kernels" in text
    assert "folded 0.095 ms against 0.150 ms as separate kernels" in text


def test_row_scale_variants_tune_over_a_unit_norm():
    """A folded layer's norm weight is all ones (its values live in the GEMM's weight), and the
    row-scale kernels ignore it: the tuning's calls for them carry ones, so the baseline (the
    norm, then the GEMM) computes what the kernels do."""
    layers = [{"weight": torch.zeros(4, 8), "bias": None, "norm_weight": torch.full((8,), 3.0), "eps": 1e-6}]
    (call,) = variant_calls(layers, "rscale_silu")
    assert call["row_scale"] and torch.equal(call["norm_weight"], torch.ones(8)) and call["eps"] == 1e-6
    assert variant_calls(layers, "norm") is layers
    assert variant_calls(layers, "residual") == [{"weight": layers[0]["weight"], "bias": None}]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_no_cuda_is_a_clear_exit(capsys):
    assert main(["--out", "unused.json"]) == 2
    assert "CUDA" in capsys.readouterr().err
