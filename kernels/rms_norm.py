"""RMSNorm over rows, optionally fused with the residual add that precedes it.

One program per row: h = x + residual (rounded to x's dtype: it is the next residual),
out = weight * (h / sqrt(mean(h^2) + eps)) with the norm in float32 and rounded to x's dtype
before the weight multiplies it, which is the transformers modules' rounding order. Launched
with programmatic dependent launch where kernels/pdl.py enables it (a decode step's norms sit
between GEMV launches: the 8B shape's batch-1 step runs 72 of them).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from enginespec.kernels.compile_pool import launcher
from enginespec.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_options, pdl_enabled


@triton.jit
def _rms_norm_kernel(
    out_ptr,  # [R, H]
    res_out_ptr,  # [R, H] new residual (USE_RESIDUAL only)
    x_ptr,  # [R, H]
    res_ptr,  # [R, H] (USE_RESIDUAL only)
    weight_ptr,  # [H]
    eps,
    hidden,
    stride_out,
    stride_res_out,
    stride_x,
    stride_res,
    BLOCK_H: tl.constexpr,
    USE_RESIDUAL: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """USE_PDL (kernels/pdl.py): the weight (no kernel writes it) is read before gdc_wait; x, the
    residual and every store after it."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    mask = cols < hidden
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)  # [BLOCK_H]
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()  # from here on, the previous kernel's writes are visible
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if USE_RESIDUAL:  # add in float32, round once (as torch does)
        res = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + res.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_res_out + cols, x, mask=mask)
    h = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, 0) / hidden + eps)
    normed = (h * rstd).to(x_ptr.dtype.element_ty)
    out = (w.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None):
    """x [..., H] -> out (same shape and dtype); with residual, returns (out, x + residual).

    Semantics: kernels.reference.rms_norm_ref.
    """
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight must be [{hidden}], got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual must match x {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}"
        )
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    x2 = x.reshape(-1, hidden)
    res2 = residual.reshape(-1, hidden) if residual is not None else x2
    if x2.stride(-1) != 1 or res2.stride(-1) != 1:
        x2, res2 = x2.contiguous(), res2.contiguous()
    out = torch.empty_like(x2)
    res_out = torch.empty_like(x2) if residual is not None else out
    if x2.shape[0] > 0:
        launcher(_rms_norm_kernel, (x2.shape[0],))(
            out,
            res_out,
            x2,
            res2,
            weight,
            eps,
            hidden,
            out.stride(0),
            res_out.stride(0),
            x2.stride(0),
            res2.stride(0),
            BLOCK_H=triton.next_power_of_2(hidden),
            USE_RESIDUAL=residual is not None,
            USE_PDL=(pdl := pdl_enabled(x2.device)),
            num_warps=4 if hidden <= 2048 else 8,
            **launch_options(pdl),
        )
    out = out.view(x.shape)
    return out if residual is None else (out, res_out.view(x.shape))
