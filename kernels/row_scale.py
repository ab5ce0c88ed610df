"""A folded RMSNorm's row scale, read from the row the norm would have normed.

When an RMSNorm's weight g is folded into the projection after it (x g W^T = x (W diag g)^T,
worker/merged_decoder.py's `fold_norms`), the norm's launch is gone and what is left of it is
one float32 scale a row, r = 1 / sqrt(mean(h^2) + eps) over the un-normed row h. It commutes
with the GEMM, so the kernel after the GEMM applies it: `qkv_rope` and `decode_attention` to
each q|k|v row, `silu_mul` to each gate|up row. Each of their programs recomputes r from h (a
few KB read from L2) rather than a launch of its own storing it; silu_mul's row-scaled programs
each cover a whole gate|up row (up to 4,096 columns), so there h is read once a row.

The hidden size H is a constexpr (HIDDEN; fixed per model, so no extra compile variants in
practice): the read of h is unrolled and static, and goes out after the kernel's PDL wait in the
same round as the loads of the row it scales (kernels/pdl.py; h is written by a launch of the
chain, so it is never read before the wait).

Semantics: kernels.reference.scale_rows_ref (the GEMM's output times r, rounded to its dtype
before anything else touches it: the rounding the un-folded GEMM's output had).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl


@triton.jit
def row_rms_scale(h_ptr, row, stride_h, eps, HIDDEN: tl.constexpr, H_BLOCK: tl.constexpr):
    """r = 1 / sqrt(mean(h[row, :HIDDEN]^2) + eps) in float32.
    h_ptr: [N, HIDDEN] (row stride stride_h, contiguous along HIDDEN); row: int64.

    HIDDEN is fixed per model, so the read is static: HIDDEN // H_BLOCK unmasked H_BLOCK-wide
    loads and one masked load for a ragged tail, unrolled, no loop and no barrier among them.
    Called right after the caller's own loads of the row it scales (and before any store or
    reduction of the caller's), those loads and these go out in one round."""
    h_row = h_ptr + row * stride_h  # [HIDDEN] (one row)
    FULL: tl.constexpr = HIDDEN - HIDDEN % H_BLOCK  # columns in whole H_BLOCK steps
    acc = tl.zeros([H_BLOCK], dtype=tl.float32)
    for start in tl.static_range(0, FULL, H_BLOCK):
        x = tl.load(h_row + start + tl.arange(0, H_BLOCK)).to(tl.float32)  # [H_BLOCK]
        acc += x * x
    if FULL < HIDDEN:
        cols = FULL + tl.arange(0, H_BLOCK)  # [H_BLOCK]
        x = tl.load(h_row + cols, mask=cols < HIDDEN, other=0.0).to(tl.float32)
        acc += x * x
    return 1.0 / tl.sqrt(tl.sum(acc, 0) / HIDDEN + eps)


H_BLOCK_MAX = 1024  # the widest step row_rms_scale reads h in (tests shrink it)


def h_block(hidden: int) -> int:
    """The step row_rms_scale reads h in: the whole row up to H_BLOCK_MAX (1,024) elements (one
    step for the 0.6B shape), H_BLOCK_MAX beyond (four for the 8B shape's 4,096)."""
    return min(H_BLOCK_MAX, triton.next_power_of_2(max(hidden, 1)))


def row_scale_constexprs(row_source: Optional[torch.Tensor]) -> dict:
    """The HIDDEN, H_BLOCK and USE_ROW_SCALE a kernel is launched with for this row_source
    [N, H]; without one, fixed values (the row scale is compiled out, and the unscaled kernel
    compiles once whatever the shapes)."""
    if row_source is None:
        return dict(HIDDEN=0, H_BLOCK=16, USE_ROW_SCALE=False)
    hidden = row_source.shape[1]
    return dict(HIDDEN=hidden, H_BLOCK=h_block(hidden), USE_ROW_SCALE=True)


def check_row_source(row_source: torch.Tensor, num_rows: int, row_eps: float) -> None:
    """row_source must be [num_rows, hidden], contiguous along hidden; row_eps > 0."""
    if row_source.dim() != 2 or row_source.shape[0] != num_rows or row_source.stride(1) != 1:
        raise ValueError(
            f"row_source must be [{num_rows}, hidden] contiguous along hidden, got "
            f"{tuple(row_source.shape)} with strides {tuple(row_source.stride())}"
        )
    if row_eps <= 0:
        raise ValueError(f"row_eps must be > 0, got {row_eps}")
