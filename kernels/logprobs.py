"""Logprobs of the raw distribution in two launches, without materialising log_softmax.

For rows asking for logprobs the sampler reports log_softmax(raw logits) at the sampled token
and the top-K (id, logprob) pairs. In torch that is a copy of the rows, a log_softmax written
out, a gather and a full-row topk: several passes over [R, V]. Here:

1. `_chunk_kernel`, grid (R, num_chunks): per chunk of the row its max m_j, sum exp(x - m_j)
   s_j, and its K largest (value, id), by K rounds of max-and-remove in registers (first id
   on ties). One read of the rows. K is a runtime argument (storage padded to KP = MAX_K), so
   a new logprobs count compiles nothing inside a user's request.
2. `_merge_kernel`, grid (R,): the normaliser lse = M + log(sum_j s_j exp(m_j - M)), the
   sampled token's logprob x[token] - lse, and the row's top-K from the chunks' (the row's K
   largest are among them), written straight into the float64 layout of
   `sample.deferred.DeviceLogprobs.packed`: [chosen, K values, K ids].

Values equal torch's log_softmax up to float32 rounding (the normaliser is summed in another
order); ids tied in value may come in another order than torch.topk's.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional on CPU
    triton = None

# tokens per program of the first pass (on the H200, 64 rows x 151,936 at K 5: 36 us at 4,096,
# 41 us at 8,192, whose fewer programs each run K rounds over twice the tokens)
CHUNK = 4096
MAX_K = 32  # larger top-k requests take the torch path

if triton is not None:

    @triton.jit(do_not_specialize=["k"])
    def _chunk_kernel(
        x_ptr, x_stride, rows_ptr, stats_ptr, top_v_ptr, top_i_ptr, vocab, num_chunks, k,
        CHUNK: tl.constexpr, KP: tl.constexpr,
    ):  # fmt: skip
        # x_ptr: [S, x_stride] (any float dtype, unit stride); rows_ptr: int64 [R];
        # stats_ptr: float32 [R, num_chunks, 2] (max, sum exp); top_v_ptr / top_i_ptr: float32 /
        # int32 [R, num_chunks, KP], the first k entries written (k <= KP, a runtime value, so
        # one compiled variant serves every k up to KP).
        i = tl.program_id(0)
        part = tl.program_id(1)
        row = tl.load(rows_ptr + i)
        cols = part * CHUNK + tl.arange(0, CHUNK)
        inside = cols < vocab
        xv = tl.load(x_ptr + row * x_stride + cols, mask=inside, other=float("-inf")).to(tl.float32)
        top = tl.max(xv, axis=0)
        shift = tl.where(top > float("-inf"), top, 0.0)
        stats = stats_ptr + (i.to(tl.int64) * num_chunks + part) * 2
        tl.store(stats, top)
        tl.store(stats + 1, tl.sum(tl.exp(xv - shift), axis=0))
        if k > 0:
            lanes = tl.arange(0, KP)
            vals = tl.full([KP], float("-inf"), tl.float32)
            ids = tl.full([KP], 2147483647, tl.int32)
            for j in range(k):
                best = tl.max(xv, axis=0)
                pick = tl.min(tl.where((xv == best) & inside, cols, 2147483647), axis=0)
                vals = tl.where(lanes == j, best, vals)
                ids = tl.where(lanes == j, pick, ids)
                xv = tl.where(cols == pick, float("-inf"), xv)
            out = (i.to(tl.int64) * num_chunks + part) * KP + lanes
            tl.store(top_v_ptr + out, vals)
            tl.store(top_i_ptr + out, ids)

    @triton.jit(do_not_specialize=["k"])
    def _merge_kernel(
        x_ptr, x_stride, rows_ptr, tok_ptr, stats_ptr, top_v_ptr, top_i_ptr, out_ptr, num_chunks, k,
        NC_BLOCK: tl.constexpr, KP: tl.constexpr,
    ):  # fmt: skip
        # tok_ptr: int64 [S] sampled ids (indexed by batch row); out_ptr: float64 [R, 1 + 2k].
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
            offs = tl.arange(0, NC_BLOCK * KP)
            inside = (offs < num_chunks * KP) & (offs % KP < k)
            base = i.to(tl.int64) * num_chunks * KP
            cand = tl.load(top_v_ptr + base + offs, mask=inside, other=float("-inf"))
            ids = tl.load(top_i_ptr + base + offs, mask=inside, other=2147483647)
            for j in range(k):
                best = tl.max(cand, axis=0)
                pick = tl.min(tl.where(cand == best, ids, 2147483647), axis=0)
                tl.store(out + 1 + j, (best - lse).to(tl.float64))
                tl.store(out + 1 + k + j, pick.to(tl.float64))
                cand = tl.where(ids == pick, float("-inf"), cand)


def available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def logprobs(raw: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """float64 [R, 1 + 2k] for the rows `rows` (int64 [R]) of raw [S, V] (unit stride along V,
    any float dtype): log_softmax at tokens[row] (tokens int64 [S]), then the k largest
    logprobs, then their ids. 0 <= k <= MAX_K, k <= V. Two launches, no host sync."""
    assert raw.stride(1) == 1 and 0 <= k <= MAX_K and k <= raw.shape[1]
    num_rows, vocab = rows.shape[0], raw.shape[1]
    num_chunks = triton.cdiv(vocab, CHUNK)
    kp = MAX_K  # storage for any k: one compiled variant
    dev = raw.device
    stats = torch.empty((num_rows, num_chunks, 2), dtype=torch.float32, device=dev)
    top_v = torch.empty((num_rows, num_chunks, kp), dtype=torch.float32, device=dev)
    top_i = torch.empty((num_rows, num_chunks, kp), dtype=torch.int32, device=dev)
    out = torch.empty((num_rows, 1 + 2 * k), dtype=torch.float64, device=dev)
    if num_rows == 0:
        return out
    _chunk_kernel[(num_rows, num_chunks)](
        raw, raw.stride(0), rows, stats, top_v, top_i, vocab, num_chunks, k, CHUNK=CHUNK, KP=kp, num_warps=8
    )
    _merge_kernel[(num_rows,)](
        raw, raw.stride(0), rows, tokens, stats, top_v, top_i, out, num_chunks, k,
        NC_BLOCK=triton.next_power_of_2(num_chunks), KP=kp, num_warps=4,
    )  # fmt: skip
    return out
