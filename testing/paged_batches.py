"""Random paged batches for the kernel tests and benchmarks (no test framework imports).

`random_batch` draws a ragged flat batch the way the engine builds one: requests with
different context lengths, some decoding (one query row), some in a prefill chunk (several
rows at the end of their context), optional padding rows (seq_len 0, slot -1), and block tables
that are random permutations of the pool's blocks. Pool slots no request owns are filled with
NaN, so a kernel that reads outside a request's context poisons its output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor  # [N, Hq, D]
    cache: torch.Tensor  # [2, num_blocks + 1, block_size, Hkv, D]
    query_start_loc: torch.Tensor  # int32 [B + 1]
    seq_lens: torch.Tensor  # int32 [B]
    block_table: torch.Tensor  # int32 [B, max_blocks]
    slot_mapping: torch.Tensor  # int64 [N]; -1 for padding rows
    positions: torch.Tensor  # int64 [N]; 0 for padding rows
    max_query_len: int
    max_seq_len: int


def _lengths(gen: torch.Generator, num_reqs: int, max_seq_len: int, max_query_len: int):
    seq_lens, q_lens = [], []
    for _ in range(num_reqs):
        seq_len = int(torch.randint(1, max_seq_len + 1, (1,), generator=gen))
        decode = bool(torch.rand(1, generator=gen) < 0.5)
        hi = min(seq_len, max_query_len)
        q_len = 1 if decode else int(torch.randint(1, hi + 1, (1,), generator=gen))
        seq_lens.append(seq_len)
        q_lens.append(q_len)
    return seq_lens, q_lens


def random_batch(
    num_reqs: int,
    max_seq_len: int,
    max_query_len: int,
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device="cpu",
    num_padding: int = 0,
    spare_blocks: int = 3,
    seed: int = 0,
    lengths: Optional[tuple[list[int], list[int]]] = None,
) -> PagedBatch:
    """A random batch; `lengths` = (seq_lens, q_lens) overrides the drawn lengths."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens, q_lens = lengths or _lengths(gen, num_reqs, max_seq_len, max_query_len)
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(blocks_per_req + [1])
    table = torch.zeros(len(seq_lens) + num_padding, max_blocks, dtype=torch.int32)
    shape = (2, num_blocks + 1, block_size, num_kv_heads, head_dim)
    cache = torch.full(shape, float("nan"), dtype=dtype)
    slots, positions = [], []
    for r, (seq_len, q_len) in enumerate(zip(seq_lens, q_lens)):
        own = [perm.pop() for _ in range(blocks_per_req[r])]
        table[r, : len(own)] = torch.tensor(own, dtype=torch.int32)
        pos = torch.arange(seq_len)
        flat = torch.tensor(own)[pos // block_size] * block_size + pos % block_size
        values = torch.randn(2, seq_len, num_kv_heads, head_dim, generator=gen)
        cache.view(2, -1, num_kv_heads, head_dim)[:, flat] = values.to(dtype)
        slots.append(flat[seq_len - q_len :])
        positions.append(pos[seq_len - q_len :])
    q_lens = list(q_lens) + [1] * num_padding
    seq_lens = list(seq_lens) + [0] * num_padding
    slots.append(torch.full((num_padding,), -1, dtype=torch.int64))
    positions.append(torch.zeros(num_padding, dtype=torch.int64))
    qsl = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    num_tokens = int(qsl[-1])
    q = torch.randn(num_tokens, num_q_heads, head_dim, generator=gen).to(dtype)
    return PagedBatch(
        q.to(device),
        cache.to(device),
        qsl.to(device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        table.to(device),
        torch.cat(slots).to(device),
        torch.cat(positions).to(device),
        max(q_lens),
        max(seq_lens),
    )


TOLERANCES = {
    torch.float32: dict(atol=2e-4, rtol=2e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}
