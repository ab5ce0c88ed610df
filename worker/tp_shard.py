"""Which part of each checkpoint tensor a tensor-parallel rank holds (Megatron's split).

Per decoder layer, with T ranks:
- q|k|v and gate|up are column-parallel: rank r holds its heads' rows of q, k and v (and their
  biases) and its slice of the intermediate rows of gate and up. Attention then runs on the
  rank's heads alone, and SiLU(gate) * up on its intermediate slice, with no communication.
- o and down are row-parallel: rank r holds the matching input columns, so each rank computes a
  partial sum of the full output; an all-reduce adds them (tp_layers.RowParallelLinear). Their
  biases (if any) are whole on every rank and added once, after the sum.
- The embedding and the LM head are vocab-parallel: rank r holds vocabulary rows
  [r * P, (r + 1) * P) with P = ceil(V / T), the last shard zero-padded to P rows.
- Everything else (norms, rotary, q/k norms) is replicated.

KV heads: with Hkv >= T each rank holds Hkv / T of them; with Hkv < T (say 1 KV head over 2
ranks) each rank holds one, the head its q heads attend to, replicated T / Hkv times (as vLLM
does), so each rank's KV pool holds that head. Requires Hq % T == 0, intermediate % T == 0, and
Hkv % T == 0 or T % Hkv == 0; anything else is a ValueError naming the field.

Invariant: rank r's q heads [r * Hq/T, (r+1) * Hq/T) all read KV heads the rank holds, in the
same GQA grouping as the full model (group size Hq/Hkv), so concatenating the ranks' attention
outputs gives the full model's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from enginespec.worker.loader import TensorSlice

_LAYER = re.compile(r"\.layers\.\d+\.")
_COLUMN_Q = (".self_attn.q_proj.",)
_COLUMN_KV = (".self_attn.k_proj.", ".self_attn.v_proj.")
_COLUMN_MLP = (".mlp.gate_proj.", ".mlp.up_proj.")
_ROW_ATTN = ".self_attn.o_proj.weight"
_ROW_MLP = ".mlp.down_proj.weight"
VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class ShardPlan:
    """Rank `rank` of `world_size`, over a model of these (full) sizes."""

    rank: int
    world_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    def __post_init__(self) -> None:
        t = self.world_size
        if not 0 <= self.rank < t:
            raise ValueError(f"rank must be in [0, {t}), got {self.rank}")
        if self.num_q_heads % t:
            raise ValueError(
                f"tensor_parallel_size ({t}) must divide num_attention_heads ({self.num_q_heads})"
            )
        if self.num_kv_heads % t and t % self.num_kv_heads:
            raise ValueError(
                f"tensor_parallel_size ({t}) must divide num_key_value_heads ({self.num_kv_heads}) "
                f"or be a multiple of it"
            )
        if self.intermediate_size % t:
            raise ValueError(
                f"tensor_parallel_size ({t}) must divide intermediate_size ({self.intermediate_size})"
            )

    @classmethod
    def from_config(cls, config, rank: int, world_size: int) -> "ShardPlan":
        """The plan of one rank for a transformers text config (Llama family field names)."""
        num_q = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // num_q
        return cls(
            rank=rank,
            world_size=world_size,
            num_q_heads=num_q,
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or num_q),
            head_dim=int(head_dim),
            intermediate_size=int(config.intermediate_size),
            vocab_size=int(config.vocab_size),
        )

    @property
    def local_q_heads(self) -> int:
        return self.num_q_heads // self.world_size

    @property
    def local_kv_heads(self) -> int:
        """KV heads this rank holds: Hkv / T, or 1 when they are replicated (Hkv < T)."""
        return max(1, self.num_kv_heads // self.world_size)

    @property
    def kv_head_start(self) -> int:
        """The first KV head of this rank (the one its q heads read when replicated)."""
        if self.num_kv_heads >= self.world_size:
            return self.rank * self.local_kv_heads
        return self.rank * self.num_kv_heads // self.world_size

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.vocab_size // self.world_size)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per_rank

    @property
    def vocab_stop(self) -> int:
        """End of this rank's real vocabulary rows (rows past it, up to vocab_per_rank, are padding)."""
        return min(self.vocab_size, self.vocab_start + self.vocab_per_rank)

    def _rows(self, start: int, count: int, dim: int = 0) -> TensorSlice:
        return TensorSlice(dim=dim, start=start, stop=start + count, size=count)

    def slice_for(self, name: str, shape: tuple) -> Optional[TensorSlice]:
        """The part of checkpoint tensor `name` (full `shape`) this rank reads; None = whole."""
        d = self.head_dim
        if name in VOCAB_TENSORS:
            stop = min(self.vocab_start + self.vocab_per_rank, self.vocab_size)
            return TensorSlice(0, min(self.vocab_start, stop), stop, self.vocab_per_rank)
        if not _LAYER.search(name):
            return None
        if any(key in name for key in _COLUMN_Q):
            return self._rows(self.rank * self.local_q_heads * d, self.local_q_heads * d)
        if any(key in name for key in _COLUMN_KV):
            return self._rows(self.kv_head_start * d, self.local_kv_heads * d)
        local_i = self.intermediate_size // self.world_size
        if any(key in name for key in _COLUMN_MLP):
            return self._rows(self.rank * local_i, local_i)
        if name.endswith(_ROW_ATTN):
            return self._rows(self.rank * self.local_q_heads * d, self.local_q_heads * d, dim=1)
        if name.endswith(_ROW_MLP):
            return self._rows(self.rank * local_i, local_i, dim=1)
        return None
