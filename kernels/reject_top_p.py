"""Top-p by rejection on the device (sample/reject.py has the rule and why it is exact).

After the draw (`cut_draw.draw` with the loose rows' top-p left out: round 0), each round r of
GRID_ROUNDS is two launches over the loose rows:

1. `_above_kernel`, grid (L, num_chunks): per chunk of a row not yet done, its max logit, the
   mass of its tokens above the current token's logit, and (round 1) its whole mass, each
   weight exp2((x - chunk max) * x_scale). One read of the row spread over num_chunks programs.
2. `_pick_kernel`, grid (L,): the row's A and total from the chunk sums (rescaled to the row
   max); accept (done) when A < top_p * total, else draw t_r over the tokens above the pivot:
   a chunk by u1 over the chunk masses above it, a token of that chunk by u2 (one chunk read).

Rows still undone after GRID_ROUNDS (about 1e-4 of rows at top-p 0.95) finish in
`_finish_kernel`, grid (L,), which runs the same rounds in one program per row until it
accepts. Programs of finished rows return at once, so an idle round costs two small launches.
Sums run in another order than torch's, so a token within float rounding of the acceptance
boundary, or a uniform within rounding of a CDF boundary, may go the other way.
"""

from __future__ import annotations

import torch

from enginespec.kernels import cut_draw
from enginespec.kernels import sampling as sampling_kernels
from enginespec.kernels.compile_pool import launcher

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional on CPU
    triton = None

GRID_ROUNDS = 3  # full-grid rounds before the per-row finish (top-p 0.95: ~1e-4 of rows left)
BLOCK = 2048  # tokens per loop step
MAX_ROUNDS = 4096  # sample/reject.py's bound

if triton is not None:
    _row_ptr = cut_draw._row_ptr
    _row_halves = sampling_kernels._row_halves
    _uniform = sampling_kernels._uniform

    @triton.jit
    def _chunk_sums(row_ptr, start, vocab, scale, pivot, CHUNK: tl.constexpr):
        """(max, mass above pivot, mass) of the chunk at start: weights exp2((x - max) * scale).
        The whole chunk is read in one load, as cut_draw's scan reads it: on the H200 a loop of
        2,048-token steps with a running max took 46 us over 256 rows x 151,936 where the scan
        takes 36."""
        cols = start + tl.arange(0, CHUNK)
        xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        top = tl.max(xv, axis=0)
        shift = tl.where(top > float("-inf"), top, 0.0)
        wv = tl.exp2((xv - shift) * scale)
        return top, tl.sum(tl.where(xv > pivot, wv, 0.0), axis=0), tl.sum(wv, axis=0)

    @triton.jit
    def _choose_chunk(part, u1, chunks):
        """First chunk whose running sum of part [NC_BLOCK] exceeds u1 * sum, else the last
        with positive part (sample/draw.py pick_tokens)."""
        prefix = tl.cumsum(part, axis=0)
        total = tl.sum(part, axis=0)
        hit = tl.min(tl.where((prefix > u1 * total) & (part > 0.0), chunks, 2147483647), axis=0)
        last = tl.max(tl.where(part > 0.0, chunks, -1), axis=0)
        return tl.where(hit < 2147483647, hit, last)

    @triton.jit(do_not_specialize=["has_edits"])
    def _above_kernel(
        x_ptr, x_stride, e_ptr, e_stride, map_ptr,  # the draw's row sources (cut_draw._row_ptr)
        rows_ptr,  # [L] int64: each loose row's batch row
        scale_ptr,  # [S] float32 x_scale
        tok_ptr,  # [S] int64: the current token of each batch row
        done_ptr,  # [L] int32
        stats_ptr,  # [L, 3, num_chunks] float32: chunk max, mass above, whole mass
        vocab, num_chunks, has_edits,
        CHUNK: tl.constexpr, FIRST: tl.constexpr,
    ):  # fmt: skip
        # FIRST (round 1): every row runs, and done_ptr is not yet written (the pick writes it)
        i = tl.program_id(0)
        part = tl.program_id(1)
        if not FIRST:
            if tl.load(done_ptr + i) != 0:
                return
        row = tl.load(rows_ptr + i)
        row_ptr = _row_ptr(x_ptr, x_stride, e_ptr, e_stride, map_ptr, row, has_edits)
        pivot = tl.load(row_ptr + tl.load(tok_ptr + row)).to(tl.float32)
        top, above, mass = _chunk_sums(row_ptr, part * CHUNK, vocab, tl.load(scale_ptr + row), pivot, CHUNK)
        out = stats_ptr + i.to(tl.int64) * 3 * num_chunks + part
        tl.store(out, top)
        tl.store(out + num_chunks, above)
        tl.store(out + 2 * num_chunks, mass)

    @triton.jit
    def _accept_or_draw(
        row_ptr, tops, above, mass, scale, top_p, pivot, lo, hi, round_index, vocab, chunks,
        CHUNK: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """(-1 when the current token is accepted, else the next token) from a row's chunk maxima,
        masses above the pivot and whole masses [NC_BLOCK] (padding chunks: -inf, 0, 0)."""
        row_max = tl.max(tops, axis=0)
        shift = tl.where(row_max > float("-inf"), row_max, 0.0)
        rescale = tl.where(tops > float("-inf"), tl.exp2((tops - shift) * scale), 0.0)
        part = above * rescale
        counter = (2 * round_index).to(tl.uint32)  # uint32: the hash's shifts must be logical
        token = tl.min(tl.full([2], -1, tl.int32), axis=0)
        if tl.sum(part, axis=0) >= top_p * tl.sum(mass * rescale, axis=0):  # rejected: draw above it
            nxt = _choose_chunk(part, _uniform(lo, hi, counter), chunks)
            chosen = chunks == nxt
            chunk_max = tl.sum(tl.where(chosen, tops, 0.0), axis=0)
            target = _uniform(lo, hi, counter + 1) * tl.sum(tl.where(chosen, above, 0.0), axis=0)
            # the first token of the chunk whose running weight above the pivot exceeds target
            token = sampling_kernels._scan_chunk(
                row_ptr, nxt * CHUNK, vocab, chunk_max, scale, pivot, target, CHUNK, BLOCK, STRICT=True
            )
        return token

    @triton.jit(do_not_specialize=["has_edits", "base_lo", "base_hi", "round_index"])
    def _pick_kernel(
        x_ptr, x_stride, e_ptr, e_stride, map_ptr, rows_ptr, scale_ptr, top_p_ptr, key_ptr,
        tok_ptr, done_ptr, stats_ptr,
        vocab, num_chunks, has_edits, base_lo, base_hi, round_index,
        CHUNK: tl.constexpr, BLOCK: tl.constexpr, NC_BLOCK: tl.constexpr, FIRST: tl.constexpr,
    ):  # fmt: skip
        # top_p_ptr: [L] float32; key_ptr: [S] int64 (sampling._row_halves); the rest: _above_kernel.
        # FIRST: done_ptr is written here for every row (no zero fill before the rounds)
        i = tl.program_id(0)
        if not FIRST:
            if tl.load(done_ptr + i) != 0:
                return
        row = tl.load(rows_ptr + i)
        row_ptr = _row_ptr(x_ptr, x_stride, e_ptr, e_stride, map_ptr, row, has_edits)
        chunks = tl.arange(0, NC_BLOCK)
        inside = chunks < num_chunks
        stats = stats_ptr + i.to(tl.int64) * 3 * num_chunks + chunks
        tops = tl.load(stats, mask=inside, other=float("-inf"))
        above = tl.load(stats + num_chunks, mask=inside, other=0.0)
        mass = tl.load(stats + 2 * num_chunks, mask=inside, other=0.0)
        pivot = tl.load(row_ptr + tl.load(tok_ptr + row)).to(tl.float32)
        lo, hi = _row_halves(key_ptr, row, base_lo, base_hi)
        token = _accept_or_draw(
            row_ptr, tops, above, mass, tl.load(scale_ptr + row), tl.load(top_p_ptr + i), pivot,
            lo, hi, round_index, vocab, chunks, CHUNK, BLOCK,
        )  # fmt: skip
        if token < 0:
            tl.store(done_ptr + i, 1)
        else:
            tl.store(tok_ptr + row, token.to(tl.int64))
            if FIRST:
                tl.store(done_ptr + i, 0)

    @triton.jit(do_not_specialize=["has_edits", "base_lo", "base_hi", "first_round"])
    def _finish_kernel(
        x_ptr, x_stride, e_ptr, e_stride, map_ptr, rows_ptr, scale_ptr, top_p_ptr, key_ptr,
        tok_ptr, done_ptr,
        vocab, num_chunks, has_edits, base_lo, base_hi, first_round,
        CHUNK: tl.constexpr, BLOCK: tl.constexpr, NC_BLOCK: tl.constexpr, MAX_ROUNDS: tl.constexpr,
        FIRST: tl.constexpr,
    ):  # fmt: skip
        """The rounds from first_round on, in one program per row, until the row accepts (FIRST:
        no grid round ran, so done_ptr holds nothing yet)."""
        i = tl.program_id(0)
        if not FIRST:
            if tl.load(done_ptr + i) != 0:
                return
        row = tl.load(rows_ptr + i)
        row_ptr = _row_ptr(x_ptr, x_stride, e_ptr, e_stride, map_ptr, row, has_edits)
        scale = tl.load(scale_ptr + row)
        top_p = tl.load(top_p_ptr + i)
        lo, hi = _row_halves(key_ptr, row, base_lo, base_hi)
        chunks = tl.arange(0, NC_BLOCK)
        token = tl.load(tok_ptr + row).to(tl.int32)
        r = first_round
        while (token >= 0) & (r < MAX_ROUNDS):
            pivot = tl.load(row_ptr + token).to(tl.float32)
            tops = tl.full([NC_BLOCK], float("-inf"), tl.float32)
            above = tl.zeros([NC_BLOCK], dtype=tl.float32)
            mass = tl.zeros([NC_BLOCK], dtype=tl.float32)
            for j in range(0, num_chunks):
                t_j, a_j, m_j = _chunk_sums(row_ptr, j * CHUNK, vocab, scale, pivot, CHUNK)
                tops = tl.where(chunks == j, t_j, tops)
                above = tl.where(chunks == j, a_j, above)
                mass = tl.where(chunks == j, m_j, mass)
            nxt = _accept_or_draw(
                row_ptr, tops, above, mass, scale, top_p, pivot, lo, hi, r, vocab, chunks, CHUNK, BLOCK
            )
            if nxt >= 0:
                tl.store(tok_ptr + row, nxt.to(tl.int64))
            token = nxt
            r += 1
        tl.store(done_ptr + i, 1)


def refine(
    x: torch.Tensor,
    rows: torch.Tensor,
    x_scale: torch.Tensor,
    top_p: torch.Tensor,
    keys: torch.Tensor,
    base: tuple[int, int],
    tokens: torch.Tensor,
    *,
    chunk: int,
    edited=None,
    edit_map=None,
    compile_only: bool = False,
) -> torch.Tensor:
    """Rounds 1.. of sample/reject.py on the device, in place on tokens [S] int64 (round 0's
    draw), for the loose rows `rows` [L] int64 of x [S, V] (read as `cut_draw.draw` reads it:
    edited / edit_map the same). x_scale [S] float32, top_p [L] float32, keys [S] int64 as the
    draw's, base its (lo, hi). Returns tokens. 2 * GRID_ROUNDS + 1 launches, no host sync and
    no fill (the first round's pick writes every row's done flag). compile_only: compile those
    launches' variants (Triton's warmup, kernels/compile_pool.py) and launch nothing."""
    num_loose, vocab = rows.shape[0], x.shape[1]
    if num_loose == 0:
        return tokens
    assert tokens.dtype == torch.int64 and tokens.is_contiguous() and x.stride(1) == 1
    has_edits = edited is not None
    e, e_stride, e_map = (edited, edited.stride(0), edit_map) if has_edits else (x, 0, keys)
    num_chunks = triton.cdiv(vocab, chunk)
    nc_block = triton.next_power_of_2(num_chunks)
    done = torch.empty(num_loose, dtype=torch.int32, device=x.device)  # round 1's pick fills it
    stats = torch.empty(num_loose, 3, num_chunks, dtype=torch.float32, device=x.device)
    src = (x, x.stride(0), e, e_stride, e_map, rows, x_scale)
    block = min(BLOCK, chunk)
    warps = 8 if chunk >= 2048 else 4
    for r in range(1, GRID_ROUNDS + 1):
        launcher(_above_kernel, (num_loose, num_chunks), compile_only)(
            *src, tokens, done, stats, vocab, num_chunks, int(has_edits), CHUNK=chunk, FIRST=r == 1,
            num_warps=warps,
        )  # fmt: skip
        launcher(_pick_kernel, (num_loose,), compile_only)(
            *src, top_p, keys, tokens, done, stats, vocab, num_chunks, int(has_edits), base[0], base[1], r,
            CHUNK=chunk, BLOCK=block, NC_BLOCK=nc_block, FIRST=r == 1, num_warps=warps,
        )  # fmt: skip
    launcher(_finish_kernel, (num_loose,), compile_only)(
        *src, top_p, keys, tokens, done, vocab, num_chunks, int(has_edits), base[0], base[1], GRID_ROUNDS + 1,
        CHUNK=chunk, BLOCK=block, NC_BLOCK=nc_block, MAX_ROUNDS=MAX_ROUNDS, FIRST=GRID_ROUNDS == 0,
        num_warps=warps,
    )  # fmt: skip
    return tokens
