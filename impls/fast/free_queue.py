"""FreeQueue: an intrusive doubly linked list over block ids, O(1) at both ends and in the middle.

Nodes are the block ids 0..num_blocks-1 themselves; two sentinels (HEAD = num_blocks,
TAIL = num_blocks + 1) bound the list so no operation needs a branch for an empty list or an
end. `prev` / `next` are plain int lists indexed by node; a block not in the queue has
prev == next == -1 (so membership is one index read). Nothing is allocated per operation.

Order: front (after HEAD) is the next block handed out, i.e. evicted; freed blocks join at the
back (before TAIL). That makes the queue an LRU over freed blocks. A trimmed block without a
hash joins at the front (push_front): it holds nothing findable, so it goes out first.
"""

from __future__ import annotations

from typing import Iterable


class FreeQueue:
    __slots__ = ("prev", "next", "head", "tail", "size")

    def __init__(self, num_blocks: int):
        """All blocks free, in id order 0, 1, ..., num_blocks - 1."""
        head, tail = num_blocks, num_blocks + 1
        self.head, self.tail = head, tail
        # Node i links to i - 1 and i + 1; the ends link to the sentinels.
        self.prev = [i - 1 for i in range(num_blocks + 2)]
        self.next = [i + 1 for i in range(num_blocks + 2)]
        if num_blocks:
            self.prev[0] = head
            self.next[num_blocks - 1] = tail
            self.next[head], self.prev[tail] = 0, num_blocks - 1
        else:
            self.next[head], self.prev[tail] = tail, head
        self.prev[head] = self.next[tail] = -1
        self.size = num_blocks

    def __len__(self) -> int:
        return self.size

    def __contains__(self, block: int) -> bool:
        return self.prev[block] != -1

    def pop_front(self) -> int:
        """Unlink and return the front block. The caller checks that the queue is not empty."""
        nxt = self.next
        block = nxt[self.head]
        after = nxt[block]
        nxt[self.head] = after
        self.prev[after] = self.head
        self.prev[block] = nxt[block] = -1
        self.size -= 1
        return block

    def remove(self, block: int) -> None:
        """Unlink a block from anywhere in the queue (it must be in it)."""
        prv, nxt = self.prev, self.next
        before, after = prv[block], nxt[block]
        nxt[before] = after
        prv[after] = before
        prv[block] = nxt[block] = -1
        self.size -= 1

    def _link(self, block: int, before: int, after: int) -> None:
        """Link a block (not in the queue) between two adjacent nodes."""
        self.next[before] = block
        self.prev[block] = before
        self.next[block] = after
        self.prev[after] = block
        self.size += 1

    def push_back(self, block: int) -> None:
        """Link a block (not in the queue) at the back."""
        self._link(block, self.prev[self.tail], self.tail)

    def push_front(self, block: int) -> None:
        """Link a block (not in the queue) at the front: the next one handed out."""
        self._link(block, self.head, self.next[self.head])

    def release(self, blocks: Iterable[int], ref_counts: list[int]) -> None:
        """Drop one reference of each block, in order; link every block reaching 0 at the back,
        in that order. One pass, no temporary list: the batched form of free()."""
        prv, nxt = self.prev, self.next
        last = prv[self.tail]
        count = 0
        for block in blocks:
            r = ref_counts[block] - 1
            ref_counts[block] = r
            if r == 0:
                nxt[last] = block
                prv[block] = last
                last = block
                count += 1
        nxt[last] = self.tail
        prv[self.tail] = last
        self.size += count

    def to_list(self) -> list[int]:
        """The queue front to back (a walk: for snapshots and tests, not the hot path)."""
        out, nxt, node = [], self.next, self.next[self.head]
        while node != self.tail:
            out.append(node)
            node = nxt[node]
        return out
