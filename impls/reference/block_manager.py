"""The reference block pool: SCHEDULING.md's "Block manager" section as plain lists and dicts.

State (all plain Python, copied out by `state()`):
- `free_queue`: list of free block ids, front = next handed out (and evicted); an LRU over
  whole prefixes because freeing appends a request's blocks tail first.
- `ref_counts[b]`: how many request tables hold block b.
- `block_hashes[b]` / `cached[h]`: the hash block b is published under, and its inverse.
  Invariant: `cached[h] == b` iff `block_hashes[b] == h`. A free block keeps its hash (it can be
  found and adopted again) until it is handed out, which evicts it.
- `tables[request_id]`: the request's block ids in logical order (only non-empty tables).
- `cursors[request_id]`: how many of the table's blocks `cache_full_blocks` has considered.
"""

from __future__ import annotations

from typing import Optional, Sequence

from enginespec.spec import PoolState, Request, check_count, hash_request_blocks


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative a."""
    return -(-a // b)


class BlockManager:
    """Owns `num_blocks` blocks of `block_size` tokens and every request's block table."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"BlockManager.num_blocks must be an int >= 1, got {num_blocks!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"BlockManager.block_size must be an int >= 1, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.free_queue: list[int] = list(range(num_blocks))
        self.ref_counts: list[int] = [0] * num_blocks
        self.block_hashes: list[Optional[bytes]] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        self.tables: dict[str, list[int]] = {}
        self.cursors: dict[str, int] = {}
        self.num_queries = 0
        self.num_hits = 0
        self.num_query_tokens = 0  # the looked-up requests' tokens (vLLM's prefix_cache_queries)

    # ---- hashing -------------------------------------------------------------------------

    def _extend_hashes(self, request: Request) -> None:
        """Extend request.block_hashes to cover every full block of its token_ids (chained,
        with the request's cache_key as extra). Existing hashes are kept: tokens never change."""
        done = len(request.block_hashes)
        parent = request.block_hashes[-1] if done else None
        request.block_hashes.extend(
            hash_request_blocks(
                request.token_ids, self.block_size, request.cache_key, start=done, parent=parent
            )
        )

    # ---- lookups ---------------------------------------------------------------------------

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Cached blocks covering the longest prefix of the request's full blocks, stopping at
        the first miss and never covering the block that holds the last token (one is always left
        to compute). [] with caching off or prompt_logprobs set (cached rows have no logits)."""
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        self._extend_hashes(request)
        found = []
        for i in range(max_blocks):
            block = self.cached.get(request.block_hashes[i])
            if block is None:
                break
            found.append(block)
        self.num_queries += max_blocks
        self.num_hits += len(found)
        self.num_query_tokens += request.num_tokens
        return found

    # ---- allocation ------------------------------------------------------------------------

    def _pop_free(self) -> int:
        """Hand out the front of the free queue; the block loses its hash (eviction)."""
        block = self.free_queue.pop(0)
        old = self.block_hashes[block]
        if old is not None:
            del self.cached[old]
            self.block_hashes[block] = None
        self.ref_counts[block] = 1
        return block

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached_blocks: Sequence[int] = ()
    ) -> bool:
        """Grow the request's table to cover num_computed + len(cached_blocks) * bs + num_new_tokens
        tokens, adopting cached_blocks first. All or nothing: on False no state changed."""
        num_new_tokens = check_count("allocate_slots", "num_new_tokens", num_new_tokens)
        table = self.tables.get(request.request_id, [])
        cached_blocks = list(cached_blocks)
        if cached_blocks and table:
            raise ValueError("allocate_slots: cached_blocks may only be given while the table is empty")
        bs = self.block_size
        required = cdiv(request.num_computed_tokens + len(cached_blocks) * bs + num_new_tokens, bs)
        num_new = max(0, required - len(table) - len(cached_blocks))
        num_revived = sum(1 for b in cached_blocks if self.ref_counts[b] == 0)
        if num_new + num_revived > len(self.free_queue):
            return False
        for b in cached_blocks:
            if self.ref_counts[b] == 0:
                self.free_queue.remove(b)
            self.ref_counts[b] += 1
            table.append(b)
        for _ in range(num_new):
            table.append(self._pop_free())
        if table:
            self.tables[request.request_id] = table
            self.cursors.setdefault(request.request_id, 0)
        return True

    def cache_full_blocks(self, request: Request, num_tokens: Optional[int] = None) -> None:
        """Publish the full blocks among the request's first num_tokens tokens (default its
        num_computed_tokens) that were not considered yet. A block that already has a hash (an
        adopted cached block) is skipped; a hash already in `cached` stays with its block (first
        writer wins). Blocks past the request's known tokens (draft tokens) are not published."""
        if num_tokens is not None:
            num_tokens = check_count("cache_full_blocks", "num_tokens", num_tokens)
        if not self.enable_prefix_caching:
            return
        table = self.tables.get(request.request_id, [])
        if num_tokens is None:
            num_tokens = request.num_computed_tokens
        num_tokens = min(num_tokens, request.num_tokens)
        num_full = min(num_tokens // self.block_size, len(table))
        cursor = self.cursors.get(request.request_id, 0)
        if num_full <= cursor:
            return
        self._extend_hashes(request)
        for i in range(cursor, num_full):
            block, h = table[i], request.block_hashes[i]
            if self.block_hashes[block] is not None or h in self.cached:
                continue
            self.block_hashes[block] = h
            self.cached[h] = block
        self.cursors[request.request_id] = num_full

    def unpublish(self, request: Request, num_tokens: int) -> None:
        """Withdraw the request's own published hashes for blocks past its first num_tokens
        tokens (their KV may never have been written); cursor = min(cursor, kept blocks)."""
        rid = request.request_id
        table = self.tables.get(rid, [])
        first = max(num_tokens, 0) // self.block_size
        for i in range(first, min(len(table), len(request.block_hashes))):
            block, h = table[i], request.block_hashes[i]
            if self.block_hashes[block] == h:
                self.block_hashes[block] = None
                del self.cached[h]
        if rid in self.cursors:
            self.cursors[rid] = min(self.cursors[rid], first)

    # ---- release ---------------------------------------------------------------------------

    def _release(self, blocks: list[int]) -> None:
        """Drop one reference of each block, last first; a block reaching 0 goes to the back of
        the free queue with its hash kept."""
        for b in reversed(blocks):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue.append(b)

    def free(self, request: Request) -> None:
        """Release every block of the request (tail first) and forget its table and cursor."""
        table = self.tables.pop(request.request_id, [])
        self.cursors.pop(request.request_id, None)
        self._release(table)

    def trim(self, request: Request, num_tokens: int) -> None:
        """Keep the blocks covering the first num_tokens tokens; release the rest. A released
        block reaching ref 0 without a hash goes to the FRONT of the free queue (the trimmed
        ones in logical order), so it is handed out again before any cached block; one with a
        hash goes to the back, tail first, as free() does (SCHEDULING.md, "trim")."""
        num_tokens = check_count("trim", "num_tokens", num_tokens)
        rid = request.request_id
        table = self.tables.get(rid, [])
        keep = cdiv(max(num_tokens, 0), self.block_size)
        if keep >= len(table):
            return
        hashed = [b for b in table[keep:] if self.block_hashes[b] is not None]
        empty = [b for b in table[keep:] if self.block_hashes[b] is None]
        for b in empty:
            self.ref_counts[b] -= 1
        self.free_queue[:0] = [b for b in empty if self.ref_counts[b] == 0]
        self._release(hashed)
        if keep == 0:
            self.tables.pop(rid, None)
            self.cursors.pop(rid, None)
        else:
            self.tables[rid] = table[:keep]
            self.cursors[rid] = min(self.cursors.get(rid, 0), keep)

    def reset_prefix_cache(self) -> bool:
        """Forget every published hash; refused (False) while any block is referenced."""
        if any(self.ref_counts):
            return False
        self.cached = {}
        self.block_hashes = [None] * self.num_blocks
        return True

    # ---- observation -----------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / self.num_blocks

    @property
    def hit_rate(self) -> float:
        return self.num_hits / self.num_queries if self.num_queries else 0.0

    def block_table(self, request_id: str) -> list[int]:
        return list(self.tables.get(request_id, []))

    def state(self) -> PoolState:
        return PoolState(
            free_queue=list(self.free_queue),
            ref_counts=list(self.ref_counts),
            block_hashes=list(self.block_hashes),
            cached=dict(self.cached),
            tables={rid: list(t) for rid, t in self.tables.items() if t},
        )

    def __repr__(self) -> str:
        return (
            f"BlockManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"free={self.num_free}, cached={len(self.cached)})"
        )
