"""The per-forward context of attention, and the one custom op through which the model reaches it.

FlatModel.forward runs the transformers decoder inside `active(StepContext(...))`. Each layer's
attention calls `torch.ops.enginespec.paged_attention(query, key, value, layer_idx, scale,
window)`, whose implementation finds this step's batch metadata, the layer's KV pool and the
backend in the active context, writes the step's K/V at the batch's slots and attends.

Why an opaque op and a side channel (as vLLM's forward context does): a compiler tracing the
decoder (torch.compile, at the runner's call site) sees attention as one op on q/k/v with
constant arguments. Nothing per step (sequence lengths, block tables, max_query_len) enters the
traced graph, so one compiled graph serves every step, prefill or decode, and the backend
(with its data-dependent host ints and Triton launches) runs as written. The decoder stays
unaware of compilation and graph capture.

Invariants: the op is only called while a context is active (else a ValueError says how to
call the model); contexts do not nest; the op mutates nothing but the active context's pool
of layer `layer_idx`, and only at the batch's slots.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from spec import AttentionBackend, BatchMeta


@dataclass
class StepContext:
    """What attention needs for one forward: the batch metadata, one pool per layer, the backend."""

    meta: BatchMeta
    kv_caches: list
    backend: AttentionBackend


_ACTIVE: list[Optional[StepContext]] = [None]


@contextlib.contextmanager
def active(ctx: StepContext) -> Iterator[StepContext]:
    """Make `ctx` the context of every paged_attention call inside the block."""
    if _ACTIVE[0] is not None:
        raise RuntimeError("a StepContext is already active: FlatModel.forward does not nest")
    _ACTIVE[0] = ctx
    try:
        yield ctx
    finally:
        _ACTIVE[0] = None


def current() -> StepContext:
    ctx = _ACTIVE[0]
    if ctx is None:
        raise ValueError("enginespec attention needs an active StepContext; call FlatModel.forward, "
                         "not the transformers model directly")
    return ctx


@torch.library.custom_op("enginespec::paged_attention", mutates_args=())
def paged_attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
                       scale: float, window: int) -> torch.Tensor:
    """query [1, Hq, N, D], key/value [1, Hkv, N, D] -> [1, N, Hq, D] (transformers' layout)."""
    ctx = current()
    cache = ctx.kv_caches[layer_idx]
    q = query[0].transpose(0, 1)   # [N, Hq, D]
    k = key[0].transpose(0, 1)     # [N, Hkv, D]
    v = value[0].transpose(0, 1)   # [N, Hkv, D]
    ctx.backend.write(cache, k, v, ctx.meta)
    out = ctx.backend.forward(q, cache, ctx.meta, scale=scale, window=window)
    return out.unsqueeze(0).contiguous()


@paged_attention_op.register_fake
def _(query, key, value, layer_idx, scale, window):
    _, num_heads, num_tokens, head_dim = query.shape
    return query.new_empty((1, num_tokens, num_heads, head_dim))
