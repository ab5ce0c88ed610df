"""Paged attention over a flat ragged batch: prefill chunks and decodes in one launch.

Work decomposition. The N query rows of B requests are cut per request into q-blocks of
BLOCK_Q rows; one program handles one q-block for one KV head and all GROUP = Hq // Hkv query
heads that share it, so each K/V tile is loaded once for BLOCK_M = BLOCK_Q * GROUP (padded to a
power of two) score rows. Row m of a program is query row m // GROUP, head m % GROUP.

Program ids need no host-side schedule (which would break CUDA-graph replay): request r owns
the global q-block ids [qsl[r] // BLOCK_Q + r, qsl[r + 1] // BLOCK_Q + r + 1), an interval of
at least ceil(len_r / BLOCK_Q) ids, increasing in r; a program finds its request by binary
search and exits if its local block lies past the request's rows. The grid is therefore
N // BLOCK_Q + B programs along axis 0. Decode-only batches (one query row per request) may
instead pass a launch order (USE_ORDER): program i along axis 0 serves request order[i], B
programs in all. The GPU starts programs in launch order as slots free up, so longest-first
(the backend's argsort of seq_lens) keeps a long request from starting in the last wave and
leaving the chip idle behind it when lengths vary.

K/V tiles of TILE positions are gathered straight from the pool through the block table
(one table load per position, so any block size works). Online softmax runs in the exp2
domain. Split-KV (IS_SPLIT): axis 2 cuts each q-block's key range into NUM_SPLITS pieces whose
partial (max, sum, unnormalised acc) go to float32 scratch; `_merge_splits_kernel` combines them.
That gives long contexts with few requests enough programs to fill the GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from enginespec.kernels.compile_pool import launcher
from enginespec.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_options, pdl_enabled

LOG2E = 1.4426950408889634
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _find_request(
    query_start_loc_ptr,  # [B + 1] int32
    q_block_id,
    num_reqs,
    BLOCK_Q: tl.constexpr,
):
    """Largest r with qsl[r] // BLOCK_Q + r <= q_block_id (r = 0 always qualifies)."""
    lo: tl.int32 = 0
    hi = num_reqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_id = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_id <= q_block_id:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def _tile_range(
    seq_len,
    q_len,
    q_block,
    split,
    num_splits,
    window,
    BLOCK_Q: tl.constexpr,
    TILE: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    USE_WINDOW: tl.constexpr,
):
    """Tiles [t_lo, t_hi) of keys this program reads and the exclusive key bound kv_hi.

    Keys past the block's last query position are never visible (causal); with a window,
    keys at or before first_position - window are never visible either.
    """
    first_pos = seq_len - q_len + q_block * BLOCK_Q
    kv_hi = tl.minimum(first_pos + BLOCK_Q, seq_len)
    kv_hi = tl.maximum(kv_hi, 0)
    kv_lo = 0
    if USE_WINDOW:
        kv_lo = tl.maximum(first_pos - window + 1, 0)
    t_lo = kv_lo // TILE
    t_hi = (kv_hi + TILE - 1) // TILE
    if IS_SPLIT:
        per_split = (t_hi - t_lo + num_splits - 1) // num_splits
        t_lo = t_lo + split * per_split
        t_hi = tl.minimum(t_lo + per_split, t_hi)
    return t_lo, t_hi, kv_hi


@triton.jit
def _attend_tile(
    q,  # [BLOCK_M, HEAD_PAD] query rows
    cache_ptr,  # [2, num_blocks + 1, block_size, Hkv, D]; K at 0, V at 1
    stride_c_kv,
    slot,  # [TILE] int64: each key's offset in the pool (its block, slot and KV head)
    kv_ok,  # [TILE] keys that exist (others are not loaded)
    dims,  # [HEAD_PAD]
    dim_ok,  # [HEAD_PAD] dims < HEAD_DIM
    visible,  # [BLOCK_M, TILE] which row sees which key (kv_ok included)
    m_i,  # [BLOCK_M] running max (log2 domain)
    l_i,  # [BLOCK_M] running sum
    acc,  # [BLOCK_M, HEAD_PAD] float32 unnormalised output
    scale_log2,
    DOT_FP32: tl.constexpr,
):
    """One step of online softmax over a tile of keys: load K and V from the pool, score,
    mask, rescale the running (max, sum, acc) and add the tile's share. Rows that have seen
    nothing yet (max -inf) keep acc = 0 and sum 0. Returns (m_i, l_i, acc)."""
    k = _load_keys(cache_ptr, slot, kv_ok, dims, dim_ok)
    m_new, l_i, p, alpha = _score_tile(q, k, visible, m_i, l_i, scale_log2, DOT_FP32)
    v = _load_values(cache_ptr, stride_c_kv, slot, kv_ok, dims, dim_ok)
    return m_new, l_i, _add_values(acc, alpha, p, v, DOT_FP32)


@triton.jit
def _load_keys(cache_ptr, slot, kv_ok, dims, dim_ok):
    """A tile's keys, transposed: [HEAD_PAD, TILE] (0 where a key or dim does not exist)."""
    return tl.load(
        cache_ptr + slot[None, :] + dims[:, None], mask=kv_ok[None, :] & dim_ok[:, None], other=0.0
    )


@triton.jit
def _load_values(cache_ptr, stride_c_kv, slot, kv_ok, dims, dim_ok):
    """A tile's values: [TILE, HEAD_PAD] (0 where a key or dim does not exist)."""
    return tl.load(
        cache_ptr + stride_c_kv + slot[:, None] + dims[None, :],
        mask=kv_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )


@triton.jit
def _score_tile(q, k, visible, m_i, l_i, scale_log2, DOT_FP32: tl.constexpr):
    """q [BLOCK_M, HEAD_PAD] against k [HEAD_PAD, TILE]: the new running max and sum, the
    tile's probabilities p [BLOCK_M, TILE] (unnormalised) and alpha [BLOCK_M], the factor that
    rescales what was accumulated before. A row whose max is still -inf gets p = 0, alpha 1."""
    if DOT_FP32:
        s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
    else:
        s = tl.dot(q, k)  # [BLOCK_M, TILE]
    s = tl.where(visible, s * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all-masked rows stay 0
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])  # [BLOCK_M, TILE]
    return m_new, l_i * alpha + tl.sum(p, 1), p, alpha


@triton.jit
def _add_values(acc, alpha, p, v, DOT_FP32: tl.constexpr):
    """acc [BLOCK_M, HEAD_PAD] rescaled by alpha, plus p [BLOCK_M, TILE] @ v [TILE, HEAD_PAD]."""
    if DOT_FP32:
        return acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    return acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)


@triton.jit
def _store_rows(
    out_ptr,  # [N, Hq, D] (written unless IS_SPLIT)
    part_ptr,  # [N, Hq, num_splits, HEAD_PAD + 2] float32 (IS_SPLIT only): acc, max, sum
    acc,  # [BLOCK_M, HEAD_PAD] float32 unnormalised output
    m_i,  # [BLOCK_M] running max (log2 domain)
    l_i,  # [BLOCK_M] running sum
    out_rows,  # [BLOCK_M] (or a scalar) int64: each row's token row
    row_head,  # [BLOCK_M] each row's query head
    row_ok,  # [BLOCK_M]
    dims,  # [HEAD_PAD]
    dim_ok,  # [HEAD_PAD]
    split,
    num_splits,
    stride_o_tok,
    stride_o_head,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    IS_SPLIT: tl.constexpr,
):
    """A program's result: its split's partial (acc, max, sum) for the merge, or, unsplit,
    the normalised output (0 for a row that saw no key)."""
    if IS_SPLIT:
        part = (out_rows * NUM_Q_HEADS + row_head) * num_splits + split  # [BLOCK_M]
        base = part * (HEAD_PAD + 2)  # [BLOCK_M]
        tl.store(part_ptr + base[:, None] + dims[None, :], acc, mask=row_ok[:, None])
        tl.store(part_ptr + base + HEAD_PAD, m_i, mask=row_ok)
        tl.store(part_ptr + base + HEAD_PAD + 1, l_i, mask=row_ok)
    else:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # nothing seen: acc = 0
        o_off = out_rows * stride_o_tok + row_head * stride_o_head
        tl.store(
            out_ptr + o_off[:, None] + dims[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )


# Ints that change from step to step are not specialised on (Triton would otherwise compile a
# variant per value class: == 1, divisible by 16, other), so a new batch shape never stalls a
# step on a JIT compile.
@triton.jit(do_not_specialize=["num_reqs", "num_splits", "window", "stride_bt"])
def _paged_attention_kernel(
    out_ptr,  # [N, Hq, D] (written unless IS_SPLIT)
    part_ptr,  # [N, Hq, num_splits, HEAD_PAD + 2] float32 (IS_SPLIT only):
    #   acc at [:HEAD_PAD], max (log2) at HEAD_PAD, sum at HEAD_PAD + 1
    q_ptr,  # [N, Hq, D]
    cache_ptr,  # [2, num_blocks + 1, block_size, Hkv, D]; K at 0, V at 1
    block_table_ptr,  # [B, max_blocks] int32
    seq_lens_ptr,  # [B] int32
    query_start_loc_ptr,  # [B + 1] int32
    order_ptr,  # [B] int32 (USE_ORDER only): a permutation of range(B), launch order
    num_reqs,
    num_splits,
    scale_log2,
    window,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_c_kv,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    stride_bt,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_ORDER: tl.constexpr,
    DOT_FP32: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """USE_PDL (kernels/pdl.py): the request lookup (launch order, query_start_loc, seq_lens,
    none written by a kernel of the chain) runs before gdc_wait; q and the cache (whose newest
    rows the kernel before wrote) are read after it, and every store comes after it."""
    q_block_id = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if USE_ORDER:  # decode-only: one q-block per request, served in the given order
        req = tl.load(order_ptr + q_block_id)
        q_block = 0
    else:
        req = _find_request(query_start_loc_ptr, q_block_id, num_reqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if not USE_ORDER:
        q_block = q_block_id - (q_start // BLOCK_Q + req)
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()  # from here on, the previous kernels' writes (q, the new K/V) are visible

    rows = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    row_tok = q_block * BLOCK_Q + rows // GROUP  # [BLOCK_M] query index in request
    row_head = kv_head * GROUP + rows % GROUP  # [BLOCK_M] query head
    row_ok = (rows < BLOCK_Q * GROUP) & (row_tok < q_len)  # [BLOCK_M]
    row_pos = seq_len - q_len + row_tok  # [BLOCK_M] absolute position
    dims = tl.arange(0, HEAD_PAD)  # [HEAD_PAD]
    dim_ok = dims < HEAD_DIM  # [HEAD_PAD]

    q_rows = (q_start + row_tok).to(tl.int64) * stride_q_tok + row_head * stride_q_head
    q = tl.load(
        q_ptr + q_rows[:, None] + dims[None, :],  # [BLOCK_M, HEAD_PAD]
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )

    t_lo, t_hi, kv_hi = _tile_range(
        seq_len, q_len, q_block, split, num_splits, window, BLOCK_Q, TILE, IS_SPLIT, USE_WINDOW
    )
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max (log2)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)  # unnormalised output
    table_row = block_table_ptr + req.to(tl.int64) * stride_bt
    head_off = kv_head * stride_c_head
    for t in range(t_lo, t_hi):
        kv_pos = t * TILE + tl.arange(0, TILE)  # [TILE]
        kv_ok = kv_pos < kv_hi  # [TILE]
        block = tl.load(table_row + kv_pos // BLOCK_SIZE, mask=kv_ok, other=0)  # [TILE]
        slot = block.to(tl.int64) * stride_c_block + (kv_pos % BLOCK_SIZE) * stride_c_slot + head_off
        visible = kv_ok[None, :] & (kv_pos[None, :] <= row_pos[:, None])
        if USE_WINDOW:
            visible = visible & (kv_pos[None, :] > row_pos[:, None] - window)
        m_i, l_i, acc = _attend_tile(
            q, cache_ptr, stride_c_kv, slot, kv_ok, dims, dim_ok, visible, m_i, l_i, acc, scale_log2, DOT_FP32
        )

    out_rows = (q_start + row_tok).to(tl.int64)
    _store_rows(
        out_ptr, part_ptr, acc, m_i, l_i, out_rows, row_head, row_ok, dims, dim_ok, split, num_splits,
        stride_o_tok, stride_o_head, NUM_Q_HEADS, HEAD_PAD, IS_SPLIT,
    )  # fmt: skip


@triton.jit
def _decode_tiles(seq_len, window, TILE: tl.constexpr, USE_WINDOW: tl.constexpr):
    """[t_lo, t_hi): the key tiles of decode rows (one query each, at position seq_len - 1),
    elementwise over seq_len (a scalar or a vector): _tile_range's unsplit range at q_len 1."""
    t_lo = seq_len * 0
    if USE_WINDOW:
        t_lo = tl.maximum(seq_len - window, 0) // TILE
    return t_lo, (tl.maximum(seq_len, 0) + TILE - 1) // TILE


@triton.jit
def _balanced_tiles_per_split(
    seq_lens_ptr,  # [num_rows] int32: the decode batch's rows
    num_rows,
    fill_splits,
    num_splits,
    window,
    TILE: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    MAX_ROWS: tl.constexpr,
):
    """Tiles a split owns in a balanced decode launch (LaunchConfig.balance_splits): the batch's
    tiles spread evenly over fill_splits splits of each live row (seq_len > 0), but never so few
    that a row would need more than num_splits splits. Every program of the launch and of its
    merge computes the same value from the same seq_lens, so they agree on which splits own
    tiles. num_rows <= MAX_ROWS."""
    rows = tl.arange(0, MAX_ROWS)  # [MAX_ROWS]
    lens = tl.load(seq_lens_ptr + rows, mask=rows < num_rows, other=0)  # [MAX_ROWS]
    t_lo, t_hi = _decode_tiles(lens, window, TILE, USE_WINDOW)
    tiles = t_hi - t_lo  # [MAX_ROWS]
    slots = tl.maximum(tl.sum((lens > 0).to(tl.int32), 0), 1) * fill_splits
    even = (tl.sum(tiles, 0) + slots - 1) // slots
    longest = (tl.max(tiles, 0) + num_splits - 1) // num_splits
    return tl.maximum(tl.maximum(even, longest), 1)


@triton.jit
def _decode_active_splits(seq_len, num_splits, window, TILE: tl.constexpr, USE_WINDOW: tl.constexpr):
    """How many splits of a decode row (one query, at position seq_len - 1) own key tiles.
    _tile_range hands split s the tiles [t_lo + s * per_split, ...) of the row's range, so
    exactly the first ceil(tiles / per_split) do (none when seq_len is 0)."""
    t_lo, t_hi = _decode_tiles(seq_len, window, TILE, USE_WINDOW)
    tiles = t_hi - t_lo
    per_split = tl.maximum((tiles + num_splits - 1) // num_splits, 1)
    return (tiles + per_split - 1) // per_split


@triton.jit
def _balanced_active_splits(seq_len, per_split, window, TILE: tl.constexpr, USE_WINDOW: tl.constexpr):
    """How many splits of a decode row own key tiles when every split owns per_split of them
    (_balanced_tiles_per_split): ceil(tiles / per_split), 0 when seq_len is 0."""
    t_lo, t_hi = _decode_tiles(seq_len, window, TILE, USE_WINDOW)
    return (t_hi - t_lo + per_split - 1) // per_split


@triton.jit(do_not_specialize=["window", "num_rows", "fill_splits"])
def _merge_splits_kernel(
    out_ptr,  # [N, Hq, D]
    part_ptr,  # [N, Hq, NUM_SPLITS, HEAD_PAD + 2] float32: acc, max (log2), sum
    seq_lens_ptr,  # [N] int32 (USE_ACTIVE only): row n is a decode request's query
    window,
    num_rows,  # N (BALANCE only)
    fill_splits,  # LaunchConfig.balance_splits (BALANCE only)
    stride_o_tok,
    stride_o_head,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    TILE: tl.constexpr = 64,
    USE_WINDOW: tl.constexpr = False,
    USE_ACTIVE: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
    BLOCK_D: tl.constexpr = 128,
    BALANCE: tl.constexpr = False,
    MAX_ROWS: tl.constexpr = 16,
):
    """out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s; zero where nothing was seen.
    One program per (row, head, BLOCK_D dims of the head's HEAD_PAD).
    USE_ACTIVE (decode rows): only the splits that own key tiles (_decode_active_splits) wrote
    partials, and only theirs are read. BALANCE (with USE_ACTIVE: a balanced decode launch,
    LaunchConfig.balance_splits): splits own the batch's share of tiles, and a row that at most
    one split owns was written to out by the attention launch, so its programs store nothing.
    USE_PDL: seq_lens (no kernel of the chain writes it) is read before the wait, the partials
    (the attention launch wrote them) after it; every program waits, even one that then stores
    nothing, so the launch after this one still sees the attention launch's output."""
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, NUM_SPLITS)  # [NUM_SPLITS]
    used = splits < NUM_SPLITS  # [NUM_SPLITS]
    num_active = NUM_SPLITS
    if USE_ACTIVE:
        seq_len = tl.load(seq_lens_ptr + tok)
        if BALANCE:
            per_split = _balanced_tiles_per_split(
                seq_lens_ptr, num_rows, fill_splits, NUM_SPLITS, window, TILE, USE_WINDOW, MAX_ROWS
            )
            num_active = _balanced_active_splits(seq_len, per_split, window, TILE, USE_WINDOW)
        else:
            num_active = _decode_active_splits(seq_len, NUM_SPLITS, window, TILE, USE_WINDOW)
        used = splits < num_active
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()
    if BALANCE:
        if num_active <= 1:
            return  # the attention launch stored this row's output itself
    dims = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    part = (tok * NUM_Q_HEADS + head) * NUM_SPLITS + splits  # [NUM_SPLITS]
    base = part * (HEAD_PAD + 2)  # [NUM_SPLITS]
    m_s = tl.load(part_ptr + base + HEAD_PAD, mask=used, other=float("-inf"))
    l_s = tl.load(part_ptr + base + HEAD_PAD + 1, mask=used, other=0.0)
    m_all = tl.max(m_s, 0)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.math.exp2(m_s - m_safe)  # [NUM_SPLITS]
    denom = tl.sum(w * l_s, 0)
    acc = tl.load(
        part_ptr + base[:, None] + dims[None, :], mask=used[:, None], other=0.0
    )  # [NUM_SPLITS, BLOCK_D]
    o = tl.sum(acc * w[:, None], 0)  # [BLOCK_D]
    o = o / tl.where(denom > 0, denom, 1.0)  # nothing seen: o = 0
    tl.store(
        out_ptr + tok * stride_o_tok + head * stride_o_head + dims,
        o.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


@dataclass(frozen=True)
class LaunchConfig:
    """Tile shapes and launch knobs of one paged-attention launch."""

    block_m: int
    tile: int
    num_splits: int
    num_warps: int
    num_stages: int
    # Fused decode attention only (kernels/decode_attention.py): read the first key tile's K and
    # V into registers before the PDL wait. Costs a [TILE, D] pair of registers a program, so
    # only small tiles (at most MAX_PRELOAD_TILE keys) at small batch take it.
    preload: bool = False
    # Fused decode attention only: keys a step of the tile loop (0: tile). A split owns whole
    # `tile`-key tiles; with preload, the keys past its first tile go by loop_tile-key steps, so a
    # small first tile (cheap to hold in registers) need not make long contexts take small steps.
    loop_tile: int = 0
    # Fused decode attention only: a split with more than loop_tile keys left after its first
    # tile steps long_tile keys instead (0: never). Chosen at run time, so the one config a graph
    # captures serves short contexts with small steps and long ones with wide pipelined steps.
    long_tile: int = 0
    # The split merge's programs: merge_block_d dims of a head each (0: the whole head), warps.
    merge_block_d: int = 0
    merge_warps: int = 4
    # Fused decode attention only, with PDL: how many loop_tile-key steps of its keys a program
    # asks L2 for before its wait (kernels/pdl.py: prefetch_l2), so DRAM streams them while the
    # q|k|v GEMM before it and the program's own q|k|v prologue run (0: none).
    prefetch_tiles: int = 1
    # Fused decode attention only, split launches: > 0 balances the splits over the batch rather
    # than over each row. A split owns max(ceil(the batch's tiles / (live rows x balance_splits)),
    # ceil(the longest row's tiles / num_splits)) tiles, so a row takes as many of its num_splits
    # splits as its own length needs: at mixed contexts the long rows spread over several splits
    # while short ones take one, and a row that one split owns is stored without the merge.
    # 0: every row's tiles are split num_splits ways, whatever the other rows' lengths.
    balance_splits: int = 0


MAX_PRELOAD_TILE = 64


def check_config(cfg: LaunchConfig, group: int) -> None:
    """A launch config's block holds at least one token's GROUP query heads, its split count
    is a power of two (the merge's range), its tile a power of two of at least 16 keys
    (tl.dot), and a preloading config's tile at most MAX_PRELOAD_TILE keys."""
    if cfg.block_m < group or cfg.num_splits & (cfg.num_splits - 1):
        raise ValueError(
            f"config: block_m {cfg.block_m} must be >= group {group} and "
            f"num_splits {cfg.num_splits} a power of two"
        )
    for name in ("tile", "loop_tile", "long_tile"):
        value = getattr(cfg, name)
        if (value or name == "tile") and (value < 16 or value & (value - 1)):
            raise ValueError(f"config: {name} {value} must be a power of two >= 16")
    if cfg.preload and cfg.tile > MAX_PRELOAD_TILE:
        raise ValueError(f"config: a preloading config's tile {cfg.tile} must be <= {MAX_PRELOAD_TILE}")


_SM_COUNT: dict = {}
# A split of fewer keys costs more in its merge than it saves. H200 (fe1b1ef, ctx 512, batch 1
# and 4, benchmarks/attention_split_probe.py): one 128-key tile a split was fastest.
MIN_KEYS_PER_SPLIT = 128


def _interpreting() -> bool:
    """Under TRITON_INTERPRET the numpy-backed tl.dot mishandles bf16 (seen with triton 3.9),
    so dots run on float32 copies of the operands there; on a GPU they use the input dtype."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    if device not in _SM_COUNT:
        _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT[device]


# Warps of a decode-heavy launch and of a prefill-heavy one (128-row blocks): 4, what every
# timing so far measured. benchmarks/kernel_resources.py: no decode config spills at 4 or 8;
# the prefill one spills 160-248 B a thread at 4 and nothing at 8, with half the instructions.
DECODE_WARPS = 4
PREFILL_WARPS = 4


def choose_config(
    num_tokens: int,
    num_reqs: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_pad: int,
    max_query_len: int,
    max_seq_len: int,
    device: torch.device,
    itemsize: int = 2,
) -> LaunchConfig:
    """Heuristic launch config (tuned on an H200, bf16, head_dim 128; see benchmarks/RESULTS.md).

    Prefill-heavy batches (many query rows per KV head) take 128-row blocks; decode-heavy ones
    the smallest block (16 rows: one token's GROUP heads) and 64-key tiles in 2 stages, which
    leaves room for 3 programs per SM (measured better than wider tiles or deeper pipelines).
    The key range is split only when few requests would leave the chip idle: splitting batch
    64 x 8 KV heads (512 programs) cost 5-45% at every context on the H200, while batch 1-16
    needs the split. Each split keeps >= MIN_KEYS_PER_SPLIT keys of max_seq_len and the float32
    scratch stays under 64 MiB. Split decode launches read 128-key tiles where they fit.

    Splits stop at two waves: programs x splits <= 2 x SMs x programs_per_sm(tile). A graph is
    captured with max_seq_len = max_model_len and the kernel hands each split ceil(tiles /
    num_splits) of the request's *actual* tiles, so one config must serve every context. H200,
    Qwen3-0.6B heads, 128-key tiles (fe1b1ef, attention_split_probe.py, contexts 512-8192):
    the best split count made ~256 programs at batch 1 (32 splits), 4 (8) and 16 (2), within
    0-18% of the best per context; the earlier bound (up to 2 x 3 programs per SM: 512
    programs) lost up to 32% at short contexts, one wave (128) up to 76% at batch 16.
    """
    group = num_q_heads // num_kv_heads
    min_m = max(16, triton.next_power_of_2(group))
    rows = max_query_len * group
    if rows >= 128:
        block_m, tile, warps, stages = max(128, min_m), 64, PREFILL_WARPS, 3
    elif rows >= 64:
        block_m, tile, warps, stages = max(64, min_m), 64, 4, 2
    else:
        block_m, tile, warps, stages = min_m, 64, DECODE_WARPS, 2
    wide = rows < 64 and _wide_tiles_fit(device, head_pad, stages, itemsize)
    programs = num_reqs * num_kv_heads
    per_sm = _programs_per_sm(device, 128 if wide else tile, head_pad, stages, itemsize)
    max_programs = 2 * _num_sms(device) * per_sm  # two waves
    splits = 1
    max_splits = max(1, max_seq_len // MIN_KEYS_PER_SPLIT)
    scratch = num_tokens * num_q_heads * (head_pad + 2) * 4
    while (
        splits * 2 <= min(max_splits, 64)
        and programs * splits * 2 <= max_programs
        and scratch * splits * 2 <= (64 << 20)
    ):
        splits *= 2
    if splits > 1 and wide:
        tile = 128  # split decode: 128-key tiles measured 6-24% faster at batch 4-32 (H200)
    return LaunchConfig(block_m, tile, splits, warps, stages)


def _smem_limit(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)


def _programs_per_sm(device: torch.device, tile: int, head_pad: int, stages: int, itemsize: int) -> int:
    """Decode programs of `tile`-key K and V tiles, `stages` deep, that one SM holds at once by
    shared memory (8 KiB each for the rest), at most 3 (the register file's bound at 4 warps,
    seen on the H200); 3 on the CPU."""
    if device.type != "cuda":
        return 3
    per_program = 2 * tile * head_pad * itemsize * stages + (8 << 10)
    return max(1, min(3, _smem_limit(device) // per_program))


def _wide_tiles_fit(device: torch.device, head_pad: int, stages: int, itemsize: int) -> bool:
    """Whether K and V tiles of 128 keys of `itemsize` bytes, `stages` deep, fit one program's
    shared memory with 32 KiB to spare (the interpreter has no limit)."""
    if device.type != "cuda":
        return True
    return 2 * 128 * head_pad * itemsize * stages + (32 << 10) <= _smem_limit(device)


def _check(
    q: torch.Tensor,
    cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    window: int,
) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [N, Hq, D], got shape {tuple(q.shape)}")
    if cache.dim() != 5 or cache.shape[0] != 2:
        raise ValueError(
            f"cache must be [2, num_blocks+1, block_size, Hkv, D], got shape {tuple(cache.shape)}"
        )
    if cache.shape[4] != q.shape[2]:
        raise ValueError(f"cache head_dim {cache.shape[4]} != q head_dim {q.shape[2]}")
    if q.shape[1] % cache.shape[3] != 0:
        raise ValueError(f"Hq={q.shape[1]} must be a multiple of Hkv={cache.shape[3]}")
    if q.dtype not in SUPPORTED_DTYPES or cache.dtype != q.dtype:
        raise ValueError(
            f"q/cache dtype must match and be one of {SUPPORTED_DTYPES}, got {q.dtype}/{cache.dtype}"
        )
    if q.stride(2) != 1 or cache.stride(4) != 1:
        raise ValueError("q and cache must be contiguous along head_dim")
    num_reqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_reqs + 1 or block_table.shape[0] != num_reqs:
        raise ValueError(
            f"query_start_loc must have B+1={num_reqs + 1} entries and "
            f"block_table B={num_reqs} rows, got {query_start_loc.shape[0]}, "
            f"{block_table.shape[0]}"
        )
    for name, t in (
        ("query_start_loc", query_start_loc),
        ("seq_lens", seq_lens),
        ("block_table", block_table),
    ):
        if t.dtype != torch.int32:
            raise ValueError(f"{name} must be int32, got {t.dtype}")
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")


def paged_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    max_query_len: int,
    max_seq_len: int,
    scale: Optional[float] = None,
    window: int = 0,
    out: Optional[torch.Tensor] = None,
    config: Optional[LaunchConfig] = None,
    order: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Attention of q [N, Hq, D] over the paged cache; returns out [N, Hq, D] (q's dtype).

    Semantics: kernels.reference.paged_attention_ref. max_query_len / max_seq_len are host
    ints that only steer the launch config (they need not be tight). `order` (decode-only
    batches, max_query_len == 1): int32 [B], a permutation of range(B) (not checked on the
    device), the order in which requests' programs launch; it changes speed, never results.
    """
    _check(q, cache, query_start_loc, seq_lens, block_table, window)
    if order is not None and (
        max_query_len != 1 or order.dtype != torch.int32 or tuple(order.shape) != (seq_lens.shape[0],)
    ):
        raise ValueError(
            f"order must be int32 [{seq_lens.shape[0]}] on a decode-only batch "
            f"(max_query_len 1), got {order.dtype} {tuple(order.shape)} with "
            f"max_query_len {max_query_len}"
        )
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = cache.shape[3], cache.shape[2]
    num_reqs = seq_lens.shape[0]
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0 or num_reqs == 0:
        return out
    head_pad = max(16, triton.next_power_of_2(head_dim))
    cfg = config or choose_config(
        num_tokens,
        num_reqs,
        num_q_heads,
        num_kv_heads,
        head_pad,
        max_query_len,
        max_seq_len,
        q.device,
        cache.element_size(),
    )
    group = num_q_heads // num_kv_heads
    check_config(cfg, group)
    block_q = max(1, cfg.block_m // group)
    scale = head_dim**-0.5 if scale is None else scale
    split = cfg.num_splits > 1
    pdl = pdl_enabled(q.device)
    if split:
        part = torch.empty(
            num_tokens, num_q_heads, cfg.num_splits, head_pad + 2, dtype=torch.float32, device=q.device
        )
    else:
        part = out
    axis0 = num_reqs if order is not None else num_tokens // block_q + num_reqs
    grid = (axis0, num_kv_heads, cfg.num_splits)
    launcher(_paged_attention_kernel, grid)(
        out,
        part,
        q,
        cache,
        block_table,
        seq_lens,
        query_start_loc,
        order if order is not None else seq_lens,
        num_reqs,
        cfg.num_splits,
        scale * LOG2E,
        window,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        cache.stride(0),
        cache.stride(1),
        cache.stride(2),
        cache.stride(3),
        block_table.stride(0),
        NUM_Q_HEADS=num_q_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        HEAD_PAD=head_pad,
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        BLOCK_M=cfg.block_m,
        TILE=cfg.tile,
        IS_SPLIT=split,
        USE_WINDOW=window > 0,
        USE_ORDER=order is not None,
        DOT_FP32=q.dtype == torch.float32 or _interpreting(),
        USE_PDL=pdl,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch_options(pdl),
    )
    if split:
        merge_splits(out, part, cfg.num_splits, pdl)
    return out


def merge_splits(
    out: torch.Tensor,
    part: torch.Tensor,
    num_splits: int,
    pdl: bool,
    decode_seq_lens: Optional[torch.Tensor] = None,
    window: int = 0,
    tile: int = 64,
    block_d: int = 0,
    num_warps: int = 4,
    balance_splits: int = 0,
) -> None:
    """Combine split-KV partials part [N, Hq, num_splits, HEAD_PAD + 2] (float32) into out
    [N, Hq, D]: one program per (row, head, block_d dims; 0 = the whole head).
    decode_seq_lens (int32 [N], row n a decode request's query, `tile` the launch's): read
    only the partials of splits that own tiles. balance_splits > 0 (with decode_seq_lens): the
    attention launch was a balanced one (LaunchConfig.balance_splits) and wrote the rows that
    one split owns to out itself; those rows are left as they are."""
    num_tokens, num_q_heads, head_dim = out.shape
    head_pad = part.shape[3] - 2
    if block_d and (block_d & (block_d - 1) or head_pad % block_d):
        raise ValueError(f"merge block_d {block_d} must be a power of two dividing {head_pad}")
    active = decode_seq_lens is not None
    if balance_splits and not active:
        raise ValueError("merge_splits: balance_splits needs decode_seq_lens (a decode batch's rows)")
    launcher(_merge_splits_kernel, (num_tokens, num_q_heads, head_pad // block_d if block_d else 1))(
        out,
        part,
        decode_seq_lens if active else out,
        window,
        num_tokens,
        max(balance_splits, 1),
        out.stride(0),
        out.stride(1),
        NUM_Q_HEADS=num_q_heads,
        HEAD_DIM=head_dim,
        HEAD_PAD=head_pad,
        NUM_SPLITS=num_splits,
        TILE=tile,
        USE_WINDOW=window > 0,
        USE_ACTIVE=active,
        USE_PDL=pdl,
        BLOCK_D=block_d or head_pad,
        BALANCE=balance_splits > 0,
        MAX_ROWS=balance_max_rows(num_tokens) if balance_splits else 16,
        num_warps=num_warps,
        **launch_options(pdl),
    )


def balance_max_rows(num_rows: int) -> int:
    """The MAX_ROWS constexpr of a balanced launch of num_rows rows: a power of two >= 16, so
    graph sizes 1-64 compile at most three variants."""
    return max(16, triton.next_power_of_2(num_rows))
