"""A block pool written from spec/SCHEDULING.md ("Block manager"), with its own data layout.

- Free list: an OrderedDict of block id -> None. Front (first key) = next handed out (and so
  evicted); freed blocks are appended at the back. Popping the front, appending and removing a
  revived block from the middle are all O(1).
- One `Block` record per block id: its reference count and the hash it is published under.
  `by_hash` maps a published hash back to its block (the inverse of the records' hashes).
- `tables[request_id]`: block ids in logical order; a request holding no block has no entry.
- `considered[request_id]`: how many leading blocks of the table cache_full_blocks has looked at.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Sequence

from enginespec.spec import PoolState, hash_request_blocks


def _count(name: str, value, minimum: int = 0) -> int:
    """A token or block count: an integer (numpy's too, not bool, float or str) >= minimum,
    else ValueError naming the argument and the bound."""
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if isinstance(value, bool) or number is None or number < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return number


@dataclass
class Block:
    ref_count: int = 0
    block_hash: Optional[bytes] = None


class OrderedPoolBlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = _count("num_blocks", num_blocks, 1)
        self.block_size = _count("block_size", block_size, 1)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.blocks = [Block() for _ in range(num_blocks)]
        self.free_list: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.by_hash: dict[bytes, int] = {}
        self.tables: dict[str, list[int]] = {}
        self.considered: dict[str, int] = {}
        self.looked_up = 0
        self.found = 0

    # -- prefix cache --------------------------------------------------------------------

    def _hashes(self, request) -> list:
        """Extend the request's block_hashes to all its full blocks (the pool extends them; a
        request only ever grows, so earlier hashes stay valid) and return them."""
        have = request.block_hashes
        parent = have[-1] if have else None
        have.extend(
            hash_request_blocks(
                request.token_ids, self.block_size, request.cache_key, start=len(have), parent=parent
            )
        )
        return have

    def find_cached_prefix(self, request) -> list[int]:
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None:
            return []
        limit = (request.num_tokens - 1) // self.block_size  # one token always left to compute
        hashes = self._hashes(request)
        hits: list[int] = []
        while len(hits) < limit and hashes[len(hits)] in self.by_hash:
            hits.append(self.by_hash[hashes[len(hits)]])
        self.looked_up += limit
        self.found += len(hits)
        return hits

    # -- allocation ----------------------------------------------------------------------

    def _take_front(self) -> int:
        block_id, _ = self.free_list.popitem(last=False)
        record = self.blocks[block_id]
        if record.block_hash is not None:  # handing a block out evicts what it caches
            del self.by_hash[record.block_hash]
            record.block_hash = None
        record.ref_count = 1
        return block_id

    def allocate_slots(self, request, num_new_tokens: int, cached_blocks: Sequence[int] = ()) -> bool:
        num_new_tokens = _count("num_new_tokens", num_new_tokens)
        adopt = list(cached_blocks)
        table = self.tables.get(request.request_id, [])
        if adopt and table:
            raise ValueError("cached_blocks may only be adopted into an empty block table")
        tokens = request.num_computed_tokens + len(adopt) * self.block_size + num_new_tokens
        needed = -(-tokens // self.block_size)
        fresh = max(0, needed - len(table) - len(adopt))
        revived = sum(self.blocks[b].ref_count == 0 for b in adopt)
        if fresh + revived > len(self.free_list):
            return False
        for b in adopt:
            self.free_list.pop(b, None)
            self.blocks[b].ref_count += 1
        table = table + adopt + [self._take_front() for _ in range(fresh)]
        if table:
            self.tables[request.request_id] = table
            self.considered.setdefault(request.request_id, 0)
        return True

    def cache_full_blocks(self, request, num_tokens: Optional[int] = None) -> None:
        if num_tokens is not None:
            _count("num_tokens", num_tokens)
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        table = self.tables.get(rid, [])
        upto = request.num_computed_tokens if num_tokens is None else _count("num_tokens", num_tokens)
        num_full = min(min(upto, request.num_tokens) // self.block_size, len(table))
        start = self.considered.get(rid, 0)
        if num_full <= start:
            return
        hashes = self._hashes(request)
        for i in range(start, num_full):
            record, h = self.blocks[table[i]], hashes[i]
            if record.block_hash is None and h not in self.by_hash:  # first writer wins
                record.block_hash = h
                self.by_hash[h] = table[i]
        self.considered[rid] = num_full

    def unpublish(self, request, num_tokens: int) -> None:
        """Withdraw the request's own published hashes from table index num_tokens // block_size
        on (a failed step: their KV may never have been written); the cursor drops there."""
        first = _count("num_tokens", num_tokens) // self.block_size
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        table, own = self.tables.get(rid, []), request.block_hashes
        for i in range(first, min(len(table), len(own))):
            record = self.blocks[table[i]]
            if record.block_hash is not None and record.block_hash == own[i]:
                del self.by_hash[record.block_hash]
                record.block_hash = None
        if rid in self.considered:
            self.considered[rid] = min(self.considered[rid], first)

    # -- release -------------------------------------------------------------------------

    def _drop(self, block_ids: list[int]) -> None:
        for b in reversed(block_ids):  # tail first: a request's last blocks are evicted first
            self.blocks[b].ref_count -= 1
            if self.blocks[b].ref_count == 0:
                self.free_list[b] = None

    def _drop_trimmed(self, block_ids: list[int]) -> None:
        """trim's release (SCHEDULING.md, "trim"): a block reaching 0 references without a
        hash (a rejected draft's) goes to the FRONT of the free list, the trimmed ones in table
        order, so it is handed out again before any cached block; hashed ones as _drop."""
        for b in reversed(block_ids):
            block = self.blocks[b]
            if block.block_hash is None:
                block.ref_count -= 1
                if block.ref_count == 0:
                    self.free_list[b] = None
                    self.free_list.move_to_end(b, last=False)
        self._drop([b for b in block_ids if self.blocks[b].block_hash is not None])

    def free(self, request) -> None:
        self.considered.pop(request.request_id, None)
        self._drop(self.tables.pop(request.request_id, []))

    def trim(self, request, num_tokens: int) -> None:
        num_tokens = _count("num_tokens", num_tokens)
        rid = request.request_id
        table = self.tables.get(rid, [])
        keep = -(-num_tokens // self.block_size)
        if keep >= len(table):
            return
        self._drop_trimmed(table[keep:])
        if keep:
            self.tables[rid] = table[:keep]
            self.considered[rid] = min(self.considered.get(rid, 0), keep)
        else:
            del self.tables[rid]
            self.considered.pop(rid, None)

    def reset_prefix_cache(self) -> bool:
        if any(record.ref_count for record in self.blocks):
            return False
        for record in self.blocks:
            record.block_hash = None
        self.by_hash.clear()
        return True

    # -- observation ---------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self.free_list)

    @property
    def usage(self) -> float:
        return (self.num_blocks - len(self.free_list)) / self.num_blocks

    @property
    def hit_rate(self) -> float:
        return self.found / self.looked_up if self.looked_up else 0.0

    def block_table(self, request_id: str) -> list[int]:
        return list(self.tables.get(request_id, ()))

    def state(self) -> PoolState:
        return PoolState(
            free_queue=list(self.free_list),
            ref_counts=[record.ref_count for record in self.blocks],
            block_hashes=[record.block_hash for record in self.blocks],
            cached=dict(self.by_hash),
            tables={rid: list(t) for rid, t in self.tables.items()},
        )
