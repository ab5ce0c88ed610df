"""The reference implementation: plain Python (and plain torch for attention), slow and obviously
correct. Every other implementation is tested against it, decision by decision.

To plant a bug for a mutation test, subclass one part and point a ReferenceImpl subclass at it:
`class Buggy(ReferenceImpl): block_manager_cls = MyBrokenBlockManager`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from enginespec.impls.reference.block_manager import BlockManager
from enginespec.impls.reference.request import Request
from enginespec.impls.reference.scheduler import Scheduler
from enginespec.spec import SamplingParams, SchedulerConfig


class ReferenceImpl:
    """spec.Implementation made of the reference Request, BlockManager and Scheduler."""

    name = "reference"
    capabilities = frozenset({"swap"})
    request_cls = Request
    block_manager_cls = BlockManager
    scheduler_cls = Scheduler

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
        """The plain-torch paged attention (imported lazily: the control plane needs no torch)."""
        from enginespec.impls.reference.attention import ReferenceAttention

        return ReferenceAttention()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


IMPL = ReferenceImpl()

__all__ = ["BlockManager", "IMPL", "ReferenceImpl", "Request", "Scheduler"]

if TYPE_CHECKING:  # mypy (tools/typecheck.py) proves each part satisfies its spec Protocol
    from enginespec import spec
    from enginespec.impls.reference.attention import ReferenceAttention as _Attention

    _impl: spec.Implementation = IMPL
    _request: spec.Request = Request("r", [1])
    _block_manager: spec.BlockManager = BlockManager(1, 1)
    _scheduler: spec.Scheduler = Scheduler(SchedulerConfig(), _block_manager)
    _attention: spec.AttentionBackend = _Attention()
