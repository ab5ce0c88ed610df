"""Speculative-decoding counters, per request and per engine (vLLM's spec-decode metrics).

- num_drafts: verification steps of a request that carried at least one scheduled draft;
- num_draft_tokens: drafts scheduled (and so verified);
- num_accepted_tokens: drafts accepted (the bonus token is not counted);
- accepted_per_pos[i]: drafts accepted at draft position i (0-based), so the acceptance rate
  at position i is accepted_per_pos[i] / drafts_per_pos[i].
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    drafts_per_pos: list[int] = field(default_factory=list)
    accepted_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's verification: num_draft_tokens drafts, the first num_accepted taken."""
        if num_draft_tokens < 1:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        grow = num_draft_tokens - len(self.drafts_per_pos)
        if grow > 0:
            self.drafts_per_pos.extend([0] * grow)
            self.accepted_per_pos.extend([0] * grow)
        for i in range(num_draft_tokens):
            self.drafts_per_pos[i] += 1
            if i < num_accepted:
                self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over verified drafts (0.0 before any)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_pos, self.drafts_per_pos)]

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verification step: 1 (the bonus) + accepted drafts per draft step."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
