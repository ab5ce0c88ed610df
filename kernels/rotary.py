"""Neox-style rotary position embedding of q and k, indexed by each row's position.

One program per token row rotates all its q and k heads: the first rot_dim dims split into
halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) with cos/sin read from a float32 cache
[max_position, rot_dim // 2] at the row's position; dims past rot_dim pass through.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from enginespec.kernels.compile_pool import launcher


@triton.jit
def _rotate_heads(
    dst_ptr,
    src_ptr,
    tok,
    stride_dst_tok,
    stride_dst_head,
    stride_src_tok,
    stride_src_head,
    cos,
    sin,
    NUM_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TAIL_PAD: tl.constexpr,
):
    heads = tl.arange(0, HEADS_PAD)[:, None]  # [HEADS_PAD, 1]
    half = tl.arange(0, HALF_PAD)[None, :]  # [1, HALF_PAD]
    mask = (heads < NUM_HEADS) & (half < HALF)
    src = src_ptr + tok * stride_src_tok + heads * stride_src_head
    dst = dst_ptr + tok * stride_dst_tok + heads * stride_dst_head
    x1 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)  # [HEADS_PAD, HALF_PAD]
    x2 = tl.load(src + HALF + half, mask=mask, other=0.0).to(tl.float32)
    ty = dst_ptr.dtype.element_ty
    tl.store(dst + half, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(dst + HALF + half, (x2 * cos + x1 * sin).to(ty), mask=mask)
    if TAIL_PAD > 0:  # partial rotary: copy the rest
        tail = 2 * HALF + tl.arange(0, TAIL_PAD)[None, :]
        tmask = (heads < NUM_HEADS) & (tail < HEAD_DIM)
        tl.store(dst + tail, tl.load(src + tail, mask=tmask), mask=tmask)


@triton.jit
def _rotary_kernel(
    q_out_ptr,
    k_out_ptr,  # [N, Hq, D], [N, Hk, D]
    q_ptr,
    k_ptr,  # [N, Hq, D], [N, Hk, D]
    positions_ptr,  # [N] int64
    cos_ptr,
    sin_ptr,  # [max_position, HALF] float32
    stride_qo_tok,
    stride_qo_head,
    stride_ko_tok,
    stride_ko_head,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_cs,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TAIL_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + tok).to(tl.int64)
    half = tl.arange(0, HALF_PAD)[None, :]  # [1, HALF_PAD]
    cos = tl.load(cos_ptr + pos * stride_cs + half, mask=half < HALF, other=0.0)
    sin = tl.load(sin_ptr + pos * stride_cs + half, mask=half < HALF, other=0.0)
    _rotate_heads(
        q_out_ptr,
        q_ptr,
        tok,
        stride_qo_tok,
        stride_qo_head,
        stride_q_tok,
        stride_q_head,
        cos,
        sin,
        NUM_Q_HEADS,
        Q_HEADS_PAD,
        HALF,
        HALF_PAD,
        HEAD_DIM,
        TAIL_PAD,
    )
    _rotate_heads(
        k_out_ptr,
        k_ptr,
        tok,
        stride_ko_tok,
        stride_ko_head,
        stride_k_tok,
        stride_k_head,
        cos,
        sin,
        NUM_K_HEADS,
        K_HEADS_PAD,
        HALF,
        HALF_PAD,
        HEAD_DIM,
        TAIL_PAD,
    )


def rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotate q [N, Hq, D] and k [N, Hk, D] at positions [N]; returns new (q, k).

    cos, sin: float32 [max_position, rot_dim // 2] (kernels.reference.rotary_cos_sin).
    Positions are not range-checked on the device. Semantics: kernels.reference.rotary_ref.
    """
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q, k must be [N, H, D] with equal N and D, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    half = cos.shape[1]
    if cos.shape != sin.shape or cos.dtype != torch.float32 or 2 * half > q.shape[2]:
        raise ValueError(
            f"cos/sin must be float32 [max_position, rot_dim // 2] with "
            f"rot_dim <= head_dim={q.shape[2]}, got {tuple(cos.shape)} "
            f"{cos.dtype} and {tuple(sin.shape)}"
        )
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions must be [{q.shape[0]}], got {tuple(positions.shape)}")
    q, k = (t if t.stride(2) == 1 else t.contiguous() for t in (q, k))
    cos, sin = cos.contiguous(), sin.contiguous()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    head_dim = q.shape[2]
    tail = head_dim - 2 * half
    if q.shape[0] > 0:
        launcher(_rotary_kernel, (q.shape[0],))(
            q_out,
            k_out,
            q,
            k,
            positions,
            cos,
            sin,
            q_out.stride(0),
            q_out.stride(1),
            k_out.stride(0),
            k_out.stride(1),
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos.stride(0),
            NUM_Q_HEADS=q.shape[1],
            NUM_K_HEADS=k.shape[1],
            Q_HEADS_PAD=triton.next_power_of_2(q.shape[1]),
            K_HEADS_PAD=triton.next_power_of_2(k.shape[1]),
            HALF=half,
            HALF_PAD=triton.next_power_of_2(half),
            HEAD_DIM=head_dim,
            TAIL_PAD=triton.next_power_of_2(tail) if tail > 0 else 0,
            num_warps=4,
        )
    return q_out, k_out
