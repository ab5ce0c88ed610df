"""The logit edits of `sampling_penalties` with every index uploaded once per batch of params.

Same order and semantics as the host's `edit_logits` (vLLM's): allowed_token_ids -> bad words
-> min_tokens -> logit_bias -> penalties. One-token bad words ban their token at every step:
their indices are uploaded once with the plan. Longer bad words ban by the newest output tokens,
so they are applied only where the caller has resolved the previous step (its placeholders
replaced by the real tokens: `Sampler.sample_deferred(..., resolved=True)`); their banned ids
are worked out on the host each step (`banned_tokens`, the host path's rule) and uploaded.
The host functions of `sampling_penalties` build their index tensors from Python lists each
call with a synchronous copy; here those tensors are built once per distinct params list (the
Sampler's BatchPlan keeps the EditPlan) through pinned, non-blocking uploads, so a step of the
device path (async scheduling) never makes the host wait. What changes per step is uploaded
the same way and is small: which min_tokens rows are still below their minimum (the host knows
num_output_tokens, placeholder included) and the output-count slots (`OutputCounts`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from enginespec.sample.penalties import (
    _UNSET,
    banned_tokens,
    bans_read_outputs,
    min_tokens_ids,
    min_tokens_yields,
    penalize_rows,
    penalty_columns,
    upload,
    upload_packed,
)

NEG_INF = float("-inf")


def _pairs(pairs: list, width: int) -> np.ndarray:
    """int64 / float32 columns [width, n] of a list of n tuples (empty: [width, 0])."""
    return np.array(pairs, dtype=np.float64).reshape(-1, width).T


class EditPlan:
    """The edits one batch of requests asks for, on the device. Built from the requests of the
    first call (stop ids and EOS come from them; params are frozen, so equal params lists
    give equal plans for allowed ids, bias and penalties; EOS is per request and read again).
    Every index and value travels in ONE host-to-device copy (`upload_packed`). penalties:
    the rows' PenaltyColumns when the caller has them on the device already (rows local to
    `requests`), else built here."""

    def __init__(self, requests: Sequence, vocab: int, device, penalties=_UNSET):
        params = [r.params for r in requests]
        self.device = device
        allowed_rows = [i for i, p in enumerate(params) if p.allowed_token_ids is not None]
        allowed = [(j, t) for j, i in enumerate(allowed_rows) for t in params[i].allowed_token_ids]
        bias = [(i, t, float(v)) for i, p in enumerate(params) for t, v in (p.logit_bias or {}).items()]
        self.min_rows = [i for i, p in enumerate(params) if p.min_tokens > 0]
        self.min_tokens = np.array([params[i].min_tokens for i in self.min_rows], dtype=np.int64)
        stops = [
            (j, i, t) for j, i in enumerate(self.min_rows) for t in min_tokens_ids(requests[i]) if t < vocab
        ]
        # min rows whose ban yields where it would leave them no token (penalties.min_tokens_yields)
        stopped = {j for j, _, _ in stops}
        guard = [(i, j) for j, i in enumerate(self.min_rows) if j in stopped and min_tokens_yields(params[i])]
        # one-token bad words ban their token at every step (penalties.bans_read_outputs):
        # their (row, token) pairs travel once with the plan; longer words are worked out per step
        fixed_bans = sorted(
            {(i, s[0]) for i, p in enumerate(params) for s in p.bad_words_token_ids if len(s) == 1}
        )
        allowed_t, bias_t, stops_t = _pairs(allowed, 2), _pairs(bias, 3), _pairs(stops, 3)
        (rows_t, allowed_ij, bias_ij, bias_v, stops_ijt, fixed_ij, guard_ij) = upload_packed(
            [
                np.array(allowed_rows, dtype=np.int64),
                allowed_t.astype(np.int64),
                bias_t[:2].astype(np.int64),
                bias_t[2].astype(np.float32),
                stops_t.astype(np.int64),
                _pairs(fixed_bans, 2).astype(np.int64),
                _pairs(guard, 2).astype(np.int64),
            ],
            device,
        )
        self.allowed: Optional[tuple] = None
        if allowed_rows:
            keep = torch.zeros((len(allowed_rows), vocab), dtype=torch.bool, device=device)
            keep[allowed_ij[0], allowed_ij[1]] = True
            self.allowed = (rows_t, keep)
        self.bias = (bias_ij[0], bias_ij[1], bias_v) if bias else None
        # (index into min_rows, batch row, stop id) of every stop id to mask
        self.min_index: Optional[tuple] = tuple(stops_ijt.unbind(0)) if stops else None
        # (batch row, index into min_rows) of each row whose min_tokens ban may yield
        self.min_guard: Optional[tuple] = (guard_ij[0], guard_ij[1]) if guard else None
        self.penalties = penalty_columns(params, device) if penalties is _UNSET else penalties
        self.fixed_bans = (fixed_ij[0], fixed_ij[1]) if fixed_bans else None
        # rows with bad words of several tokens: their bans depend on each step's newest output
        # tokens (`_apply_bans`): (row, those words), filtered once here, not every step
        self.ban_words = [
            (i, tuple(w for w in p.bad_words_token_ids if len(w) > 1))
            for i, p in enumerate(params)
            if bans_read_outputs(p.bad_words_token_ids)
        ]

    def apply(self, x: torch.Tensor, requests: Sequence, counts) -> Optional[torch.Tensor]:
        """Edit float32 x [S, V] in place. counts: the Sampler's OutputCounts (output counts and
        prompt masks of the penalty rows, read in place by slot). Returns the penalty rows'
        slots (None without penalty rows): the caller adds the tokens it draws there
        (`OutputCounts.add`)."""
        if self.allowed is not None:
            rows, keep = self.allowed
            x.index_copy_(0, rows, x.index_select(0, rows).masked_fill(~keep, NEG_INF))
        if self.fixed_bans is not None:
            x.index_put_(self.fixed_bans, x.new_full((), NEG_INF))
        if self.ban_words:
            self._apply_bans(x, requests)
        if self.min_index is not None:
            self._apply_min_tokens(x, requests)
        if self.bias is not None:
            r, c, v = self.bias
            x.index_put_((r, c), v, accumulate=True)
        if self.penalties is not None:
            return self._apply_penalties(x, requests, counts)
        return None

    def _apply_bans(self, x: torch.Tensor, requests: Sequence) -> None:
        """-inf on each ban row's tokens that would complete one of its bad words of several
        tokens after its output so far (the host's rule, `banned_tokens`; one-token words are
        the plan's fixed bans): one small upload a step where any applies. The requests' newest
        output tokens must be real, not placeholders (the caller resolved the previous step), or
        the bans would be a step late."""
        pairs = [
            (row, token)
            for row, words in self.ban_words
            for token in banned_tokens(words, requests[row].output_token_ids)
        ]
        if pairs:
            index = upload(torch.tensor(pairs, dtype=torch.int64).T.contiguous(), x.device)
            # the value made on the device: a Python scalar here would go up as a pageable
            # copy, which waits for the stream (the step's forward) first
            x.index_put_((index[0], index[1]), x.new_full((), NEG_INF))

    def _apply_min_tokens(self, x: torch.Tensor, requests: Sequence) -> None:
        """Stop ids and EOS (`min_tokens_ids`) at -inf on rows still below min_tokens; which
        rows those are is this step's one small upload. A row of hard constraints
        (`min_guard`) that the ban would leave with no token keeps its stop ids, as on the
        host (penalties.apply_min_tokens): whether any token survives is one reduction over
        those rows on the device, no host sync."""
        num_out = np.fromiter(
            (requests[i].num_output_tokens for i in self.min_rows), dtype=np.int64, count=len(self.min_rows)
        )
        below = upload(torch.from_numpy(num_out < self.min_tokens), x.device)
        local, rows, cols = self.min_index
        current = x[rows, cols]
        ban = below.index_select(0, local)
        neg = torch.full_like(current, NEG_INF)
        x[rows, cols] = torch.where(ban, neg, current)
        if self.min_guard is not None:
            guard_rows, guard_local = self.min_guard
            alive = (x.index_select(0, guard_rows) > NEG_INF).any(dim=1)
            keep = torch.ones_like(below).index_copy(0, guard_local, alive)
            x[rows, cols] = torch.where(ban & keep.index_select(0, local), neg, current)

    def edited_copy(self, x: torch.Tensor, index: torch.Tensor, requests: Sequence, counts) -> tuple:
        """(edited, slots): the rows `index` of x [S, V] (int64 [E], the rows these edits are
        for, in order) copied and edited (`apply`). When every edited row is a penalty row and
        penalties are the only edit, the copy is the penalty pass itself, which reads x's rows
        and writes the edited ones: one pass over the rows instead of two (on the H200 the
        separate copy of 64 rows of 151,936 took 18 us)."""
        only_penalties = (
            self.allowed is None
            and self.fixed_bans is None
            and not self.ban_words
            and self.bias is None
            and self.min_index is None
        )
        cols = self.penalties
        if only_penalties and cols is not None and len(cols.rows) == index.shape[0]:
            edited = torch.empty((index.shape[0], x.shape[1]), dtype=torch.float32, device=x.device)
            return edited, self._apply_penalties(edited, requests, counts, source=(x, index))
        edited = x.index_select(0, index)
        return edited, self.apply(edited, requests, counts)

    def _apply_penalties(self, x: torch.Tensor, requests: Sequence, counts, source=None) -> torch.Tensor:
        cols = self.penalties
        slots = counts.slots([requests[i] for i in cols.rows])
        penalize_rows(x, cols, counts.prompt, counts.table, slots, source)
        return slots
