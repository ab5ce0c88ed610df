"""The logit edits of `sampling_penalties` with every index uploaded once per batch of params.

Same order and semantics (vLLM's): allowed_token_ids -> min_tokens -> logit_bias -> penalties.
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

from enginespec.sample.penalties import penalize_rows, penalty_columns, stop_ids_to_mask, upload

NEG_INF = float("-inf")


def _flat(rows_cols: list[tuple[int, int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    both = upload(torch.tensor(rows_cols, dtype=torch.int64).view(-1, 2).t().contiguous(), device)
    return both[0], both[1]


class EditPlan:
    """The edits one batch of requests asks for, on the device. Built from the requests of the
    first call (stop ids and EOS come from them; params are frozen, so equal params lists
    give equal plans for allowed ids, bias and penalties; EOS is per request and read again)."""

    def __init__(self, requests: Sequence, vocab: int, device):
        params = [r.params for r in requests]
        self.device = device
        self.allowed: Optional[tuple] = None
        allowed_rows = [i for i, p in enumerate(params) if p.allowed_token_ids is not None]
        if allowed_rows:
            pairs = [(j, t) for j, i in enumerate(allowed_rows) for t in params[i].allowed_token_ids]
            local, cols = _flat(pairs, device)
            keep = torch.zeros((len(allowed_rows), vocab), dtype=torch.bool, device=device)
            keep[local, cols] = True
            self.allowed = (upload(torch.tensor(allowed_rows, dtype=torch.int64), device), keep)
        self.bias: Optional[tuple] = None
        bias = [(i, t, float(v)) for i, p in enumerate(params) for t, v in (p.logit_bias or {}).items()]
        if bias:
            r, c = _flat([(i, t) for i, t, _ in bias], device)
            self.bias = (r, c, upload(torch.tensor([v for _, _, v in bias], dtype=torch.float32), device))
        self.min_rows = [i for i, p in enumerate(params) if p.min_tokens > 0]
        self.min_tokens = np.array([params[i].min_tokens for i in self.min_rows], dtype=np.int64)
        self.min_index: Optional[tuple] = None
        if self.min_rows:
            pairs = [
                (j, t)
                for j, i in enumerate(self.min_rows)
                for t in stop_ids_to_mask(requests[i])
                if t < vocab
            ]
            if pairs:
                local, cols = _flat(pairs, device)
                rows = upload(torch.tensor(self.min_rows, dtype=torch.int64), device)
                self.min_index = (local, rows.index_select(0, local), cols)
        self.penalties = penalty_columns(params, device)
        self.any = bool(self.allowed or self.bias or self.min_index is not None or self.penalties)

    def apply(self, x: torch.Tensor, requests: Sequence, counts) -> Optional[torch.Tensor]:
        """Edit float32 x [S, V] in place. counts: the Sampler's OutputCounts (output counts and
        prompt masks of the penalty rows, read in place by slot). Returns the penalty rows'
        slots (None without penalty rows): the caller adds the tokens it draws there
        (`OutputCounts.add`)."""
        if self.allowed is not None:
            rows, keep = self.allowed
            x.index_copy_(0, rows, x.index_select(0, rows).masked_fill(~keep, NEG_INF))
        if self.min_index is not None:
            self._apply_min_tokens(x, requests)
        if self.bias is not None:
            r, c, v = self.bias
            x.index_put_((r, c), v, accumulate=True)
        if self.penalties is not None:
            return self._apply_penalties(x, requests, counts)
        return None

    def _apply_min_tokens(self, x: torch.Tensor, requests: Sequence) -> None:
        """Stop ids (and EOS unless ignore_eos) at -inf on rows still below min_tokens; which
        rows those are is this step's one small upload."""
        num_out = np.fromiter(
            (requests[i].num_output_tokens for i in self.min_rows), dtype=np.int64, count=len(self.min_rows)
        )
        below = upload(torch.from_numpy(num_out < self.min_tokens), x.device)
        local, rows, cols = self.min_index
        current = x[rows, cols]
        x[rows, cols] = torch.where(below.index_select(0, local), torch.full_like(current, NEG_INF), current)

    def _apply_penalties(self, x: torch.Tensor, requests: Sequence, counts) -> torch.Tensor:
        cols = self.penalties
        slots = counts.slots([requests[i] for i in cols.rows])
        penalize_rows(x, cols, counts.prompt, counts.table, slots)
        return slots
