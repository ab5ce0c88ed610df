"""The Request protocol: a request's whole state is its token list and num_computed_tokens."""
from __future__ import annotations

import enum
from typing import Optional, Protocol, Sequence, runtime_checkable

from .params import SamplingParams


class Status(enum.Enum):
    """Where a request is. WAITING and PREEMPTED wait in the queue (PREEMPTED was running and
    lost its blocks); SWAPPED waits with its KV in host memory; FINISHED_* are final."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "finished_stopped"      # stop token, EOS or stop string
    FINISHED_LENGTH = "finished_length"        # max_tokens or max_model_len
    FINISHED_ABORTED = "finished_aborted"      # abort()

    @property
    def is_finished(self) -> bool:
        return self in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH, Status.FINISHED_ABORTED)

    @property
    def finish_reason(self) -> Optional[str]:
        """vLLM's finish_reason strings: "stop", "length", "abort" (None while unfinished)."""
        return {Status.FINISHED_STOPPED: "stop", Status.FINISHED_LENGTH: "length",
                Status.FINISHED_ABORTED: "abort"}.get(self)


@runtime_checkable
class Request(Protocol):
    """One generation request. Each implementation has its own class, made by its Implementation.

    Invariants (checked by the conformance suite):
    - `token_ids == prompt_token_ids + output_token_ids`, `num_tokens == len(token_ids)`.
    - `0 <= num_cached_tokens <= num_computed_tokens <= num_tokens`.
    - The newest token is never computed while the request runs: after a decode step,
      `num_tokens == num_computed_tokens + 1` (the sampled token is the next step's input).
    - `block_hashes[i]` is `spec.hash_block` of full block i chained on block i-1, with
      `cache_key` as extra; it only grows (tokens are never removed).
    - An empty prompt is a ValueError at construction.
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    params: SamplingParams
    eos_token_id: Optional[int]
    priority: int
    arrival_time: float
    cache_key: tuple
    status: Status
    num_computed_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    spec_token_ids: list[int]
    block_hashes: list[bytes]
    swapped_out: bool
    stop_reason: object  # the stop token id or stop string, None otherwise

    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def output_token_ids(self) -> Sequence[int]: ...
    @property
    def num_tokens_with_spec(self) -> int: ...

    def append(self, token: int) -> None:
        """Append one sampled token to token_ids (and so to the output)."""
        ...
