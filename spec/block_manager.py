"""The BlockManager protocol and PoolState, the snapshot the conformance suite checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence, runtime_checkable

from enginespec.spec.request import Request


@dataclass
class PoolState:
    """Observable state of a block pool: copies, safe to keep and compare.

    - free_queue: ids of the blocks with ref count 0, front = next to be handed out (evicted).
    - ref_counts: per block id, the number of request tables that hold it.
    - block_hashes: per block id, the hash it is published under, or None.
    - cached: hash -> block id, for every published block (first writer wins).
    - tables: request id -> block ids in logical order, for every request holding blocks.

    Invariants (conformance point 1): ref_counts[b] == occurrences of b over all tables;
    set(free_queue) == {b : ref_counts[b] == 0}, without repeats; cached[h] == b iff
    block_hashes[b] == h; every block is either free or in some table.
    """

    free_queue: list[int]
    ref_counts: list[int]
    block_hashes: list[Optional[bytes]]
    cached: dict[bytes, int]
    tables: dict[str, list[int]] = field(default_factory=dict)


@runtime_checkable
class BlockManager(Protocol):
    """Owns `num_blocks` KV blocks of `block_size` tokens and every request's block table.

    Prefix caching: a full block is published under its hash chain (spec.hash_block with the
    request's cache_key) as soon as it is allocated for a step that fills it, before its KV is
    computed (publish-before-compute: the same forward pass writes it before anyone reads it).
    Freed blocks keep their hash and stay findable until handed out again; handing a block out
    evicts its hash. Freeing goes tail-first so that a request's last blocks (least likely to be
    shared) are evicted first: the free queue is an LRU over whole prefixes.
    """

    num_blocks: int
    block_size: int
    enable_prefix_caching: bool

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Longest run of cached full blocks from the start of the request's tokens.

        Stops at the first miss. Never covers the block holding the last known token, so at least
        one token is left to compute (its logits are needed). Returns [] when prefix caching is
        off or the request asks for prompt_logprobs. Changes no state but the request's
        block_hashes (which it may extend) and the hit-rate counters.
        """
        ...

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached_blocks: Sequence[int] = ()
    ) -> bool:
        """Make the request's table cover num_computed_tokens + len(cached_blocks) * block_size
        + num_new_tokens tokens, adopting `cached_blocks` (from find_cached_prefix, only while the
        table is empty) first. All or nothing: on False nothing changed. A cached block that sits
        in the free queue is taken out of it, so it costs a free slot like a new block."""
        ...

    def cache_full_blocks(self, request: Request, num_tokens: Optional[int] = None) -> None:
        """Publish the request's full blocks among its first `num_tokens` tokens (default:
        num_computed_tokens; capped at request.num_tokens: a step's draft tokens are never
        hashed, so num_tokens may reach past the request's known tokens). A hash already
        published by another block stays with that block (first writer wins); a block publishes
        at most one hash."""
        ...

    def unpublish(self, request: Request, num_tokens: int) -> None:
        """Withdraw the hashes of the request's blocks past its first `num_tokens` tokens
        (table index >= num_tokens // block_size) that are published under the request's own
        chain hash for that index (block_hashes[b] == request.block_hashes[i]): their KV may
        never have been written (a step whose forward failed). Blocks published by others are
        untouched. The request's publish cursor drops to num_tokens // block_size. Changes no
        ref count and no free-queue order; a no-op with caching off."""
        ...

    def free(self, request: Request) -> None:
        """Drop the request's references. Blocks reaching 0 go to the back of the free queue,
        last logical block first, keeping their hashes."""
        ...

    def trim(self, request: Request, num_tokens: int) -> None:
        """Keep only the blocks needed for the first num_tokens tokens; free the rest: a block
        reaching ref 0 without a hash to the FRONT of the free queue (the trimmed ones in logical
        order: handed out again before any cached block), one with a hash to the back, tail
        first, as free() does (SCHEDULING.md, "Block manager")."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Forget every published hash. Returns False (and does nothing) while any block is in use."""
        ...

    @property
    def num_free(self) -> int:
        """Blocks in the free queue (cached-but-free ones included)."""
        ...

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        ...

    @property
    def hit_rate(self) -> float:
        """Fraction of the blocks looked up by find_cached_prefix that were found cached."""
        ...

    def block_table(self, request_id: str) -> list[int]:
        """The request's block ids in logical order (a copy; [] if it holds none)."""
        ...

    def state(self) -> PoolState:
        """A snapshot of the observable state (copies)."""
        ...
