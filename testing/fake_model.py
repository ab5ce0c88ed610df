"""A deterministic stand-in for the model, for control-plane tests (no tensors).

The next token of a request is a pure function of (seed, its token list), so the impl under test
and the reference, fed the same history, get the same samples, and a failing Hypothesis example
replays exactly. With probability about `eos_rate` the next token is the EOS id, so requests also
finish early, not only at max_tokens.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Sequence

from enginespec.spec import SchedulerOutput

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class FakeModel:
    """Deterministic next tokens in [0, vocab_size), EOS about once in 1/eos_rate draws."""

    vocab_size: int = 32
    eos_token_id: int = 0
    eos_rate: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        """The seed is hashed as a signed 64-bit int (next_token): one outside that range is
        a ValueError here, naming the bound, not a struct.error at the first step."""
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not INT64_MIN <= self.seed <= INT64_MAX
        ):
            raise ValueError(f"seed must be an int in [{INT64_MIN}, {INT64_MAX}], got {self.seed!r}")

    def next_token(self, token_ids: Sequence[int]) -> int:
        """The token that follows `token_ids` (a pure function of seed and the whole history)."""
        digest = hashlib.blake2b(
            struct.pack(f"<q{len(token_ids)}q", self.seed, *token_ids), digest_size=8
        ).digest()
        draw = int.from_bytes(digest, "little")
        if (draw % 10_000) < self.eos_rate * 10_000:
            return self.eos_token_id
        return (draw // 10_000) % self.vocab_size

    def sample(self, output: SchedulerOutput) -> dict[str, list[int]]:
        """Samples of one step, keyed by request id. Call BEFORE update_from_output: a request
        samples iff its scheduled tokens reach the end of its known tokens (a mid-prompt chunk
        samples nothing)."""
        sampled: dict[str, list[int]] = {}
        for request, n in output.scheduled:
            if request.num_computed_tokens + n >= request.num_tokens:
                sampled[request.request_id] = [self.next_token(request.token_ids)]
        return sampled
