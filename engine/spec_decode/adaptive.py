"""Adaptive drafting: how many drafts each request may be given, from its recent verifications.

Speculation must not cost when it does not help. A step that carries drafts pays for them
whether they are accepted or not: d more query rows per drafted request, and the whole step
runs without a CUDA graph and without async overlap (decoder.py). So proposals follow what
verification has shown, per request:

- A request starts with k (num_speculative_tokens) drafts allowed.
- After a verification that accepted a of d drafts, 0 < a < d: a + 1 allowed next (one more
  than the run that was right). a = d: twice d, at most k (growing back).
- a = 0 (rejected outright; or the engine waited for its token and nothing was drafted) is a
  miss: the request gets no drafts until the next step that is a multiple of 2**min(j, 6),
  j its misses in a row, and then one draft (a cheap probe). An accepted draft resets j.

- A request the drafter found nothing for EMPTY_STREAK proposals in a row (its text does not
  repeat) is looked up only on multiples of EMPTY_PERIOD steps until it gets a draft: the
  look-up is the per-step host cost at batch 256 (benchmarks/spec_host_cost.py), and a
  repetition that starts later is found at most EMPTY_PERIOD - 1 steps late.

Re-probes are lined up on multiples of powers of two of one step clock (the decoder's count of
proposals), not on each request's own clock: requests whose drafts keep failing then probe
together in the same few steps, so at most about one step in 64 pays for their probes,
whatever the batch size. Requests scattered over their own clocks would put some probe in
almost every step at batch 256, each step then paying the no-graph, no-overlap cost.

Only WHICH drafts are proposed changes: verification, and so the output, is untouched.
"""

from __future__ import annotations

MAX_LEVEL = 6  # the longest wait between probes is 2**MAX_LEVEL steps
EMPTY_STREAK = 8  # empty proposals in a row before look-ups thin out
EMPTY_PERIOD = 4  # then one look-up per this many steps


class AdaptiveDrafting:
    """Per request id: [misses in a row, first step it may be drafted at, drafts allowed,
    empty proposals in a row]. A request absent from the table is in the default state
    [0, 0, k, 0]; a verification resets the empty count."""

    def __init__(self, num_speculative_tokens: int):
        self.k = num_speculative_tokens
        self._state: dict[str, list[int]] = {}

    def allowed(self, request_id: str, step: int) -> int:
        """Drafts the request may be given at `step` (0: backing off)."""
        state = self._state.get(request_id)
        if state is None:
            return self.k
        return state[2] if step >= state[1] else 0

    def observe(self, request_id: str, num_drafts: int, num_accepted: int, step: int) -> None:
        """A verification of num_drafts drafts at `step`, the first num_accepted taken."""
        if num_drafts < 1:
            return
        if num_accepted == 0:
            self.miss(request_id, step)
            return
        allowed = min(self.k, 2 * num_drafts if num_accepted == num_drafts else num_accepted + 1)
        if allowed == self.k:
            self._state.pop(request_id, None)  # back to the default state
        else:
            self._state[request_id] = [0, 0, allowed, 0]

    def miss(self, request_id: str, step: int) -> None:
        """Rejected outright at `step`: wait for the next multiple of the doubled period."""
        state = self._state.get(request_id)
        misses = (state[0] if state is not None else 0) + 1
        period = 1 << min(misses, MAX_LEVEL)
        self._state[request_id] = [misses, (step // period + 1) * period, 1, 0]

    def empty(self, request_id: str, step: int) -> None:
        """The drafter proposed nothing for the request at `step` (it was allowed some)."""
        state = self._state.get(request_id)
        if state is None:
            state = self._state[request_id] = [0, 0, self.k, 0]
        state[3] += 1
        if state[3] >= EMPTY_STREAK:
            state[1] = max(state[1], (step // EMPTY_PERIOD + 1) * EMPTY_PERIOD)

    def misses(self, request_id: str) -> int:
        """Misses in a row (0 for a request in the default state)."""
        state = self._state.get(request_id)
        return state[0] if state is not None else 0

    def forget(self, request_id: str) -> None:
        self._state.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._state)
