"""SiLU(gate) * up over a gate|up GEMM's rows: the MLP activation as one elementwise launch.

Where it is used: worker/skinny_linear.py's fused MLP op, when the measured choice for a shape
is a GEMM without the fused epilogue (cuBLAS, say): that GEMM then needs this as its epilogue,
in one launch, as the compiled decoder's fused elementwise kernel would have done. Computed in
float32 from the stored gate and up values, rounded once (kernels.reference.silu_mul_ref).
With `row_source` (the rows a folded post-attention norm would have normed, kernels/row_scale.py)
each program first scales its gate and up values by that row's norm scale.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from enginespec.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_options, pdl_enabled
from enginespec.kernels.row_scale import check_row_source, h_block, row_rms_scale


@triton.jit(do_not_specialize=["num_rows"])
def _silu_mul_kernel(
    out_ptr,  # [M, I]
    gate_up_ptr,  # [M, 2 I]: gate columns, then up
    h_ptr,  # [M, H] (USE_ROW_SCALE only): the rows the folded norm would have normed
    num_rows,
    inter,  # I
    stride_out,
    stride_in,
    stride_h,
    hidden,  # H
    row_eps,
    BLOCK: tl.constexpr,
    H_BLOCK: tl.constexpr = 16,
    USE_ROW_SCALE: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    """USE_PDL (kernels/pdl.py): everything it reads the GEMM before wrote, so it waits first; its
    launch still overlaps that GEMM's tail."""
    row = tl.program_id(0).to(tl.int64)
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < inter
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + inter + cols, mask=mask, other=0.0).to(tl.float32)
    if USE_ROW_SCALE:  # scaled and rounded as the un-folded GEMM's output was
        r = row_rms_scale(h_ptr, row, stride_h, hidden, row_eps, H_BLOCK)
        in_ty = gate_up_ptr.dtype.element_ty
        gate = (gate * r).to(in_ty).to(tl.float32)
        up = (up * r).to(in_ty).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


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
        block = min(1024, triton.next_power_of_2(inter))
        _silu_mul_kernel[(rows, triton.cdiv(inter, block))](
            out, gate_up, h, rows, inter, out.stride(0), gate_up.stride(0), h.stride(0), h.shape[1],
            row_eps, BLOCK=block, H_BLOCK=h_block(h.shape[1]), USE_ROW_SCALE=row_source is not None,
            USE_PDL=(pdl := pdl_enabled(gate_up.device)), num_warps=4, **launch_options(pdl),
        )  # fmt: skip
    return out
