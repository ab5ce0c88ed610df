"""The sampler's Triton kernels (CUDA; the interpreter in tests): the draw, two launches that
turn [S, V] float32 logits and given thresholds into one token per row, and the penalty
arithmetic in one launch (`apply_penalties`, the fused form of
`sampling_penalties.apply_penalties`). The Sampler on CUDA draws with `cut_draw`, which finds
the thresholds itself and reuses this module's hash, uniforms and chunk scan; `draw` here is
the same draw for thresholds computed elsewhere (and the kernels' reference in tests).

The draw is inverse-CDF sampling split over fixed chunks of CHUNK tokens (`sampling_draw`
states the math and holds the plain-torch version; both compute the same quantities):

1. `_chunk_stats_kernel`, grid (S, ceil(V / CHUNK)): per (row, chunk) the chunk's max logit,
   the first id holding it, and the chunk's kept mass sum(exp2((x - chunk max) * x_scale)) over
   tokens with x >= thr. One read of the logits, spread over thousands of programs, so the pass
   is bandwidth-bound (no per-token hash or logarithm).
2. `_pick_kernel`, grid (S,): per row two uniforms u1, u2 from the row key (the hash of
   `sampling_rng`, uint32 arithmetic); a chunk with probability proportional to its mass
   (prefix sums over the chunks vs u1 * total), then a token of that chunk with probability
   proportional to its weight (running cumsum vs u2 * chunk mass). Greedy rows (noisy == 0)
   take the row's first max instead. Writes int64 ids.

Chunks are CHUNK tokens whatever the batch, so a row's sums, and so its token, never depend
on the other rows. Rows whose key is negative are unseeded: their key halves are derived in the
kernel from (base_lo, base_hi, row) (`sampling_rng.derived_key`), so a batch of unseeded rows
needs no per-step upload.
"""

from __future__ import annotations

from typing import Optional

import torch

from enginespec.kernels.compile_pool import launcher

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional on CPU
    triton = None


BLOCK = 2048  # tokens per loop step of one program (CHUNK must be a multiple)
NUM_WARPS = 8

if triton is not None:

    @triton.jit
    def _mix32(v):
        v = v ^ (v >> 16)
        v = v * 0x7FEB352D
        v = v ^ (v >> 15)
        v = v * 0x6C8E9CF5
        v = v ^ (v >> 13)
        v = v * 0x2C1B3C6D
        return v ^ (v >> 16)

    @triton.jit
    def _uniform(lo, hi, k):
        """sampling_rng.bits_to_uniform(hash_bits(k, lo, hi)): lo, hi uint32 scalars."""
        bits = _mix32(_mix32(lo + k) ^ hi)
        return ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)

    @triton.jit
    def _chunk_stats_kernel(
        x_ptr,
        x_stride,
        scale_ptr,
        thr_ptr,
        stats_ptr,
        vocab,
        num_chunks,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # x_ptr: [S, x_stride] float32, unit stride along the vocab; scale_ptr, thr_ptr: [S]
        # float32; stats_ptr: [S, 3, num_chunks] float32 (chunk max, chunk mass, first argmax).
        row = tl.program_id(0)
        part = tl.program_id(1)
        scale = tl.load(scale_ptr + row)
        thr = tl.load(thr_ptr + row)
        lanes = tl.arange(0, BLOCK)
        row_ptr = x_ptr + row.to(tl.int64) * x_stride
        start = part * CHUNK
        lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
        lane_idx = tl.zeros([BLOCK], dtype=tl.int32)
        run_max = tl.max(lane_max, axis=0)  # fp32 scalar, -inf
        run_mass = tl.sum(tl.zeros([BLOCK], dtype=tl.float32), axis=0)
        for off in range(0, CHUNK, BLOCK):
            cols = start + off + lanes
            xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf"))
            better = xv > lane_max
            lane_max = tl.where(better, xv, lane_max)
            lane_idx = tl.where(better, cols, lane_idx)
            new_max = tl.maximum(run_max, tl.max(xv, axis=0))
            shift = tl.where(new_max > float("-inf"), new_max, 0.0)
            wv = tl.where(xv >= thr, tl.exp2((xv - shift) * scale), 0.0)
            run_mass = run_mass * tl.exp2((run_max - shift) * scale) + tl.sum(wv, axis=0)
            run_max = new_max
        top = tl.max(lane_max, axis=0)
        first = tl.min(tl.where(lane_max == top, lane_idx, 2147483647), axis=0)
        out = stats_ptr + row.to(tl.int64) * 3 * num_chunks + part
        tl.store(out, top)
        tl.store(out + num_chunks, run_mass)
        tl.store(out + 2 * num_chunks, first.to(tl.float32))

    @triton.jit
    def _row_halves(key_ptr, row, base_lo, base_hi):
        """The row key's (lo, hi) uint32 halves; a negative key means unseeded: halves derived
        from (base_lo, base_hi, row) as in sampling_rng.derived_key."""
        key = tl.load(key_ptr + row)
        d_lo = _mix32(row.to(tl.uint32) + base_lo.to(tl.uint32))
        d_hi = _mix32(d_lo ^ base_hi.to(tl.uint32))
        lo = tl.where(key >= 0, key.to(tl.uint32), d_lo)
        hi = tl.where(key >= 0, (key >> 32).to(tl.uint32), d_hi)
        return lo, hi

    @triton.jit
    def _scan_chunk(
        row_ptr,
        start,
        vocab,
        chunk_top,
        scale,
        thr,
        target,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
        STRICT: tl.constexpr = False,
    ):
        """First id in [start, start + CHUNK) whose running weight sum exceeds target (weights
        exp2((x - chunk_top) * scale) on x >= thr, or x > thr with STRICT: rejection top-p's
        redraw above its pivot), else the last id of positive weight, else -1."""
        lanes = tl.arange(0, BLOCK)
        shift = tl.where(chunk_top > float("-inf"), chunk_top, 0.0)
        acc = tl.sum(tl.zeros([BLOCK], dtype=tl.float32), axis=0)
        pick = tl.min(tl.full([BLOCK], 2147483647, tl.int32), axis=0)
        last = tl.max(tl.full([BLOCK], -1, tl.int32), axis=0)
        for off in range(0, CHUNK, BLOCK):
            cols = start + off + lanes
            xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
            keep = (xv > thr) if STRICT else (xv >= thr)
            wv = tl.where(keep, tl.exp2((xv - shift) * scale), 0.0)
            run = tl.cumsum(wv, axis=0) + acc
            positive = wv > 0.0
            pick = tl.minimum(pick, tl.min(tl.where((run > target) & positive, cols, 2147483647), axis=0))
            last = tl.maximum(last, tl.max(tl.where(positive, cols, -1), axis=0))
            acc = acc + tl.sum(wv, axis=0)
        return tl.where(pick < 2147483647, pick, last)

    @triton.jit(do_not_specialize=["base_lo", "base_hi"])
    def _pick_kernel(
        x_ptr,
        x_stride,
        scale_ptr,
        thr_ptr,
        noisy_ptr,
        key_ptr,
        stats_ptr,
        out_ptr,
        vocab,
        num_chunks,
        base_lo,
        base_hi,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
        NC_BLOCK: tl.constexpr,
    ):
        # x_ptr: [S, x_stride] float32; scale/thr/noisy_ptr: [S] float32; key_ptr: [S] int64;
        # stats_ptr: [S, 3, num_chunks] float32 from _chunk_stats_kernel; out_ptr: [S] int64.
        row = tl.program_id(0)
        parts = tl.arange(0, NC_BLOCK)
        valid = parts < num_chunks
        stats = stats_ptr + row.to(tl.int64) * 3 * num_chunks
        tops = tl.load(stats + parts, mask=valid, other=float("-inf"))
        masses = tl.load(stats + num_chunks + parts, mask=valid, other=0.0)
        firsts = tl.load(stats + 2 * num_chunks + parts, mask=valid, other=0.0).to(tl.int32)
        row_max = tl.max(tops, axis=0)
        greedy = tl.min(tl.where(valid & (tops == row_max), firsts, 2147483647), axis=0)
        scale = tl.load(scale_ptr + row)
        row_shift = tl.where(row_max > float("-inf"), row_max, 0.0)
        part_mass = tl.where(valid, masses * tl.exp2((tops - row_shift) * scale), 0.0)
        prefix = tl.cumsum(part_mass, axis=0)
        total = tl.sum(tl.where(parts == num_chunks - 1, prefix, 0.0), axis=0)
        lo, hi = _row_halves(key_ptr, row, base_lo, base_hi)
        u1 = _uniform(lo, hi, 0)
        u2 = _uniform(lo, hi, 1)
        hit = tl.min(tl.where((prefix > u1 * total) & (part_mass > 0.0), parts, NC_BLOCK), axis=0)
        last_part = tl.max(tl.where(part_mass > 0.0, parts, 0), axis=0)
        chosen = tl.where(hit < NC_BLOCK, hit, last_part)
        chunk_top = tl.load(stats + chosen)
        target = u2 * tl.load(stats + num_chunks + chosen)
        tok = _scan_chunk(
            x_ptr + row.to(tl.int64) * x_stride,
            chosen * CHUNK,
            vocab,
            chunk_top,
            scale,
            tl.load(thr_ptr + row),
            target,
            CHUNK,
            BLOCK,
        )
        noisy = tl.load(noisy_ptr + row)
        tok = tl.where((noisy > 0.0) & (tok >= 0), tok, greedy)
        tl.store(out_ptr + row, tok.to(tl.int64))

    @triton.jit
    def _penalty_kernel(
        x_ptr,
        x_stride,
        src_ptr,
        src_stride,
        src_map_ptr,
        rows_ptr,
        slots_ptr,
        prompt_ptr,
        counts_ptr,
        rep_ptr,
        freq_ptr,
        pres_ptr,
        vocab,
        BLOCK: tl.constexpr,
        USE_SOURCE: tl.constexpr,
    ):
        # x_ptr: [S, x_stride] float32, written on rows rows_ptr[i] (int64 [R]): in place, or
        # (USE_SOURCE) from row src_map_ptr[rows_ptr[i]] (int64) of src_ptr [*, src_stride], the
        # copy and the edit in one pass; slots_ptr: int64 [R], row i's row of the tables:
        # prompt_ptr [*, vocab] uint8 (1 = token in the prompt), counts_ptr [*, vocab] int32
        # output counts; rep_ptr, freq_ptr, pres_ptr: [R] float32.
        i = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < vocab
        row = tl.load(rows_ptr + i)
        x_row = x_ptr + row * x_stride
        if USE_SOURCE:
            xv = tl.load(src_ptr + tl.load(src_map_ptr + row) * src_stride + cols, mask=inside, other=0.0)
        else:
            xv = tl.load(x_row + cols, mask=inside, other=0.0)
        slot = tl.load(slots_ptr + i)
        count = tl.load(counts_ptr + slot * vocab + cols, mask=inside, other=0)
        in_prompt = tl.load(prompt_ptr + slot * vocab + cols, mask=inside, other=0)
        rep = tl.load(rep_ptr + i)
        in_output = count > 0
        scaled = tl.where(xv > 0.0, tl.div_rn(xv, rep), xv * rep)  # IEEE division, as torch
        xv = tl.where((in_prompt != 0) | in_output, scaled, xv)
        xv = (
            xv
            - tl.load(freq_ptr + i) * count.to(tl.float32)
            - tl.load(pres_ptr + i) * in_output.to(tl.float32)
        )
        tl.store(x_row + cols, xv, mask=inside)


def available(device: torch.device) -> bool:
    """The kernels run on CUDA tensors (and under TRITON_INTERPRET=1 for tests)."""
    return triton is not None and device.type == "cuda"


def draw(
    x: torch.Tensor,
    x_scale: torch.Tensor,
    thr: torch.Tensor,
    noisy: torch.Tensor,
    keys: torch.Tensor,
    base: tuple[int, int],
    *,
    chunk: int,
    block: int = 0,
    num_warps: int = 0,
) -> torch.Tensor:
    """Token per row of x [S, V] (float32, unit stride along V). Per row: float32 x_scale (> 0),
    thr (-inf = no cut), noisy (1 random, 0 greedy) and int64 keys (>= 0 seeded key, < 0
    unseeded: derived from base = (base_lo, base_hi), each in [0, 2**31)). Returns int64 [S].
    chunk: tokens per chunk (a multiple of BLOCK or a power of two below it; the sampler passes
    enginespec.sample.draw.CHUNK, so both draw paths split the vocabulary alike). block / num_warps override BLOCK / NUM_WARPS (tuning:
    they change sums only in rounding, so tokens only on near-boundary rows; chunk changes the
    draw itself, and so every seeded request's tokens)."""
    block = min(block or BLOCK, chunk)
    assert chunk % block == 0 and x.stride(1) == 1 and x.shape[1] < (1 << 24)
    num_rows, vocab = x.shape
    num_chunks = triton.cdiv(vocab, chunk)
    stats = torch.empty((num_rows, 3, num_chunks), dtype=torch.float32, device=x.device)
    out = torch.empty(num_rows, dtype=torch.int64, device=x.device)
    warps = num_warps or (NUM_WARPS if block >= 1024 else 4)
    _chunk_stats_kernel[(num_rows, num_chunks)](
        x, x.stride(0), x_scale, thr, stats, vocab, num_chunks, CHUNK=chunk, BLOCK=block, num_warps=warps
    )
    _pick_kernel[(num_rows,)](
        x,
        x.stride(0),
        x_scale,
        thr,
        noisy,
        keys,
        stats,
        out,
        vocab,
        num_chunks,
        base[0],
        base[1],
        CHUNK=chunk,
        BLOCK=block,
        NC_BLOCK=triton.next_power_of_2(num_chunks),
        num_warps=warps,
    )
    return out


def apply_penalties(
    x: torch.Tensor,
    rows: torch.Tensor,
    prompt: torch.Tensor,
    counts: torch.Tensor,
    rep: torch.Tensor,
    freq: torch.Tensor,
    pres: torch.Tensor,
    slots: torch.Tensor,
    source: Optional[tuple] = None,
    compile_only: bool = False,
) -> None:
    """`sampling_penalties.apply_penalties`' arithmetic in one launch, in place on x [S, V]
    (unit stride along V): rows int64 [R] of x; slots int64 [R], each row's row of the tables
    prompt bool [N, V] and counts int32 [N, V] (output occurrences), read in place (no gather);
    rep, freq, pres float32 [R]. Same operations in the same order as the torch version, with
    IEEE-rounded division (div_rn), so results match it up to FMA contraction. source = (src,
    src_map): row r of x is written from row src_map[r] (int64) of src (unit stride) instead
    of edited in place, so a copy of the rows need not be made first. compile_only: compile the
    launch's variant (Triton's warmup, kernels/compile_pool.py) and launch nothing."""
    assert x.stride(1) == 1 and prompt.is_contiguous() and counts.is_contiguous()
    vocab = counts.shape[1]
    src, src_map = source if source is not None else (x, rows)
    assert src.stride(1) == 1
    launcher(_penalty_kernel, (rows.shape[0], triton.cdiv(vocab, BLOCK)), compile_only)(
        x,
        x.stride(0),
        src,
        src.stride(0),
        src_map,
        rows,
        slots,
        prompt.view(torch.uint8),
        counts,
        rep,
        freq,
        pres,
        vocab,
        BLOCK=BLOCK,
        USE_SOURCE=source is not None,
        num_warps=NUM_WARPS,
    )
