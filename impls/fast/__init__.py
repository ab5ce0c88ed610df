"""The fast implementation: the same decisions as the reference (spec/SCHEDULING.md), at a
fraction of the CPU overhead, plus Triton attention and CUDA-graph-friendly batches.

It imports `spec` (and, for attention, `kernels` through `.attention`), never impls.reference:
shared code would hide shared bugs from the differential tests.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Optional, Sequence

from enginespec.impls.fast.batch import BatchBuilder
from enginespec.impls.fast.block_manager import FastBlockManager
from enginespec.impls.fast.request import FastRequest
from enginespec.impls.fast.scheduler import FastScheduler
from enginespec.spec import SamplingParams, SchedulerConfig


class FastImpl:
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

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: Optional[SamplingParams] = None,
        *,
        eos_token_id: Optional[int] = None,
        priority: int = 0,
        arrival_time: Optional[float] = None,
        cache_key: tuple = (),
    ):
        return self.request_cls(
            request_id,
            prompt_token_ids,
            params,
            eos_token_id=eos_token_id,
            priority=priority,
            arrival_time=arrival_time,
            cache_key=cache_key,
        )

    def new_block_manager(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        return self.block_manager_cls(num_blocks, block_size, enable_prefix_caching)

    def new_scheduler(self, config: SchedulerConfig, block_manager):
        return self.scheduler_cls(config, block_manager)

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


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
