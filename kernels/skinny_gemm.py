"""Skinny GEMM: out = x @ w.T (+ bias) for few rows of x (decode projections), one launch.

At decode the projections have 1-64 rows against weights of 2-12 MB (Qwen3-0.6B): the work is
reading the weight once, about 1-3 us on an H200, yet cuBLAS took 5.4-8 us per GEMM at every
row count (benchmarks/RESULTS.md, issue 6): its tiles are sized for many rows, so few programs
stream the weight. Here the grid is (N / BLOCK_N tiles of w's rows) x (num_splits slices of K),
chosen so that enough programs run to keep every SM's loads in flight; each program streams its
[BLOCK_N, K slice] of w (K contiguous: coalesced) exactly once and accumulates in float32.

Two ways to multiply a tile (USE_DOT): tl.dot on tensor cores with x padded to BLOCK_M >= 16
rows (any row count), or (for 1-4 rows) a broadcast multiply into a [BLOCK_M, BLOCK_N, BLOCK_K]
float32 accumulator reduced once after the K loop (no tensor cores, no padding).

Split K in one launch (USE_SPLIT): every program stores its float32 partial [M, BLOCK_N] into
`part` at its split's slice, then bumps its tile's arrival counter (acq_rel, GPU scope, after a
CTA barrier so every thread's stores come first). The program that arrives last sums the
partials of all splits in split order (so the result does not depend on which program came
last: deterministic), adds the bias, rounds once to out's dtype, stores, and resets the counter
to zero. Invariant: every counter is zero between launches, so the buffers can be reused by the
next launch and by CUDA-graph replays without a memset. The partials are read through L2
(`.cg`): another SM wrote them.

Fusions, each a constexpr switch, so one launch can stand for a few of a decoder layer's
kernels: USE_NORM (the layer's RMSNorm of x rows as a prologue: every program recomputes its
rows' float32 statistics over all of K, then normalises each x tile as it loads it, with
transformers' rounding order), USE_SILU_MUL (w is gate|up: two accumulators, silu(gate) * up
stored), USE_RESIDUAL (the result plus a residual row, the decoder's `hidden + proj(...)`).
With split K these run in the last-arriving program's epilogue.

The one-tile path (`_gemv_kernel`, SkinnyConfig(gemv=True), up to MAX_GEMV_ROWS rows): a
tile is a whole row (BLOCK_K >= K), BLOCK_N is 1-8 weight rows, the weight load is issued first
and the kernel has no K loop, so every program's loads are in flight at once; after the wait
all x rows in one round of loads, then each row in turn against the tile in registers; the same
fusions, each row's RMSNorm statistics taken from that row (all rows' in one reduction before
the row loop, when there are several). At one row it took the 0.6B
decode step from 1.43 to 1.05 ms on the H200 (benchmarks/RESULTS.md, fifth session).

Which (BLOCK_N, BLOCK_K, num_splits, USE_DOT) is fastest depends on the shape and the device;
callers choose by measuring (worker/skinny_linear.py), never by rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from enginespec.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_options, pdl_enabled

# Both kernels launch with programmatic dependent launch (kernels/pdl.py): each GEMV's weight
# read (the tiled kernel's first K step of its slice) starts while the kernel before it in the
# stream finishes, and only its reads of x and the residual wait for it. H200, 6edd423
# (benchmarks/gpu_round6d.sh), the one-tile kernel: the batch-1 decode graph 0.913 -> 0.853 ms,
# LLM.generate 1.035 -> 0.974 ms/token. The tiled kernel's: 16- and 32-row decode steps 7-9% and
# 4-6% faster once routed (benchmarks/RESULTS.md, fourteenth session).


@triton.jit
def _store_out(
    out_ptrs,
    bias_ptr,
    acc,
    acc_up,
    res,
    cols,
    N,
    mask,
    USE_BIAS: tl.constexpr,
    USE_SILU_MUL: tl.constexpr,
    USE_RESIDUAL: tl.constexpr,
):
    """acc float32 (any tile shape: [BLOCK_M, BLOCK_N], or one row's [BLOCK_N, 1]) (+ bias) ->
    out, rounded once. out_ptrs point at each element's output, cols is its output column
    (broadcast to acc's shape), res the residual's values there (_residual: read by the caller,
    as early as it may). USE_SILU_MUL: acc is the gate and acc_up the up projection (bias columns
    N + cols); each is rounded to out's dtype as the GEMM would store it, then silu(gate) * up
    in float32, rounded once (the compiled decoder's fused elementwise kernel computes it the
    same way). USE_RESIDUAL: the rounded result plus the residual, rounded once more (the
    decoder's `hidden + proj(...)`)."""
    ty = out_ptrs.dtype.element_ty
    if USE_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        if USE_SILU_MUL:
            acc_up += tl.load(bias_ptr + N + cols, mask=cols < N, other=0.0).to(tl.float32)
    if USE_SILU_MUL:
        gate = acc.to(ty).to(tl.float32)
        acc = gate * tl.sigmoid(gate) * acc_up.to(ty).to(tl.float32)
    if USE_RESIDUAL:
        acc = acc.to(ty).to(tl.float32) + res.to(tl.float32)
    tl.store(out_ptrs, acc.to(ty), mask=mask)


@triton.jit
def _residual(res_ptrs, mask, USE_RESIDUAL: tl.constexpr):
    """The residual's values at res_ptrs (USE_RESIDUAL), else a placeholder _store_out ignores."""
    if USE_RESIDUAL:
        return tl.load(res_ptrs, mask=mask, other=0.0)
    else:
        return 0.0


@triton.jit
def _rstd(sum_sq, K, eps):
    """1 / sqrt(mean(x^2) + eps) from a row's float32 sum of squares over its K elements."""
    return 1.0 / tl.sqrt(sum_sq / K + eps)


@triton.jit
def _row_rstd(x_rows, mask_m, K, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, ROW_K: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of each x row [BLOCK_M] over all K (float32): the RMSNorm
    statistics, recomputed by every program (a row is a few KiB, read from L2). ROW_K > 0 (a
    power of two >= K): the rows in one load, one round of latency; 0: BLOCK_K steps, one round
    each (for rows too long to hold in registers)."""
    sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ROW_K > 0:
        cols = tl.arange(0, ROW_K)
        rows = tl.load(x_rows + cols[None, :], mask=mask_m[:, None] & (cols < K)[None, :], other=0.0).to(
            tl.float32
        )
        sum_sq = tl.sum(rows * rows, axis=1)
    else:
        rk = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            x = tl.load(x_rows + kk[None, :], mask=mask_m[:, None] & (kk < K)[None, :], other=0.0).to(
                tl.float32
            )
            sum_sq += tl.sum(x * x, axis=1)
    return _rstd(sum_sq, K, eps)


@triton.jit
def _row_scaled(acc, acc_up, rstd, USE_ROW_SCALE: tl.constexpr, USE_SILU_MUL: tl.constexpr):
    """USE_ROW_SCALE (a folded RMSNorm): acc [BLOCK_M, BLOCK_N] (and acc_up) times each x row's
    scale rstd [BLOCK_M] (float32, from _row_rstd in the prologue); else both as they are."""
    if USE_ROW_SCALE:
        acc = acc * rstd[:, None]
        if USE_SILU_MUL:
            acc_up = acc_up * rstd[:, None]
    return acc, acc_up


@triton.jit
def _normed(x, rstd, norm_ptr, kk, mask_k):
    """x [BM, BK] -> the RMSNorm module's output on these columns (_normed_by), the norm's
    weight read here."""
    return _normed_by(x, rstd, tl.load(norm_ptr + kk, mask=mask_k, other=0.0)[None, :])


@triton.jit
def _normed_by(x, rstd, norm_w):
    """x [BM, BK], rstd [BM], the norm's weight on these columns ([1, BK], or x's shape) ->
    (x * rstd) rounded to x's dtype, times the weight, rounded again (transformers' rounding
    order)."""
    ty = x.dtype
    n = (x.to(tl.float32) * rstd[:, None]).to(ty).to(tl.float32)
    return (norm_w.to(tl.float32) * n).to(ty)


@triton.jit
def _x_tile(x_rows, kk, mask_m, K, rstd, norm_ptr, USE_NORM: tl.constexpr):
    """x rows [BLOCK_M, 1] at columns kk [BLOCK_K] -> [BLOCK_M, BLOCK_K], RMS-normed with USE_NORM."""
    mask_k = kk < K
    x = tl.load(x_rows + kk[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
    if USE_NORM:
        x = _normed(x, rstd, norm_ptr, kk, mask_k)
    return x


@triton.jit
def _w_tiles(w_rows, up_rows, kk, mask_n, K, USE_SILU_MUL: tl.constexpr):
    """The weight tile [BLOCK_N, BLOCK_K] at columns kk of rows w_rows [BLOCK_N, 1], and with
    USE_SILU_MUL the up rows' tile (else the same tile again, not loaded twice)."""
    w_mask = mask_n[:, None] & (kk < K)[None, :]
    w = tl.load(w_rows + kk[None, :], mask=w_mask, other=0.0)
    w_up = w
    if USE_SILU_MUL:
        w_up = tl.load(up_rows + kk[None, :], mask=w_mask, other=0.0)
    return w, w_up


@triton.jit
def _mul_tile(acc, acc3, x, w, USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr):
    """One K step of a tile: x [BM, BK] times w [BN, BK].T into acc [BM, BN] (tensor cores) or
    into acc3 [BM, BN, BK] (broadcast; reduced over K once after the loop)."""
    if USE_DOT and DOT_FP32:  # float32 operands, no TF32 rounding
        acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    elif USE_DOT:
        acc = tl.dot(x, tl.trans(w), acc)
    else:
        acc3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc, acc3


@triton.jit(do_not_specialize=["M"])  # one variant for every row count (no compile at graph capture)
def _skinny_gemm_kernel(
    out_ptr,  # [M, N] x's dtype
    x_ptr,  # [M, K], K contiguous
    w_ptr,  # [N, K] (USE_SILU_MUL: [2 N, K], gate rows then up rows), K contiguous (nn.Linear's layout)
    bias_ptr,  # [N] (USE_SILU_MUL: [2 N]) (USE_BIAS only)
    part_ptr,  # [num_splits, M, N] (USE_SILU_MUL: [num_splits, M, 2 N]) float32 partials (USE_SPLIT only)
    count_ptr,  # [cdiv(N, BLOCK_N)] int32 arrivals per tile, zero between launches (USE_SPLIT only)
    norm_ptr,  # [K] RMSNorm weight applied to x rows first (USE_NORM only)
    res_ptr,  # [M, N] residual added to the result (USE_RESIDUAL only)
    M,
    N,  # output columns
    K,
    k_per_split,  # a multiple of BLOCK_K; split s covers [s * k_per_split, (s + 1) * k_per_split) & [0, K)
    eps,  # RMSNorm epsilon (USE_NORM only)
    stride_xm,
    stride_wn,
    stride_om,
    stride_rm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    USE_SPLIT: tl.constexpr,
    USE_BIAS: tl.constexpr,
    USE_SILU_MUL: tl.constexpr,
    USE_NORM: tl.constexpr,
    USE_RESIDUAL: tl.constexpr,
    DOT_FP32: tl.constexpr,
    USE_PDL: tl.constexpr = False,
    ROW_K: tl.constexpr = 0,  # USE_NORM / USE_ROW_SCALE: _row_rstd's one-load width (0: its K loop)
    USE_ROW_SCALE: tl.constexpr = False,  # a folded RMSNorm: the result times each x row's scale
):
    """USE_PDL (launched with launch_pdl): the slice's first weight tile (gate and up tiles with
    USE_SILU_MUL) is loaded before waiting for the previous kernel in the stream (gdc_wait);
    x, the norm's statistics, the rest of the slice, the partials, the counters and the residual
    after. With the most K splits (a slice of one BLOCK_K step) the whole weight is in flight
    before the wait, as in the one-tile kernel. USE_ROW_SCALE: x rows are not normed; the
    epilogue multiplies each row's float32 result by its RMS scale, which every program takes
    from the whole rows right after the wait (as USE_NORM's statistics): no dot waits for it and
    no x tile in the loop is touched. Squares summed from the loop's x tiles instead put an
    elementwise use on the dot operands, and the 64 x 256 gate|up SiLU tile took 10.1 us against
    6.8 without the scale (H100, benchmarks/RESULTS.md, fifty-first session); the rows read again
    in the epilogue, 7.9 (fiftieth)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    mask_m, mask_n = rm < M, rn < N
    x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm  # [BLOCK_M, 1]
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn  # [BLOCK_N, 1]
    up_rows = w_rows + N * stride_wn  # [BLOCK_N, 1] (USE_SILU_MUL only)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, BLOCK_N, 1 if USE_DOT else BLOCK_K], dtype=tl.float32)
    acc3_up = tl.zeros([BLOCK_M, BLOCK_N, 1 if USE_DOT or not USE_SILU_MUL else BLOCK_K], dtype=tl.float32)
    k_start = pid_k * k_per_split
    kk = k_start + rk  # [BLOCK_K] the slice's first step, peeled: its weight is read before the wait
    w, w_up = _w_tiles(w_rows, up_rows, kk, mask_n, K, USE_SILU_MUL)  # [BN, BK] each
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()  # from here on, the previous kernel's writes (x, the residual) are visible
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if USE_NORM or USE_ROW_SCALE:  # USE_ROW_SCALE: only the epilogue reads it, no dot waits for it
        rstd = _row_rstd(x_rows, mask_m, K, eps, BLOCK_M, BLOCK_K, ROW_K)  # [BLOCK_M]
    x = _x_tile(x_rows, kk, mask_m, K, rstd, norm_ptr, USE_NORM)  # [BM, BK]
    acc, acc3 = _mul_tile(acc, acc3, x, w, USE_DOT, DOT_FP32)
    if USE_SILU_MUL:
        acc_up, acc3_up = _mul_tile(acc_up, acc3_up, x, w_up, USE_DOT, DOT_FP32)
    for k0 in range(k_start + BLOCK_K, k_start + k_per_split, BLOCK_K):
        kk = k0 + rk  # [BLOCK_K]
        x = _x_tile(x_rows, kk, mask_m, K, rstd, norm_ptr, USE_NORM)  # [BM, BK]
        w, w_up = _w_tiles(w_rows, up_rows, kk, mask_n, K, USE_SILU_MUL)  # [BN, BK] each
        acc, acc3 = _mul_tile(acc, acc3, x, w, USE_DOT, DOT_FP32)
        if USE_SILU_MUL:
            acc_up, acc3_up = _mul_tile(acc_up, acc3_up, x, w_up, USE_DOT, DOT_FP32)
    if not USE_DOT:
        acc = tl.sum(acc3, axis=2)  # [BLOCK_M, BLOCK_N]
        if USE_SILU_MUL:
            acc_up = tl.sum(acc3_up, axis=2)
    mask = mask_m[:, None] & mask_n[None, :]
    out_ptrs = out_ptr + rm[:, None] * stride_om + rn[None, :]  # [BLOCK_M, BLOCK_N]
    res_ptrs = res_ptr + rm[:, None] * stride_rm + rn[None, :]  # [BLOCK_M, BLOCK_N] (USE_RESIDUAL only)
    if USE_SPLIT:
        part_n = 2 * N if USE_SILU_MUL else N  # partial columns: gate (and up) sums
        part = part_ptr + rm[:, None] * part_n + rn[None, :]  # [BLOCK_M, BLOCK_N] within one split
        tl.store(part + pid_k * M * part_n, acc, mask=mask)
        if USE_SILU_MUL:
            tl.store(part + pid_k * M * part_n + N, acc_up, mask=mask)
        tl.debug_barrier()  # every thread's partial is stored before the arrival is published
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == tl.num_programs(1) - 1:  # the last to arrive reduces, in split order
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in range(0, tl.num_programs(1)):
                acc += tl.load(part + s * M * part_n, mask=mask, other=0.0, cache_modifier=".cg")
                if USE_SILU_MUL:
                    acc_up += tl.load(part + s * M * part_n + N, mask=mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + pid_n, 0)  # zero again for the next launch
            acc, acc_up = _row_scaled(acc, acc_up, rstd, USE_ROW_SCALE, USE_SILU_MUL)
            res = _residual(res_ptrs, mask, USE_RESIDUAL)
            _store_out(out_ptrs, bias_ptr, acc, acc_up, res, rn[None, :], N, mask,
                       USE_BIAS, USE_SILU_MUL, USE_RESIDUAL)  # fmt: skip
    else:
        acc, acc_up = _row_scaled(acc, acc_up, rstd, USE_ROW_SCALE, USE_SILU_MUL)
        res = _residual(res_ptrs, mask, USE_RESIDUAL)
        _store_out(out_ptrs, bias_ptr, acc, acc_up, res, rn[None, :], N, mask,
                   USE_BIAS, USE_SILU_MUL, USE_RESIDUAL)  # fmt: skip


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(
    out_ptr,  # [M, N] x's dtype
    x_ptr,  # [M, K], K contiguous
    w_ptr,  # [N, K] (USE_SILU_MUL: [2 N, K], gate rows then up rows), K contiguous
    bias_ptr,  # [N] (USE_SILU_MUL: [2 N]) (USE_BIAS only)
    norm_ptr,  # [K] RMSNorm weight applied to x rows first (USE_NORM only)
    res_ptr,  # [M, N] residual added to the result (USE_RESIDUAL only)
    M,
    N,  # output columns
    K,  # <= BLOCK_K: one tile holds a whole row
    eps,  # RMSNorm epsilon (USE_NORM only)
    stride_xm,
    stride_wn,
    stride_om,
    stride_rm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_BIAS: tl.constexpr,
    USE_SILU_MUL: tl.constexpr,
    USE_NORM: tl.constexpr,
    USE_RESIDUAL: tl.constexpr,
    USE_PDL: tl.constexpr = False,
    USE_ROW_SCALE: tl.constexpr = False,  # a folded RMSNorm: the result times each x row's scale
):
    """The one-tile path (GEMV): BLOCK_K >= K, so a program reads its BLOCK_N weight rows in
    one load issued before anything else (no K loop, nothing to wait for first). After the
    wait it loads all its x rows (and residual rows) in one round, then takes them one at a
    time (a loop unrolled over BLOCK_M <= MAX_GEMV_ROWS): the row is taken out of the block by
    a masked sum (exact; with USE_NORM and several rows, every row was normed before the loop,
    its statistics in one reduction), normed at one row, multiplied with the
    tile held in registers and stored. Registers (triton 3.6, sm_90): 39-62 a thread at one
    row, 87-156 at eight, no spills; a [BLOCK_M, BLOCK_N, BLOCK_K] broadcast product would hold
    BLOCK_M times the tile. Its time grows with the rows (FMAs on CUDA cores and reductions per
    row), which is why the tuning offers it up to worker/gemm_tuning.GEMV_TUNE_ROWS rows. With BLOCK_N of 1-8 a projection
    has hundreds to thousands of programs, all resident at once: the whole weight is in flight
    together, which is what a bandwidth-bound read of a few MiB needs. USE_PDL (launched with
    launch_pdl): the weight loads are issued before waiting for the previous kernel in the
    stream (gdc_wait), as is the read of the norm's weight (a parameter: no kernel writes it);
    every read of what an earlier kernel wrote (x, the norm's input, the residual) and every
    store come after it; the next kernel may launch at once. USE_ROW_SCALE: the x rows are not
    normed; every row's RMS scale comes from the rows already in registers (one reduction for
    all of them) and multiplies that row's float32 results just before they are stored, so no
    dot waits for it."""
    pid_n = tl.program_id(0)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rk = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    mask_n, mask_k = rn < N, rk < K
    w_tile = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]  # [BLOCK_N, BLOCK_K]
    w_mask = mask_n[:, None] & mask_k[None, :]
    w = tl.load(w_tile, mask=w_mask, other=0.0)  # [BN, BK]: the weight read is the kernel
    w_up = w
    if USE_SILU_MUL:
        w_up = tl.load(w_tile + N * stride_wn, mask=w_mask, other=0.0)  # [BN, BK]
    if USE_NORM:
        norm_w = tl.load(
            norm_ptr + rk[None, :], mask=mask_k[None, :], other=0.0
        )  # [1, BK]: a weight, before the wait
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()  # from here on, the previous kernel's writes are visible
    # Every x row (and residual row) in one round of loads right after the wait: inside the
    # loop, a row's loads would sit behind the previous row's reduction barriers
    rm = tl.arange(0, BLOCK_M)  # [BM]
    rows_ok = rm < M  # [BM]
    x_all = tl.load(
        x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=rows_ok[:, None] & mask_k[None, :], other=0.0
    )
    res_ptrs = res_ptr + rm[None, :] * stride_rm + rn[:, None]  # [BN, BM]
    res_all = _residual(res_ptrs, mask_n[:, None] & rows_ok[None, :], USE_RESIDUAL)  # [BN, BM]
    if USE_NORM and BLOCK_M > 1:  # every row's statistics in one reduction, not one a row
        xa = x_all.to(tl.float32)
        x_all = _normed_by(x_all, _rstd(tl.sum(xa * xa, axis=1), K, eps), norm_w)  # [BM, BK]
    scales = tl.zeros([BLOCK_M], dtype=tl.float32)
    if USE_ROW_SCALE:
        xs = x_all.to(tl.float32)
        scales = _rstd(tl.sum(xs * xs, axis=1), K, eps)  # [BM]
    for m in tl.static_range(BLOCK_M):  # one x row at a time against the tile held in registers
        row_ok = (tl.zeros([1], dtype=tl.int32) + m) < M  # [1]
        # row m of x_all (a sum over one nonzero: exact)
        x = tl.sum(tl.where(rm[:, None] == m, x_all.to(tl.float32), 0.0), axis=0)[None, :].to(x_all.dtype)
        cols, mask = rn[:, None], mask_n[:, None] & row_ok[None, :]  # [BN, 1]
        res = res_all
        if USE_RESIDUAL:  # column m of res_all: [BN, 1]
            res = tl.sum(tl.where(rm[None, :] == m, res_all.to(tl.float32), 0.0), axis=1, keep_dims=True)
        if USE_NORM and BLOCK_M == 1:
            xf = x.to(tl.float32)
            rstd = _rstd(tl.sum(xf * xf, axis=1), K, eps)  # [1]
            x = _normed_by(x, rstd, norm_w)
        xf = x.to(tl.float32)  # [1, BK]
        acc = tl.sum(w.to(tl.float32) * xf, axis=1, keep_dims=True)  # [BN, 1]
        acc_up = acc
        if USE_SILU_MUL:
            acc_up = tl.sum(w_up.to(tl.float32) * xf, axis=1, keep_dims=True)
        if USE_ROW_SCALE:  # row m's scale (a sum over one nonzero: exact)
            r = tl.sum(tl.where(rm == m, scales, 0.0), axis=0)
            acc = acc * r
            acc_up = acc_up * r
        _store_out(out_ptr + m * stride_om + cols, bias_ptr, acc, acc_up, res, cols, N, mask,
                   USE_BIAS, USE_SILU_MUL, USE_RESIDUAL)  # fmt: skip


@dataclass(frozen=True)
class SkinnyConfig:
    """One launch shape. block_m is derived from the row count (launch()); num_splits is an
    upper bound (the K slices are whole BLOCK_K multiples, so fewer may result).
    gemv: the one-tile kernel (_gemv_kernel): broadcast, one split, block_k >= K (checked at
    launch), and block_n may go down to 1 (more programs, each one weight row or a few)."""

    block_n: int
    block_k: int
    num_splits: int = 1
    use_dot: bool = True
    num_warps: int = 4
    num_stages: int = 3
    gemv: bool = False

    def __post_init__(self) -> None:
        min_n = 1 if self.gemv else 8
        for name, least in (("block_n", min_n), ("block_k", 8)):
            value = getattr(self, name)
            if value < least or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= {least}, got {value}")
        if self.num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {self.num_splits}")
        if self.use_dot and self.block_n < 16:
            raise ValueError(f"block_n must be >= 16 with use_dot (tl.dot's minimum), got {self.block_n}")
        if self.gemv and (self.use_dot or self.num_splits != 1):
            raise ValueError("gemv configs take use_dot=False and num_splits=1")

    @property
    def max_rows(self) -> Optional[int]:
        """The most x rows a launch of this shape takes (None: any number; tensor cores)."""
        if self.gemv:
            return MAX_GEMV_ROWS
        return None if self.use_dot else MAX_BROADCAST_ROWS

    def block_m(self, num_rows: int) -> int:
        """Rows of the x tile: a power of two holding num_rows; at least 16 for tl.dot."""
        pow2 = triton.next_power_of_2(max(1, num_rows))
        return max(16, pow2) if self.use_dot else pow2


def interpreting() -> bool:
    """Under TRITON_INTERPRET the numpy-backed tl.dot mishandles bf16 (triton 3.9), so dots run
    on float32 copies of the operands there (as paged_attention does); on a GPU in x's dtype."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# The broadcast (no tensor core) tiled path keeps a [BLOCK_M, BLOCK_N, BLOCK_K] float32
# accumulator: it is meant for a handful of rows only.
MAX_BROADCAST_ROWS = 4
# The one-tile GEMV holds its x rows as one block and loops over them (unrolled): registers and
# time grow with the rows, and the startup tuning offers it up to worker/gemm_tuning.GEMV_TUNE_ROWS
# rows only.
MAX_GEMV_ROWS = 8


# The tiled kernel's fused RMSNorm reads its x rows whole (one load) for the statistics while
# the block's rows hold at most this many elements (16 rows of 2,048, or 32 of 1,024: 64 KiB of
# bf16, 128 registers a thread at 4 warps); longer rows or more of them take BLOCK_K steps.
# Before, every K was stepped: at 16 rows and K 1,024 (four 256-wide steps, a round of latency
# each) the fused q|k|v measured 7.45 us against 5.35 for cuBLAS alone (tuning table, H200,
# eighteenth session), so the norm ran as its own launch.
ROW_K_MAX_ELEMENTS = 16 * 2048


def row_k(k: int, block_m: int) -> int:
    """_row_rstd's one-load width for block_m rows of k elements (0: too many, step them)."""
    width = triton.next_power_of_2(k)
    return width if block_m * width <= ROW_K_MAX_ELEMENTS else 0


class SplitBuffers:
    """The split-K scratch of one device: float32 partials and int32 arrival counters, grown on
    demand, never shrunk. Invariant: every counter is zero between launches (the kernel's last
    program of a tile resets its counter), so launches on one stream may share them."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.part = torch.empty(0, dtype=torch.float32, device=self.device)
        self.counts = torch.zeros(0, dtype=torch.int32, device=self.device)

    def get(self, num_part: int, num_counts: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.part.numel() < num_part:
            self.part = torch.empty(num_part, dtype=torch.float32, device=self.device)
        if self.counts.numel() < num_counts:
            self.counts = torch.zeros(num_counts, dtype=torch.int32, device=self.device)
        return self.part, self.counts


def launch_grid(config: SkinnyConfig, n: int, k: int) -> tuple[int, int, int]:
    """(tiles over N, splits over K, k_per_split) of a launch."""
    k_per_split = triton.cdiv(triton.cdiv(k, config.num_splits), config.block_k) * config.block_k
    return triton.cdiv(n, config.block_n), triton.cdiv(k, k_per_split), k_per_split


def _check(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], config: SkinnyConfig, silu_mul: bool
):
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"skinny_linear: x must be [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(
            f"skinny_linear: x and weight must share dtype and device, got {x.dtype}, {weight.dtype}"
        )
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("skinny_linear: x and weight need a contiguous last dim")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"skinny_linear: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
    if silu_mul and weight.shape[0] % 2:
        raise ValueError(f"skinny_linear: silu_mul needs gate|up rows (an even N), got N = {weight.shape[0]}")
    if config.gemv and x.shape[1] > config.block_k:
        raise ValueError(
            f"skinny_linear: a gemv config needs K <= block_k = {config.block_k}, got K = {x.shape[1]}"
        )
    if config.max_rows is not None and x.shape[0] > config.max_rows:
        kind = "a gemv config" if config.gemv else "use_dot=False"
        raise ValueError(f"skinny_linear: {kind} takes at most {config.max_rows} rows, got {x.shape[0]}")


def _check_fusions(
    x, out_cols: int, norm_weight, eps: float, residual, silu_mul: bool, row_scale=False, bias=None
) -> None:
    if row_scale and (norm_weight is not None or residual is not None or bias is not None or eps <= 0):
        raise ValueError(
            "skinny_linear: row_scale needs eps > 0 and takes no norm_weight, residual or bias "
            f"(a folded norm's GEMM has none), got eps {eps}"
        )
    if norm_weight is not None and (norm_weight.shape != (x.shape[1],) or eps <= 0):
        raise ValueError(
            f"skinny_linear: norm_weight must be [{x.shape[1]}] with eps > 0, got {tuple(norm_weight.shape)}, {eps}"
        )
    if residual is None:
        return
    if (
        silu_mul
        or residual.shape != (x.shape[0], out_cols)
        or residual.dtype != x.dtype
        or residual.stride(-1) != 1
    ):
        raise ValueError(
            f"skinny_linear: residual must be a [{x.shape[0]}, {out_cols}] {x.dtype} tensor with a contiguous "
            f"last dim, and not with silu_mul; got {tuple(residual.shape)} {residual.dtype}"
        )


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    config: SkinnyConfig,
    buffers: Optional[SplitBuffers] = None,
    silu_mul: bool = False,
    norm_weight: Optional[torch.Tensor] = None,
    eps: float = 0.0,
    residual: Optional[torch.Tensor] = None,
    compile_only: bool = False,
    row_scale: bool = False,
) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T (+ bias [N]) -> [M, N] in x's dtype, float32 accumulation.
    What else runs in the same launch:
    - norm_weight [K], eps: x rows are RMS-normed first (the decoder's input/post-attention
      RMSNorm: float32 statistics, rounded, times the weight, rounded: kernels.reference.rms_norm_ref);
    - row_scale, eps (a norm folded into weight: worker/merged_decoder.py's fold_norms): each
      row's float32 result times 1 / sqrt(mean(x_row^2) + eps) before the rest of the epilogue
      (kernels.reference.row_scaled_linear_ref); no norm_weight, residual or bias with it;
    - silu_mul: weight is gate|up [2 I, K] and the result is silu(gate) * up, [M, I];
    - residual [M, N]: the result plus residual (the decoder's `hidden + o_proj(...)`).
    `buffers`: the split-K scratch (a fresh one per call when None: fine for tests, not for a
    hot path). compile_only: compile the launch's kernel variant (Triton's warmup) and launch
    nothing; the returned tensor is then uninitialised. Semantics: kernels.reference
    linear_ref, silu_mul_ref, rms_norm_ref."""
    _check(x, weight, bias, config, silu_mul)
    m, k = x.shape
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    _check_fusions(x, n, norm_weight, eps, residual, silu_mul, row_scale, bias)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    if config.gemv:
        _launch_gemv(
            out, x, weight, bias, config, silu_mul, norm_weight, eps, residual, compile_only, row_scale
        )
        return out
    tiles, splits, k_per_split = launch_grid(config, n, k)
    part = counts = out  # unused pointers when there is one split
    if splits > 1:
        part_cols = 2 * n if silu_mul else n
        part, counts = (buffers or SplitBuffers(x.device)).get(splits * m * part_cols, tiles)
    kernel = _skinny_gemm_kernel.warmup if compile_only else _skinny_gemm_kernel[(tiles, splits)]
    extra = {"grid": (tiles, splits)} if compile_only else {}
    pdl = pdl_enabled(x.device)
    kernel(
        out,
        x,
        weight,
        bias if bias is not None else out,
        part,
        counts,
        norm_weight if norm_weight is not None else out,
        residual if residual is not None else out,
        m,
        n,
        k,
        k_per_split,
        float(eps),
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        residual.stride(0) if residual is not None else 0,
        BLOCK_M=config.block_m(m),
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        USE_DOT=config.use_dot,
        USE_SPLIT=splits > 1,
        USE_BIAS=bias is not None,
        USE_SILU_MUL=silu_mul,
        USE_NORM=norm_weight is not None,
        USE_RESIDUAL=residual is not None,
        DOT_FP32=x.dtype == torch.float32 or interpreting(),
        USE_PDL=pdl,
        ROW_K=row_k(k, config.block_m(m)) if norm_weight is not None or row_scale else 0,
        USE_ROW_SCALE=row_scale,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **launch_options(pdl),
        **extra,
    )
    return out


def _launch_gemv(
    out,
    x,
    weight,
    bias,
    config: SkinnyConfig,
    silu_mul,
    norm_weight,
    eps,
    residual,
    compile_only,
    row_scale=False,
):
    """skinny_linear's launch of the one-tile kernel (checked there: K <= block_k)."""
    (m, k), n = x.shape, out.shape[1]
    grid = (triton.cdiv(n, config.block_n),)
    kernel = _gemv_kernel.warmup if compile_only else _gemv_kernel[grid]
    pdl = pdl_enabled(x.device)
    kernel(
        out,
        x,
        weight,
        bias if bias is not None else out,
        norm_weight if norm_weight is not None else out,
        residual if residual is not None else out,
        m,
        n,
        k,
        float(eps),
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        residual.stride(0) if residual is not None else 0,
        BLOCK_M=config.block_m(m),
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        USE_BIAS=bias is not None,
        USE_SILU_MUL=silu_mul,
        USE_NORM=norm_weight is not None,
        USE_RESIDUAL=residual is not None,
        USE_PDL=pdl,
        USE_ROW_SCALE=row_scale,
        num_warps=config.num_warps,
        num_stages=1,
        **launch_options(pdl),
        **({"grid": grid} if compile_only else {}),
    )
