"""Write one step's K and V rows into the paged pool at their slots.

One program per token row copies its [Hkv, D] K and V rows to slot s = block * block_size +
offset. Padding rows carry slot -1 and land in the scratch block (the last block), so every
row writes somewhere and no branch on the host is needed (CUDA-graph friendly).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from enginespec.kernels.compile_pool import launcher


@triton.jit
def _write_kv_kernel(
    cache_ptr,  # [2, num_blocks + 1, block_size, Hkv, D]; K at 0, V at 1
    k_ptr,  # [N, Hkv, D]
    v_ptr,  # [N, Hkv, D]
    slot_mapping_ptr,  # [N] int64; -1 = padding row
    scratch_slot,  # first slot of the scratch block
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_c_kv,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    slot = tl.where(slot < 0, scratch_slot, slot)
    heads = tl.arange(0, HEADS_PAD)  # [HEADS_PAD]
    dims = tl.arange(0, HEAD_PAD)  # [HEAD_PAD]
    mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    dst = (
        (slot // BLOCK_SIZE) * stride_c_block
        + (slot % BLOCK_SIZE) * stride_c_slot
        + heads[:, None] * stride_c_head
        + dims[None, :]
    )  # [HEADS_PAD, HEAD_PAD]
    k = tl.load(k_ptr + tok * stride_k_tok + heads[:, None] * stride_k_head + dims[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_v_tok + heads[:, None] * stride_v_head + dims[None, :], mask=mask)
    tl.store(cache_ptr + dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(cache_ptr + stride_c_kv + dst, v.to(cache_ptr.dtype.element_ty), mask=mask)


def write_kv(cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store k, v [N, Hkv, D] at slot_mapping [N] (int64, -1 = scratch) in cache, in place.

    Semantics: kernels.reference.write_kv_ref. Slots are not range-checked on the device
    (that would need a sync); the batch builder guarantees slot < num_blocks * block_size.
    """
    if cache.dim() != 5 or cache.shape[0] != 2:
        raise ValueError(
            f"cache must be [2, num_blocks+1, block_size, Hkv, D], got shape {tuple(cache.shape)}"
        )
    if k.shape != v.shape or k.dim() != 3 or tuple(k.shape[1:]) != tuple(cache.shape[3:]):
        raise ValueError(
            f"k and v must both be [N, {cache.shape[3]}, {cache.shape[4]}], "
            f"got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if slot_mapping.shape != (k.shape[0],) or slot_mapping.dtype != torch.int64:
        raise ValueError(
            f"slot_mapping must be int64 [{k.shape[0]}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    if k.stride(2) != 1 or v.stride(2) != 1 or cache.stride(4) != 1:
        raise ValueError("k, v and cache must be contiguous along head_dim")
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    block_size = cache.shape[2]
    launcher(_write_kv_kernel, (num_tokens,))(
        cache,
        k,
        v,
        slot_mapping,
        (cache.shape[1] - 1) * block_size,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cache.stride(0),
        cache.stride(1),
        cache.stride(2),
        cache.stride(3),
        NUM_KV_HEADS=cache.shape[3],
        HEAD_DIM=cache.shape[4],
        HEADS_PAD=triton.next_power_of_2(cache.shape[3]),
        HEAD_PAD=triton.next_power_of_2(cache.shape[4]),
        BLOCK_SIZE=block_size,
        num_warps=4,
    )
