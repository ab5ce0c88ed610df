"""The one op folded norms add to the merged decoder: SiLU * up with the post-attention norm's
row scale (merged_decoder.py's `fold_norms`, kernels/row_scale.py).

An opaque custom op, as the attention and skinny-GEMM ops are, because the compiler would split
it: the row scale is a reduction over the hidden rows and the product an elementwise pass over
the gate|up rows, two kernels where kernels/silu_mul.py's one launch reads both.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("enginespec::silu_mul_rows", mutates_args=())
def silu_mul_rows(gate_up: torch.Tensor, row_source: torch.Tensor, row_eps: float) -> torch.Tensor:
    """gate_up [M, 2 I] (un-normed rows' GEMM), row_source [M, H] (those rows) -> silu(gate) * up
    [M, I] of gate_up scaled by each row's norm scale: one Triton launch on CUDA, the reference
    elsewhere (kernels.reference.silu_mul_ref)."""
    if gate_up.is_cuda:
        from enginespec.kernels.silu_mul import silu_mul

        return silu_mul(gate_up, row_source, row_eps)
    from enginespec.kernels.reference import silu_mul_ref

    return silu_mul_ref(gate_up, row_source, row_eps)


@silu_mul_rows.register_fake
def _(gate_up, row_source, row_eps):
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))
