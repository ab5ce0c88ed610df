"""ReferenceAttention: paged attention in plain torch, one request at a time. The oracle.

Slow on purpose: every request gathers its whole context through its block table and runs a
dense masked softmax, so there is nothing clever to get wrong. Other backends are tested
against it (conformance point 7).

Pool layout per layer: [2, num_blocks + 1, block_size, kv_heads, head_dim]; index 0 = K,
1 = V; the last block is scratch: rows with slot -1 (padding) write there and nothing reads it.
"""

from __future__ import annotations

from typing import Optional

import torch

from enginespec.spec import BatchMeta

# Most score elements one _attend call holds (64 MiB of float32): forward attends a prefill
# chunk this many scores at a time, so its memory is O(budget + context), never chunk x context.
SCORE_BUDGET = 1 << 24


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax in at least float32 (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


class ReferenceAttention:
    """Plain-torch AttentionBackend: per-request gather, causal by position, GQA, sliding window."""

    name = "reference"

    def allocate(self, shape, dtype: torch.dtype, device) -> torch.Tensor:
        """Zeroed pool [2, *shape] for shape (num_blocks + 1, block_size, kv_heads, head_dim)."""
        if len(shape) != 4 or min(shape) < 1:
            raise ValueError(
                f"allocate: shape must be (num_blocks + 1, block_size, kv_heads, head_dim) "
                f"with every entry >= 1, got {tuple(shape)}"
            )
        return torch.zeros((2, *shape), dtype=dtype, device=device)

    def write(self, cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: BatchMeta) -> None:
        """cache[:, slot // bs, slot % bs] = k, v for each row; slot -1 goes to the scratch block."""
        num_pool_blocks, block_size = cache.shape[1], cache.shape[2]
        scratch = num_pool_blocks - 1
        slots = meta.slot_mapping.to(torch.int64)
        if slots.shape[0] != k.shape[0] or k.shape != v.shape:
            raise ValueError(
                f"write: k {tuple(k.shape)}, v {tuple(v.shape)} and slot_mapping "
                f"{tuple(slots.shape)} must agree on N rows"
            )
        if slots.numel() and (int(slots.max()) >= scratch * block_size or int(slots.min()) < -1):
            raise ValueError(
                f"write: slots must be -1 or in [0, {scratch * block_size}), "
                f"got range [{int(slots.min())}, {int(slots.max())}]"
            )
        pad = slots < 0
        blocks = torch.where(pad, torch.full_like(slots, scratch), slots // block_size)
        offsets = torch.where(pad, torch.zeros_like(slots), slots % block_size)
        cache[0, blocks, offsets] = k.to(cache.dtype)
        cache[1, blocks, offsets] = v.to(cache.dtype)

    def forward(
        self,
        q: torch.Tensor,
        cache: torch.Tensor,
        meta: BatchMeta,
        scale: Optional[float] = None,
        window: int = 0,
    ) -> torch.Tensor:
        """q [N, Hq, D] -> [N, Hq, D]; request r's t rows are the last t positions of its seq_len."""
        num_q_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = cache.shape[3]
        if num_q_heads % num_kv_heads:
            raise ValueError(
                f"forward: q heads ({num_q_heads}) must be a multiple of kv heads ({num_kv_heads})"
            )
        scale = head_dim**-0.5 if scale is None else scale
        out = torch.zeros_like(q)
        qsl = meta.query_start_loc_cpu.tolist()
        seq_lens = meta.seq_lens_cpu.tolist()
        for r, seq_len in enumerate(seq_lens):
            start, end = qsl[r], qsl[r + 1]
            if seq_len == 0 or end == start:
                continue  # padding request: its row stays zero
            if end - start > seq_len:
                raise ValueError(f"forward: request {r} has {end - start} query rows but seq_len {seq_len}")
            k, v = self._gather(cache, meta.block_table[r], seq_len, meta.block_size)
            group, dtype = num_q_heads // num_kv_heads, _compute_dtype(q.dtype)
            k = k.to(dtype).repeat_interleave(group, dim=1)  # query head h reads kv head h // group
            v = v.to(dtype).repeat_interleave(group, dim=1)  # once per request, not per piece
            rows = max(1, SCORE_BUDGET // (num_q_heads * seq_len))  # a row's scores: [Hq, seq_len]
            for lo in range(start, end, rows):
                hi = min(lo + rows, end)
                upto = seq_len - (end - hi)  # rows lo..hi-1 are the last hi - lo of positions 0..upto-1
                out[lo:hi] = self._attend(q[lo:hi], k[:upto], v[:upto], upto, scale, window)
        return out

    @staticmethod
    def _gather(cache: torch.Tensor, table_row: torch.Tensor, seq_len: int, block_size: int):
        """K, V [seq_len, kv_heads, D] of positions 0..seq_len-1 through the block table."""
        positions = torch.arange(seq_len, device=cache.device)
        blocks = table_row.to(torch.int64)[positions // block_size]
        offsets = positions % block_size
        return cache[0, blocks, offsets], cache[1, blocks, offsets]

    @staticmethod
    def _attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int, scale: float, window: int
    ) -> torch.Tensor:
        """Dense masked softmax attention of t queries (positions seq_len-t..seq_len-1) over
        k, v [seq_len, Hq, D] (one kv head per query head, in the compute dtype)."""
        num_rows = q.shape[0]
        scores = torch.einsum("thd,shd->hts", q.to(k.dtype), k) * scale
        q_pos = torch.arange(seq_len - num_rows, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        allowed = k_pos <= q_pos
        if window > 0:
            allowed &= k_pos > q_pos - window
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.einsum("hts,shd->thd", probs, v).to(q.dtype)
