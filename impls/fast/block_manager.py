"""FastBlockManager: the block pool of spec/SCHEDULING.md with O(1) free-queue operations.

State is kept in flat per-block lists (ref counts, published hash) plus an intrusive free list
(FreeQueue), so handing out, adopting and freeing a block are a few list writes, with no
per-call allocation beyond the request's own table growing. Each request has a publish cursor:
the number of its table's blocks already considered for publishing, so a decode step that fills
no block does no hashing and no loop. Hashes are computed once per full block per request
(request.block_hashes only grows, but for the engine's async placeholder: spec/SCHEDULING.md).

Mirrors on the request (for the scheduler's inline no-op checks; the dicts stay the truth):
`request._capacity` = tokens its table covers, `request._publish_at` = the smallest token count
at which cache_full_blocks could publish another block. Either may be 0, meaning "just call":
every path that changes a table or a cursor refreshes them or resets them to 0.

The observable state (`state()`) is exactly the one spec/SCHEDULING.md prescribes; state() walks
the free list and copies everything, so it is for tests, not for the hot path.
"""

from __future__ import annotations

from typing import Optional, Sequence

from enginespec.impls.fast.free_queue import FreeQueue
from enginespec.impls.fast.hashing import extend_block_hashes
from enginespec.spec import PoolState, check_count

_NEVER = 1 << 62  # a `_publish_at` no token count reaches


class FastBlockManager:
    """Owns `num_blocks` blocks of `block_size` tokens and every request's block table."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"BlockManager.num_blocks must be >= 1, got {num_blocks!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"BlockManager.block_size must be >= 1, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._queue = FreeQueue(num_blocks)
        self._ref = [0] * num_blocks
        self._hash: list[Optional[bytes]] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}
        self._tables: dict[str, list[int]] = {}
        self._cursor: dict[str, int] = {}
        self._queries = 0
        self._hits = 0
        self._query_tokens = 0  # the looked-up requests' tokens (vLLM's prefix_cache_queries)

    # -- prefix cache lookup -------------------------------------------------------------------

    def find_cached_prefix(self, request) -> list[int]:
        """Longest run of cached full blocks from the start, never covering the last token."""
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None:
            return []
        bs = self.block_size
        token_ids = request.token_ids
        max_blocks = (len(token_ids) - 1) // bs
        hashes = extend_block_hashes(request, bs)
        cached = self._cached
        out: list[int] = []
        for i in range(max_blocks):
            block = cached.get(hashes[i])
            if block is None:
                break
            out.append(block)
        self._queries += max_blocks
        self._hits += len(out)
        self._query_tokens += len(token_ids)
        return out

    # -- allocation ----------------------------------------------------------------------------

    def allocate_slots(self, request, num_new_tokens: int, cached_blocks: Sequence[int] = ()) -> bool:
        """Grow the table to cover computed + cached + new tokens; all or nothing."""
        if type(num_new_tokens) is not int or num_new_tokens < 0:  # the spec's check, off the hot path
            num_new_tokens = check_count("allocate_slots", "num_new_tokens", num_new_tokens)
        if cached_blocks:
            return self._allocate_cached(request, num_new_tokens, cached_blocks)
        table = self._tables.get(request.request_id)
        bs = self.block_size
        have = len(table) if table is not None else 0
        total = request.num_computed_tokens + num_new_tokens
        if total <= have * bs:
            return True  # decodes and later chunks, most steps: the table already covers it
        num_new = (total + bs - 1) // bs - have
        if num_new > self._queue.size:
            return False
        if table is None:
            table = self._new_table(request.request_id)
        self._pop_free(num_new, table)
        request._capacity = len(table) * bs
        return True

    def _allocate_cached(self, request, num_new_tokens: int, cached_blocks: Sequence[int]) -> bool:
        """Admission after a prefix-cache hit: adopt `cached_blocks`, then pop new blocks."""
        rid = request.request_id
        if self._tables.get(rid):
            raise ValueError(
                f"allocate_slots: cached_blocks may only be given while request {rid!r} "
                f"holds no blocks (it holds {len(self._tables[rid])})"
            )
        bs = self.block_size
        num_cached = len(cached_blocks)
        required = -(-(request.num_computed_tokens + num_cached * bs + num_new_tokens) // bs)
        num_new = max(0, required - num_cached)
        ref = self._ref
        num_revived = 0
        for b in cached_blocks:
            if ref[b] == 0:
                num_revived += 1
        if num_new + num_revived > self._queue.size:
            return False
        table = self._tables.get(rid)
        if table is None:
            table = self._new_table(rid)
        remove = self._queue.remove
        for b in cached_blocks:
            if ref[b] == 0:
                remove(b)
            ref[b] += 1
        table.extend(cached_blocks)
        if num_new:
            self._pop_free(num_new, table)
        request._capacity = len(table) * bs
        return True

    def _new_table(self, request_id: str) -> list[int]:
        """A new table is a new list object: the batch builder relies on identity + length.
        (The request's `_publish_at` mirror is left at 0, "call", until a first publish.)"""
        table = self._tables[request_id] = []
        self._cursor[request_id] = 0
        return table

    def _pop_free(self, count: int, table: list[int]) -> None:
        """Hand out `count` blocks from the front of the free queue into `table`, evicting their
        hashes (a block being reused no longer holds the KV its hash names)."""
        queue, ref, hashes, cached = self._queue, self._ref, self._hash, self._cached
        for _ in range(count):
            b = queue.pop_front()
            h = hashes[b]
            if h is not None:
                del cached[h]
                hashes[b] = None
            ref[b] = 1
            table.append(b)

    # -- publishing ----------------------------------------------------------------------------

    def cache_full_blocks(self, request, num_tokens: Optional[int] = None) -> None:
        """Publish the full blocks among the first num_tokens known tokens not yet considered
        (the cursor only moves forward: a block is considered once per table)."""
        if num_tokens is not None and (type(num_tokens) is not int or num_tokens < 0):
            num_tokens = check_count("cache_full_blocks", "num_tokens", num_tokens)
        if not self.enable_prefix_caching:
            request._publish_at = _NEVER  # nothing is ever published: the scheduler stops asking
            return
        rid = request.request_id
        table = self._tables.get(rid)
        if table is None:
            return
        if num_tokens is None:
            num_tokens = request.num_computed_tokens
        num_known = len(request.token_ids)  # draft tokens past the known ones are not published
        if num_tokens > num_known:
            num_tokens = num_known
        num_full = num_tokens // self.block_size
        if num_full > len(table):
            num_full = len(table)
        start = self._cursor[rid]
        if num_full > start:
            self._publish(request, table, start, num_full)
            self._cursor[rid] = start = num_full
        request._publish_at = (start + 1) * self.block_size

    def _publish(self, request, table: list[int], start: int, stop: int) -> None:
        """Publish table[start:stop]; skip blocks already published and hashes already taken.
        The request's hash chain is extended over all its full blocks (as the reference does,
        so request.block_hashes looks the same), each block hashed once per request."""
        request_hashes = extend_block_hashes(request, self.block_size)
        hashes, cached = self._hash, self._cached
        for i in range(start, stop):
            b = table[i]
            if hashes[b] is not None:
                continue
            h = request_hashes[i]
            if h in cached:
                continue
            cached[h] = b
            hashes[b] = h

    def unpublish(self, request, num_tokens: int) -> None:
        """Withdraw the request's own published hashes for blocks past its first num_tokens
        tokens (their KV may never have been written); cursor = min(cursor, kept blocks)."""
        rid = request.request_id
        table = self._tables.get(rid)
        if table is None:
            return
        first = max(num_tokens, 0) // self.block_size
        own, hashes, cached = request.block_hashes, self._hash, self._cached
        for i in range(first, min(len(table), len(own))):
            b = table[i]
            if hashes[b] == own[i]:
                hashes[b] = None
                del cached[own[i]]
        if self._cursor[rid] > first:
            self._cursor[rid] = first
        request._publish_at = 0  # "call": the next cache_full_blocks recomputes it

    # -- freeing -------------------------------------------------------------------------------

    def free(self, request) -> None:
        """Drop the request's references, tail first; blocks at 0 join the back of the queue."""
        rid = request.request_id
        table = self._tables.pop(rid, None)
        self._cursor.pop(rid, None)
        request._capacity = request._publish_at = 0
        if table:
            self._release(reversed(table))

    def _release(self, blocks) -> None:
        self._queue.release(blocks, self._ref)

    def _release_trimmed(self, blocks: list[int]) -> None:
        """trim's release: unhashed blocks reaching ref 0 to the front, the first trimmed one
        first; hashed ones to the back, tail first."""
        ref, hashes, queue = self._ref, self._hash, self._queue
        for b in reversed(blocks):
            if hashes[b] is None:
                ref[b] -= 1
                if ref[b] == 0:
                    queue.push_front(b)
        queue.release((b for b in reversed(blocks) if hashes[b] is not None), ref)

    def trim(self, request, num_tokens: int) -> None:
        """Keep the blocks of the first num_tokens tokens; free the rest: those reaching ref 0
        without a hash to the front of the free queue in logical order (handed out again before
        any cached block), hashed ones to the back tail first (SCHEDULING.md, "trim"). The kept
        part becomes a new list object (so a cached batch row never mistakes it for the old)."""
        num_tokens = check_count("trim", "num_tokens", num_tokens)
        rid = request.request_id
        table = self._tables.get(rid)
        if table is None:
            return
        keep = -(-num_tokens // self.block_size)
        if keep >= len(table):
            return
        self._release_trimmed(table[keep:])
        request._capacity = request._publish_at = 0  # conservative: the next calls recompute
        if keep == 0:
            del self._tables[rid]
            del self._cursor[rid]
        else:
            self._tables[rid] = table[:keep]
            request._capacity = keep * self.block_size
            if self._cursor[rid] > keep:
                self._cursor[rid] = keep

    def reset_prefix_cache(self) -> bool:
        """Forget every published hash; False (nothing done) while any block is referenced."""
        if self._queue.size != self.num_blocks:
            return False
        hashes = self._hash
        for b in self._cached.values():
            hashes[b] = None
        self._cached.clear()
        return True

    # -- queries -------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return self._queue.size

    @property
    def usage(self) -> float:
        return 1.0 - self._queue.size / self.num_blocks

    @property
    def hit_rate(self) -> float:
        return self._hits / self._queries if self._queries else 0.0

    def block_table(self, request_id: str) -> list[int]:
        table = self._tables.get(request_id)
        return list(table) if table else []

    def state(self) -> PoolState:
        """A snapshot (copies) of the observable state."""
        return PoolState(
            free_queue=self._queue.to_list(),
            ref_counts=list(self._ref),
            block_hashes=list(self._hash),
            cached=dict(self._cached),
            tables={rid: list(t) for rid, t in self._tables.items() if t},
        )
