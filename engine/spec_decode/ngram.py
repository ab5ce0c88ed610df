"""N-gram prompt lookup (vLLM's `ngram` method), one incremental index per request.

Proposal rule, for a request whose known tokens are t[0..L-1]: for n from prompt_lookup_max
down to prompt_lookup_min, take the suffix s = t[L-n..L-1]; if s also starts at some p < L - n,
take the earliest such p and propose t[p+n .. p+n+k-1] (at most k tokens, fewer near the end);
the first n that matches wins; no match proposes nothing.

Why an index rather than a scan: a scan costs O(L) per request per step (a numpy sliding-window
compare is ~20-50 us per request at L = 2k, 5-10 ms per step at batch 256, more than a decode
step's GPU time). One table per n maps each n-gram to the earliest position it starts at among
those followed by at least one token (the earliest has the longest known continuation: in a
loop or a quoted passage the latest occurrence is often right before the suffix, with one
token after it); a proposal is one lookup per n.

Host cost per step (benchmarks/spec_host_cost.py, batch 256): only the shortest n's table is
kept current (one entry per appended token); a longer n's table catches up only when the
shortest suffix matched, since an n-gram occurring earlier implies its last prompt_lookup_min
tokens do. A request whose text does not repeat (the common case on a random model) costs one
insert and one lookup a step, and a prompt costs one table, built in one pass of C-level zips
when the request first decodes (a numpy vectorisation does not help here: the tables make each
proposal O(max - min + 1)).

Invariant: table n indexes the first `lengths[n]` tokens, its entries p satisfying
p + n <= lengths[n] - 1, so a suffix never matches itself. Token ids are append-only in a
request's life (a recompute keeps them); the async placeholder (the newest token of a step in
flight) is never indexed: callers pass the number of real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

from enginespec.engine.spec_decode.drafter import Drafter


@dataclass
class _State:
    request: object  # the request the tables belong to (a reused id starts afresh)
    tables: dict = field(default_factory=dict)  # n -> {ngram tuple: earliest start}
    lengths: dict = field(default_factory=dict)  # n -> tokens indexed in tables[n]


def _catch_up(table: dict, n: int, tokens, old: int, num_real: int) -> None:
    """Index in `table` (n-grams, earliest start kept) the starts p newly followed by a token:
    max(0, old - n) <= p <= num_real - 1 - n, `old` tokens having been indexed before."""
    first, last = max(0, old - n), num_real - 1 - n
    if last < first:
        return
    if last - first < 16:  # a few appended tokens: the common step, one insert each
        for p in range(first, last + 1):
            table.setdefault(tuple(tokens[p : p + n]), p)
        return
    window = tokens[first : last + n]
    grams = zip(*(window[i : len(window) - n + 1 + i] for i in range(n)))
    if not table:  # reversed, so the earliest start is written last and wins
        table.update(zip(reversed(list(grams)), range(last, first - 1, -1)))
    else:
        for p, gram in enumerate(grams, first):
            table.setdefault(gram, p)


class NgramDrafter(Drafter):
    """Proposes draft tokens by prompt lookup; keeps one index per live request id."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.k = num_speculative_tokens
        self.sizes = list(range(prompt_lookup_max, prompt_lookup_min - 1, -1))  # longest first
        self.min_n = prompt_lookup_min
        self._states: dict[str, _State] = {}

    def _state(self, request) -> _State:
        state = self._states.get(request.request_id)
        if state is None or state.request is not request:
            state = _State(request, {n: {} for n in self.sizes}, dict.fromkeys(self.sizes, 0))
            self._states[request.request_id] = state
        return state

    def _lookup(self, state: _State, n: int, tokens, num_real: int):
        """Earliest start p of the suffix n-gram with p + n < num_real, or None."""
        table, old = state.tables[n], state.lengths[n]
        if num_real > old:
            _catch_up(table, n, tokens, old, num_real)
            state.lengths[n] = num_real
        p = table.get(tuple(tokens[num_real - n : num_real]))
        return p if p is not None and p + n < num_real else None

    def propose(self, request, num_real: int, max_drafts: int) -> list[int]:
        """Up to min(k, max_drafts) drafts following the first num_real tokens of the request
        (see the module docstring); [] when nothing matches or max_drafts < 1."""
        return self.propose_batch([request], [num_real], [max_drafts])[0]

    def propose_batch(self, requests, num_reals, max_drafts) -> list[list[int]]:
        """`propose` for each request."""
        return list(self._proposals(requests, num_reals, max_drafts))

    def first_to_propose(self, requests, num_reals) -> Optional[int]:
        """The first request with a one-draft proposal (the later ones are not looked up)."""
        found = self._proposals(requests, num_reals, [1] * len(requests))
        return next((i for i, drafts in enumerate(found) if drafts), None)

    def _proposals(self, requests, num_reals, max_drafts) -> Iterator[list[int]]:
        """One proposal per request, in order. This loop is the per-step host cost at batch
        256, so the shortest n's table is updated and looked up inline: a request whose
        shortest suffix never occurred before costs two dict operations and a state look-up."""
        k, n, states = self.k, self.min_n, self._states
        for request, num_real, limit in zip(requests, num_reals, max_drafts):
            if limit < 1 or num_real <= n:
                yield []
                continue
            state = states.get(request.request_id)
            if state is None or state.request is not request:
                state = self._state(request)
            tokens, table, old = request.token_ids, state.tables[n], state.lengths[n]
            if num_real == old + 1 and old >= n:  # one appended token: one new start
                table.setdefault(tuple(tokens[old - n : old]), old - n)
            elif num_real > old:
                _catch_up(table, n, tokens, old, num_real)
            state.lengths[n] = max(old, num_real)
            p = table.get(tuple(tokens[num_real - n : num_real]))
            if p is None or p + n >= num_real:
                yield []  # no longer n-gram can occur earlier either
            else:
                yield self._longest(state, tokens, num_real, min(k, limit))

    def _longest(self, state: _State, tokens, num_real: int, limit: int) -> list[int]:
        """The drafts of the longest n whose suffix occurred earlier (the shortest did)."""
        for n in self.sizes:
            if n >= num_real:
                continue
            p = self._lookup(state, n, tokens, num_real)
            if p is not None:
                return list(tokens[p + n : min(p + n + limit, num_real)])
        return []  # unreachable: the caller saw the shortest n match

    def forget(self, request_id: str) -> None:
        """Drop a finished request's index."""
        self._states.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._states)
