"""An example outside enginespec backend: its own block pool, the rest from the reference.

Registered under the `enginespec.impls` entry point group as "ordered-pool" (see pyproject.toml),
so `pytest --pyargs enginespec.conformance --impl=ordered-pool` and
`LLM(model, impl="ordered-pool")` both find it.
"""

from __future__ import annotations

from enginespec.impls.reference import ReferenceImpl
from enginespec_ordered_pool.block_pool import OrderedPoolBlockManager

__version__ = "0.1.0"


class OrderedPoolImpl(ReferenceImpl):
    """The reference Implementation with its block manager swapped for ours. The reference's
    scheduler talks to the block manager only through the spec's BlockManager protocol, so any
    conforming pool composes with it; swap preemption is the scheduler's, so it is kept."""

    name = "ordered-pool"
    version = __version__
    capabilities = frozenset({"swap"})
    block_manager_cls = OrderedPoolBlockManager


IMPL = OrderedPoolImpl()

__all__ = ["IMPL", "OrderedPoolBlockManager", "OrderedPoolImpl"]
