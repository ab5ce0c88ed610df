"""Drafter: the one small interface every drafter implements (n-gram, draft model, tests' oracles).

A drafter proposes tokens that follow the first `num_real` tokens of a running decode (all real
ids: the async placeholder is never passed). `SpecDecoder` calls `propose_batch` once per step
with every eligible request, so a drafter that runs a model batches them in one pass; the
per-request `propose` is the simple form a subclass may implement instead. Drafts must be a
deterministic function of what the drafter saw (verify.py's rejection rule treats the draft
distribution q as one-hot on the draft), never depend on the target's sampling draws.
"""

from __future__ import annotations

from typing import Optional, Sequence


class Drafter:
    """Base class: subclasses implement `propose` or `propose_batch` (each defaults to the other
    being defined), and may override `would_propose`, `first_to_propose` and `forget`."""

    def propose(self, request, num_real: int, max_drafts: int) -> list[int]:
        """At most max_drafts tokens following request.token_ids[:num_real]; [] for none."""
        return self.propose_batch([request], [num_real], [max_drafts])[0]

    def propose_batch(
        self, requests: Sequence, num_reals: Sequence[int], max_drafts: Sequence[int]
    ) -> list[list[int]]:
        """`propose` for each request, in order (one list per request, [] for none)."""
        return [self.propose(r, n, m) for r, n, m in zip(requests, num_reals, max_drafts)]

    def would_propose(self, request, num_real: int) -> bool:
        """Whether `propose(request, num_real, 1)` would give a draft (the async engine's
        lagged look-up: it waits for the step in flight only when this says yes)."""
        return bool(self.propose(request, num_real, 1))

    def first_to_propose(self, requests: Sequence, num_reals: Sequence[int]) -> Optional[int]:
        """The index of the first request that `would_propose` with its num_real tokens, or
        None (the async engine asks this of every decode waiting for its token each step)."""
        for i, (request, num_real) in enumerate(zip(requests, num_reals)):
            if self.would_propose(request, num_real):
                return i
        return None

    def forget(self, request_id: str) -> None:
        """Drop what the drafter keeps for a request (it finished, was aborted or preempted)."""
