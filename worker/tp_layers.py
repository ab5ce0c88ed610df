"""The three module kinds a tensor-parallel rank swaps into the checkpoint's model, and the swap.

The model code (merged_decoder.py, or transformers' own decoder) stays unaware of parallelism,
in gpt-fast's spirit: the loader gives each rank its shard of every weight (tp_shard.py), the
column-parallel q|k|v and gate|up need nothing more (a Linear over fewer output rows), and
`parallelize` replaces the four modules whose result needs the other ranks:
- o_proj, down_proj -> RowParallelLinear: partial GEMM, all-reduce, then the bias once;
- embed_tokens -> VocabParallelEmbedding: rows of other ranks' tokens are zeros, all-reduce;
- lm_head -> VocabParallelHead: each rank's vocabulary slice of the logits, gathered to rank 0
  (the only rank that samples), cut back to the real vocabulary.

The all-reduce is the custom op `enginespec::tp_all_reduce_` (in place, on the process's TP
group): opaque to torch.compile (like the attention op) and capturable in a CUDA graph (NCCL's
all_reduce is), so the runner's compile and graph paths work unchanged under TP. A process has
at most one TP group (set_group), since it hosts one rank of one engine.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from enginespec.worker.tp_shard import ShardPlan

_GROUP: list = [None]  # this process's TP group (None: torch.distributed's default group)


def set_group(group) -> None:
    _GROUP[0] = group


@torch.library.custom_op("enginespec::tp_all_reduce_", mutates_args=("x",))
def tp_all_reduce_(x: torch.Tensor) -> None:
    """Sum x over the ranks of the TP group, in place."""
    import torch.distributed as dist

    dist.all_reduce(x, group=_GROUP[0])


@tp_all_reduce_.register_fake
def _(x):
    return None


class RowParallelLinear(nn.Module):
    """A Linear whose weight is this rank's input-column slice: y = all_reduce(x @ W_r^T) + b."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        torch.ops.enginespec.tp_all_reduce_(y)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding rows [start, stop) of the vocabulary: other ids embed to zeros, then the
    all-reduce gives every rank the full embedding."""

    def __init__(self, embedding: nn.Embedding, start: int, stop: int):
        super().__init__()
        self.weight = embedding.weight
        self.start, self.stop = start, stop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        outside = (input_ids < self.start) | (input_ids >= self.stop)
        local = (input_ids - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0)
        torch.ops.enginespec.tp_all_reduce_(out)
        return out


class VocabParallelHead(nn.Module):
    """LM head over this rank's vocabulary rows: hidden [S, H] -> logits [S, V] on rank 0 (the
    ranks' slices gathered in rank order, padding cut), this rank's [S, P] elsewhere."""

    def __init__(self, weight: nn.Parameter, vocab_size: int, rank: int, world_size: int):
        super().__init__()
        self.weight = weight
        self.vocab_size = vocab_size
        self.rank, self.world_size = rank, world_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        local = F.linear(hidden, self.weight)  # [S, P]
        if hidden.shape[0] == 0:  # every rank sees the same S: no rank enters the gather
            return local.new_empty((0, self.vocab_size))
        parts: Optional[list] = None
        if self.rank == 0:
            parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.gather(local, parts, dst=0, group=_GROUP[0])
        if parts is None:
            return local
        logits = torch.cat(parts, dim=-1)
        if logits.shape[-1] == self.vocab_size:
            return logits
        return logits[:, : self.vocab_size].contiguous()  # the sampler wants contiguous rows


def parallelize(hf_model: nn.Module, plan: ShardPlan) -> None:
    """Swap the modules that need the other ranks (module doc) into a transformers CausalLM
    whose weights were loaded with plan.slice_for. Call before FlatModel wraps the model, so
    the merged decoder picks up the swapped modules."""
    decoder = hf_model.get_decoder() if hasattr(hf_model, "get_decoder") else hf_model.model
    head = hf_model.get_output_embeddings()
    tied = head is not None and head.weight is decoder.embed_tokens.weight
    for layer in decoder.layers:
        layer.self_attn.o_proj = RowParallelLinear(layer.self_attn.o_proj)
        layer.mlp.down_proj = RowParallelLinear(layer.mlp.down_proj)
    decoder.embed_tokens = VocabParallelEmbedding(decoder.embed_tokens, plan.vocab_start, plan.vocab_stop)
    weight = decoder.embed_tokens.weight if tied else head.weight
    hf_model.set_output_embeddings(VocabParallelHead(weight, plan.vocab_size, plan.rank, plan.world_size))
