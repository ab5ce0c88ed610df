"""SiLU(gate) * up over a gate|up GEMM's rows: the MLP activation as one elementwise launch.

Where it is used: worker/skinny_linear.py's fused MLP op, when the measured choice for a shape
is a GEMM without the fused epilogue (cuBLAS, say): that GEMM then needs this as its epilogue,
in one launch, as the compiled decoder's fused elementwise kernel would have done. Computed in
float32 from the stored gate and up values, rounded once (kernels.reference.silu_mul_ref).
With `row_source` (the rows a folded post-attention norm would have normed, kernels/row_scale.py)
each program first scales its gate and up values by that row's norm scale. Such a program covers
the whole row (up to ROW_SCALE_BLOCK columns, with warps in proportion), so the hidden row is read
and r computed once a row rather than once per 1,024 columns; its gate|up loads and its hidden
row's go out in one round after the wait.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from enginespec.kernels.compile_pool import launcher
from enginespec.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_options, pdl_enabled
from enginespec.kernels.row_scale import check_row_source, row_rms_scale, row_scale_constexprs


@triton.jit(do_not_specialize=["num_rows"])
def _silu_mul_kernel(
    out_ptr,  # [M, I]
    gate_up_ptr,  # [M, 2 I]: gate columns, then up
    h_ptr,  # [M, HIDDEN] (USE_ROW_SCALE only): the rows the folded norm would have normed
    num_rows,
    inter,  # I
    stride_out,
    stride_in,
    stride_h,
    row_eps,
    BLOCK: tl.constexpr,
    HIDDEN: tl.constexpr = 0,
    H_BLOCK: tl.constexpr = 16,
    USE_ROW_SCALE: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    """Program (row, j) computes columns [j BLOCK, (j + 1) BLOCK) of its row. USE_PDL
    (kernels/pdl.py): everything it reads a launch of the chain wrote (gate|up the GEMM before,
    h an earlier one), so it waits first; its launch still overlaps that GEMM's tail. Its gate
    and up loads, then the hidden row's (USE_ROW_SCALE), come before any arithmetic on them:
    one load round."""
    row = tl.program_id(0).to(tl.int64)
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < inter
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + inter + cols, mask=mask, other=0.0).to(tl.float32)
    if USE_ROW_SCALE:  # scaled and rounded as the un-folded GEMM's output was
        r = row_rms_scale(h_ptr, row, stride_h, row_eps, HIDDEN, H_BLOCK)
        in_ty = gate_up_ptr.dtype.element_ty
        gate = (gate * r).to(in_ty).to(tl.float32)
        up = (up * r).to(in_ty).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


BLOCK_MAX = 1024  # columns an unscaled program covers at most (4 warps: 8 a thread)
ROW_SCALE_BLOCK = 4096  # columns a row-scaled program covers at most (tests shrink it)
COLUMNS_PER_WARP = 256  # a row-scaled program's warps: 8 columns a thread, as unscaled


def launch_config(inter: int, row_scaled: bool) -> tuple[int, int]:
    """(BLOCK, num_warps) for rows of I = inter columns. Unscaled: 1,024-column programs of 4
    warps. Row-scaled: one program a row up to ROW_SCALE_BLOCK columns (the 0.6B shape's 3,072:
    one 4,096-column program of 16 warps a row; the 8B shape's 12,288: three), so the hidden row
    is read once per program, not once per 1,024 columns. The grid shrinks accordingly (a
    128-row 0.6B step: 128 programs of 16 warps where unscaled it is 384 of 4, the same warps a
    row); not yet timed on the H200."""
    if not row_scaled:
        return min(BLOCK_MAX, triton.next_power_of_2(inter)), 4
    block = min(ROW_SCALE_BLOCK, triton.next_power_of_2(inter))
    return block, max(4, min(16, block // COLUMNS_PER_WARP))


def silu_mul(
    gate_up: torch.Tensor, row_source: Optional[torch.Tensor] = None, row_eps: float = 0.0
) -> torch.Tensor:
    """gate_up [M, 2 I] -> silu(gate) * up [M, I] in gate_up's dtype; with row_source [M, H],
    of gate_up's rows scaled by row_source's norm scales (kernels.reference.silu_mul_ref)."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul: gate_up must be [M, 2 I], got {tuple(gate_up.shape)}")
    if row_source is not None:
        check_row_source(row_source, gate_up.shape[0], row_eps)
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    h = gate_up if row_source is None else row_source
    if rows:
        block, warps = launch_config(inter, row_source is not None)
        launcher(_silu_mul_kernel, (rows, triton.cdiv(inter, block)))(
            out, gate_up, h, rows, inter, out.stride(0), gate_up.stride(0), h.stride(0), row_eps,
            BLOCK=block, **row_scale_constexprs(row_source), USE_PDL=(pdl := pdl_enabled(gate_up.device)),
            num_warps=warps, **launch_options(pdl),
        )  # fmt: skip
    return out
