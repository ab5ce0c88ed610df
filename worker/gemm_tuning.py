"""Timing helpers for worker/skinny_linear.py's measured GEMM choice: a CUDA-graph timer and the
launch shapes worth timing for a (row bucket, N, K).

Timing conditions are a decode step's: the GEMMs of every layer (distinct weights, so L2 holds
none of them) back to back inside one CUDA graph (no launch gaps from the host), the median
of several replays, each timed with CUDA events.
"""

from __future__ import annotations

import statistics
from typing import Callable

import torch


def graph_us(fn: Callable[[], list], num_calls: int, reps: int = 7) -> tuple[float, list]:
    """Microseconds per call of fn (which makes num_calls GEMMs and returns their outputs)
    replayed from a CUDA graph: the median of `reps` replays timed with events, after a warm-up
    run and one replay. Also returns float32 copies of the outputs as the last replay left them
    (back-to-back replays are where a split-K launch that left a counter set would go wrong)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / num_calls)
    return statistics.median(times), [o.float() for o in outs]


def candidates(bucket: int, n: int, k: int, num_sms: int, silu_mul: bool = False) -> list:
    """Launch shapes worth timing for a row bucket and N output columns: tensor-core tiles
    (BLOCK_N 32/64, BLOCK_K 128/256, within ~160 KiB of 3-stage shared memory; silu_mul streams
    two weight tiles) and, for at most 4 rows, broadcast tiles; each with one K split, with
    the fewest splits (a power of two, <= 8) that give every SM a program, and with the most
    (<= 8; slices of one or two BLOCK_K steps: the tiled kernel reads a slice's first step
    before its PDL wait, so a one-step slice has its whole weight in flight); for at most
    GEMV_TUNE_ROWS rows, one-tile GEMV shapes; for ONE_STEP_ROWS, tiles of one 1,024-long K step
    a split (_one_step_candidates). A list to measure,
    not a ranking."""
    from enginespec.kernels.skinny_gemm import MAX_BROADCAST_ROWS, SkinnyConfig

    def splits(block_n: int, block_k: int) -> list[int]:
        tiles, num, most = -(-n // block_n), 1, 1
        while tiles * num < num_sms and num < 8 and k // (2 * num) >= block_k:
            num *= 2
        while most < 8 and k // (2 * most) >= block_k:
            most *= 2
        return sorted({1, num, most})

    out = []
    block_m, tiles_w = max(16, bucket), 2 if silu_mul else 1
    for block_n in (32, 64):
        for block_k in (128, 256):
            if 3 * (block_m + tiles_w * block_n) * block_k * 2 > 160 * 1024 or block_k > k:
                continue
            out += [SkinnyConfig(block_n, block_k, s) for s in splits(block_n, block_k)]
    if bucket <= MAX_BROADCAST_ROWS:
        block_k = 256 // bucket  # a [bucket, BLOCK_N, BLOCK_K] float32 accumulator of ~32 registers a thread
        for block_n in (8, 16):
            out += [SkinnyConfig(block_n, block_k, s, use_dot=False) for s in splits(block_n, block_k)]
    out += _gemv_candidates(bucket, k, silu_mul)
    out += _one_step_candidates(bucket, k, silu_mul)
    if bucket <= 2:  # GEMV-like: longer K tiles over 8 warps keep more of the weight in flight per SM
        for block_n, block_k in ((8, 1024 // bucket), (16, 512 // bucket)):
            if block_k <= k:
                out += [
                    SkinnyConfig(block_n, block_k, s, use_dot=False, num_warps=8)
                    for s in splits(block_n, block_k)
                ]
    return out


# A whole row per tile: K up to 4096 (the 0.6B-8B shapes but 8B's down projection). A 16,384-wide
# tile for that one (K 12,288, one weight row per program over 8 warps) was timed on the H200 at
# 41.1 us against the split-K tile's 27.3 and cuBLAS's 29.8 (benchmarks/RESULTS.md, eighth
# session): the row does not fit a program's registers, so wider rows stay with the tiled kernel.
GEMV_MAX_BLOCK_K = 4096
GEMV_MAX_PER_THREAD = 64  # float32 weight elements a thread holds: beyond, registers spill
# The kernel takes up to MAX_GEMV_ROWS (8) rows, but at 8 rows the one-tile shapes were the
# fastest for no 0.6B projection in the one H200 tuning that offered them (benchmarks/RESULTS.md,
# twelfth session: q|k|v 8.6 us against cuBLAS's 5.3), so the startup tuning, whose time grows
# with every shape, offers them up to 4 rows.
GEMV_TUNE_ROWS = 4
# ENGINESPEC_GEMV_TUNE_ROWS overrides it (a power of two up to the kernel's MAX_GEMV_ROWS), for
# A/B runs; the table file's fingerprint records the value, so each setting tunes its own table.
GEMV_ROWS_ENV = "ENGINESPEC_GEMV_TUNE_ROWS"


def rows_from_env(name: str, default: int, most: int) -> int:
    """A row bound from the environment variable `name` (unset or blank: default): a power of
    two from 1 to `most`, else a ValueError naming the variable and the bound."""
    import os

    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    rows = int(raw) if raw.isdigit() else 0
    if not 1 <= rows <= most or rows & (rows - 1):
        raise ValueError(f"{name} must be a power of two from 1 to {most}, got {raw!r}")
    return rows


def gemv_tune_rows() -> int:
    """The most rows the tuning offers one-tile GEMV shapes for: GEMV_TUNE_ROWS, or
    ENGINESPEC_GEMV_TUNE_ROWS when set (at most the kernel's MAX_GEMV_ROWS)."""
    from enginespec.kernels.skinny_gemm import MAX_GEMV_ROWS

    return rows_from_env(GEMV_ROWS_ENV, GEMV_TUNE_ROWS, MAX_GEMV_ROWS)


# Tensor-core tiles of one K step a split for 4-32 rows: a program's whole [BLOCK_N, BLOCK_K]
# weight tile is read before its PDL wait (as the one-tile GEMV's is), then x and one dot; K
# longer than ONE_STEP_MAX_K is cut into that many slices, one split each (the split-K partials
# reduced by the last to arrive). H200, Qwen3-0.6B shape, picks at 4-32 rows (twentieth session,
# benchmarks/RESULTS.md): q|k|v at 4-16 rows 4.7-4.8 us (cuBLAS 5.4, the GEMV 4.9 at 4 rows);
# o and down at 8-32 rows in 2 and 3 slices 4.4-5.9 us (8-split 256-long tiles 5.1-6.8); decode
# graphs 3%, 11%, 7% and 1% faster at 4, 8, 16 and 32 rows. Compiled for sm_90 (block_m 16, K 1,024): 218-250
# registers and no spills for block_n 16-32 at 4 or 8 warps, with or without the norm (triton 3.6
# and 3.9); at block_m 32 56-288 B of spills. Not offered: SiLU * up (two weight tiles: 3-7 KB
# of spills, never picked when offered) and one step of 2,048 (~400 B of spills, never picked).
ONE_STEP_MAX_K = 1024
ONE_STEP_ROWS = (4, 8, 16, 32)


def _one_step_candidates(bucket: int, k: int, silu_mul: bool) -> list:
    """One-step tensor-core shapes for row buckets in ONE_STEP_ROWS, without SiLU * up: one
    stage, block_n 16 or 32 at 4 or 8 warps, and either block_k = K rounded up to a power of two
    in one split (K <= ONE_STEP_MAX_K) or block_k = ONE_STEP_MAX_K in ceil(K / ONE_STEP_MAX_K)
    splits, so every split is exactly one BLOCK_K step."""
    from enginespec.kernels.skinny_gemm import SkinnyConfig

    if bucket not in ONE_STEP_ROWS or silu_mul:
        return []
    block_k = min(1 << max(3, (k - 1).bit_length()), ONE_STEP_MAX_K)
    slices = -(-k // block_k)
    return [
        SkinnyConfig(block_n, block_k, slices, num_warps=warps, num_stages=1)
        for block_n in (16, 32)
        for warps in (4, 8)
    ]


def _gemv_candidates(bucket: int, k: int, silu_mul: bool) -> list:
    """One-tile (gemv) shapes for up to gemv_tune_rows() rows: a tile is a whole row
    (block_k = K rounded up to a power of two), block_n 1-8 rows of the weight per program,
    4 or 8 warps, each thread holding between 8 (one 16-byte load of bf16) and
    GEMV_MAX_PER_THREAD float32 weight elements (the kernel takes x rows one at a time: the
    tile's share is what fills the registers, not the rows)."""
    from enginespec.kernels.skinny_gemm import SkinnyConfig

    block_k = 1 << max(3, (k - 1).bit_length())
    if bucket > gemv_tune_rows() or block_k > GEMV_MAX_BLOCK_K:
        return []
    tiles_w = 2 if silu_mul else 1
    return [
        SkinnyConfig(block_n, block_k, use_dot=False, num_warps=warps, gemv=True)
        for block_n in (1, 2, 4, 8)
        for warps in (4, 8)
        if 8 * 32 * warps <= block_n * block_k * tiles_w <= GEMV_MAX_PER_THREAD * 32 * warps
    ]
