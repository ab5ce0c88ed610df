"""The two ops folded norms add to the merged decoder (merged_decoder.py's `fold_norms`).

- `silu_mul_rows`: SiLU * up with the post-attention norm's row scale (kernels/row_scale.py).
  Opaque, as the attention and skinny-GEMM ops are, because the compiler would split it: the
  row scale is a reduction over the hidden rows and the product an elementwise pass over the
  gate|up rows, two kernels where kernels/silu_mul.py's one launch reads both.
- `add_linear_`: the residual add inside the o and down GEMMs, in place (hidden += x W^T: one
  cuBLAS GEMM with the residual as its C and beta 1). Out of place, `torch.addmm(hidden, ...)`
  first copies hidden into its output (a memcpy kernel for every GEMM: the H200 profile showed
  59 a step, as many launches as the folded norms saved). Declared as mutating `hidden`, so the
  compiler keeps it in place where the old rows are dead (they are: attention and the GEMMs
  before have read them), and clones them first where they are not.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("enginespec::silu_mul_rows", mutates_args=())
def silu_mul_rows(gate_up: torch.Tensor, row_source: torch.Tensor, row_eps: float) -> torch.Tensor:
    """gate_up [M, 2 I] (un-normed rows' GEMM), row_source [M, H] (those rows) -> silu(gate) * up
    [M, I] of gate_up scaled by each row's norm scale (skinny_linear.silu_mul_any: one Triton
    launch on CUDA or under the interpreter, kernels.reference.silu_mul_ref elsewhere)."""
    from enginespec.worker.skinny_linear import silu_mul_any

    return silu_mul_any(gate_up, row_source, row_eps)


@silu_mul_rows.register_fake
def _(gate_up, row_source, row_eps):
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


@torch.library.custom_op("enginespec::add_linear_", mutates_args=("hidden",))
def add_linear_(hidden: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """hidden [M, H] += x [M, K] @ weight [H, K].T, in place, rounded once (one GEMM)."""
    hidden.addmm_(x, weight.t())
