"""The whole random draw with min-p / top-k / top-p in two launches, no sort or topk of the row.

`sampling.draw` needs each row's raw-space threshold before its first pass; finding it with a
full-vocabulary `torch.topk` (plus a dozen small ops) cost more than the draw itself. Here the
threshold comes out of the draw's own passes:

1. `_scan_kernel`, grid (S, num_chunks), one read of the logits, each chunk held in registers:
   the chunk's max, first argmax (greedy rows only) and untruncated mass sum(exp2((x - chunk
   max) * x_scale)) (the draw's statistics), and on cut rows the maxima of the chunk's NB
   sub-blocks (nothing else: a per-token compaction here cost more than the whole scan).
2. `_cut_pick_kernel`, grid (S,): per row, the CANDIDATES (`_gather_candidates`): of the
   sub-blocks whose max reaches the min-p cut, the fewer than GATHER above t (the GATHER-th
   largest max) are read again, and their tokens above t compacted (at most CAND). Every token
   x > t lies in one of those sub-blocks, so with certain = the float after t, any cut that
   lands at or above certain is exact from the candidates alone: min-p is row max + base_off,
   top-k the k-th largest candidate (any top-k below GATHER lands there), top-p the cumulative
   mass over the survivors (the total from the survivors when the cut before top-p is certain,
   else from step 1's masses when there was no cut before top-p), each by bisection over the
   float order. The kept mass of each chunk is then summed from its candidates. A row whose
   cut falls below certain (a flat row with a loose top-p, a top-k of GATHER or more, a
   candidate overflow) takes the WIDE path in the same program: the exact cuts by bisection
   over the float order (`_to_key`; 16 pivots per read of the row, so 8 reads per cut), then
   one read for the chunk masses. One program reads its row ~17 times there: a batch of rows
   that all take it (a loose top-p alone over a flat distribution) costs far more than the
   candidate path.
   Then the draw of `sampling._pick_kernel`: a chunk by u1, a token of it by u2; for a row the
   candidates settled, over the candidates themselves (every kept token is one, in column
   order: `_candidate_pick`), so the row is not read again. A top-k row ranks only its
   top_k + 1 largest sub-block maxima, and each bisection stops once its interval holds a
   single value. On the H200 (256 rows x 151,936, chat settings) this launch went from 81 to
   29 us: it had run in two waves (255 registers at 8 warps, one program an SM), a row took
   40 us of serial reductions, and the pick re-read a chunk.

SPREAD (`draw(..., spread=True)`, which the Sampler asks for when a row has a loose top-p: no
top-k, no min-p): step 2 runs as `_cut_pick_kernel` MODE 1 (cuts only, into a [S, 4 +
NC_BLOCK] buffer), and a row without top-k that would take the wide path is flagged instead;
its cut is the same bisection, spread over the grid (S, num_chunks): NUM_ROUNDS launches of
`_spread_round_kernel`, each program summing its chunk's mass above the round's WAYS pivots
(round 0 also the chunk's survivor mass), each program re-deriving the row's interval from the
earlier rounds' per-chunk sums (same sums in the same order in every program of the row: they
agree exactly, with no atomics and no reduction launch); `_spread_finish_kernel` turns the last
interval into the cut and each chunk's kept mass; MODE 2 picks. Programs of unflagged rows exit
at once. So a flagged row is read NUM_ROUNDS + 1 times by num_chunks programs each, not ~17
times by one.

Same thresholds as `sample.truncation.exact_thresholds` (values of the row; the top-p sums run in
another order, so a token within float rounding of the top-p boundary may fall on the other
side), same chunked inverse-CDF draw and same uniforms as `sample.draw.draw_torch`: seeded rows
give the torch path's tokens and never depend on the other rows (chunks, sub-blocks and slots
are fixed per row). Greedy rows take the first argmax.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional

import torch

from enginespec.kernels import sampling as sampling_kernels
from enginespec.kernels.compile_pool import launcher

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional on CPU
    triton = None

FLOAT_TYPES = (torch.float32, torch.bfloat16, torch.float16)  # logits read as they are, in float32
NUM_PARAMS = 8  # columns of the per-row parameter table (see `draw`)
BLOCK = 2048  # tokens per loop step of the final scan
WIDE_BLOCK = 512  # tokens per loop step of the wide path's passes (a [WIDE_BLOCK, WAYS] accumulator)
WAYS = tl.constexpr(16) if triton is not None else 16  # pivots per read in the wide bisection
NUM_KEY_STEPS = 32  # bisection steps over the 32-bit float order: exact
NUM_ROUNDS = 8  # spread rounds: WAYS ** NUM_ROUNDS = 16 ** 8 covers the 32-bit float order
# Ways the candidate cut's bisection splits its key interval per step (`_bisect_block`): fewer,
# wider steps trade block-wide reductions (one per step) for compares. Any power of two gives
# the same cut. benchmarks/sampler_probe.py on the H200, 256 rows at chat settings, the whole
# draw: with 2,048 candidate slots (0ae5e28) 178 us split 2, 184 split 4, 205 split 8, 202 split
# 16; with CAND = 256 candidates (759cd92) 152, 137, 136 and 132 us.
CUT_SPLIT = 16
# The cut's candidates (`_gather_candidates`): the GATHER sub-blocks of a row with the largest
# maxima are read (so top-k below GATHER is always settled by them) and their tokens above the
# GATHER-th largest max, at most CAND (more: the row takes the wide path), are the candidates.
GATHER = 64
CAND = 256
# A row with a min-p cut reads up to MIN_P_ROUNDS * GATHER sub-blocks (GATHER a round), so that
# all its survivors are candidates also where many tokens come near its max. With GATHER alone,
# such rows took the wide path: on the H200 (759cd92) a few of 256 rows at min-p 0.05 (up to 84
# sub-blocks above the cut) made the whole launch 1.3 ms instead of ~0.13.
MIN_P_ROUNDS = 4
# The ranking of the sub-block maxima (`_gather_candidates`) bisects GATHER_SPLIT ways a step
# and the candidates are read GATHER_STEP sub-blocks a loop step. Both bound the largest register
# blocks of `_cut_pick_kernel`: with a 16-way split ([2048, 16] block) and all GATHER sub-blocks
# at once ([64, 128]), triton 3.6 gave it 255 registers a thread (and spills) at 8 warps, one
# program per SM, so 256 rows ran in two waves (H200: 40 us a row, 81 us the launch).
GATHER_SPLIT = tl.constexpr(4) if triton is not None else 4
GATHER_STEPS = tl.constexpr(16) if triton is not None else 16  # ceil(32 / log2(GATHER_SPLIT)): exact
GATHER_STEP = tl.constexpr(32) if triton is not None else 32
# Warps of `_cut_pick_kernel` (one program per row). On the H200 (triton 3.6) it takes 195
# registers a thread at 8 warps, so one program fits an SM and 256 rows run in two waves; at 4
# warps two fit, and the launch took 47.6 us against 69.4 at chat settings (8.1 against 15.4
# without a cut, 31.4 against 35.9 at min-p + top-p), although each row's program is slower.
PICK_WARPS = 4


def split_steps(split: int) -> int:
    """Steps of a `split`-way bisection over the 32-bit float order: ceil(32 / log2(split))."""
    assert split >= 2 and split & (split - 1) == 0, split
    return -(-32 // (split.bit_length() - 1))


def layout(chunk: int) -> tuple[int, int, int]:
    """(NB sub-blocks per chunk, GATHER, CAND). Fixed by the chunk size alone, so a row's
    candidates never depend on the batch."""
    return min(64, chunk), GATHER, CAND


if triton is not None:

    @triton.jit
    def _row_ptr(x_ptr, x_stride, e_ptr, e_stride, map_ptr, row, has_edits):
        """Row `row`'s logits: row map[row] of the edited rows e_ptr when that is >= 0, else x's.
        has_edits is a runtime flag (one compiled variant whether a batch edits or not)."""
        ptr = x_ptr + row.to(tl.int64) * x_stride
        if has_edits != 0:
            e = tl.load(map_ptr + row)
            ptr = tl.where(e >= 0, e_ptr + e * e_stride, ptr)
        return ptr

    @triton.jit(do_not_specialize=["has_edits"])
    def _scan_kernel(
        x_ptr,
        x_stride,
        e_ptr,
        e_stride,
        map_ptr,
        prm_ptr,
        stats_ptr,
        bmax_ptr,
        vocab,
        num_chunks,
        has_edits,
        CHUNK: tl.constexpr,
        NB: tl.constexpr,
        NUM_PARAMS: tl.constexpr,
    ):
        # x_ptr: [S, x_stride] float32 (e_ptr, e_stride, map_ptr: see _row_ptr); prm_ptr: [S, NUM_PARAMS] float32 (col 0 x_scale, 2 cut);
        # stats_ptr: [S, 3, num_chunks] (max, mass, first argmax); bmax_ptr: [S, num_chunks, NB]
        # float32, the maxima of the chunk's NB sub-blocks (cut rows only).
        row = tl.program_id(0)
        part = tl.program_id(1)
        cols = part * CHUNK + tl.arange(0, CHUNK)
        row_ptr = _row_ptr(x_ptr, x_stride, e_ptr, e_stride, map_ptr, row, has_edits)
        xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        top = tl.max(xv, axis=0)
        first = part * 0 - 1  # the first argmax: greedy rows only (see _first_max)
        if tl.load(prm_ptr + row * NUM_PARAMS + 1) == 0.0:
            first = tl.min(tl.where(xv == top, cols, 2147483647), axis=0)
        scale = tl.load(prm_ptr + row * NUM_PARAMS)
        shift = tl.where(top > float("-inf"), top, 0.0)
        mass = tl.sum(tl.exp2((xv - shift) * scale), axis=0)
        out = stats_ptr + row.to(tl.int64) * 3 * num_chunks + part
        tl.store(out, top)
        tl.store(out + num_chunks, mass)
        tl.store(out + 2 * num_chunks, first.to(tl.float32))
        if tl.load(prm_ptr + row * NUM_PARAMS + 2) != 0.0:
            block_max = tl.max(tl.reshape(xv, [NB, CHUNK // NB]), axis=1)
            sub = tl.arange(0, NB)
            tl.store(bmax_ptr + (row.to(tl.int64) * num_chunks + part) * NB + sub, block_max)

    @triton.jit
    def _first_max(row_ptr, vocab, x_max, BLOCK: tl.constexpr):
        """The first column of the row holding x_max (the scan stores chunk argmaxes for
        greedy rows only; a random row needs one only when it has no token of positive mass)."""
        lanes = tl.arange(0, BLOCK)
        best = tl.min(tl.full([BLOCK], 2147483647, tl.int32), axis=0)
        for start in range(0, vocab, BLOCK):
            cols = start + lanes
            xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
            best = tl.minimum(
                best, tl.min(tl.where((xv == x_max) & (cols < vocab), cols, 2147483647), axis=0)
            )
        return best

    @triton.jit
    def _to_key(v):
        """An int64 key with the order of the float32 v (a bijection onto [0, 2**32))."""
        b = v.to(tl.int32, bitcast=True)
        return tl.where(b >= 0, b.to(tl.int64) + 2147483648, 2147483647 - (b & 0x7FFFFFFF).to(tl.int64))

    @triton.jit
    def _from_key(k):
        b = tl.where(k >= 2147483648, k - 2147483648, -1 - k)
        return b.to(tl.int32).to(tl.float32, bitcast=True)

    @triton.jit
    def _above(row_ptr, vocab, t, floor, x_max, inv_t, BY_MASS: tl.constexpr, BLOCK: tl.constexpr):
        """Over tokens x > t with x >= floor: their count, or (BY_MASS) sum exp((x - x_max) * inv_t)."""
        lanes = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + lanes
            xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
            keep = (xv > t) & (xv >= floor) & (xv > float("-inf"))
            if BY_MASS:
                acc += tl.where(keep, tl.exp((xv - x_max) * inv_t), 0.0)
            else:
                acc += keep.to(tl.float32)
        return tl.sum(acc, axis=0)

    @triton.jit
    def _above_many(row_ptr, vocab, pivots, floor, x_max, inv_t, BY_MASS: tl.constexpr, BLOCK: tl.constexpr):
        """`_above` at WAYS pivots at once (pivots [WAYS]): one read of the row for all."""
        lanes = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK, WAYS], dtype=tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + lanes
            xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
            keep = (xv >= floor) & (xv > float("-inf"))
            if BY_MASS:
                w = tl.where(keep, tl.exp((xv - x_max) * inv_t), 0.0)
            else:
                w = keep.to(tl.float32)
            acc += tl.where(xv[:, None] > pivots[None, :], w[:, None], 0.0)
        return tl.sum(acc, axis=0)

    @triton.jit
    def _bisect(row_ptr, vocab, floor, x_max, inv_t, target, BY_MASS: tl.constexpr, BLOCK: tl.constexpr):
        """The smallest float t with _above(t) < target, given _above(-inf) >= target and
        _above(x_max) = 0 < target: exact, over the 32-bit key interval split WAYS ways per
        read of the row (8 reads: 16**8 = 2**32), invariant _above(lo) >= target > _above(hi)."""
        hi = _to_key(x_max)
        lo = hi * 0 + 8388607  # _to_key(-inf)
        ways = tl.arange(0, WAYS)
        for _ in range(8):
            step = (hi - lo + WAYS - 1) // WAYS
            keys = tl.minimum(lo + (ways + 1).to(tl.int64) * step, hi)
            below = _above_many(row_ptr, vocab, _from_key(keys), floor, x_max, inv_t, BY_MASS, BLOCK) < target
            first = tl.min(tl.where(below, ways, WAYS), axis=0)  # keys[WAYS - 1] == hi is below
            new_lo = tl.max(tl.where(ways == first - 1, keys, lo), axis=0)
            hi = tl.min(tl.where(ways == first, keys, hi), axis=0)
            lo = new_lo
        return _from_key(hi)

    @triton.jit
    def _wide_cut(row_ptr, vocab, x_max, base, top_k, top_p, inv_t, BLOCK: tl.constexpr):
        # BLOCK: any power of two (these passes ignore chunks)
        """The exact min-p / top-k / top-p cut of a whole row (the rare path)."""
        thr = base
        if top_k > 0:
            n = _above(row_ptr, vocab, float("-inf"), float("-inf"), x_max, inv_t, False, BLOCK)
            if n > top_k:
                kth = _bisect(row_ptr, vocab, float("-inf"), x_max, inv_t, top_k.to(tl.float32), False, BLOCK)
                thr = tl.maximum(thr, kth)
        if top_p < 1.0:
            total = _above(row_ptr, vocab, float("-inf"), thr, x_max, inv_t, True, BLOCK)
            thr = tl.maximum(thr, _bisect(row_ptr, vocab, thr, x_max, inv_t, top_p * total, True, BLOCK))
        return thr

    @triton.jit
    def _wide_masses(
        row_ptr, vocab, num_chunks, tops, parts, thr, scale, CHUNK: tl.constexpr, BLOCK: tl.constexpr
    ):
        """Per chunk j: sum of exp2((x - tops[j]) * scale) over its tokens x >= thr."""
        lanes = tl.arange(0, BLOCK)
        masses = tl.zeros_like(tops)
        for j in range(0, num_chunks):
            top = tl.max(tl.where(parts == j, tops, float("-inf")), axis=0)
            shift = tl.where(top > float("-inf"), top, 0.0)
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for off in range(0, CHUNK, BLOCK):
                cols = j * CHUNK + off + lanes
                xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
                acc += tl.where(xv >= thr, tl.exp2((xv - shift) * scale), 0.0)
            masses = tl.where(parts == j, tl.sum(acc, axis=0), masses)
        return masses

    @triton.jit
    def _bisect_block(
        vals, x_max, inv_t, target, BY_MASS: tl.constexpr, SPLIT: tl.constexpr, STEPS: tl.constexpr
    ):
        """`_bisect` over the values held in a register block (-inf entries count for nothing):
        the key interval split SPLIT ways per step (a power of two; at most STEPS = ceil(32 /
        log2(SPLIT)) steps, each one block-wide reduction of a [len(vals), SPLIT] block), the
        weights computed once. The answer is the smallest t with above(t) < target for every
        SPLIT (the mass sums may round differently: a [len, SPLIT] reduction orders them
        otherwise). That t is one of the values (above(t) only changes at a value), so the
        search stops as soon as the interval (lo, hi] holds a single distinct value v: by the
        invariant, above(v) = above(hi) < target <= above(lo) = above(any t in [lo, v)), so v
        is the answer. Over N spread values that takes about log_SPLIT(N) steps, not STEPS."""
        live = vals > float("-inf")
        if BY_MASS:
            w = tl.where(live, tl.exp((vals - x_max) * inv_t), 0.0)
        else:
            w = live.to(tl.float32)
        hi = _to_key(x_max)
        # above(t) for t just below the smallest value is the whole weight, so the interval
        # can start there instead of at -inf (_to_key(-inf) = 8388607): the first steps no
        # longer split the empty keys below the values
        least = tl.min(tl.where(live, vals, float("inf")), axis=0)
        lo = tl.where(least < float("inf"), _to_key(least) - 1, hi * 0 + 8388607)
        ways = tl.arange(0, SPLIT)
        n = tl.program_id(0) * 0
        spread = n == 0  # True: (lo, hi] may hold two distinct values or more
        while spread & (n < STEPS):
            step = (hi - lo + SPLIT - 1) // SPLIT
            keys = tl.minimum(lo + (ways + 1).to(tl.int64) * step, hi)
            got = tl.sum(tl.where(vals[:, None] > _from_key(keys)[None, :], w[:, None], 0.0), axis=0)
            first = tl.min(tl.where(got < target, ways, SPLIT), axis=0)  # keys[SPLIT - 1] == hi is below
            new_lo = tl.max(tl.where(ways == first - 1, keys, lo), axis=0)
            hi = tl.min(tl.where(ways == first, keys, hi), axis=0)
            lo = new_lo
            inside = live & (vals > _from_key(lo)) & (vals <= _from_key(hi))
            top = tl.max(tl.where(inside, vals, float("-inf")), axis=0)
            spread = top != tl.min(tl.where(inside, vals, float("inf")), axis=0)
            hi = tl.where(spread, hi, _to_key(top))
            n += 1
        return _from_key(hi)

    @triton.jit
    def _next_up(t):
        """The smallest float32 above t (t finite or -inf)."""
        return _from_key(_to_key(t) + 1)

    @triton.jit
    def _gather_candidates(
        row_ptr, bmax_row, work_row, num_chunks, vocab, x_max, base, top_k,
        NB: tl.constexpr, NC_BLOCK: tl.constexpr, SUB: tl.constexpr, GATHER: tl.constexpr, CAND: tl.constexpr,
        ROUNDS: tl.constexpr,
    ):  # fmt: skip
        """(cand [CAND] values, -inf padded; their columns; certain): every token x >= base with
        x >= certain is in cand. The row's sub-blocks whose max reaches base are ranked by max,
        and fewer than `limit` of them (GATHER; ROUNDS * GATHER for a row with a min-p cut; at
        most top_k + 1 for a row with a top-k: its k-th largest token is at least the k-th
        largest max, which is above the (k + 1)-th unless they tie, so the top-k cut lands above
        t), those above t (the limit-th largest max), are read, GATHER a round: any token x > t lies
        in one of them, so certain = the float after t (-inf when all were read; +inf when
        their tokens above t overflow CAND). work_row: [ROUNDS * GATHER + 2 * CAND] float32
        scratch of this row (the compactions go through it). The ranking's bisection splits
        GATHER_SPLIT ways a step and the reads take GATHER_STEP sub-blocks a loop step: the two
        largest register blocks of the kernel, kept small so that two programs fit an SM."""
        offs = tl.arange(0, NC_BLOCK * NB)
        bm = tl.load(bmax_row + offs, mask=offs < num_chunks * NB, other=float("-inf"))
        bm = tl.where(bm >= base, bm, float("-inf"))
        # a row with a min-p cut reads up to ROUNDS * GATHER sub-blocks, GATHER a round, so that
        # all of its survivors are candidates even where many tokens come near its max
        limit = tl.where(base > float("-inf"), ROUNDS * GATHER, GATHER)
        limit = tl.where(top_k > 0, tl.minimum(top_k + 1, limit), limit)
        t = tl.max(tl.full([GATHER], float("-inf"), tl.float32), axis=0)
        if tl.sum((bm > float("-inf")).to(tl.int32), axis=0) >= limit:
            t = _bisect_block(bm, x_max, 1.0, limit.to(tl.float32), False, GATHER_SPLIT, GATHER_STEPS)
        sel = bm > t
        n_sel = tl.sum(sel.to(tl.int32), axis=0)  # < limit
        tl.store(work_row + tl.cumsum(sel.to(tl.int32), axis=0) - 1, offs.to(tl.float32), mask=sel)
        tl.debug_barrier()
        found = ROUNDS * GATHER  # where the candidates start in the scratch
        count = n_sel * 0
        for first in range(0, n_sel, GATHER_STEP):
            slot = first + tl.arange(0, GATHER_STEP)
            ids = tl.load(work_row + slot, mask=slot < n_sel, other=0.0).to(tl.int32)  # [GATHER_STEP]
            cols = ids[:, None] * SUB + tl.arange(0, SUB)[None, :]  # [GATHER_STEP, SUB]
            inside = (slot < n_sel)[:, None] & (cols < vocab)
            xv = tl.load(row_ptr + cols, mask=inside, other=float("-inf")).to(tl.float32)
            take = tl.reshape(inside & (xv > t) & (xv >= base) & (xv > float("-inf")), [GATHER_STEP * SUB])
            pos = count + tl.cumsum(take.to(tl.int32), axis=0) - 1
            keep = take & (pos < CAND)
            tl.store(work_row + found + pos, tl.reshape(xv, [GATHER_STEP * SUB]), mask=keep)
            tl.store(
                work_row + found + CAND + pos, tl.reshape(cols, [GATHER_STEP * SUB]).to(tl.float32), mask=keep
            )
            count += tl.sum(take.to(tl.int32), axis=0)
        tl.debug_barrier()
        c = tl.arange(0, CAND)
        cand = tl.load(work_row + found + c, mask=c < count, other=float("-inf"))
        cand_cols = tl.load(work_row + found + CAND + c, mask=c < count, other=0.0).to(tl.int32)
        certain = tl.where(t > float("-inf"), _next_up(t), float("-inf"))
        return cand, cand_cols, tl.where(count > CAND, float("inf"), certain)

    @triton.jit
    def _candidate_cut(
        cand, certain, x_max, total_all, base, top_k, top_p, inv_t, SPLIT: tl.constexpr, STEPS: tl.constexpr,
    ):  # fmt: skip
        """(thr, ok) from the candidates (`_gather_candidates`); ok False when the cut is not
        certain (it falls below `certain`) and the row must take the wide path. When ok, every
        token x >= thr is a candidate."""
        thr = base
        if top_k > 0:
            # exactly top_k candidates with tokens left unread (certain > -inf): the k-th
            # largest token is the smallest candidate (every unread token is below them all)
            n_cand = tl.sum((cand > float("-inf")).to(tl.int32), axis=0)
            if (n_cand > top_k) | ((n_cand == top_k) & (certain > float("-inf"))):
                thr = tl.maximum(
                    thr, _bisect_block(cand, x_max, inv_t, top_k.to(tl.float32), False, SPLIT, STEPS)
                )
        ok = thr >= certain
        if top_p < 1.0:
            live = (cand >= thr) & (cand > float("-inf"))
            w = tl.where(live, tl.exp((cand - x_max) * inv_t), 0.0)
            total = tl.where(thr > float("-inf"), tl.sum(w, axis=0), total_all)
            p_thr = _bisect_block(
                tl.where(live, cand, float("-inf")), x_max, inv_t, top_p * total, True, SPLIT, STEPS
            )
            num_kept = tl.sum((live & (cand >= p_thr)).to(tl.int32), axis=0)
            # no cut before top-p (so total_all is the survivors' mass) and the crossing found
            # among the certain candidates: exact although not every token is a candidate
            uncut = (thr == float("-inf")) & (top_k == 0)
            open_ok = uncut & (num_kept < tl.sum(live.to(tl.int32), axis=0)) & (p_thr >= certain)
            ok = ok | open_ok
            thr = tl.maximum(thr, p_thr)
        return thr, ok

    @triton.jit
    def _candidate_masses(cand, cand_cols, thr, parts, tops, scale, CHUNK: tl.constexpr):
        """Each chunk's kept mass, sum exp2((x - chunk max) * x_scale) over its candidates x >=
        thr (all its kept tokens when the cut was ok): a [NC_BLOCK, CAND] block."""
        mine = parts[:, None] == (cand_cols // CHUNK)[None, :]  # [NC_BLOCK, CAND]
        shift = tl.max(tl.where(mine, tops[:, None], float("-inf")), axis=0)  # [CAND]
        shift = tl.where(shift > float("-inf"), shift, 0.0)
        w2 = tl.where(cand >= thr, tl.exp2((cand - shift) * scale), 0.0)  # [CAND]
        return tl.sum(tl.where(mine, w2[None, :], 0.0), axis=1)

    @triton.jit
    def _candidate_pick(
        cand, cand_cols, thr, stats, row_shift, scale, key_ptr, row, base_lo, base_hi,
        CHUNK: tl.constexpr, CAND: tl.constexpr,
    ):  # fmt: skip
        """`_row_pick`'s draw over the candidates of a row whose cut they settled (so every kept
        token is a candidate, and they lie in column order): the chunk by u1 over the running
        kept mass (each weight exp2((x - chunk max) * x_scale) scaled to the row max, as the
        chunk masses are), then a token of that chunk by u2 over its candidates' running
        chunk-relative weight, as `_scan_chunk` walks the chunk. No read of the row. -1 when no
        candidate has positive weight."""
        chunk_of = cand_cols // CHUNK
        ctop = tl.load(stats + chunk_of, mask=cand > float("-inf"), other=float("-inf"))  # chunk maxima
        shift = tl.where(ctop > float("-inf"), ctop, 0.0)
        w = tl.where((cand >= thr) & (cand > float("-inf")), tl.exp2((cand - shift) * scale), 0.0)
        wr = w * tl.exp2((ctop - row_shift) * scale)
        lo, hi = sampling_kernels._row_halves(key_ptr, row, base_lo, base_hi)
        u1 = sampling_kernels._uniform(lo, hi, 0)
        u2 = sampling_kernels._uniform(lo, hi, 1)
        slot = tl.arange(0, CAND)
        hit = tl.min(
            tl.where((tl.cumsum(wr, axis=0) > u1 * tl.sum(wr, axis=0)) & (wr > 0.0), slot, CAND), axis=0
        )
        hit = tl.where(hit < CAND, hit, tl.max(tl.where(wr > 0.0, slot, -1), axis=0))
        chosen = tl.max(tl.where(slot == hit, chunk_of, -1), axis=0)
        wc = tl.where(chunk_of == chosen, w, 0.0)
        run = tl.cumsum(wc, axis=0)
        pick = tl.min(tl.where((run > u2 * tl.sum(wc, axis=0)) & (wc > 0.0), cand_cols, 2147483647), axis=0)
        return tl.where(pick < 2147483647, pick, tl.max(tl.where(wc > 0.0, cand_cols, -1), axis=0))

    @triton.jit
    def _row_cut(
        row_ptr, prm, bmax_row, work_row, parts, valid, tops, masses, num_chunks, vocab, x_max, scale, rel,
        CHUNK: tl.constexpr, NB: tl.constexpr, GATHER: tl.constexpr, CAND: tl.constexpr, ROUNDS: tl.constexpr,
        NC_BLOCK: tl.constexpr, BLOCK: tl.constexpr, WIDE_BLOCK: tl.constexpr, SPREAD: tl.constexpr,
        SPLIT: tl.constexpr, STEPS: tl.constexpr,
    ):  # fmt: skip
        """(thr, kept chunk masses, spread, base, cand, cand_cols, settled) of a cut row: from
        the candidates when certain (settled; their chunk masses only with SPREAD, where MODE 2
        picks from chunk masses; otherwise the caller picks from the candidates and `masses`
        comes back as given), else by the wide path in this program, except (SPREAD) a row
        without top-k: spread 1, its cut left to the multi-program rounds
        (`_spread_round_kernel`), base its min-p cut."""
        top_k = tl.load(prm + 4).to(tl.int32)
        top_p = tl.load(prm + 5)
        inv_t = tl.load(prm + 6)
        base = x_max + tl.load(prm + 3)
        total_all = tl.sum(tl.where(valid, masses * rel, 0.0), axis=0)
        cand, cand_cols, certain = _gather_candidates(
            row_ptr, bmax_row, work_row, num_chunks, vocab, x_max, base, top_k, NB, NC_BLOCK, CHUNK // NB, GATHER,
            CAND, ROUNDS,
        )  # fmt: skip
        thr, ok = _candidate_cut(cand, certain, x_max, total_all, base, top_k, top_p, inv_t, SPLIT, STEPS)
        if SPREAD:
            masses = _candidate_masses(cand, cand_cols, thr, parts, tops, scale, CHUNK)
        wide = ok.to(tl.int32) == 0
        spread = wide & (top_k == 0)
        if not SPREAD:
            spread = wide & (top_k < 0)  # False, as a tensor
        if wide & (spread.to(tl.int32) == 0):
            thr = _wide_cut(row_ptr, vocab, x_max, base, top_k, top_p, inv_t, WIDE_BLOCK)
            masses = _wide_masses(row_ptr, vocab, num_chunks, tops, parts, thr, scale, CHUNK, BLOCK)
        return thr, masses, spread, base, cand, cand_cols, ok

    @triton.jit
    def _row_pick(
        row_ptr, key_ptr, row, base_lo, base_hi, parts, valid, tops, masses, rel, thr, scale, vocab,
        CHUNK: tl.constexpr, NC_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """The draw of `sampling._pick_kernel` over the kept chunk masses: a chunk by u1, a
        token of it by u2 (-1 when the row has no token of positive mass)."""
        part_mass = tl.where(valid, masses * rel, 0.0)
        prefix = tl.cumsum(part_mass, axis=0)
        total = tl.sum(part_mass, axis=0)
        lo, hi = sampling_kernels._row_halves(key_ptr, row, base_lo, base_hi)
        u1 = sampling_kernels._uniform(lo, hi, 0)
        u2 = sampling_kernels._uniform(lo, hi, 1)
        hit = tl.min(tl.where((prefix > u1 * total) & (part_mass > 0.0), parts, NC_BLOCK), axis=0)
        last_part = tl.max(tl.where(part_mass > 0.0, parts, 0), axis=0)
        chosen = tl.where(hit < NC_BLOCK, hit, last_part)
        chunk_top = tl.max(tl.where(parts == chosen, tops, float("-inf")), axis=0)
        target = u2 * tl.sum(tl.where(parts == chosen, masses, 0.0), axis=0)
        return sampling_kernels._scan_chunk(
            row_ptr, chosen * CHUNK, vocab, chunk_top, scale, thr, target, CHUNK, BLOCK
        )

    @triton.jit(do_not_specialize=["has_edits", "base_lo", "base_hi"])
    def _cut_pick_kernel(
        x_ptr, x_stride, e_ptr, e_stride, map_ptr, prm_ptr, key_ptr, stats_ptr, bmax_ptr, work_ptr, out_ptr,
        cut_ptr, vocab, num_chunks, has_edits, base_lo, base_hi,
        CHUNK: tl.constexpr, NB: tl.constexpr, GATHER: tl.constexpr, CAND: tl.constexpr, ROUNDS: tl.constexpr,
        NC_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
        WIDE_BLOCK: tl.constexpr, NUM_PARAMS: tl.constexpr, MODE: tl.constexpr, SPLIT: tl.constexpr,
        STEPS: tl.constexpr,
    ):  # fmt: skip
        # prm_ptr: [S, NUM_PARAMS] float32: x_scale, noisy, cut, base_off, top_k, top_p, inv_t.
        # MODE 0: cut and pick. MODE 1: cut only, into cut_ptr [S, 4 + NC_BLOCK] float32 (thr,
        # spread flag, min-p cut, x_max, the kept chunk masses); spread rows are cut by the
        # rounds. MODE 2: pick only, the cuts read from cut_ptr.
        row = tl.program_id(0)
        parts = tl.arange(0, NC_BLOCK)
        valid = parts < num_chunks
        stats = stats_ptr + row.to(tl.int64) * 3 * num_chunks
        tops = tl.load(stats + parts, mask=valid, other=float("-inf"))
        masses = tl.load(stats + num_chunks + parts, mask=valid, other=0.0)
        firsts = tl.load(stats + 2 * num_chunks + parts, mask=valid, other=0.0).to(tl.int32)
        x_max = tl.max(tops, axis=0)
        greedy = tl.min(tl.where(valid & (tops == x_max), firsts, 2147483647), axis=0)
        prm = prm_ptr + row * NUM_PARAMS
        scale = tl.load(prm)
        row_shift = tl.where(x_max > float("-inf"), x_max, 0.0)
        rel = tl.exp2((tops - row_shift) * scale)
        thr = tl.max(tl.full([NC_BLOCK], float("-inf"), tl.float32), axis=0)
        row_ptr = _row_ptr(x_ptr, x_stride, e_ptr, e_stride, map_ptr, row, has_edits)
        cut_row = cut_ptr + row.to(tl.int64) * (4 + NC_BLOCK)
        if MODE == 2:
            thr = tl.load(cut_row)
            masses = tl.load(cut_row + 4 + parts, mask=valid, other=0.0)
        settled = thr < thr  # False: picked from the chunk masses, not the candidates
        cand = tl.full([CAND], float("-inf"), tl.float32)
        cand_cols = tl.zeros([CAND], dtype=tl.int32)
        if MODE != 2:
            spread = thr < thr  # False
            base = thr
            if tl.load(prm + 2) != 0.0:
                bmax_row = bmax_ptr + row.to(tl.int64) * num_chunks * NB
                work_row = work_ptr + row.to(tl.int64) * (ROUNDS * GATHER + 2 * CAND)
                thr, masses, spread, base, cand, cand_cols, settled = _row_cut(
                    row_ptr, prm, bmax_row, work_row, parts, valid, tops, masses, num_chunks, vocab, x_max,
                    scale, rel, CHUNK, NB, GATHER, CAND, ROUNDS, NC_BLOCK, BLOCK, WIDE_BLOCK, MODE == 1, SPLIT,
                    STEPS,
                )  # fmt: skip
            if MODE == 1:
                tl.store(cut_row, thr)
                tl.store(cut_row + 1, spread.to(tl.float32))
                tl.store(cut_row + 2, base)
                tl.store(cut_row + 3, x_max)
                tl.store(cut_row + 4 + parts, masses, mask=valid)
        if MODE != 1:
            if settled:
                tok = _candidate_pick(
                    cand, cand_cols, thr, stats, row_shift, scale, key_ptr, row, base_lo, base_hi, CHUNK, CAND
                )
            else:
                tok = _row_pick(
                    row_ptr, key_ptr, row, base_lo, base_hi, parts, valid, tops, masses, rel, thr, scale, vocab,
                    CHUNK, NC_BLOCK, BLOCK,
                )  # fmt: skip
            if tl.load(prm + 1) > 0.0:
                if tok < 0:  # no token of positive mass (a row of -inf): the first argmax
                    tok = _first_max(row_ptr, vocab, x_max, BLOCK)
            else:
                tok = greedy
            tl.store(out_ptr + row, tok.to(tl.int64))

    @triton.jit
    def _spread_interval(round_ptr, total_ptr, row, num_rows, num_chunks, num_rounds, x_max, target_p,
                         NC_BLOCK: tl.constexpr):  # fmt: skip
        """(lo, hi, target) of a spread row after `num_rounds` rounds: the key interval of
        `_bisect`, replayed from the rounds' per-chunk masses (round_ptr [ROUNDS, S, num_chunks,
        WAYS]) and the survivors' mass (total_ptr [S, num_chunks]), target = top_p * total.
        Every program of the row replays the same sums in the same order: they agree exactly."""
        chunks = tl.arange(0, NC_BLOCK)
        ways = tl.arange(0, WAYS)
        valid = chunks < num_chunks
        total = tl.sum(tl.load(total_ptr + row * num_chunks + chunks, mask=valid, other=0.0), axis=0)
        target = target_p * total
        hi = _to_key(x_max)
        lo = hi * 0 + 8388607  # _to_key(-inf)
        for q in range(0, num_rounds):
            step = (hi - lo + WAYS - 1) // WAYS
            keys = tl.minimum(lo + (ways + 1).to(tl.int64) * step, hi)
            at = ((q * num_rows + row).to(tl.int64) * num_chunks + chunks[:, None]) * WAYS + ways[None, :]
            got = tl.sum(tl.load(round_ptr + at, mask=valid[:, None], other=0.0), axis=0)
            first = tl.min(tl.where(got < target, ways, WAYS), axis=0)  # keys[WAYS - 1] == hi is below
            new_lo = tl.max(tl.where(ways == first - 1, keys, lo), axis=0)
            hi = tl.min(tl.where(ways == first, keys, hi), axis=0)
            lo = new_lo
        return lo, hi, target

    @triton.jit(do_not_specialize=["num_rows", "has_edits", "round_index"])
    def _spread_round_kernel(
        x_ptr, x_stride, e_ptr, e_stride, map_ptr, prm_ptr, cut_ptr, round_ptr, total_ptr, vocab, num_chunks,
        num_rows, has_edits, round_index,
        CHUNK: tl.constexpr, NC_BLOCK: tl.constexpr, WIDE_BLOCK: tl.constexpr, NUM_PARAMS: tl.constexpr,
    ):  # fmt: skip
        # grid (S, num_chunks). Round r of the spread rows' top-p bisection: this chunk's mass
        # above each of the WAYS pivots of the interval left by rounds 0..r-1, into
        # round_ptr[r, row, chunk, :]; round 0 also writes the chunk's survivor mass to
        # total_ptr[row, chunk]. Rows that are not spread (cut_ptr's flag 0) exit at once.
        row = tl.program_id(0)
        part = tl.program_id(1)
        cut_row = cut_ptr + row.to(tl.int64) * (4 + NC_BLOCK)
        if tl.load(cut_row + 1) != 0.0:
            base = tl.load(cut_row + 2)
            x_max = tl.load(cut_row + 3)
            inv_t = tl.load(prm_ptr + row * NUM_PARAMS + 6)
            top_p = tl.load(prm_ptr + row * NUM_PARAMS + 5)
            lo, hi, _ = _spread_interval(
                round_ptr, total_ptr, row, num_rows, num_chunks, round_index, x_max, top_p, NC_BLOCK
            )
            ways = tl.arange(0, WAYS)
            step = (hi - lo + WAYS - 1) // WAYS
            pivots = _from_key(tl.minimum(lo + (ways + 1).to(tl.int64) * step, hi))
            row_ptr = _row_ptr(x_ptr, x_stride, e_ptr, e_stride, map_ptr, row, has_edits)
            lanes = tl.arange(0, WIDE_BLOCK)
            acc = tl.zeros([WIDE_BLOCK, WAYS], dtype=tl.float32)
            tot = tl.zeros([WIDE_BLOCK], dtype=tl.float32)
            for off in range(0, CHUNK, WIDE_BLOCK):
                cols = part * CHUNK + off + lanes
                xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
                keep = (xv >= base) & (xv > float("-inf"))
                w = tl.where(keep, tl.exp((xv - x_max) * inv_t), 0.0)
                tot += w
                acc += tl.where(xv[:, None] > pivots[None, :], w[:, None], 0.0)
            at = ((round_index * num_rows + row).to(tl.int64) * num_chunks + part) * WAYS + ways
            tl.store(round_ptr + at, tl.sum(acc, axis=0))
            if round_index == 0:
                tl.store(total_ptr + row * num_chunks + part, tl.sum(tot, axis=0))

    @triton.jit(do_not_specialize=["num_rows", "has_edits"])
    def _spread_finish_kernel(
        x_ptr, x_stride, e_ptr, e_stride, map_ptr, prm_ptr, stats_ptr, cut_ptr, round_ptr, total_ptr, vocab,
        num_chunks, num_rows, has_edits, num_rounds,
        CHUNK: tl.constexpr, NC_BLOCK: tl.constexpr, BLOCK: tl.constexpr, NUM_PARAMS: tl.constexpr,
    ):  # fmt: skip
        # grid (S, num_chunks). A spread row's cut from its rounds (max of the min-p cut and the
        # bisected top-p cut, as `_wide_cut`), and this chunk's kept mass sum exp2((x - chunk
        # max) * x_scale) over x >= cut (as `_wide_masses`), into cut_ptr for the pick.
        row = tl.program_id(0)
        part = tl.program_id(1)
        cut_row = cut_ptr + row.to(tl.int64) * (4 + NC_BLOCK)
        if tl.load(cut_row + 1) != 0.0:
            base = tl.load(cut_row + 2)
            x_max = tl.load(cut_row + 3)
            top_p = tl.load(prm_ptr + row * NUM_PARAMS + 5)
            scale = tl.load(prm_ptr + row * NUM_PARAMS)
            _, hi, _ = _spread_interval(
                round_ptr, total_ptr, row, num_rows, num_chunks, num_rounds, x_max, top_p, NC_BLOCK
            )
            thr = tl.maximum(base, _from_key(hi))
            top = tl.load(stats_ptr + row.to(tl.int64) * 3 * num_chunks + part)
            shift = tl.where(top > float("-inf"), top, 0.0)
            row_ptr = _row_ptr(x_ptr, x_stride, e_ptr, e_stride, map_ptr, row, has_edits)
            lanes = tl.arange(0, BLOCK)
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for off in range(0, CHUNK, BLOCK):
                cols = part * CHUNK + off + lanes
                xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
                acc += tl.where(xv >= thr, tl.exp2((xv - shift) * scale), 0.0)
            tl.store(cut_row + 4 + part, tl.sum(acc, axis=0))
            if part == 0:
                tl.store(cut_row, thr)


def _aligned(num_floats: int) -> int:
    """num_floats rounded up to a multiple of 16 (64 bytes of float32)."""
    return -(-num_floats // 16) * 16


def available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def draw(
    x: torch.Tensor,
    prm: torch.Tensor,
    keys: torch.Tensor,
    base: tuple[int, int],
    *,
    chunk: int,
    edited: Optional[torch.Tensor] = None,
    edit_map: Optional[torch.Tensor] = None,
    num_warps: int = 0,
    spread: bool = False,
    compile_only: bool = False,
) -> torch.Tensor:
    """Token per row of x [S, V] (float32, or the model's bfloat16 / float16 read as float32:
    no conversion pass; unit stride along V). prm [S, NUM_PARAMS] float32,
    contiguous, per row: x_scale (log2(e) / T; 1 on greedy rows), noisy (1 random, 0 greedy),
    cut (1 when a random row has a min-p/top-k/top-p cut), base_off (log(min_p) / inv_t: the
    min-p cut is row max + base_off; -inf for none), top_k (0 = none; below V), top_p (1 =
    none), inv_t (1 / T), unused. keys int64 [S] (see `sampling.draw`); base = (base_lo,
    base_hi). chunk: `sample.draw.CHUNK` (a power of two). edited [E, V'] float32 (unit stride,
    V' >= V) with edit_map int64 [S]: row i is read from edited[edit_map[i]] where that is >= 0
    (the rows a logit edit changed, so the others need no copy; x must then be float32).
    num_warps overrides the launches' warp count (tuning: sums change only in rounding).
    spread: cut rows without a top-k whose cut the candidates cannot settle (a loose top-p over
    a flat row) are cut by NUM_ROUNDS multi-program rounds (`_spread_round_kernel`, grid
    (S, num_chunks)) instead of one program reading the row ~17 times; the cut is the same
    bisection (`_bisect`), summed in another order. Returns int64 [S]; two launches, or
    NUM_ROUNDS + 4 with spread. compile_only: compile those launches' variants (Triton's
    warmup, kernels/compile_pool.py) and launch nothing; the result is then uninitialised."""
    return _launch(x, prm, keys, base, chunk, edited, edit_map, num_warps, spread, True, compile_only)[0]


def spread_cuts(x: torch.Tensor, prm: torch.Tensor, *, chunk: int) -> torch.Tensor:
    """float32 [S]: each row's cut as `draw(..., spread=True)` finds it (the raw-space
    threshold: tokens x >= cut are kept; -inf for rows without a cut). For tests: the draw
    without its pick."""
    keys = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    return _launch(x, prm, keys, (0, 0), chunk, None, None, 0, True, pick=False)[1][:, 0].clone()


def _launch(x, prm, keys, base, chunk, edited, edit_map, num_warps, spread, pick, compile_only=False):
    """(ids, cuts [S, 4 + NC_BLOCK] or a dummy) of `draw`; pick False stops before the pick;
    compile_only: each launch only compiles (`compile_pool.launcher`)."""
    assert x.dtype in FLOAT_TYPES and x.stride(1) == 1 and x.shape[1] < (1 << 24)
    assert prm.is_contiguous() and prm.shape == (x.shape[0], NUM_PARAMS) and chunk & (chunk - 1) == 0
    num_rows, vocab = x.shape
    has_edits = edited is not None
    if has_edits:
        assert x.dtype == edited.dtype == torch.float32 and edited.stride(1) == 1
        assert edit_map.dtype == torch.int64
    e, e_stride, e_map = (edited, edited.stride(0), edit_map) if has_edits else (x, 0, keys)
    num_chunks = triton.cdiv(vocab, chunk)
    nc_block = triton.next_power_of_2(num_chunks)
    nb, gather, cand_slots = layout(chunk)
    stats, bmax, work, cut, rounds, totals = _work_buffers(num_rows, num_chunks, nb, spread, x.device)
    out = torch.empty(num_rows, dtype=torch.int64, device=x.device)
    warps = num_warps or (8 if chunk >= 2048 else 4)
    pick_warps = num_warps or PICK_WARPS
    rows = (x, x.stride(0), e, e_stride, e_map, prm)
    launcher(_scan_kernel, (num_rows, num_chunks), compile_only)(
        *rows, stats, bmax, vocab, num_chunks, int(has_edits),
        CHUNK=chunk, NB=nb, NUM_PARAMS=NUM_PARAMS, num_warps=warps,
    )  # fmt: skip
    launch = dict(
        CHUNK=chunk, NB=nb, GATHER=gather, CAND=cand_slots, ROUNDS=MIN_P_ROUNDS, NC_BLOCK=nc_block,
        BLOCK=min(BLOCK, chunk),
        WIDE_BLOCK=WIDE_BLOCK,
        NUM_PARAMS=NUM_PARAMS, num_warps=pick_warps, SPLIT=CUT_SPLIT, STEPS=split_steps(CUT_SPLIT),
    )  # fmt: skip
    args = (*rows, keys, stats, bmax, work, out, cut, vocab, num_chunks, int(has_edits), base[0], base[1])
    cut_pick = launcher(_cut_pick_kernel, (num_rows,), compile_only)
    if not spread:
        cut_pick(*args, MODE=0, **launch)
        return out, cut
    cut_pick(*args, MODE=1, **launch)
    common = (vocab, num_chunks, num_rows, int(has_edits))
    sizes = dict(CHUNK=chunk, NC_BLOCK=nc_block, NUM_PARAMS=NUM_PARAMS, num_warps=warps)
    for r in range(NUM_ROUNDS):
        launcher(_spread_round_kernel, (num_rows, num_chunks), compile_only)(
            *rows, cut, rounds, totals, *common, r, WIDE_BLOCK=min(WIDE_BLOCK, chunk), **sizes
        )
    launcher(_spread_finish_kernel, (num_rows, num_chunks), compile_only)(
        *rows, stats, cut, rounds, totals, *common, NUM_ROUNDS, BLOCK=min(BLOCK, chunk), **sizes
    )
    if pick:
        cut_pick(*args, MODE=2, **launch)
    return out, cut


# The work buffers of recent draw shapes, kept for the next call of the same shape (a decode
# loop keeps its row count for many steps): an allocation and eight views a call cost ~20 us of
# host time. Only the draw's own launches read and write them, and the next draw's launches
# queue after them on the same stream, so reuse is safe; the key holds the stream, so draws on
# other streams never share, and the cache is per thread, so two threads drawing at once (two
# engines in one process) never interleave launches over one buffer. Bounded: WORK_CACHE shapes
# a thread.
WORK_CACHE = 16
_WORK = threading.local()


def _work_buffers(num_rows: int, num_chunks: int, nb: int, spread: bool, device: torch.device) -> list:
    """`_buffers`, reused from this thread's recent call of the same shape, device and stream."""
    cache = getattr(_WORK, "shapes", None)
    if cache is None:
        cache = _WORK.shapes = OrderedDict()
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    key = (num_rows, num_chunks, nb, spread, device, stream, GATHER, CAND, MIN_P_ROUNDS)
    parts = cache.get(key)
    if parts is None:
        parts = cache[key] = _buffers(num_rows, num_chunks, nb, spread, device)
        if len(cache) > WORK_CACHE:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return parts


def _buffers(num_rows: int, num_chunks: int, nb: int, spread: bool, device) -> list:
    """float32 work buffers of one draw, views of one allocation: stats [S * 3 * num_chunks],
    sub-block maxima [S * num_chunks * nb], the cut's per-row scratch [S * (MIN_P_ROUNDS * GATHER +
    2 * CAND)]
    (`_gather_candidates`), and with spread the cuts
    [S, 4 + NC_BLOCK], the rounds' sums [NUM_ROUNDS * S * num_chunks * WAYS] and the survivor
    masses [S * num_chunks] (without spread those three are the whole buffer, never read)."""
    nc_block = triton.next_power_of_2(num_chunks)
    sizes = [
        num_rows * 3 * num_chunks,
        num_rows * num_chunks * nb,
        num_rows * (MIN_P_ROUNDS * GATHER + 2 * CAND),
    ]
    if spread:
        sizes += [num_rows * (4 + nc_block), NUM_ROUNDS * num_rows * num_chunks * WAYS, num_rows * num_chunks]
    # Each part starts 64-byte aligned whatever the row count: Triton specialises pointer
    # arguments on 16-byte alignment, so a part whose offset followed num_rows would compile new
    # variants of the kernels in the middle of traffic (seen on the H200 in a first generate()).
    padded = [_aligned(n) for n in sizes]
    work = torch.empty(sum(padded), dtype=torch.float32, device=device)
    parts = [part[:n] for part, n in zip(torch.split(work, padded), sizes)]
    if not spread:
        return parts + [work, work, work]
    parts[3] = parts[3].view(num_rows, 4 + nc_block)
    return parts
