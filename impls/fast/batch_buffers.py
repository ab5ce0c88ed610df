"""Persistent host buffers of the fast batch builder.

- `TableRows`: one persistent int32 row per request (a "slot") holding its block table. A step
  writes only what changed since the request's last step (usually nothing, one new block id
  when a decode crosses a block boundary), then the batch's block_table is one numpy gather of
  the scheduled requests' slots. A row is keyed by the identity of the table list object plus
  its length: FastBlockManager only ever appends to a table list, and replaces the list object
  whenever a table is rebuilt (free, trim, re-admission), so identity + length pins the content.
  The builder holds a reference to each table it mirrors, so an identity can never be reused.
- `Staging`: one byte buffer (pinned on CUDA) that holds every array of a step back to back,
  so the host-to-device transfer is a single copy; grown on demand. The copy lands in one of
  RING_SLOTS device buffers in turn, so a step's device tensors are views the builder made
  once per (shape, slot), not nine new views of a fresh allocation every step.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

ZERO_SLOT = 0  # an all-zero row: padding requests gather it


class TableRows:
    """Per-request block-table rows; slot ZERO_SLOT stays all zeros."""

    def __init__(self, num_rows: int = 64, num_cols: int = 16):
        self.rows = np.zeros((num_rows, num_cols), dtype=np.int32)
        self.slot_of: dict[str, int] = {}
        self.table_of: list = [None] * num_rows  # the table list object mirrored per slot
        self.len_of: list[int] = [0] * num_rows  # entries written per slot (the rest are 0)
        self.free_slots: list[int] = list(range(num_rows - 1, 0, -1))

    def release(self, request_ids) -> None:
        """Give back the slots of finished requests (their rows are rewritten on reuse)."""
        for rid in request_ids:
            slot = self.slot_of.pop(rid, None)
            if slot is not None:
                self.table_of[slot] = None
                self.free_slots.append(slot)

    def sync(self, request_id: str, table: list[int]) -> int:
        """Make the request's slot mirror `table`; returns the slot. Writes only new entries
        when the same table list grew; rewrites the row when the list object changed."""
        slot = self.slot_of.get(request_id)
        if slot is None:
            slot = self._new_slot(request_id)
        old_len, new_len = self.len_of[slot], len(table)
        if self.table_of[slot] is table:
            if new_len == old_len:
                return slot
            start = old_len if new_len > old_len else 0
        else:
            self.table_of[slot] = table
            start = 0
        if new_len > self.rows.shape[1]:
            self._grow(self.rows.shape[0], max(new_len, 2 * self.rows.shape[1]))
        row = self.rows[slot]
        if new_len - start == 1:
            row[start] = table[start]
        elif new_len > start:
            row[start:new_len] = table[start:new_len]
        if old_len > new_len:
            row[new_len:old_len] = 0
        self.len_of[slot] = new_len
        return slot

    def bound(self, limit: int) -> None:
        """Forget every mirror once more than `limit` slots are held (ids whose finish was never
        reported would otherwise pile up). Called between steps, never inside one."""
        if len(self.slot_of) > limit:
            self.release(list(self.slot_of))

    def _new_slot(self, request_id: str) -> int:
        if not self.free_slots:
            old = self.rows.shape[0]
            self._grow(old * 2, self.rows.shape[1])
            self.free_slots.extend(range(old * 2 - 1, old - 1, -1))
        slot = self.free_slots.pop()
        self.slot_of[request_id] = slot
        return slot

    def _grow(self, num_rows: int, num_cols: int) -> None:
        rows = np.zeros((num_rows, num_cols), dtype=np.int32)
        old_rows, old_cols = self.rows.shape
        rows[:old_rows, :old_cols] = self.rows
        self.rows = rows
        extra = num_rows - len(self.table_of)
        if extra > 0:
            self.table_of += [None] * extra
            self.len_of += [0] * extra


RING_SLOTS = 4  # device buffers a Staging copies into in turn: a Batch stays valid for 3 more builds


class Staging:
    """A growable host byte buffer (pinned for CUDA) and its transfer to the device, into
    RING_SLOTS device buffers in turn.

    Invariants:
    - the host buffer is rewritten only after its last copy finished: on CUDA the copy is
      non_blocking, and acquire() waits on the event recorded after it;
    - a device buffer is rewritten only by the copy RING_SLOTS transfers later, so a Batch's
      tensors stay valid while RING_SLOTS - 1 more batches are built. On a GPU that copy is
      enqueued on the stream behind every kernel launched before it, so a step's kernels never
      see the next steps' inputs; on the host a Batch must not be kept (or must be cloned)
      across more builds than that. The engine uses a batch within its step.
    """

    def __init__(self, device: torch.device, num_bytes: int = 1 << 16):
        self.device = device
        self.cuda = device.type == "cuda"
        self.event: Optional[torch.cuda.Event] = None
        self._alloc(num_bytes)

    def _alloc(self, num_bytes: int) -> None:
        self.host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=self.cuda)
        self.np = self.host.numpy()
        self.ring = [torch.empty(num_bytes, dtype=torch.uint8, device=self.device) for _ in range(RING_SLOTS)]
        self.next_slot = 0
        self._spans: dict[tuple[int, int], tuple] = {}  # (slot, bytes) -> (dst, src): numpy on the CPU

    def acquire(self, num_bytes: int) -> np.ndarray:
        """The buffer, ready to be written (previous copy finished), at least num_bytes long.
        Growing it reallocates the device ring too (views of the old one stay valid: torch
        keeps the storage of a live view)."""
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        if num_bytes > self.np.shape[0]:
            self._alloc(max(num_bytes, 2 * self.np.shape[0]))
        return self.np

    def transfer(self, num_bytes: int) -> tuple[int, torch.Tensor]:
        """One copy of the first num_bytes into the next device buffer: (its slot, the buffer)."""
        slot = self.next_slot
        self.next_slot = (slot + 1) % RING_SLOTS
        span = self._spans.get((slot, num_bytes))
        if span is None:  # the slices of a step size, kept (a steady decode repeats one)
            if len(self._spans) >= 16 * RING_SLOTS:
                self._spans.clear()
            ring, host = self.ring[slot][:num_bytes], self.host[:num_bytes]
            # numpy's copy on the CPU: torch's parallelizes past 32 KiB, slower here
            span = (ring.numpy(), host.numpy()) if self.device.type == "cpu" else (ring, host)
            self._spans[slot, num_bytes] = span
        dst, src = span
        if self.device.type == "cpu":
            dst[:] = src
        elif not self.cuda:
            dst.copy_(src)
        else:
            dst.copy_(src, non_blocking=True)
            self.event = torch.cuda.Event()
            # on the given device's stream: no lookup of the current device
            self.event.record(torch.cuda.current_stream(dst.device))
        return slot, self.ring[slot]
