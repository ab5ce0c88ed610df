"""Per-request output-token histograms kept on the device, updated from the sampled ids tensor.

Frequency, presence and repetition penalties need each row's output-token counts. Rebuilding
them from the host's token lists every step costs an upload of every history and, under async
scheduling, cannot see the newest token: it is still a placeholder whose real id sits in the
launched step's ids tensor. So the counts live in a device table (int32 [num_slots, V], one
slot per request) and each device draw adds its sampled ids to its rows (`add`, a scatter on
the device, no host round trip); the placeholder is thereby counted with its real id.

Invariant: a slot holds the histogram of the request's first `num_counted` output tokens.
`slots()` checks num_counted against request.num_output_tokens (placeholder included) and
rebuilds a row from the host list when they differ: a new request, tokens appended outside the
device path (the serial sampler, speculative tokens), or a batch that held the same request
twice (the increments of such a call are not kept: the entry is marked stale). A rebuild skips
ids >= vocab (a placeholder); in the engine a request holding a placeholder was counted by the
step that drew it, so a rebuild never meets one (a rebuild that did would miss that one token).
Slots of finished requests are released at the next call.

Beside the counts, `prompt` (bool [num_slots, V]) holds each slot's prompt mask (which tokens
occur in the prompt: the repetition penalty's other half), written once when a request takes
its slot (prompts never change). The penalty kernel reads both tables in place by slot, so a
step gathers nothing.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
import torch

from enginespec.sample.penalties import upload_packed


class OutputCounts:
    """The device tables (counts, prompt masks) and the host bookkeeping: id(request) ->
    [request, slot, num_counted] (the entry keeps the request alive, so its id cannot be
    reused while the entry lives)."""

    def __init__(self, vocab: int, device):
        self.vocab = vocab
        self.device = torch.device(device)
        self.table = torch.zeros((0, vocab), dtype=torch.int32, device=self.device)
        self.prompt = torch.zeros((0, vocab), dtype=torch.bool, device=self.device)
        self.entries: dict[int, list] = {}
        self.free: list[int] = []
        self._ones = torch.ones(0, dtype=torch.int32, device=self.device)  # add()'s increments, kept
        self._last_slots: list = []  # slots() of the last call and their device copy
        self._last_slots_t = torch.zeros(0, dtype=torch.int64, device=self.device)

    def _release_finished(self) -> None:
        for key in [k for k, e in self.entries.items() if e[0].status.is_finished]:
            self.free.append(self.entries.pop(key)[1])

    def _grow(self, need: int) -> None:
        """Room for `need` more slots: the table doubles (a copy, only when it grows)."""
        if len(self.free) >= need:
            return
        old = self.table.shape[0]
        new = max(2 * old, old + need - len(self.free), 16)
        table = torch.zeros((new, self.vocab), dtype=torch.int32, device=self.device)
        table[:old] = self.table
        prompt = torch.zeros((new, self.vocab), dtype=torch.bool, device=self.device)
        prompt[:old] = self.prompt
        self.table, self.prompt = table, prompt
        self.free.extend(range(new - 1, old - 1, -1))

    def slots(self, requests: Sequence) -> torch.Tensor:
        """Each row's slot (int64 [R] on the device), after writing the prompt masks of new
        entries and rebuilding stale rows: whatever this needs travels in ONE upload."""
        self._release_finished()
        missing = {id(r): r for r in requests if id(r) not in self.entries or self.entries[id(r)][0] is not r}
        self._grow(len(missing))
        for key, r in missing.items():
            if key in self.entries:  # a dead request's id reused: its slot goes back first
                self.free.append(self.entries.pop(key)[1])
            self.entries[key] = [r, self.free.pop(), -1]
        fresh = [self.entries[key] for key in missing]
        stale = [
            self.entries[id(r)]
            for r in dict.fromkeys(requests)
            if self.entries[id(r)][2] != r.num_output_tokens
        ]
        slots = [self.entries[id(r)][1] for r in requests]
        changed = slots != self._last_slots  # the steady state (same requests, same order) uploads nothing
        if not (fresh or stale or changed):
            return self._last_slots_t
        fresh_slots, prompt_cells = self._cells(fresh, lambda e: e[0].prompt_token_ids)
        stale_slots, count_cells = self._cells(stale, lambda e: e[0].output_token_ids)
        slots_t, fresh_t, prompt_t, stale_t, count_t = upload_packed(
            [np.array(slots, dtype=np.int64), fresh_slots, prompt_cells, stale_slots, count_cells],
            self.device,
        )
        if fresh:  # prompt masks: cleared, then the prompt's cells set
            self.prompt.index_fill_(0, fresh_t, False)
            if len(prompt_cells):
                self.prompt.view(-1).index_fill_(0, prompt_t, True)
        if stale:  # counts rebuilt from the host lists
            self.table.index_fill_(0, stale_t, 0)
            if len(count_cells):
                ones = torch.ones(len(count_cells), dtype=torch.int32, device=self.device)
                self.table.view(-1).scatter_add_(0, count_t, ones)
            for e in stale:
                e[2] = e[0].num_output_tokens
        if changed:
            self._last_slots, self._last_slots_t = slots, slots_t
        return self._last_slots_t

    def _cells(self, entries: list, ids_of) -> tuple[np.ndarray, np.ndarray]:
        """(the entries' slots, the flat cells slot * vocab + id of each id below the vocab
        in ids_of(entry)), int64 host arrays."""
        slots = np.array([e[1] for e in entries], dtype=np.int64)
        lists = [[t for t in ids_of(e) if t < self.vocab] for e in entries]
        lengths = np.fromiter((len(ids) for ids in lists), dtype=np.int64, count=len(lists))
        flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=int(lengths.sum()))
        return slots, flat + np.repeat(slots * self.vocab, lengths)

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """The counts of the given slots, int32 [R, V] (a copy)."""
        return self.table.index_select(0, slots)

    def add(self, requests: Sequence, slots: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Count each row's sampled id (token_ids int64 [R], on the device) in its slot. Rows
        are distinct requests in the engine; a call that repeats one marks it stale instead."""
        if len(set(map(id, requests))) != len(requests):
            for r in requests:
                self.entries[id(r)][2] = -1
            return
        flat = token_ids.add(slots, alpha=self.vocab)  # slot * vocab + id, one launch
        ones = self._ones if self._ones.shape == flat.shape else torch.ones_like(flat, dtype=torch.int32)
        self._ones = ones
        # distinct slots, so distinct cells: a scatter (one launch, no sort as index_put_'s
        # accumulate takes on CUDA)
        self.table.view(-1).scatter_add_(0, flat, ones)
        for r in requests:
            self.entries[id(r)][2] += 1
