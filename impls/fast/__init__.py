"""The fast implementation: the same decisions as the reference (spec/SCHEDULING.md), at a
fraction of the CPU overhead, plus Triton attention and CUDA-graph-friendly batches.

It imports `spec` (and, for attention, `kernels` through `.attention`), never impls.reference:
shared code would hide shared bugs from the differential tests.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Optional

from enginespec.impls.fast.batch import BatchBuilder
from enginespec.impls.fast.block_manager import FastBlockManager
from enginespec.impls.fast.request import FastRequest
from enginespec.impls.fast.scheduler import FastScheduler
from enginespec.spec import PartsImpl, SchedulerConfig


class FastImpl(PartsImpl):
    """spec.Implementation made of FastRequest, FastBlockManager, FastScheduler, a persistent
    batch builder and FastAttention (Triton on CUDA)."""

    name = "fast"
    capabilities = frozenset({"swap", "cuda_graphs"})
    request_cls = FastRequest
    block_manager_cls = FastBlockManager
    scheduler_cls = FastScheduler

    def __init__(self) -> None:
        # One builder per (block manager, device): its row cache is keyed by request id, which
        # is unique within one pool; it goes away with the pool (weak keys).
        self._builders: "weakref.WeakKeyDictionary[object, dict[str, BatchBuilder]]" = (
            weakref.WeakKeyDictionary()
        )

    def attention_backend(self, device):
        """Triton paged attention on CUDA, the kernels' plain-torch references elsewhere
        (imported lazily: the control plane needs neither)."""
        from enginespec.impls.fast.attention import FastAttention

        return FastAttention(device)

    def build_batch(self, output, block_manager, device="cpu", pad_to: Optional[int] = None):
        """Same tensors as the spec's canonical spec/batch_layout.py:build_batch, from
        persistent buffers reused step after step (one builder per block manager and device)."""
        per_device = self._builders.get(block_manager)
        if per_device is None:
            per_device = self._builders[block_manager] = {}
        key = str(device)
        builder = per_device.get(key)
        if builder is None:
            builder = per_device[key] = BatchBuilder(device)
        return builder.build(output, block_manager, pad_to)


IMPL = FastImpl()

__all__ = ["FastBlockManager", "FastImpl", "FastRequest", "FastScheduler", "IMPL"]

if TYPE_CHECKING:  # mypy (tools/typecheck.py) proves each part satisfies its spec Protocol
    from enginespec import spec
    from enginespec.impls.fast.attention import FastAttention as _Attention

    _impl: spec.Implementation = IMPL
    _request: spec.Request = FastRequest("r", [1])
    _block_manager: spec.BlockManager = FastBlockManager(1, 1)
    _scheduler: spec.Scheduler = FastScheduler(SchedulerConfig(), _block_manager)
    _attention: spec.AttentionBackend = _Attention("cpu")
