"""A folded RMSNorm's row scale, read from the row the norm would have normed.

When an RMSNorm's weight g is folded into the projection after it (x g W^T = x (W diag g)^T,
worker/merged_decoder.py's `fold_norms`), the norm's launch is gone and what is left of it is
one float32 scale a row, r = 1 / sqrt(mean(h^2) + eps) over the un-normed row h. It commutes
with the GEMM, so the kernel after the GEMM applies it: `qkv_rope` and `decode_attention` to
each q|k|v row, `silu_mul` to each gate|up row. Each of their programs recomputes r from h (a
few KB read from L2) rather than a launch of its own storing it.

Semantics: kernels.reference.scale_rows_ref (the GEMM's output times r, rounded to its dtype
before anything else touches it: the rounding the un-folded GEMM's output had).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def row_rms_scale(h_ptr, row, stride_h, hidden, eps, H_BLOCK: tl.constexpr):
    """r = 1 / sqrt(mean(h[row, :hidden]^2) + eps) in float32, read H_BLOCK elements a step.
    h_ptr: [N, hidden] (row stride stride_h, contiguous along hidden); row: int64."""
    acc = tl.zeros([H_BLOCK], dtype=tl.float32)
    for start in range(0, hidden, H_BLOCK):
        cols = start + tl.arange(0, H_BLOCK)  # [H_BLOCK]
        x = tl.load(h_ptr + row * stride_h + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        acc += x * x
    return 1.0 / tl.sqrt(tl.sum(acc, 0) / hidden + eps)


def h_block(hidden: int) -> int:
    """The step row_rms_scale reads h in: the whole row up to 1,024 elements (one step for the
    0.6B shape), 1,024 beyond (four for the 8B shape's 4,096)."""
    return min(1024, triton.next_power_of_2(max(hidden, 1)))


def check_row_source(row_source: torch.Tensor, num_rows: int, row_eps: float) -> None:
    """row_source must be [num_rows, hidden], contiguous along hidden; row_eps > 0."""
    if row_source.dim() != 2 or row_source.shape[0] != num_rows or row_source.stride(1) != 1:
        raise ValueError(
            f"row_source must be [{num_rows}, hidden] contiguous along hidden, got "
            f"{tuple(row_source.shape)} with strides {tuple(row_source.stride())}"
        )
    if row_eps <= 0:
        raise ValueError(f"row_eps must be > 0, got {row_eps}")
