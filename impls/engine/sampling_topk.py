"""Row-wise top-k over a large vocabulary in two stages, for GPU parallelism.

`torch.topk` over 256 rows of 151,936 logits keeps one row per thread block and costs about
ten full-row passes on an H200. Splitting each row into C equal chunks (a free view when C
divides V) gives C times more independent slices; the top-k of each chunk, then the top-k of
those C * k survivors, is exactly the row's top-k (every row winner is a winner of its chunk).
"""
from __future__ import annotations

import torch

MIN_CHUNK = 2048   # below this a chunk is too short to be worth a slice of its own
MAX_CHUNKS = 64


def num_chunks(vocab: int, k: int) -> int:
    """Largest power-of-two C <= MAX_CHUNKS dividing vocab with chunks >= max(MIN_CHUNK, 4k);
    1 when none (then this is a plain torch.topk)."""
    c = 1
    while (c * 2 <= MAX_CHUNKS and vocab % (c * 2) == 0
           and vocab // (c * 2) >= max(MIN_CHUNK, 4 * k)):
        c *= 2
    return c


def topk(x: torch.Tensor, k: int, *, chunked: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest entries per row of x [R, V], sorted descending.
    Ties may resolve to different indices than torch.topk; the values are identical.
    `chunked` None = two stages on CUDA only (on CPU one stage is as fast)."""
    rows, vocab = x.shape
    chunks = num_chunks(vocab, k)
    if chunked is None:
        chunked = x.device.type == "cuda"
    if chunks == 1 or not chunked:
        return torch.topk(x, k, dim=1)
    width = vocab // chunks
    part_v, part_i = torch.topk(x.reshape(rows * chunks, width), k, dim=1)
    offsets = torch.arange(0, vocab, width, device=x.device).repeat(rows).unsqueeze(1)
    part_i = (part_i + offsets).view(rows, chunks * k)
    values, pos = torch.topk(part_v.view(rows, chunks * k), k, dim=1)
    return values, part_i.gather(1, pos)
