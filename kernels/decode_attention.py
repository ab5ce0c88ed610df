"""Decode attention from a layer's raw q|k|v rows: q|k norm, rotary, K/V write and attention in
one launch.

A decode-only batch has one query row per request (row r belongs to request r). Unfused, each
layer runs kernels/qkv_rope.py (norm and rotate q|k, write K/V to the pool) and then
kernels/paged_attention.py over the pool: two launches, and q round-trips through memory.
Here every attention program (request, KV head, split) loads its GROUP query heads and its KV
head's new key and value straight from the q|k|v row, norms and rotates them in registers
(the qkv_rope rounding: norm statistics in float32, the normed value rounded to the input
dtype before the weight, rotary in float32, one rounding to the input dtype), and

- split 0 stores the new k and v at the row's slot (slot -1: the scratch block), the only
  write, and counts the new key as the first key it attends to, from registers;
- every split reads only the keys before it from the pool (positions < seq_len - 1), so no
  program reads what another program of the same launch writes;
- a split other than 0 that owns no key tile (a short context under a split count chosen for
  the longest) exits at once, writing nothing, and the merge reads only the partials of the
  splits that own tiles (paged_attention._decode_active_splits).

Everything else is paged_attention's decode path: the same launch config, launch order,
tiles, online softmax in the exp2 domain, split-KV partials and the same merge kernel.

Invariants: row r's q|k|v, cos/sin and slot belong to request r (the caller passes only
decode-only batches with N == B); seq_len counts the new token (a request's new key sits at
position seq_len - 1); seq_len 0 marks a padding row, which attends to nothing (output 0) and
still writes its K/V to the scratch block.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
from typing import Optional

import torch
import triton
import triton.language as tl

from enginespec.kernels import paged_attention as pa
from enginespec.kernels.compile_pool import launcher
from enginespec.kernels.paged_attention import (
    _add_values,
    _attend_tile,
    _load_keys,
    _load_values,
    _score_tile,
    _store_rows,
    _tile_range,
)
from enginespec.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_options, pdl_enabled, prefetch_l2
from enginespec.kernels.row_scale import check_row_source, row_rms_scale, row_scale_constexprs


@triton.jit
def _norm_rope(
    x,  # [R, HEAD_DIM] float32: raw head rows
    x_partner,  # [R, HEAD_DIM] float32: the same rows at dims (d + HALF) % HEAD_DIM
    w,  # [R, HEAD_DIM] float32 norm weights (USE_NORM)
    w_partner,  # [R, HEAD_DIM] float32 norm weights at the partner dims (USE_NORM)
    cos,  # [1, HEAD_DIM] float32
    sin_signed,  # [1, HEAD_DIM] float32: -sin on the first half, sin on the second
    eps,
    in_dtype: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_NORM: tl.constexpr,
):
    """Per-head RMSNorm (optional) then neox rotary: x * cos + rotate_half(x) * sin, where
    rotate_half(x)[d] = -x[d + HALF] on the first half and x[d - HALF] on the second."""
    if USE_NORM:
        rstd = (1.0 / tl.sqrt(tl.sum(x * x, 1) / HEAD_DIM + eps))[:, None]  # [R, 1]
        x = w * (x * rstd).to(in_dtype).to(tl.float32)
        x_partner = w_partner * (x_partner * rstd).to(in_dtype).to(tl.float32)
    return x * cos + x_partner * sin_signed


@triton.jit
def _prefetch_tile(
    cache_ptr,  # [2, num_blocks + 1, block_size, Hkv, D]; K at 0, V at 1
    stride_c_kv,
    table_row,  # [max_blocks] int32: the request's block table row
    first,  # the tile's first key position
    hi,  # keys at positions >= hi are not prefetched
    head_off,
    stride_c_block,
    stride_c_slot,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    LINE: tl.constexpr,
):
    """prefetch_l2 of every 128-byte line (LINE elements) of a tile's K and V rows in the pool;
    keys past hi fall back to the pool's first line."""
    kv_pos = first + tl.arange(0, TILE)  # [TILE]
    kv_ok = kv_pos < hi  # [TILE]
    row = _pool_slots(table_row, kv_pos, kv_ok, head_off, stride_c_block, stride_c_slot, BLOCK_SIZE)  # [TILE]
    lines = row[:, None] + tl.arange(0, HEAD_DIM // LINE)[None, :] * LINE  # [TILE, HEAD_DIM // LINE]
    lines = tl.where(kv_ok[:, None], lines, 0)
    prefetch_l2(cache_ptr + lines)
    prefetch_l2(cache_ptr + stride_c_kv + lines)


@triton.jit
def _pool_slots(table_row, kv_pos, kv_ok, head_off, stride_c_block, stride_c_slot, BLOCK_SIZE: tl.constexpr):
    """[TILE] int64 offsets in the pool of keys at positions kv_pos (0 where not kv_ok), through
    the request's block table row."""
    block = tl.load(table_row + kv_pos // BLOCK_SIZE, mask=kv_ok, other=0)  # [TILE]
    return block.to(tl.int64) * stride_c_block + (kv_pos % BLOCK_SIZE) * stride_c_slot + head_off


@triton.jit
def _attend_keys(
    q,  # [BLOCK_M, HEAD_DIM] the rows' normed, rotated queries
    cache_ptr,  # [2, num_blocks + 1, block_size, Hkv, D]; K at 0, V at 1
    stride_c_kv,
    table_row,  # [max_blocks] int32: the request's block table row
    lo,  # the first key position to attend to
    hi,  # keys at positions >= hi are not attended to
    new_pos,  # the new key's position (the window's anchor)
    window,
    head_off,
    stride_c_block,
    stride_c_slot,
    dims,  # [HEAD_DIM]
    dim_ok,  # [HEAD_DIM]
    m_i,  # [BLOCK_M] running max (log2)
    l_i,  # [BLOCK_M] running sum
    acc,  # [BLOCK_M, HEAD_DIM] float32 unnormalised output
    scale_log2,
    BLOCK_SIZE: tl.constexpr,
    STEP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """Online softmax over the pooled keys [lo, hi), STEP keys a step (the last one masked)."""
    for start in range(lo, hi, STEP):
        kv_pos = start + tl.arange(0, STEP)  # [STEP]
        kv_ok = kv_pos < hi  # [STEP]
        kv_slot = _pool_slots(table_row, kv_pos, kv_ok, head_off, stride_c_block, stride_c_slot, BLOCK_SIZE)
        visible = kv_ok[None, :]
        if USE_WINDOW:
            visible = visible & (kv_pos[None, :] > new_pos - window)
        m_i, l_i, acc = _attend_tile(
            q,
            cache_ptr,
            stride_c_kv,
            kv_slot,
            kv_ok,
            dims,
            dim_ok,
            visible,
            m_i,
            l_i,
            acc,
            scale_log2,
            DOT_FP32,
        )
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["num_splits", "window", "stride_bt", "num_rows", "fill_splits"])
def _decode_attention_kernel(
    out_ptr,  # [B, Hq, D] (written unless IS_SPLIT)
    part_ptr,  # [B, Hq, num_splits, D + 2] float32 (IS_SPLIT only): acc, max (log2), sum
    cache_ptr,  # [2, num_blocks + 1, block_size, Hkv, D]; K at 0, V at 1
    qkv_ptr,  # [B, (Hq + 2 Hkv) * D]: q heads, then k heads, then v heads
    cos_ptr,  # [B, D]
    sin_ptr,  # [B, D]
    norm_ptr,  # [Hq + Hkv, D] (USE_NORM only): per-head norm weights, q heads first
    slot_ptr,  # [B] int64; -1 = padding row (scratch block)
    block_table_ptr,  # [B, max_blocks] int32
    seq_lens_ptr,  # [B] int32, the new token included
    order_ptr,  # [B] int32 (USE_ORDER only): a permutation of range(B), launch order
    h_ptr,  # [B, HIDDEN] (USE_ROW_SCALE only): the rows the folded input norm would have normed
    num_splits,
    num_rows,  # B (BALANCE only)
    fill_splits,  # LaunchConfig.balance_splits (BALANCE only)
    scale_log2,
    window,
    eps,
    row_eps,
    scratch_slot,
    stride_h,
    stride_qkv,
    stride_cos,
    stride_sin,
    stride_o_tok,
    stride_o_head,
    stride_c_kv,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    stride_bt,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_ORDER: tl.constexpr,
    USE_NORM: tl.constexpr,
    DOT_FP32: tl.constexpr,
    USE_PDL: tl.constexpr = False,
    LINE: tl.constexpr = 64,
    PRELOAD: tl.constexpr = False,
    LOOP_TILE: tl.constexpr = 64,
    LONG_TILE: tl.constexpr = 0,
    PREFETCH_TILES: tl.constexpr = 1,
    HIDDEN: tl.constexpr = 0,
    H_BLOCK: tl.constexpr = 16,
    USE_ROW_SCALE: tl.constexpr = False,
    BALANCE: tl.constexpr = False,
    MAX_ROWS: tl.constexpr = 16,
):
    """One program per (request, KV head, split); row m < GROUP of it is query head
    kv_head * GROUP + m. USE_PDL (kernels/pdl.py): the request's length, slot, cos/sin, the
    norm weights and the block-table entries of the split's first tile (none written by a
    kernel of the chain; BALANCE: every row's length too, for the batch's tiles a split) are
    read before gdc_wait, and L2 is asked for that tile's K and V;
    the q|k|v row (the GEMM before wrote it), the hidden row (USE_ROW_SCALE) and the pool are
    read after it, and every store comes after it; the q|k|v row and the hidden row in one load
    round, before any reduction."""
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if USE_ORDER:
        req = tl.load(order_ptr + req)
    req = req.to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + req)
    # This split's tiles of the pool's keys [kv_lo, seq_len - 1) (and the new key's position).
    if BALANCE:  # the batch's tiles a split: a row takes as many splits as its length needs
        per_split = pa._balanced_tiles_per_split(
            seq_lens_ptr, num_rows, fill_splits, num_splits, window, TILE, USE_WINDOW, MAX_ROWS
        )
        r_lo, r_hi = pa._decode_tiles(seq_len, window, TILE, USE_WINDOW)
        t_lo = r_lo + split * per_split
        t_hi = tl.minimum(t_lo + per_split, r_hi)
        kv_hi = tl.maximum(seq_len, 0)
        alone = r_hi - r_lo <= per_split  # split 0 owns every tile: its output is the row's
    else:
        t_lo, t_hi, kv_hi = _tile_range(
            seq_len, 1, 0, split, num_splits, window, 1, TILE, IS_SPLIT, USE_WINDOW
        )
    if (split > 0) & (t_lo >= t_hi):
        return  # owns no tile: writes nothing (the merge reads only splits that own tiles)
    slot = tl.load(slot_ptr + req).to(tl.int64)
    HALF: tl.constexpr = HEAD_DIM // 2
    rows = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    row_ok = rows < GROUP  # [BLOCK_M]
    q_head = kv_head * GROUP + rows  # [BLOCK_M]
    dims = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    partner = (dims + HALF) % HEAD_DIM  # [HEAD_DIM]
    cos = tl.load(cos_ptr + req * stride_cos + dims).to(tl.float32)[None, :]  # [1, HEAD_DIM]
    sin = tl.load(sin_ptr + req * stride_sin + dims).to(tl.float32)
    sin_signed = tl.where(dims < HALF, -sin, sin)[None, :]  # [1, HEAD_DIM]
    k_head = NUM_Q_HEADS + kv_head
    wq = cos  # placeholders when USE_NORM is off (never read)
    wq_p = cos
    wk = cos
    wk_p = cos
    if USE_NORM:
        wq_rows = norm_ptr + q_head[:, None] * HEAD_DIM  # [BLOCK_M, 1]
        wq = tl.load(wq_rows + dims[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
        wq_p = tl.load(wq_rows + partner[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
        wk = tl.load(norm_ptr + k_head * HEAD_DIM + dims).to(tl.float32)[None, :]  # [1, HEAD_DIM]
        wk_p = tl.load(norm_ptr + k_head * HEAD_DIM + partner).to(tl.float32)[None, :]
    head_off = kv_head * stride_c_head
    table_row = block_table_ptr + req * stride_bt
    cached_hi = kv_hi - 1  # the pool's keys: positions < seq_len - 1
    dim_ok = dims < HEAD_DIM
    key_end = tl.minimum(cached_hi, t_hi * TILE)  # this split's pooled keys end here
    loop_lo = t_lo * TILE  # the first key the loop below reads from the pool
    if PRELOAD:
        loop_lo += TILE
        # The split's first tile of pooled keys and values, into registers, before the wait.
        first_pos = t_lo * TILE + tl.arange(0, TILE)  # [TILE]
        first_ok = first_pos < key_end  # [TILE]
        first_slot = _pool_slots(
            table_row, first_pos, first_ok, head_off, stride_c_block, stride_c_slot, BLOCK_SIZE
        )
        k_first = _load_keys(cache_ptr, first_slot, first_ok, dims, dim_ok)  # [HEAD_DIM, TILE]
        v_first = _load_values(cache_ptr, stride_c_kv, first_slot, first_ok, dims, dim_ok)  # [TILE, HEAD_DIM]
    if USE_PDL:
        # While the q|k|v GEMM runs: ask L2 for the loop's first PREFETCH_TILES steps of pooled
        # keys and values (earlier steps wrote them; the block table is the step's copy), LINE
        # elements a line; keys past the split's end ask for the pool's first line.
        for i in tl.static_range(PREFETCH_TILES):
            _prefetch_tile(cache_ptr, stride_c_kv, table_row, loop_lo + i * LOOP_TILE, key_end, head_off,
                           stride_c_block, stride_c_slot, BLOCK_SIZE, LOOP_TILE, HEAD_DIM, LINE)  # fmt: skip
        gdc_launch_dependents()
        gdc_wait()  # from here on, the GEMM's q|k|v row and earlier layers' pool writes are visible

    in_ty = qkv_ptr.dtype.element_ty
    row = qkv_ptr + req * stride_qkv
    q_off = q_head[:, None] * HEAD_DIM  # [BLOCK_M, 1]
    xq = tl.load(row + q_off + dims[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    xq_p = tl.load(row + q_off + partner[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    xk = tl.load(row + k_head * HEAD_DIM + dims).to(tl.float32)[None, :]  # [1, HEAD_DIM]
    xk_p = tl.load(row + k_head * HEAD_DIM + partner).to(tl.float32)[None, :]
    c_ty = cache_ptr.dtype.element_ty
    # v_new with q and k, and the hidden row (USE_ROW_SCALE) right after them: one load round
    # for both rows, before the norms' reductions.
    v_new = tl.load(row + (NUM_Q_HEADS + NUM_KV_HEADS + kv_head) * HEAD_DIM + dims)  # [HEAD_DIM]
    if USE_ROW_SCALE:  # a folded input norm: scaled and rounded as the un-folded GEMM's output was
        r = row_rms_scale(h_ptr, req, stride_h, row_eps, HIDDEN, H_BLOCK)
        xq = (xq * r).to(in_ty).to(tl.float32)
        xq_p = (xq_p * r).to(in_ty).to(tl.float32)
        xk = (xk * r).to(in_ty).to(tl.float32)
        xk_p = (xk_p * r).to(in_ty).to(tl.float32)
        v_new = (v_new.to(tl.float32) * r).to(in_ty)
    v_new = v_new.to(c_ty)
    q = _norm_rope(xq, xq_p, wq, wq_p, cos, sin_signed, eps, in_ty, HEAD_DIM, USE_NORM).to(in_ty)
    k_new = _norm_rope(xk, xk_p, wk, wk_p, cos, sin_signed, eps, in_ty, HEAD_DIM, USE_NORM).to(c_ty)

    if split == 0:  # the one writer of this request's new K/V for this head
        pos = tl.where(slot < 0, scratch_slot, slot)
        new = (pos // BLOCK_SIZE) * stride_c_block + (pos % BLOCK_SIZE) * stride_c_slot + head_off
        tl.store(cache_ptr + new + dims[None, :], k_new)
        tl.store(cache_ptr + stride_c_kv + new + dims, v_new)

    # The new key first (split 0 only; none for a padding row), from registers.
    has_new = (split == 0) & (seq_len > 0)
    s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), 1) * scale_log2  # [BLOCK_M]
    m_i = tl.where(has_new, s_new, float("-inf"))  # running max (log2)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + has_new.to(tl.float32)  # running sum
    zeros = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc = tl.where(has_new, zeros + v_new.to(tl.float32)[None, :], zeros)  # unnormalised output

    # Then the pool's keys before it, this split's tiles of them (the first from registers).
    new_pos = seq_len - 1
    if PRELOAD:
        first_visible = first_ok[None, :]
        if USE_WINDOW:
            first_visible = first_visible & (first_pos[None, :] > new_pos - window)
        m_i, l_i, p, alpha = _score_tile(q, k_first, first_visible, m_i, l_i, scale_log2, DOT_FP32)
        acc = _add_values(acc, alpha, p, v_first, DOT_FP32)
    # The rest of the split's keys: LOOP_TILE-key steps, or LONG_TILE-key ones (LONG_TILE > LOOP_TILE)
    # when more than LONG_TILE - LOOP_TILE keys remain (one wide step then replaces at least
    # LONG_TILE / LOOP_TILE short ones), a runtime choice, so the one config a graph captures takes
    # few short steps at short contexts and few wide pipelined ones at long contexts.
    if LONG_TILE > LOOP_TILE:  # constexpr: without it, the one loop (measured as such at 2-64 rows)
        if key_end - loop_lo > LONG_TILE - LOOP_TILE:
            m_i, l_i, acc = _attend_keys(
                q, cache_ptr, stride_c_kv, table_row, loop_lo, key_end, new_pos, window, head_off, stride_c_block,
                stride_c_slot, dims, dim_ok, m_i, l_i, acc, scale_log2, BLOCK_SIZE, LONG_TILE, USE_WINDOW, DOT_FP32,
            )  # fmt: skip
        else:
            m_i, l_i, acc = _attend_keys(
                q, cache_ptr, stride_c_kv, table_row, loop_lo, key_end, new_pos, window, head_off, stride_c_block,
                stride_c_slot, dims, dim_ok, m_i, l_i, acc, scale_log2, BLOCK_SIZE, LOOP_TILE, USE_WINDOW, DOT_FP32,
            )  # fmt: skip
    else:
        m_i, l_i, acc = _attend_keys(
            q, cache_ptr, stride_c_kv, table_row, loop_lo, key_end, new_pos, window, head_off, stride_c_block,
            stride_c_slot, dims, dim_ok, m_i, l_i, acc, scale_log2, BLOCK_SIZE, LOOP_TILE, USE_WINDOW, DOT_FP32,
        )  # fmt: skip

    if BALANCE:
        if alone:  # the merge skips this row: the normalised output goes to out now
            _store_rows(out_ptr, part_ptr, acc, m_i, l_i, req, q_head, row_ok, dims, dim_ok, split, num_splits, stride_o_tok, stride_o_head, NUM_Q_HEADS, HEAD_DIM, False)  # fmt: skip  # noqa: E501
            return
    _store_rows(
        out_ptr, part_ptr, acc, m_i, l_i, req, q_head, row_ok, dims, dim_ok, split, num_splits,
        stride_o_tok, stride_o_head, NUM_Q_HEADS, HEAD_DIM, IS_SPLIT,
    )  # fmt: skip


# The preloading config of split decode launches of at most ENGINESPEC_DECODE_PRELOAD_ROWS rows
# (default 1): each split's first 16 keys read into registers before the PDL wait, the rest in
# 32-key steps, or in choose_config's tile (128 keys where two stages of them fit shared memory,
# as on the H200) when more than tile - 32 remain (a runtime branch: LONG_TILE), two stages, and
# a merge of 32 dims a program on one warp.
# Measured (H200, Qwen3-0.6B, batch 1, decode graph ms, benchmarks/RESULTS.md, sixteenth
# session), choose_config's 128-key 2-stage tiles against the preloaded first tile and then:
# 64-key 1-stage steps 0.670 -> 0.644 at 517 tokens but 0.935 -> 1.007 at 8192; 16-key steps
# 0.621 and 1.376; 32-key 2-stage 0.615 and 0.984; 128-key 2-stage 0.704 and 0.901; this config
# (with the switch at 32 keys left) 0.634 and 0.905. Short contexts want short steps and long ones
# wide steps. Fitted to those: a 32-key step ~1.3 us a layer, a 128-key one ~3.8 us, so the switch
# sits where 3 short steps cost one wide one (96 keys; not timed at the contexts it changes,
# ~1.5-3.5K tokens at 32 splits). 2-8 rows with 64 splits of 16-64-key tiles measured slower than
# choose_config's (fifteenth session). Compiled for sm_90: 222 registers, 92 KiB shared.
PRELOAD_ROWS_ENV = "ENGINESPEC_DECODE_PRELOAD_ROWS"
PRELOAD_TILE = 16
PRELOAD_LOOP_TILE = 32
PRELOAD_STAGES = 2
MERGE_BLOCK_D = 32
MERGE_WARPS = 1
DECODE_ATTN_ENV = "ENGINESPEC_DECODE_ATTN"
MAX_BALANCED_SPLITS = 64  # choose_config's own bound on splits
# Balanced splits (LaunchConfig.balance_splits) at split launches (choose_config's F >= 2) of at
# least 8 rows, twice F splits in the grid. H200, Qwen3-0.6B, decode graph ms (benchmarks/
# RESULTS.md, twenty-eighth session), default -> balanced at R = 2: contexts uniform in
# 100-2,048 at 8 rows 1.353 -> 1.288 and 16 rows 1.749 -> 1.577 (-5%, -10%); one 517-token
# context 1.089 -> 1.103 and 1.287 -> 1.318 (+1%, +2%); 4 rows lost both ways (+3%, +8%). At
# 32-64 rows (F = 1: unsplit, no merge launch) mixed contexts gained 7-17% but one context lost
# 5-13% (the merge launch balancing adds), so they stay unsplit; R = 4 measured as R = 2.
BALANCED_MIN_ROWS = 8
BALANCE_RATIO = 2
# the forced ratio while balanced_launches or unbalanced_launches is open in this thread (None:
# neither, decode_config's default rule; 0: no launch balanced); other threads' configs are
# untouched
_FORCED_RATIO: contextvars.ContextVar[Optional[int]] = contextvars.ContextVar(
    "enginespec_balanced_ratio", default=None
)


@contextlib.contextmanager
def balanced_launches(ratio: int = BALANCE_RATIO):
    """Inside, decode_config balances every launch of at least BALANCED_MIN_ROWS rows at this
    ratio, the unsplit ones of 24-64 rows too (their default stays unbalanced: a batch of one
    context lost 5-13% there): worker/cuda_graphs.py captures such buckets a second time under
    it and replays that graph for batches whose lengths spread (ENGINESPEC_BALANCED_GRAPHS)."""
    if ratio < 1:
        raise ValueError(f"balanced_launches: ratio must be >= 1, got {ratio}")
    with _forced_ratio(ratio):
        yield


@contextlib.contextmanager
def unbalanced_launches():
    """Inside, decode_config balances no launch, the 8-16-row split ones it balances by default
    included: the plain graph of a bucket that also has a balanced one is captured so, and
    replayed for batches of one context (their splits' tiles are even already, and the balanced
    launch cost 8 rows 4.4% on an H100 and 1-2% on the H200 at one 517-token context;
    benchmarks/RESULTS.md, forty-fourth and twenty-eighth sessions)."""
    with _forced_ratio(0):
        yield


@contextlib.contextmanager
def _forced_ratio(ratio: int):
    token = _FORCED_RATIO.set(ratio)
    try:
        yield
    finally:
        _FORCED_RATIO.reset(token)


_OVERRIDE_KEYS = (
    "tile",
    "loop_tile",
    "long_tile",
    "splits",
    "warps",
    "stages",
    "preload",
    "merge_d",
    "merge_warps",
    "max_rows",
    "min_rows",
    "prefetch",
    "balance",
)


def decode_config(
    num_reqs: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_seq_len: int,
    device: torch.device,
    itemsize: int = 2,
) -> pa.LaunchConfig:
    """The launch config of a decode-only batch of num_reqs rows: paged_attention's
    choose_config, with a preloaded 16-key first tile and a narrow merge at split launches of at
    most preload_rows() rows, and splits balanced over the batch (BALANCE_RATIO times
    choose_config's count F in the grid, filled as F would: balanced_splits) at split launches of
    at least BALANCED_MIN_ROWS rows, unless ENGINESPEC_DECODE_ATTN overrides it (for A/B runs): comma-separated
    key=value pairs of tile, loop_tile, long_tile, splits, warps, stages, preload (0/1), merge_d and merge_warps (the
    split merge's dims and warps a program), prefetch (loop steps asked of L2 before the PDL
    wait; 0: none), balance (R: the splits share the batch's tiles, LaunchConfig.balance_splits,
    filling as choose_config's split count F would, over R x F splits, balanced_splits; 0: off)
    and min_rows/max_rows (the override
    applies to batches of that many rows; default every batch), e.g.
    "tile=32,splits=64,stages=1,preload=1,max_rows=4" or "balance=4,min_rows=2"."""
    cfg = pa.choose_config(
        num_reqs, num_reqs, num_q_heads, num_kv_heads, head_dim, 1, max_seq_len, device, itemsize
    )
    if num_reqs <= preload_rows() and cfg.num_splits > 1:
        cfg = dataclasses.replace(
            cfg,
            tile=PRELOAD_TILE,
            loop_tile=min(PRELOAD_LOOP_TILE, cfg.tile),
            # the wide steps: choose_config's own tile (128 keys where 2 stages of them fit)
            long_tile=cfg.tile if cfg.tile > PRELOAD_LOOP_TILE else 0,
            num_stages=PRELOAD_STAGES,
            preload=True,
            merge_block_d=min(MERGE_BLOCK_D, head_dim),
            merge_warps=MERGE_WARPS,
        )
    elif num_reqs >= BALANCED_MIN_ROWS and _balanced(cfg.num_splits, _FORCED_RATIO.get()):
        splits, balance = balanced_splits(cfg.num_splits, _FORCED_RATIO.get() or BALANCE_RATIO)
        cfg = dataclasses.replace(cfg, num_splits=splits, balance_splits=balance)
    override = _env_override(os.environ.get(DECODE_ATTN_ENV, ""))
    if not override or not override.get("min_rows", 1) <= num_reqs <= override.get("max_rows", num_reqs):
        return cfg
    splits, balance = cfg.num_splits, cfg.balance_splits
    if "balance" in override:  # R: fill as choose_config's split count would, over R times as many
        splits, balance = balanced_splits(cfg.balance_splits or cfg.num_splits, override["balance"])
    return dataclasses.replace(
        cfg,
        tile=override.get("tile", cfg.tile),
        loop_tile=override.get("loop_tile", cfg.loop_tile),
        long_tile=override.get("long_tile", cfg.long_tile),
        num_splits=override.get("splits", splits),
        num_warps=override.get("warps", cfg.num_warps),
        num_stages=override.get("stages", cfg.num_stages),
        preload=bool(override.get("preload", cfg.preload)),
        merge_block_d=override.get("merge_d", cfg.merge_block_d),
        merge_warps=override.get("merge_warps", cfg.merge_warps),
        prefetch_tiles=override.get("prefetch", cfg.prefetch_tiles),
        balance_splits=balance,
    )


def _balanced(fill_splits: int, forced: Optional[int]) -> bool:
    """Whether a launch of at least BALANCED_MIN_ROWS rows is balanced: split ones by default
    (forced None), every one inside balanced_launches, none inside unbalanced_launches."""
    return fill_splits > 1 if forced is None else forced > 0


def balanced_splits(fill_splits: int, ratio: int) -> tuple:
    """(num_splits, balance_splits) of a balanced launch whose batch would fill the chip at
    fill_splits splits a row (choose_config's count): ratio times as many splits in the grid, at
    most MAX_BALANCED_SPLITS, so a long row can take that many while short ones take one;
    ratio 0: (fill_splits, 0), not balanced."""
    if not ratio:
        return fill_splits, 0
    return min(fill_splits * ratio, MAX_BALANCED_SPLITS), fill_splits


def preload_rows() -> int:
    """ENGINESPEC_DECODE_PRELOAD_ROWS: the most rows a split decode launch takes the preloading
    config at (default 1); 0 never. ValueError for anything but an int >= 0."""
    raw = os.environ.get(PRELOAD_ROWS_ENV, "1").strip() or "1"
    if not raw.isdigit():
        raise ValueError(f"{PRELOAD_ROWS_ENV} must be an int >= 0, got {raw!r}")
    return int(raw)


@functools.lru_cache(maxsize=8)
def _env_override(raw: str) -> dict:
    """ENGINESPEC_DECODE_ATTN parsed: {key: int}; ValueError naming the variable otherwise."""
    out: dict = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, _, value = item.partition("=")
        if key not in _OVERRIDE_KEYS or not value.strip().isdigit():
            raise ValueError(
                f"{DECODE_ATTN_ENV} takes key=int pairs of {', '.join(_OVERRIDE_KEYS)}; got {item!r} in {raw!r}"
            )
        out[key] = int(value)
    splits = out.get("splits", 1)
    if splits < 1 or splits & (splits - 1) or out.get("warps", 4) not in (1, 2, 4, 8, 16):
        raise ValueError(
            f"{DECODE_ATTN_ENV}: splits must be a power of two >= 1 and warps one of 1-16, got {raw!r}"
        )
    if min(out.get("stages", 1), out.get("max_rows", 1), out.get("min_rows", 1)) < 1:
        raise ValueError(f"{DECODE_ATTN_ENV}: stages, min_rows and max_rows must be >= 1, got {raw!r}")
    return out


def supported(head_dim: int) -> bool:
    """A power-of-two head_dim of at least 16 (the dims are one Triton range; tl.dot needs 16)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def decode_attention(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm_weight: Optional[torch.Tensor],
    eps: float,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_q_heads: int,
    *,
    max_seq_len: int,
    scale: Optional[float] = None,
    window: int = 0,
    config: Optional[pa.LaunchConfig] = None,
    order: Optional[torch.Tensor] = None,
    row_source: Optional[torch.Tensor] = None,
    row_eps: float = 0.0,
) -> torch.Tensor:
    """A decode-only batch's q|k|v rows [B, (Hq + 2 Hkv) * D] -> attention output [B, Hq, D];
    writes each row's normed, rotated k and its v into `cache` at slot_mapping [B] (int64,
    -1 = scratch). Row r is request r's new token: seq_lens [B] int32 counts it, block_table
    [B, max_blocks] int32 maps its positions. cos/sin [B, D]; norm_weight [Hq + Hkv, D] or None.

    Semantics: kernels.reference.decode_attention_ref (qkv_rope_ref, then paged_attention_ref
    with every query length 1). max_seq_len only steers the launch config. `order`: as
    paged_attention's. row_source [B, H] or None: a folded input norm's rows (kernels/row_scale.py).
    """
    num_reqs = seq_lens.shape[0]
    _check(qkv, cos, sin, norm_weight, cache, slot_mapping, seq_lens, block_table, num_q_heads, eps, window)
    if order is not None and (order.dtype != torch.int32 or tuple(order.shape) != (num_reqs,)):
        raise ValueError(f"order must be int32 [{num_reqs}], got {order.dtype} {tuple(order.shape)}")
    if row_source is not None:
        check_row_source(row_source, num_reqs, row_eps)
    h = row_source if row_source is not None else qkv
    num_kv_heads, block_size, head_dim = cache.shape[3], cache.shape[2], cache.shape[4]
    out = _output((num_reqs, num_q_heads, head_dim), qkv.dtype, qkv.device)
    if num_reqs == 0:
        return out
    cfg = config or decode_config(
        num_reqs, num_q_heads, num_kv_heads, head_dim, max_seq_len, qkv.device, cache.element_size()
    )
    group = num_q_heads // num_kv_heads
    pa.check_config(cfg, group)
    split = cfg.num_splits > 1
    balance = cfg.balance_splits if split else 0
    pdl = pdl_enabled(qkv.device)
    part = out
    if split:
        part = _scratch((num_reqs, num_q_heads, cfg.num_splits, head_dim + 2), qkv.device)
    launcher(_decode_attention_kernel, (num_reqs, num_kv_heads, cfg.num_splits))(
        out,
        part,
        cache,
        qkv,
        cos,
        sin,
        norm_weight if norm_weight is not None else qkv,
        slot_mapping,
        block_table,
        seq_lens,
        order if order is not None else seq_lens,
        h,
        cfg.num_splits,
        num_reqs,
        max(balance, 1),
        (head_dim**-0.5 if scale is None else scale) * pa.LOG2E,
        window,
        eps,
        row_eps,
        (cache.shape[1] - 1) * block_size,
        h.stride(0),
        qkv.stride(0),
        cos.stride(0),
        sin.stride(0),
        out.stride(0),
        out.stride(1),
        cache.stride(0),
        cache.stride(1),
        cache.stride(2),
        cache.stride(3),
        block_table.stride(0),
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=cfg.block_m,
        TILE=cfg.tile,
        IS_SPLIT=split,
        USE_WINDOW=window > 0,
        USE_ORDER=order is not None,
        USE_NORM=norm_weight is not None,
        DOT_FP32=qkv.dtype == torch.float32 or pa._interpreting(),
        USE_PDL=pdl,
        LINE=max(1, min(head_dim, 128 // cache.element_size())),
        PRELOAD=cfg.preload,
        LOOP_TILE=cfg.loop_tile or cfg.tile,
        LONG_TILE=cfg.long_tile,
        PREFETCH_TILES=cfg.prefetch_tiles,
        **row_scale_constexprs(row_source),
        BALANCE=balance > 0,
        MAX_ROWS=pa.balance_max_rows(num_reqs) if balance else 16,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch_options(pdl),
    )
    if split:
        pa.merge_splits(
            out,
            part,
            cfg.num_splits,
            pdl,
            seq_lens,
            window,
            cfg.tile,
            cfg.merge_block_d,
            cfg.merge_warps,
            balance,
        )
    return out


def _output(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The attention output (uninitialised: every row is written by the launch or its merge)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _scratch(shape: tuple, device: torch.device) -> torch.Tensor:
    """The split partials (float32, uninitialised: splits that own no tile leave theirs so)."""
    return torch.empty(shape, dtype=torch.float32, device=device)


def _check(qkv, cos, sin, norm_weight, cache, slot_mapping, seq_lens, block_table, num_q_heads, eps, window):
    """The shapes qkv_rope checks, plus the decode batch's: one row per request."""
    from enginespec.kernels.qkv_rope import _check as check_rows

    check_rows(qkv, cos, sin, norm_weight, cache, slot_mapping, num_q_heads, eps)
    head_dim = cache.shape[4]
    if not supported(head_dim):
        raise ValueError(f"decode_attention needs a power-of-two head_dim >= 16, got {head_dim}")
    if qkv.dtype not in pa.SUPPORTED_DTYPES or cache.dtype != qkv.dtype:
        raise ValueError(
            f"qkv/cache dtype must match and be one of {pa.SUPPORTED_DTYPES}, got {qkv.dtype}/{cache.dtype}"
        )
    if qkv.stride(1) != 1 or cos.stride(1) != 1 or sin.stride(1) != 1:
        raise ValueError("qkv, cos and sin must be contiguous along their last dim")
    n = qkv.shape[0]
    if tuple(seq_lens.shape) != (n,) or block_table.dim() != 2 or block_table.shape[0] != n:
        raise ValueError(
            f"a decode batch has one row per request: seq_lens must be [{n}] and block_table "
            f"[{n}, max_blocks], got {tuple(seq_lens.shape)} and {tuple(block_table.shape)}"
        )
    for name, t in (("seq_lens", seq_lens), ("block_table", block_table)):
        if t.dtype != torch.int32:
            raise ValueError(f"{name} must be int32, got {t.dtype}")
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
