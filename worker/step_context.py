"""The per-forward context of attention, and the one custom op through which the model reaches it.

FlatModel.forward runs the decoder (merged_decoder.py, or transformers' own) inside
`active(StepContext(...))`. Each layer's attention calls `torch.ops.enginespec.paged_attention(
query, key, value, layer_idx, scale, window)` on flat [N, heads, head_dim] rows; the op finds
this step's batch metadata, the layer's KV pool and the backend in the active context, writes
the step's K/V at the batch's slots and attends.

Why an opaque op and a side channel (as vLLM's forward context does): a compiler tracing the
decoder (torch.compile, at the runner's call site) sees attention as one op on q/k/v with
constant arguments. Nothing per step (sequence lengths, block tables, max_query_len) enters the
traced graph, so one compiled graph serves every step, prefill or decode, and the backend
(with its data-dependent host ints and Triton launches) runs as written. The decoder stays
unaware of compilation and graph capture.

A backend with `write_qkv` (impls.fast's) gets the second op, `enginespec::paged_attention_qkv`,
from the merged decoder instead: the layer's raw q|k|v rows in, so that the backend can norm and
rotate q|k and write K/V in one kernel rather than the compiler's two or three.

Invariants: the ops are only called while a context is active (else a ValueError says how to
call the model); contexts do not nest within a thread; an op mutates nothing but the active
context's pool of layer `layer_idx`, and only at the batch's slots. The active context is the
calling thread's: two engines in one process step on their own threads (an in-process AsyncLLM's
engine thread beside an LLM.generate), and one process-wide slot made the second of two
overlapping steps fail its requests with "a StepContext is already active".
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from enginespec.spec import AttentionBackend, BatchMeta


@dataclass
class StepContext:
    """What attention needs for one forward: the batch metadata, one pool per layer, the backend."""

    meta: BatchMeta
    kv_caches: list
    backend: AttentionBackend


# this thread's active context (a ContextVar, as the decode attention's forced balance and the
# compile-only launches are: each thread starts with none)
_ACTIVE: contextvars.ContextVar[Optional[StepContext]] = contextvars.ContextVar(
    "enginespec_step", default=None
)


@contextlib.contextmanager
def active(ctx: StepContext) -> Iterator[StepContext]:
    """Make `ctx` the context of every paged_attention call this thread makes inside the block."""
    if _ACTIVE.get() is not None:
        raise RuntimeError("a StepContext is already active: FlatModel.forward does not nest")
    token = _ACTIVE.set(ctx)
    try:
        yield ctx
    finally:
        _ACTIVE.reset(token)


def current_or_none() -> Optional[StepContext]:
    """This thread's active StepContext, or None outside FlatModel.forward."""
    return _ACTIVE.get()


def current() -> StepContext:
    ctx = _ACTIVE.get()
    if ctx is None:
        raise ValueError(
            "enginespec attention needs an active StepContext; call FlatModel.forward, "
            "not the transformers model directly"
        )
    return ctx


@torch.library.custom_op("enginespec::paged_attention", mutates_args=())
def paged_attention_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int, scale: float, window: int
) -> torch.Tensor:
    """query [N, Hq, D], key/value [N, Hkv, D] (any strides with D contiguous) -> [N, Hq, D]."""
    ctx = current()
    cache = ctx.kv_caches[layer_idx]
    ctx.backend.write(cache, key, value, ctx.meta)
    return ctx.backend.forward(query, cache, ctx.meta, scale=scale, window=window).contiguous()


@paged_attention_op.register_fake
def _(query, key, value, layer_idx, scale, window):
    return torch.empty_like(query, memory_format=torch.contiguous_format)


@torch.library.custom_op("enginespec::paged_attention_qkv", mutates_args=())
def paged_attention_qkv_op(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm_weight: Optional[torch.Tensor],
    eps: float,
    layer_idx: int,
    num_q_heads: int,
    scale: float,
    window: int,
    row_source: Optional[torch.Tensor] = None,
    row_eps: float = 0.0,
) -> torch.Tensor:
    """The same attention from a layer's q|k|v GEMM output [N, (Hq + 2 Hkv) * D]: the backend's
    `write_qkv` norms q|k per head (when norm_weight [Hq + Hkv, D] is given), rotates them with
    cos/sin [N, D], writes k and v into the pool and returns q; then it attends -> [N, Hq, D].
    A backend that also has `attend_qkv` (same arguments, plus scale and window) does both in
    one call. Only for backends that have write_qkv (the merged decoder checks first).
    row_source [N, H] (a folded input norm, only for backends with `folds_norms`): the q|k|v
    rows are first scaled by that norm's row scales (kernels/row_scale.py)."""
    ctx = current()
    cache = ctx.kv_caches[layer_idx]
    extra = {} if row_source is None else dict(row_source=row_source, row_eps=row_eps)
    attend_qkv = getattr(ctx.backend, "attend_qkv", None)
    if attend_qkv is not None:  # the backend may fuse the two (impls.fast: decode batches)
        out = attend_qkv(
            cache, qkv, cos, sin, norm_weight, eps, ctx.meta, num_q_heads, scale, window, **extra
        )
        return out.contiguous()
    query = ctx.backend.write_qkv(cache, qkv, cos, sin, norm_weight, eps, ctx.meta, num_q_heads, **extra)
    return ctx.backend.forward(query, cache, ctx.meta, scale=scale, window=window).contiguous()


@paged_attention_qkv_op.register_fake
def _(qkv, cos, sin, norm_weight, eps, layer_idx, num_q_heads, scale, window, row_source=None, row_eps=0.0):
    return qkv.new_empty((qkv.shape[0], num_q_heads, cos.shape[1]))
