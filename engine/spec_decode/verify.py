"""Verification of draft tokens in one target forward: which drafts a step keeps.

Rows: a request with d scheduled drafts D[0..d-1] gets d + 1 logits rows, its last d + 1
scheduled positions; row j predicts the token after D[:j] (row 0 after its last known token).
Each row is sampled as if D[:j] were already output tokens (`DraftRow`: penalties, min_tokens
and a seeded row's index all see them), so row j's distribution is exactly the one plain
decoding would use once D[:j] had been sampled.

- Greedy requests (temperature < GREEDY_EPS): the sampler's own argmax per row, t_j; accept
  the longest prefix with D[j] == t_j, then append t_a (the first mismatch's target token, or
  the bonus after all d). Token for token the output of plain greedy decoding.
- Random requests: the sampler's processed distribution p_j (`Sampler.probs`: every edit,
  temperature and cut). A drafter here is deterministic (q is one-hot on D[j]), so the
  rejection rule is: accept D[j] with probability p_j(D[j]); at the first rejection sample
  from p_j with D[j] removed and renormalised; after d acceptances sample the bonus from p_d.
  Then P(token = x) = p(D) [x = D] + (1 - p(D)) p(x) / (1 - p(D)) [x != D] = p(x): exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from enginespec.sample.sampler import GREEDY_EPS


class DraftRow:
    """A request seen as if `extra` tokens had been appended to its output (read-only view of
    what the sampler reads: params, eos, prompt, output ids and their count)."""

    __slots__ = ("request", "extra", "request_id", "params", "eos_token_id", "num_output_tokens")

    def __init__(self, request, extra: list[int]):
        self.request, self.extra = request, extra
        self.request_id = request.request_id
        self.params = request.params
        self.eos_token_id = request.eos_token_id
        self.num_output_tokens = request.num_output_tokens + len(extra)

    @property
    def prompt_token_ids(self):
        return self.request.prompt_token_ids

    @property
    def output_token_ids(self):
        return list(self.request.output_token_ids) + self.extra


@dataclass
class Verified:
    """Per request (sampling order): the tokens to append (accepted drafts + one) and how many
    drafts were accepted."""

    token_ids: list[list[int]]
    num_accepted: list[int]


def logits_rows(last_rows: Sequence[int], num_drafts: Sequence[int]) -> list[int]:
    """The d + 1 rows ending at each request's last row, in order."""
    rows: list[int] = []
    for last, d in zip(last_rows, num_drafts):
        rows.extend(range(last - d, last + 1))
    return rows


def verify(
    sampler, logits: torch.Tensor, requests: Sequence, drafts: Sequence[list[int]], generator: torch.Generator
) -> Verified:
    """Verify drafts[i] of requests[i] against logits (d_i + 1 rows each, in order)."""
    starts, rows = [], []
    for r, d in zip(requests, drafts):
        starts.append(len(rows))
        rows.extend(DraftRow(r, d[:j]) for j in range(len(d) + 1))
    greedy = [i for i, r in enumerate(requests) if r.params.temperature < GREEDY_EPS]
    random_ = [i for i, r in enumerate(requests) if r.params.temperature >= GREEDY_EPS]
    out: list[Optional[list[int]]] = [None] * len(requests)
    accepted = [0] * len(requests)
    if greedy:
        _verify_greedy(sampler, logits, rows, starts, drafts, greedy, out, accepted)
    if random_:
        _verify_random(sampler, logits, rows, starts, drafts, random_, out, accepted, generator)
    return Verified([list(t or ()) for t in out], accepted)


def _select(logits, rows, starts, drafts, which):
    index = [starts[i] + j for i in which for j in range(len(drafts[i]) + 1)]
    sub = logits.index_select(0, torch.tensor(index, dtype=torch.long, device=logits.device))
    return sub, [rows[k] for k in index]


def _verify_greedy(sampler, logits, rows, starts, drafts, which, out, accepted) -> None:
    sub, views = _select(logits, rows, starts, drafts, which)
    targets = sampler(sub, views).token_ids
    k = 0
    for i in which:
        d = drafts[i]
        a = 0
        while a < len(d) and d[a] == targets[k + a]:
            a += 1
        out[i], accepted[i] = d[:a] + [targets[k + a]], a
        k += len(d) + 1


def _verify_random(sampler, logits, rows, starts, drafts, which, out, accepted, generator) -> None:
    sub, views = _select(logits, rows, starts, drafts, which)
    probs = sampler.probs(sub, views)
    dev = probs.device
    draft_rows, draft_ids, offsets = [], [], []
    k = 0
    for i in which:
        offsets.append(k)
        draft_rows.extend(range(k, k + len(drafts[i])))
        draft_ids.extend(drafts[i])
        k += len(drafts[i]) + 1
    ok: list[bool] = []
    if draft_rows:
        p_draft = probs[torch.tensor(draft_rows, device=dev), torch.tensor(draft_ids, device=dev)]
        u = torch.rand(len(draft_rows), generator=generator, device=dev)
        ok = (u < p_draft).tolist()
    final_rows, removed = [], []
    j = 0
    for i, off in zip(which, offsets):
        d = drafts[i]
        a = 0
        while a < len(d) and ok[j + a]:
            a += 1
        j += len(d)
        accepted[i] = a
        final_rows.append(off + a)
        removed.append(d[a] if a < len(d) else -1)
    tokens = _residual_draw(probs, final_rows, removed, generator)
    for n, i in enumerate(which):
        out[i] = drafts[i][: accepted[i]] + [tokens[n]]


def _residual_draw(probs, final_rows, removed, generator) -> list[int]:
    """One token per final row from its distribution with the rejected draft (if any) removed;
    a row whose remaining mass is 0 (float rounding) draws from the full row."""
    dev = probs.device
    p = probs.index_select(0, torch.tensor(final_rows, dtype=torch.long, device=dev))
    rem = torch.tensor(removed, dtype=torch.long, device=dev)
    has = rem >= 0
    residual = p.scatter(1, rem.clamp(min=0).view(-1, 1), 0.0)
    residual = torch.where(has.view(-1, 1), residual, p)
    empty = residual.sum(dim=1, keepdim=True) <= 0
    residual = torch.where(empty, p, residual)
    return torch.multinomial(residual, 1, generator=generator).view(-1).tolist()
