"""N-gram prompt lookup (vLLM's `ngram` method), one incremental index per request.

Proposal rule, for a request whose known tokens are t[0..L-1]: for n from prompt_lookup_max
down to prompt_lookup_min, take the suffix s = t[L-n..L-1]; if s also starts at some p < L - n,
take the earliest such p and propose t[p+n .. p+n+k-1] (at most k tokens, fewer near the end);
the first n that matches wins; no match proposes nothing.

Why an index rather than a scan: a scan costs O(L) per request per step (a numpy sliding-window
compare is ~20-50 us per request at L = 2k, 5-10 ms per step at batch 256, more than a decode
step's GPU time). The index maps each n-gram to the earliest position it starts at among those
followed by at least one token (the earliest has the longest known continuation: in a loop or a
quoted passage the latest occurrence is often right before the suffix, with one token after
it); appending a token adds one entry per n, a proposal is one
lookup per n. The prompt is indexed in one pass of C-level zips when first seen (a numpy
vectorisation does not help here: the index makes each proposal O(max - min + 1)).

Invariant: `State.length` tokens are indexed and entries satisfy p + n <= length - 1, so a
suffix never matches itself. Token ids are append-only in a request's life (a recompute keeps
them); the async placeholder (the newest token of a step in flight) is never indexed: callers
pass the number of real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from enginespec.engine.spec_decode.drafter import Drafter


@dataclass
class _State:
    request: object  # the request the index belongs to (a reused id starts afresh)
    length: int = 0
    index: dict = field(default_factory=dict)  # n -> {ngram tuple: latest start}


class NgramDrafter(Drafter):
    """Proposes draft tokens by prompt lookup; keeps one index per live request id."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.k = num_speculative_tokens
        self.sizes = list(range(prompt_lookup_max, prompt_lookup_min - 1, -1))  # longest first
        self._states: dict[str, _State] = {}

    def _state(self, request, num_real: int) -> _State:
        state = self._states.get(request.request_id)
        if state is None or state.request is not request:
            state = self._states[request.request_id] = _State(request, 0, {n: {} for n in self.sizes})
        if num_real > state.length:
            self._extend(state, request.token_ids, num_real)
        return state

    def _extend(self, state: _State, tokens, num_real: int) -> None:
        """Index the starts p newly followed by a token: max(0, old - n) <= p <= num_real - 1 - n
        (the earliest start of an n-gram stays: setdefault, or a reversed build when empty)."""
        old = state.length
        for n, table in state.index.items():
            first, last = max(0, old - n), num_real - 1 - n
            if last < first:
                continue
            window = tokens[first : last + n]
            grams = list(zip(*(window[i : len(window) - n + 1 + i] for i in range(n))))
            if not table:
                table.update(zip(reversed(grams), range(last, first - 1, -1)))
            else:
                for p, gram in enumerate(grams, first):
                    table.setdefault(gram, p)
        state.length = num_real

    def propose(self, request, num_real: int, max_drafts: int) -> list[int]:
        """Up to min(k, max_drafts) drafts following the first num_real tokens of the request
        (see the module docstring); [] when nothing matches or max_drafts < 1."""
        limit = min(self.k, max_drafts)
        if limit < 1 or num_real < 2:
            return []
        state = self._state(request, num_real)
        tokens = request.token_ids
        for n in self.sizes:
            if n >= num_real:
                continue
            p = state.index[n].get(tuple(tokens[num_real - n : num_real]))
            if p is not None and p + n < num_real:  # never the suffix itself
                return list(tokens[p + n : min(p + n + limit, num_real)])
        return []

    def forget(self, request_id: str) -> None:
        """Drop a finished request's index."""
        self._states.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._states)
