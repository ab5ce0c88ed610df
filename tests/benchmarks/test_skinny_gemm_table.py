"""benchmarks/skinny_gemm_table.py's CPU-side pieces: the projection shapes it times and the
per-step sums of its report (the timing itself needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.skinny_gemm_table import main, markdown, projection_shapes


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
    ]
    text = markdown({"num_layers": 10, "rows": rows})
    assert "rows 4: the four GEMMs 0.110 ms a step with cuBLAS -> 0.090 ms chosen" in text
    assert "the fused layer calls 0.050 ms against 0.080 ms as separate kernels" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_no_cuda_is_a_clear_exit(capsys):
    assert main(["--out", "unused.json"]) == 2
    assert "CUDA" in capsys.readouterr().err
