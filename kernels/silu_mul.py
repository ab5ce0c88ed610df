"""SiLU(gate) * up over a gate|up GEMM's rows: the MLP activation as one elementwise launch.

Where it is used: worker/skinny_linear.py's fused MLP op, when the measured choice for a shape
is a GEMM without the fused epilogue (cuBLAS, say): that GEMM then needs this as its epilogue,
in one launch, as the compiled decoder's fused elementwise kernel would have done. Computed in
float32 from the stored gate and up values, rounded once (kernels.reference.silu_mul_ref).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from enginespec.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_options, pdl_enabled


@triton.jit(do_not_specialize=["num_rows"])
def _silu_mul_kernel(
    out_ptr,  # [M, I]
    gate_up_ptr,  # [M, 2 I]: gate columns, then up
    num_rows,
    inter,  # I
    stride_out,
    stride_in,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """USE_PDL (kernels/pdl.py): everything it reads the GEMM before wrote, so it waits first; its
    launch still overlaps that GEMM's tail."""
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < inter
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + inter + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2 I] -> silu(gate) * up [M, I] in gate_up's dtype."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul: gate_up must be [M, 2 I], got {tuple(gate_up.shape)}")
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        block = min(1024, triton.next_power_of_2(inter))
        _silu_mul_kernel[(rows, triton.cdiv(inter, block))](
            out, gate_up, rows, inter, out.stride(0), gate_up.stride(0), BLOCK=block,
            USE_PDL=(pdl := pdl_enabled(gate_up.device)), num_warps=4, **launch_options(pdl),
        )  # fmt: skip
    return out
