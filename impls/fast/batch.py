"""The fast batch builder: the tensors of the spec's canonical builder
(spec/batch_layout.py:build_batch), built from persistent buffers with numpy, moved to the
device in one copy.

Layout (identical to the spec's builder, which documents it): rows follow output.scheduled;
request r (computed c, scheduled n) owns rows at positions c..c+n-1, seq_len c + n, a block
table row of its first cdiv(c + n, bs) blocks padded with 0 to the widest row (at least 1);
it samples its last row iff c + n >= r.num_tokens; prompt logprob rows are listed while it has
no output; pad_to adds one-row requests with seq_len 0, slot -1, id 0, position 0, zero table.

Per step the Python loop does only per-request work (a slice of token ids, a table sync that
is usually a no-op); positions, slots, query_start_loc and the table gather are numpy ops into
one staging byte buffer, copied into the next of batch_buffers.RING_SLOTS device buffers, whose
sections are viewed as int64 / int32 tensors once per (shape, buffer) and reused: a Batch's
tensors stay valid while RING_SLOTS - 1 more batches are built (batch_buffers.Staging). On
a 2-core CPU a 1-decode build took 42 us with nine new views a step and 23 with the kept ones
(benchmarks/bench_core.py, benchmarks/RESULTS.md, twenty-third session).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from enginespec.impls.fast.batch_buffers import RING_SLOTS, ZERO_SLOT, Staging, TableRows
from enginespec.impls.fast.block_manager import FastBlockManager
from enginespec.spec import PACKED_ALIGN, Batch, BatchMeta

LAYOUT_CACHE = 64  # shapes whose layout and host views a builder keeps (oldest dropped first)


class _Rows:
    """What the per-request loop collects for one step (plain lists; numpy takes them in one
    conversion each; sample_ids and prompt_rows go into the Batch as they are)."""

    __slots__ = ("ids", "starts", "counts", "slots", "logits", "sample_ids", "prompt_rows", "width", "trim")

    def __init__(self):
        self.ids: list[int] = []
        self.starts: list[int] = []
        self.counts: list[int] = []
        self.slots: list[int] = []
        self.logits: list[int] = []
        self.sample_ids: list[str] = []
        self.prompt_rows: dict = {}
        self.width = 1
        self.trim = False  # some table is longer than its row: zero past cdiv(seq_len, bs)


class BatchBuilder:
    """Builds spec.Batch objects for one device, reusing its buffers step after step."""

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self._tables = TableRows()
        self._staging = Staging(self.device)
        # (rows, reqs, width, logits) -> (layout, host views, device views per ring slot or None)
        self._layouts: dict[tuple, tuple] = {}
        self._layouts_of = None  # the staging array those views are of

    def build(self, output, block_manager, pad_to: Optional[int] = None) -> Batch:
        """Lay out every scheduled token of `output` (call before update_from_output)."""
        rows = self._tables
        rows.release(output.finished)
        rows.bound(4 * len(output.scheduled) + 4096)
        acc = self._collect(output.scheduled, block_manager)
        num_tokens, num_reqs = len(acc.ids), len(acc.counts)
        num_pad = 0
        if pad_to is not None:
            if pad_to < num_tokens:
                raise ValueError(
                    f"pad_to must be >= the number of scheduled tokens ({num_tokens}), got {pad_to}"
                )
            num_pad = pad_to - num_tokens
        return self._assemble(acc, block_manager.block_size, num_tokens, num_reqs, num_pad)

    def _layout(self, n_rows: int, n_reqs: int, width: int, n_logits: int) -> tuple["_Layout", list, list]:
        """The step's layout, its typed views of the staging buffer (ready to be written) and
        its device views per ring slot (made at the slot's first use). All are kept per shape (a
        steady decode repeats one shape step after step) until the buffers are reallocated."""
        key = (n_rows, n_reqs, width, n_logits)
        hit = self._layouts.get(key)
        layout = hit[0] if hit is not None else _Layout(*key)
        buf = self._staging.acquire(layout.num_bytes)  # (waits for the last copy out of it)
        if buf is not self._layouts_of:  # reallocated: every kept view is of the old buffer
            self._layouts.clear()
            self._layouts_of = hit = None
        if hit is None:
            if len(self._layouts) >= LAYOUT_CACHE:
                self._layouts.pop(next(iter(self._layouts)))
            hit = self._layouts[key] = (layout, layout.views(buf), [None] * RING_SLOTS)
            self._layouts_of = buf
        return hit

    def _collect(self, scheduled, block_manager) -> _Rows:
        """The per-request loop: token ids, starts, counts, table slots, sampling rows."""
        acc = _Rows()
        ids, starts, counts, slots = acc.ids, acc.starts, acc.counts, acc.slots
        logits, sample_ids = acc.logits, acc.sample_ids
        bs = block_manager.block_size
        # FastBlockManager's own table lists (read, never copied); any other pool: block_table().
        tables = block_manager._tables if isinstance(block_manager, FastBlockManager) else None
        rows = self._tables
        sync, slot_of, table_of, len_of = rows.sync, rows.slot_of, rows.table_of, rows.len_of
        width = 1
        for r, n in scheduled:
            rid = r.request_id
            c = r.num_computed_tokens
            tok = r.token_ids
            end = c + n
            if n < 1 or end > len(tok):
                tok = _known_tokens(r, n, end)
            if n == 1:
                ids.append(tok[c])
            else:
                ids += tok[c:end]
            table = tables.get(rid) if tables is not None else block_manager.block_table(rid)
            need = (end + bs - 1) // bs
            if table is None or len(table) < need:
                raise _short_table(r, table, bs, end)
            if len(table) > need:
                acc.trim = True
            if need > width:
                width = need
            slot = slot_of.get(rid)  # inline TableRows.sync's no-change case
            if slot is None or table_of[slot] is not table or len_of[slot] != len(table):
                slot = sync(rid, table)
            slots.append(slot)
            starts.append(c)
            counts.append(n)
            if end >= len(r.token_ids):
                logits.append(len(ids) - 1)
                sample_ids.append(rid)
            if r.params.prompt_logprobs is not None:
                _prompt_logprob_rows(r, len(ids) - n, c, end, acc.prompt_rows)
        acc.width = width
        return acc

    def _assemble(self, acc: _Rows, bs: int, num_tokens: int, num_reqs: int, num_pad: int) -> Batch:
        """Vectorized layout into the staging buffer, one transfer, tensor views."""
        n_rows, n_reqs, width = num_tokens + num_pad, num_reqs + num_pad, acc.width
        layout, host, dev_views = self._layout(n_rows, n_reqs, width, len(acc.logits))
        ids, pos, slot, qsl, seq_lens, logits, table = host
        table = table.reshape(n_reqs, width)
        _fill_table(self._tables.rows, acc, width, num_pad, bs, table)
        counts = np.asarray(acc.counts, dtype=np.int64)
        starts = np.asarray(acc.starts, dtype=np.int64)
        ids[:num_tokens] = acc.ids
        _fill_positions(pos, slot, table, counts, starts, bs, num_tokens)
        qsl[0] = 0
        np.cumsum(counts, out=qsl[1 : num_reqs + 1])
        seq_lens[:num_reqs] = starts + counts
        if num_pad:
            ids[num_tokens:] = 0
            pos[num_tokens:] = 0
            slot[num_tokens:] = -1
            qsl[num_reqs + 1 :] = np.arange(num_tokens + 1, n_rows + 1, dtype=np.int32)
            seq_lens[num_reqs:] = 0
        logits[:] = acc.logits
        max_query_len = int(counts.max()) if num_reqs else 0
        max_seq_len = int(seq_lens[:num_reqs].max()) if num_reqs else 0
        if num_pad:
            max_query_len = max(max_query_len, 1)
        slot, dst = self._staging.transfer(layout.num_bytes)
        dev = dev_views[slot]
        if dev is None:
            dev = dev_views[slot] = layout.views(dst)
        if self.device.type == "cpu":
            host_qsl, host_seq_lens = dev[3], dev[4]
        else:  # copies: the staging buffer is rewritten next step
            host_qsl, host_seq_lens = torch.from_numpy(qsl.copy()), torch.from_numpy(seq_lens.copy())
        meta = BatchMeta(
            query_start_loc=dev[3],
            seq_lens=dev[4],
            block_table=dev[6].view(n_reqs, width),
            slot_mapping=dev[2],
            block_size=bs,
            query_start_loc_cpu=host_qsl,
            seq_lens_cpu=host_seq_lens,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
        )
        return Batch(
            input_ids=dev[0],
            positions=dev[1],
            meta=meta,
            logits_indices=dev[5],
            sample_request_ids=acc.sample_ids,
            num_scheduled_tokens=num_tokens,
            num_reqs=num_reqs,
            prompt_logprob_rows=acc.prompt_rows,
        )


class _Layout:
    """Where each array of a step sits in the staging bytes: input_ids, positions,
    slot_mapping (int64), query_start_loc, seq_lens (int32), logits_indices (int64),
    block_table (int32), each section starting on a 16-byte boundary (aligned loads in kernels,
    and one Triton pointer specialization whatever the batch shape). The first five are
    spec.packed_offsets' layout, so a decode graph loads them with one copy."""

    __slots__ = ("sections", "num_bytes")
    ALIGN = PACKED_ALIGN

    def __init__(self, n_rows: int, n_reqs: int, width: int, n_logits: int):
        sizes = (
            (8, n_rows),
            (8, n_rows),
            (8, n_rows),
            (4, n_reqs + 1),
            (4, n_reqs),
            (8, n_logits),
            (4, n_reqs * width),
        )
        offset, sections = 0, []
        for itemsize, count in sizes:
            sections.append((offset, itemsize, count))
            offset += -(-itemsize * count // self.ALIGN) * self.ALIGN
        self.sections, self.num_bytes = sections, offset

    def views(self, buf):
        """Typed 1-D views of a numpy byte array or a torch uint8 tensor: the buffer is viewed
        once per item size (num_bytes is a multiple of ALIGN), then each section is one slice
        of those (two views and seven slices a step, where a view per section took fourteen
        calls)."""
        typed: dict[int, Any]
        if isinstance(buf, np.ndarray):
            typed = {8: buf[: self.num_bytes].view(np.int64), 4: buf[: self.num_bytes].view(np.int32)}
        else:
            typed = {8: buf[: self.num_bytes].view(torch.int64), 4: buf[: self.num_bytes].view(torch.int32)}
        return [typed[size][off // size : off // size + count] for off, size, count in self.sections]


def _fill_table(rows: np.ndarray, acc: _Rows, width: int, num_pad: int, bs: int, out: np.ndarray) -> None:
    """Gather the scheduled requests' persistent rows (padding requests gather the zero row);
    zero entries past cdiv(seq_len, bs) when some table is longer than its row needs."""
    if out.shape[0] == 0:
        return
    slots = np.asarray(acc.slots + [ZERO_SLOT] * num_pad, dtype=np.intp)
    np.take(rows[:, :width], slots, axis=0, out=out)
    if acc.trim:
        need = -(-(np.asarray(acc.starts) + np.asarray(acc.counts)) // bs)
        out[: len(acc.counts)][np.arange(width)[None, :] >= need[:, None]] = 0


def _fill_positions(pos, slot, table, counts, starts, bs: int, num_tokens: int) -> None:
    """Positions c..c+n-1 per request and their slots table[p // bs] * bs + p % bs."""
    num_reqs = counts.shape[0]
    if num_tokens == num_reqs:  # every request has one row (decodes)
        p = starts
        req = np.arange(num_reqs)
    else:
        req = np.repeat(np.arange(num_reqs), counts)
        first_row = np.cumsum(counts) - counts
        p = np.arange(num_tokens, dtype=np.int64) - np.repeat(first_row - starts, counts)
    pos[:num_tokens] = p
    slot[:num_tokens] = table[req, p // bs].astype(np.int64) * bs + p % bs


def _known_tokens(r, n: int, end: int) -> list[int]:
    """Token ids including draft tokens; the plain builder's ValueErrors for bad counts."""
    known = list(r.token_ids) + list(getattr(r, "spec_token_ids", None) or ())
    if n < 1:
        raise ValueError(f"request {r.request_id!r}: scheduled tokens must be >= 1, got {n}")
    if end > len(known):
        raise ValueError(
            f"request {r.request_id!r}: scheduled {n} tokens from position {r.num_computed_tokens} "
            f"but only {len(known)} tokens are known"
        )
    return known


def _short_table(r, table, bs: int, end: int) -> ValueError:
    covered = len(table or ()) * bs
    return ValueError(
        f"request {r.request_id!r}: block table covers {covered} tokens, needs >= {end} "
        f"(allocate_slots before build_batch)"
    )


def _prompt_logprob_rows(r, first_row: int, c: int, end: int, out: dict) -> None:
    """Rows at prompt positions p < num_prompt - 1 (they predict prompt token p + 1), listed
    only while the request has no output (a recomputed request does not report them twice)."""
    if r.num_output_tokens > 0:
        return
    last = min(end, r.num_prompt_tokens - 1)
    if c >= last:
        return
    out[r.request_id] = (
        list(range(first_row, first_row + last - c)),
        list(r.prompt_token_ids[c + 1 : last + 1]),
    )
