"""The AttentionBackend protocol: attention over the paged KV pool for one flat batch."""

from __future__ import annotations

from typing import Optional, Protocol, runtime_checkable

import torch

from enginespec.spec.batch import BatchMeta


@runtime_checkable
class AttentionBackend(Protocol):
    """Paged attention for one layer's pool.

    Pool layout per layer: one tensor [2, num_blocks + 1, block_size, kv_heads, head_dim]
    (index 0 = K, 1 = V); the last block is the scratch block that padding rows (slot -1)
    write to and nothing reads.
    `forward`: request r's t query rows attend causally to the last t positions of its
    seq_len-long context: query j of r sits at position seq_len - t + j and sees keys at
    positions <= its own (and > position - window when window > 0). GQA: query head h reads
    kv head h // (Hq // Hkv). Rows of requests with seq_len 0 (padding) output zeros.
    """

    name: str

    def allocate(self, shape: tuple[int, int, int, int], dtype: torch.dtype, device) -> torch.Tensor:
        """Allocate one layer's pool for shape (num_blocks + 1, block_size, kv_heads, head_dim);
        returns [2, *shape]."""
        ...

    def write(self, cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: BatchMeta) -> None:
        """Store k, v [N, kv_heads, head_dim] at meta.slot_mapping (slot -1: the scratch block)."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        cache: torch.Tensor,
        meta: BatchMeta,
        scale: Optional[float] = None,
        window: int = 0,
    ) -> torch.Tensor:
        """q [N, Hq, D] -> [N, Hq, D]; scale defaults to D ** -0.5."""
        ...
