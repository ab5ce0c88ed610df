"""SchedulerConfig: the one token budget and the policies that spend it. Validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

POLICIES = ("fcfs", "priority")
PREEMPTION_MODES = ("recompute", "swap")


def _check(cond: bool, name: str, bound: str, value: object) -> None:
    if not cond:
        raise ValueError(f"SchedulerConfig.{name} must be {bound}, got {value!r}")


def _is_count(value: object, low: int) -> bool:
    """An int (not a bool: True is an int to isinstance) >= low."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one scheduling step (names as vLLM's).

    - max_num_batched_tokens: the token budget of one step (all requests together).
    - max_num_seqs: most requests in one step (and in the running set).
    - enable_chunked_prefill: a prompt may be split over several steps. When off, a prompt is
      scheduled whole or not at all, and a prompt longer than the budget is refused on add.
    - long_prefill_token_threshold: at most this many tokens of one request per step while it is
      prefilling (0 = no cap), so long prompts do not starve decodes.
    - policy: "fcfs" (arrival order) or "priority" (lower `priority` value first, then arrival).
    - preemption_mode: "recompute" (drop blocks, recompute later) or "swap" (copy blocks to host
      memory and keep num_computed_tokens).
    - max_model_len: most tokens (prompt + output) of one request; None = no limit but the pool.
    """

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    preemption_mode: str = "recompute"
    max_model_len: Optional[int] = None

    def __post_init__(self) -> None:
        _check(
            _is_count(self.max_num_batched_tokens, 1),
            "max_num_batched_tokens",
            ">= 1",
            self.max_num_batched_tokens,
        )
        _check(
            _is_count(self.max_num_seqs, 1),
            "max_num_seqs",
            ">= 1",
            self.max_num_seqs,
        )
        _check(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "max_num_batched_tokens",
            f">= max_num_seqs ({self.max_num_seqs}) so every running request can decode in one step",
            self.max_num_batched_tokens,
        )
        _check(
            _is_count(self.long_prefill_token_threshold, 0),
            "long_prefill_token_threshold",
            ">= 0 (0 = off)",
            self.long_prefill_token_threshold,
        )
        _check(self.policy in POLICIES, "policy", f"one of {POLICIES}", self.policy)
        _check(
            self.preemption_mode in PREEMPTION_MODES,
            "preemption_mode",
            f"one of {PREEMPTION_MODES}",
            self.preemption_mode,
        )
        _check(
            self.max_model_len is None or _is_count(self.max_model_len, 2),
            "max_model_len",
            "None or >= 2",
            self.max_model_len,
        )
