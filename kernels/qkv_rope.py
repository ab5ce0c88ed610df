"""One step's q|k|v rows into attention: q|k RMSNorm (Qwen3), rotary, and the K/V pool write.

After a layer's q|k|v GEMM, a row holds Hq query heads, Hkv key heads and Hkv value heads of D
dims each. Before attention, q and k heads are RMS-normed per head (Qwen3's q_norm/k_norm;
optional), rotated (neox rotate-half with the row's cos/sin), and k and v are stored in the
paged pool at the row's slot. Composed from framework ops that is three to five kernels and a
round trip of q|k through memory; here it is one program per token row.

Rounding follows the transformers modules (kernels.reference.qkv_rope_ref): the norm's float32
statistics, its result rounded to the input dtype before the weight multiplies it, then the
rotary in float32 and one rounding at the store.

With `row_source` (a folded input norm: the rows that norm would have normed, kernels/row_scale.py)
every q|k|v value is first scaled by its row's norm scale and rounded to the input dtype.

Padding rows (slot -1) write their K/V to the scratch block, as kv_write does; their q rows are
computed like any other and ignored downstream.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from enginespec.kernels.compile_pool import launcher
from enginespec.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_options, pdl_enabled
from enginespec.kernels.row_scale import check_row_source, row_rms_scale, row_scale_constexprs


@triton.jit
def _qkv_rope_kernel(
    q_out_ptr,  # [N, Hq, D]
    cache_ptr,  # [2, num_blocks + 1, block_size, Hkv, D]; K at 0, V at 1
    qkv_ptr,  # [N, (Hq + 2 Hkv) * D]: q heads, then k heads, then v heads
    cos_ptr,  # [N, D]
    sin_ptr,  # [N, D]
    norm_ptr,  # [Hq + Hkv, D] (USE_NORM only): per-head norm weights, q heads first
    slot_ptr,  # [N] int64; -1 = padding row (scratch block)
    h_ptr,  # [N, HIDDEN] (USE_ROW_SCALE only): the rows the folded input norm would have normed
    eps,
    row_eps,
    scratch_slot,
    stride_h,
    stride_qkv,
    stride_cos,
    stride_sin,
    stride_qo_tok,
    stride_qo_head,
    stride_c_kv,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    NUM_Q: tl.constexpr,
    NUM_KV: tl.constexpr,
    QK_PAD: tl.constexpr,
    KV_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    USE_NORM: tl.constexpr,
    HIDDEN: tl.constexpr = 0,
    H_BLOCK: tl.constexpr = 16,
    USE_ROW_SCALE: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    """USE_PDL (kernels/pdl.py): the norm weights, cos/sin and the slot (none written by a
    kernel of the chain) are read before gdc_wait; the q|k|v row (the GEMM before wrote it) and
    the hidden row (USE_ROW_SCALE) after it, and every store comes after it. With USE_ROW_SCALE
    the whole q|k|v row (v included) and the hidden row are loaded before any store or
    reduction: one load round."""
    tok = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, QK_PAD)[:, None]  # [QK_PAD, 1] q heads, then k heads
    half = tl.arange(0, HALF)[None, :]  # [1, HALF]
    is_qk = heads < NUM_Q + NUM_KV  # [QK_PAD, 1]
    if USE_NORM:
        w_row = norm_ptr + heads * HEAD_DIM  # [QK_PAD, 1]
        w1 = tl.load(w_row + half, mask=is_qk, other=0.0).to(tl.float32)  # [QK_PAD, HALF]
        w2 = tl.load(w_row + HALF + half, mask=is_qk, other=0.0).to(tl.float32)
    cos1 = tl.load(cos_ptr + tok * stride_cos + half).to(tl.float32)  # [1, HALF]
    cos2 = tl.load(cos_ptr + tok * stride_cos + HALF + half).to(tl.float32)
    sin1 = tl.load(sin_ptr + tok * stride_sin + half).to(tl.float32)
    sin2 = tl.load(sin_ptr + tok * stride_sin + HALF + half).to(tl.float32)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()  # from here on, the GEMM's q|k|v row is visible
    row = qkv_ptr + tok * stride_qkv + heads * HEAD_DIM  # [QK_PAD, 1]
    x1 = tl.load(row + half, mask=is_qk, other=0.0).to(tl.float32)  # [QK_PAD, HALF]
    x2 = tl.load(row + HALF + half, mask=is_qk, other=0.0).to(tl.float32)  # [QK_PAD, HALF]
    in_ty = qkv_ptr.dtype.element_ty
    v_heads = tl.arange(0, KV_PAD)[:, None]  # [KV_PAD, 1]
    dims = tl.arange(0, HEAD_DIM)[None, :]  # [1, HEAD_DIM]
    is_v = v_heads < NUM_KV
    if USE_ROW_SCALE:  # scaled and rounded as the un-folded GEMM's output was
        # v here, with q|k: the row scale's reduction has a barrier, which a load after it
        # would wait for (a second round). Unscaled, v is loaded where it is stored.
        v = _load_v(qkv_ptr, tok, stride_qkv, v_heads, dims, is_v, NUM_Q, NUM_KV, HEAD_DIM)
        r = row_rms_scale(h_ptr, tok, stride_h, row_eps, HIDDEN, H_BLOCK)
        x1 = (x1 * r).to(in_ty).to(tl.float32)
        x2 = (x2 * r).to(in_ty).to(tl.float32)
        v = (v.to(tl.float32) * r).to(in_ty)
    if USE_NORM:
        mean_sq = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / HEAD_DIM  # [QK_PAD]
        rstd = (1.0 / tl.sqrt(mean_sq + eps))[:, None]  # [QK_PAD, 1]
        x1 = w1 * (x1 * rstd).to(in_ty).to(tl.float32)
        x2 = w2 * (x2 * rstd).to(in_ty).to(tl.float32)
    o1 = x1 * cos1 - x2 * sin1  # [QK_PAD, HALF]
    o2 = x2 * cos2 + x1 * sin2  # [QK_PAD, HALF]

    is_q = heads < NUM_Q  # [QK_PAD, 1]
    q_row = q_out_ptr + tok * stride_qo_tok + heads * stride_qo_head
    q_ty = q_out_ptr.dtype.element_ty
    tl.store(q_row + half, o1.to(q_ty), mask=is_q)
    tl.store(q_row + HALF + half, o2.to(q_ty), mask=is_q)

    slot = tl.where(slot < 0, scratch_slot, slot)
    base = (slot // BLOCK_SIZE) * stride_c_block + (slot % BLOCK_SIZE) * stride_c_slot
    c_ty = cache_ptr.dtype.element_ty
    is_k = is_qk & (heads >= NUM_Q)  # [QK_PAD, 1]
    k_row = cache_ptr + base + (heads - NUM_Q) * stride_c_head  # [QK_PAD, 1] (masked where q)
    tl.store(k_row + half, o1.to(c_ty), mask=is_k)
    tl.store(k_row + HALF + half, o2.to(c_ty), mask=is_k)
    if not USE_ROW_SCALE:
        v = _load_v(qkv_ptr, tok, stride_qkv, v_heads, dims, is_v, NUM_Q, NUM_KV, HEAD_DIM)
    tl.store(cache_ptr + stride_c_kv + base + v_heads * stride_c_head + dims, v.to(c_ty), mask=is_v)


@triton.jit
def _load_v(qkv_ptr, tok, stride_qkv, v_heads, dims, is_v, NUM_Q: tl.constexpr, NUM_KV: tl.constexpr,
            HEAD_DIM: tl.constexpr):  # fmt: skip
    """Row tok's v heads [KV_PAD, HEAD_DIM] in qkv's dtype (rows past NUM_KV: 0). qkv_ptr:
    [N, (NUM_Q + 2 NUM_KV) * HEAD_DIM]; v_heads [KV_PAD, 1], dims [1, HEAD_DIM], is_v [KV_PAD, 1]."""
    v_cols = (NUM_Q + NUM_KV + v_heads) * HEAD_DIM + dims  # [KV_PAD, HEAD_DIM]
    return tl.load(qkv_ptr + tok * stride_qkv + v_cols, mask=is_v, other=0.0)


def supported(head_dim: int) -> bool:
    """The kernel needs a power-of-two head_dim of at least 4 (its halves are Triton ranges)."""
    return head_dim >= 4 and head_dim & (head_dim - 1) == 0


def qkv_rope(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm_weight: Optional[torch.Tensor],
    eps: float,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_q_heads: int,
    row_source: Optional[torch.Tensor] = None,
    row_eps: float = 0.0,
) -> torch.Tensor:
    """qkv [N, (Hq + 2 Hkv) * D] -> q [N, Hq, D] normed and rotated; writes the normed, rotated
    k and the v of each row into `cache` [2, num_blocks + 1, block_size, Hkv, D] at
    slot_mapping [N] (int64, -1 = scratch). cos/sin [N, D]; norm_weight [Hq + Hkv, D] or None;
    row_source [N, H] or None (a folded input norm's rows, kernels/row_scale.py).

    Semantics: kernels.reference.qkv_rope_ref. Slots are not range-checked on the device.
    """
    num_kv_heads, head_dim = cache.shape[3], cache.shape[4]
    n = qkv.shape[0]
    _check(qkv, cos, sin, norm_weight, cache, slot_mapping, num_q_heads, eps)
    if row_source is not None:
        check_row_source(row_source, n, row_eps)
    h = row_source if row_source is not None else qkv
    qkv = qkv if qkv.stride(1) == 1 else qkv.contiguous()
    cos, sin = (t if t.stride(1) == 1 else t.contiguous() for t in (cos, sin))
    q = torch.empty(n, num_q_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if n == 0:
        return q
    block_size = cache.shape[2]
    pdl = pdl_enabled(qkv.device)
    launcher(_qkv_rope_kernel, (n,))(
        q,
        cache,
        qkv,
        cos,
        sin,
        norm_weight if norm_weight is not None else qkv,
        slot_mapping,
        h,
        eps,
        row_eps,
        (cache.shape[1] - 1) * block_size,
        h.stride(0),
        qkv.stride(0),
        cos.stride(0),
        sin.stride(0),
        q.stride(0),
        q.stride(1),
        cache.stride(0),
        cache.stride(1),
        cache.stride(2),
        cache.stride(3),
        NUM_Q=num_q_heads,
        NUM_KV=num_kv_heads,
        QK_PAD=triton.next_power_of_2(num_q_heads + num_kv_heads),
        KV_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        HALF=head_dim // 2,
        BLOCK_SIZE=block_size,
        USE_NORM=norm_weight is not None,
        **row_scale_constexprs(row_source),
        USE_PDL=pdl,
        num_warps=4,
        **launch_options(pdl),
    )
    return q


def _check(qkv, cos, sin, norm_weight, cache, slot_mapping, num_q_heads: int, eps: float) -> None:
    if cache.dim() != 5 or cache.shape[0] != 2 or cache.stride(4) != 1:
        raise ValueError(
            f"cache must be [2, num_blocks+1, block_size, Hkv, D] contiguous along D, "
            f"got shape {tuple(cache.shape)}"
        )
    num_kv_heads, head_dim = cache.shape[3], cache.shape[4]
    if not supported(head_dim):
        raise ValueError(f"qkv_rope needs a power-of-two head_dim >= 4, got {head_dim}")
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width:
        raise ValueError(f"qkv must be [N, (Hq + 2 Hkv) * D] = [N, {width}], got {tuple(qkv.shape)}")
    n = qkv.shape[0]
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (n, head_dim):
            raise ValueError(f"{name} must be [{n}, {head_dim}], got {tuple(t.shape)}")
    if norm_weight is not None:
        if (
            tuple(norm_weight.shape) != (num_q_heads + num_kv_heads, head_dim)
            or not norm_weight.is_contiguous()
        ):
            raise ValueError(
                f"norm_weight must be contiguous [{num_q_heads + num_kv_heads}, {head_dim}], "
                f"got {tuple(norm_weight.shape)}"
            )
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
    if slot_mapping.dtype != torch.int64 or tuple(slot_mapping.shape) != (n,):
        raise ValueError(
            f"slot_mapping must be int64 [{n}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
