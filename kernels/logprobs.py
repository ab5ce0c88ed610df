"""Logprobs of the raw distribution in two launches, without materialising log_softmax.

For rows asking for logprobs the sampler reports log_softmax(raw logits) at the sampled token
and the top-K (id, logprob) pairs. In torch that is a copy of the rows, a log_softmax written
out, a gather and a full-row topk: several passes over [R, V]. Here:

1. `_chunk_kernel`, grid (R, num_chunks): one read of the rows. Per chunk of CHUNK tokens its
   max m_j and sum exp(x - m_j) s_j, and (when K > 0) the max of each sub-block of SUB tokens.
   No top-K work here: the whole launch streams at the read rate.
2. `_merge_kernel`, grid (R,): the normaliser lse = M + log(sum_j s_j exp(m_j - M)), the sampled
   token's logprob x[token] - lse, and the row's top-K, written straight into the float64
   layout of `sample.deferred.DeviceLogprobs.packed`: [chosen, K values, K ids].

Why the top K lie in K sub-blocks. Rank tokens by (value descending, id ascending) and
sub-blocks by (max descending, index ascending), and take the K first sub-blocks. Let t be a
token of a sub-block b that was not taken. Every taken sub-block u has max_u >= max_b >= t, and
where max_u equals t, u and b tie on their maxima, so u comes before b and its tokens have the
smaller ids. Each of the K taken sub-blocks' max tokens therefore ranks above t, and t is not in
the top K. (A row of fewer than K sub-blocks takes them all.) The merge ranks the row's V / SUB
sub-block maxima, gathers those K sub-blocks ([KP, SUB] tokens, KP = MAX_K rows of which K are
read) and takes K rounds of max-and-remove there. Ties go to the lower id, as torch.topk on
these rows; a row with fewer than K finite values still yields K distinct ids.

K is a runtime argument (storage and tiles padded to KP = MAX_K), so a new logprobs count
compiles nothing inside a user's request. Values equal torch's log_softmax up to float32
rounding (the normaliser is summed in another order).
"""

from __future__ import annotations

import torch

from enginespec.kernels.compile_pool import launcher

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional on CPU
    triton = None

# tokens per program of the first pass (H200, 64 rows x 151,936 at K 5: the first pass 12 us,
# the merge 9; benchmarks/RESULTS.md, twenty-second session)
CHUNK = 4096
SUB = 128  # tokens per sub-block whose max the first pass keeps (CHUNK's, if smaller)
MAX_K = 32  # larger top-k requests take the torch path

if triton is not None:

    @triton.jit(do_not_specialize=["k"])
    def _chunk_kernel(
        x_ptr, x_stride, rows_ptr, stats_ptr, sub_ptr, vocab, num_chunks, k,
        CHUNK: tl.constexpr, SUB: tl.constexpr,
    ):  # fmt: skip
        # x_ptr: [S, x_stride] (any float dtype, unit stride); rows_ptr: int64 [R];
        # stats_ptr: float32 [R, num_chunks, 2] (max, sum exp); sub_ptr: float32
        # [R, num_chunks * CHUNK // SUB], each sub-block's max (-inf past vocab), written when k > 0.
        i = tl.program_id(0)
        part = tl.program_id(1)
        row = tl.load(rows_ptr + i)
        NSUB: tl.constexpr = CHUNK // SUB
        subs = tl.arange(0, NSUB)
        cols = part * CHUNK + subs[:, None] * SUB + tl.arange(0, SUB)[None, :]  # [NSUB, SUB]
        xv = tl.load(x_ptr + row * x_stride + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        sub_max = tl.max(xv, axis=1)  # [NSUB]
        top = tl.max(sub_max, axis=0)
        shift = tl.where(top > float("-inf"), top, 0.0)
        stats = stats_ptr + (i.to(tl.int64) * num_chunks + part) * 2
        tl.store(stats, top)
        tl.store(stats + 1, tl.sum(tl.sum(tl.exp(xv - shift), axis=1), axis=0))
        if k > 0:
            tl.store(sub_ptr + (i.to(tl.int64) * num_chunks + part) * NSUB + subs, sub_max)

    @triton.jit
    def _top_sub_blocks(row_sub_ptr, vocab, k, NS_BLOCK: tl.constexpr, SUB: tl.constexpr, KP: tl.constexpr):
        # int32 [KP]: the indices of the row's k first sub-blocks by (max descending, index
        # ascending) in lanes 0..k-1, -1 in the others (and where the row has fewer than k).
        # row_sub_ptr: float32 [>= cdiv(vocab, SUB)], the row's sub-block maxima.
        idx = tl.arange(0, NS_BLOCK)
        alive = idx < tl.cdiv(vocab, SUB)
        maxima = tl.load(row_sub_ptr + idx, mask=alive, other=float("-inf"))
        lanes = tl.arange(0, KP)
        taken = tl.full([KP], -1, dtype=tl.int32)
        for j in range(k):
            best = tl.max(tl.where(alive, maxima, float("-inf")), axis=0)
            pick = tl.min(tl.where(alive & (maxima == best), idx, 2147483647), axis=0)
            taken = tl.where((lanes == j) & (pick < 2147483647), pick, taken)
            alive = alive & (idx != pick)
        return taken

    @triton.jit(do_not_specialize=["k", "sub_stride"])  # sub_stride 1 (k = 0) needs no variant of its own
    def _merge_kernel(
        x_ptr, x_stride, rows_ptr, tok_ptr, stats_ptr, sub_ptr, sub_stride, out_ptr, vocab, num_chunks, k,
        NC_BLOCK: tl.constexpr, NS_BLOCK: tl.constexpr, SUB: tl.constexpr, KP: tl.constexpr,
    ):  # fmt: skip
        # tok_ptr: int64 [S] sampled ids (indexed by batch row); sub_ptr: as _chunk_kernel's,
        # rows sub_stride apart (the first cdiv(vocab, SUB) entries a row are read);
        # out_ptr: float64 [R, 1 + 2k].
        i = tl.program_id(0)
        row = tl.load(rows_ptr + i)
        parts = tl.arange(0, NC_BLOCK)
        valid = parts < num_chunks
        stats = stats_ptr + i.to(tl.int64) * num_chunks * 2 + parts * 2
        tops = tl.load(stats, mask=valid, other=float("-inf"))
        sums = tl.load(stats + 1, mask=valid, other=0.0)
        x_max = tl.max(tops, axis=0)
        shift = tl.where(x_max > float("-inf"), x_max, 0.0)
        lse = shift + tl.log(tl.sum(tl.where(valid, sums * tl.exp(tops - shift), 0.0), axis=0))
        tok = tl.load(tok_ptr + row)
        out = out_ptr + i.to(tl.int64) * (1 + 2 * k)
        tl.store(out, (tl.load(x_ptr + row * x_stride + tok).to(tl.float32) - lse).to(tl.float64))
        if k > 0:
            taken = _top_sub_blocks(sub_ptr + i.to(tl.int64) * sub_stride, vocab, k, NS_BLOCK, SUB, KP)
            cols = taken[:, None] * SUB + tl.arange(0, SUB)[None, :]  # [KP, SUB] token ids
            alive = (taken[:, None] >= 0) & (cols < vocab)
            vals = tl.load(x_ptr + row * x_stride + cols, mask=alive, other=float("-inf")).to(tl.float32)
            for j in range(k):
                best = tl.max(tl.max(tl.where(alive, vals, float("-inf")), axis=1), axis=0)
                hit = alive & (vals == best)
                pick = tl.min(tl.min(tl.where(hit, cols, 2147483647), axis=1), axis=0)
                tl.store(out + 1 + j, (best - lse).to(tl.float64))
                tl.store(out + 1 + k + j, pick.to(tl.float64))
                alive = alive & (cols != pick)


def available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def logprobs(
    raw: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, k: int, compile_only: bool = False
) -> torch.Tensor:
    """float64 [R, 1 + 2k] for the rows `rows` (int64 [R]) of raw [S, V] (unit stride along V,
    any float dtype): log_softmax at tokens[row] (tokens int64 [S]), then the k largest
    logprobs, then their ids. 0 <= k <= MAX_K, k <= V. Two launches, no host sync.
    compile_only: compile their variants (Triton's warmup, kernels/compile_pool.py) and launch
    nothing; the result is then uninitialised."""
    assert raw.stride(1) == 1 and 0 <= k <= MAX_K and k <= raw.shape[1]
    sub = min(SUB, CHUNK)  # both powers of two
    num_rows, vocab = rows.shape[0], raw.shape[1]
    num_chunks = triton.cdiv(vocab, CHUNK)
    dev = raw.device
    stats = torch.empty((num_rows, num_chunks, 2), dtype=torch.float32, device=dev)
    # the sub-block maxima only serve the top k: none kept (nor allocated) when k is 0; NS_BLOCK
    # below does not follow k, so k = 0 and k > 0 share one compiled merge
    sub_max = torch.empty(
        (num_rows, num_chunks * (CHUNK // sub) if k else 1), dtype=torch.float32, device=dev
    )
    out = torch.empty((num_rows, 1 + 2 * k), dtype=torch.float64, device=dev)
    if num_rows == 0:
        return out
    launcher(_chunk_kernel, (num_rows, num_chunks), compile_only)(
        raw, raw.stride(0), rows, stats, sub_max, vocab, num_chunks, k, CHUNK=CHUNK, SUB=sub, num_warps=8
    )
    launcher(_merge_kernel, (num_rows,), compile_only)(
        raw, raw.stride(0), rows, tokens, stats, sub_max, sub_max.stride(0), out, vocab, num_chunks, k,
        NC_BLOCK=triton.next_power_of_2(num_chunks), NS_BLOCK=triton.next_power_of_2(num_chunks * (CHUNK // sub)),
        SUB=sub, KP=MAX_K, num_warps=8,
    )  # fmt: skip
    return out
