"""The reference implementation: plain Python (and plain torch for attention), slow and obviously
correct. Every other implementation is tested against it, decision by decision.

To plant a bug for a mutation test, subclass one part and point a ReferenceImpl subclass at it:
`class Buggy(ReferenceImpl): block_manager_cls = MyBrokenBlockManager`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginespec.impls.reference.block_manager import BlockManager
from enginespec.impls.reference.request import Request
from enginespec.impls.reference.scheduler import Scheduler
from enginespec.spec import PartsImpl, SchedulerConfig


class ReferenceImpl(PartsImpl):
    """spec.Implementation made of the reference Request, BlockManager and Scheduler."""

    name = "reference"
    capabilities = frozenset({"swap"})
    request_cls = Request
    block_manager_cls = BlockManager
    scheduler_cls = Scheduler

    def attention_backend(self, device):
        """The plain-torch paged attention (imported lazily: the control plane needs no torch)."""
        from enginespec.impls.reference.attention import ReferenceAttention

        return ReferenceAttention()


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
