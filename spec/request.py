"""The Request protocol: a request's whole state is its token list and num_computed_tokens."""

from __future__ import annotations

import enum
import numbers
import time
from typing import NamedTuple, Optional, Protocol, Sequence, runtime_checkable

from enginespec.spec.params import ALL_LOGPROBS, SamplingParams
from enginespec.spec.validation import check_cache_key, check_real, check_token_id, check_token_ids


class Status(enum.Enum):
    """Where a request is. WAITING and PREEMPTED wait in the queue (PREEMPTED was running and
    lost its blocks); SWAPPED waits with its KV in host memory; FINISHED_* are final."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "finished_stopped"  # stop token, EOS or stop string
    FINISHED_LENGTH = "finished_length"  # max_tokens or max_model_len
    FINISHED_ABORTED = "finished_aborted"  # abort()

    @property
    def is_finished(self) -> bool:
        return self in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH, Status.FINISHED_ABORTED)

    @property
    def finish_reason(self) -> Optional[str]:
        """vLLM's finish_reason strings: "stop", "length", "abort" (None while unfinished)."""
        return {
            Status.FINISHED_STOPPED: "stop",
            Status.FINISHED_LENGTH: "length",
            Status.FINISHED_ABORTED: "abort",
        }.get(self)


@runtime_checkable
class Request(Protocol):
    """One generation request. Each implementation has its own class, made by its Implementation.

    Invariants (checked by the conformance suite):
    - `token_ids == prompt_token_ids + output_token_ids`, `num_tokens == len(token_ids)`.
    - `0 <= num_cached_tokens <= num_computed_tokens <= num_tokens`.
    - The newest token is never computed while the request runs: after a decode step,
      `num_tokens == num_computed_tokens + 1` (the sampled token is the next step's input).
    - `block_hashes[i]` is `spec.hash_block` of full block i chained on block i-1, with
      `cache_key` as extra; it only grows (tokens are never removed). Exception: under the
      engine's async scheduling, the hash of a block hashed while holding a placeholder is
      dropped once the real token replaces it, and computed again (spec/SCHEDULING.md).
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


@runtime_checkable
class SupportsAsyncScheduling(Protocol):
    """Optional capability of a Request class: the engine's async scheduling appends a
    placeholder token (the id vocab_size) through update_from_output and fills in the sampled
    token a step later. An impl whose requests satisfy this Protocol supports it; the engine
    checks with isinstance(request, SupportsAsyncScheduling), and steps of other impls run
    serially."""

    def replace_last_token(self, token: int) -> None:
        """Overwrite the newest output token with `token` (validated by
        spec.validation.check_token_id). ValueError if there is no output token."""
        ...


class RequestArgs(NamedTuple):
    """Validated, normalised constructor arguments of a Request (see check_request_args)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_id: Optional[int]
    priority: int
    arrival_time: float
    cache_key: tuple


_DEFAULT_PARAMS = SamplingParams()


def check_request_args(
    request_id, prompt_token_ids, params=None, eos_token_id=None, priority=0, arrival_time=None, cache_key=()
) -> RequestArgs:
    """The input contract every Request class enforces, shared so that all impls refuse the
    same things with the same ValueErrors: a non-empty str id; a non-empty prompt of token ids
    (spec.validation.check_token_id; copied to a fresh list of plain ints); a SamplingParams or
    None (the defaults) whose max_tokens is an int (None, "up to max_model_len", is resolved
    by the engine on add, which knows the model's length) and whose logprobs and
    prompt_logprobs are not ALL_LOGPROBS (-1, "the whole vocabulary", resolved there too); an int priority; a cache_key as
    spec.validation.check_cache_key says; a finite real arrival_time (default
    time.monotonic())."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"Request.request_id must be a non-empty str, got {request_id!r}")
    prompt = check_token_ids("Request.prompt_token_ids", prompt_token_ids)
    if not prompt:
        raise ValueError("Request.prompt_token_ids must be non-empty, got []")
    params = _DEFAULT_PARAMS if params is None else params
    if not isinstance(params, SamplingParams):
        raise ValueError(f"Request.params must be a SamplingParams or None, got {type(params).__name__}")
    if params.max_tokens is None:
        raise ValueError(
            "Request.params.max_tokens must be an int: None (up to max_model_len) is resolved by "
            "the engine on add (EngineCore.add_request), got None"
        )
    for name in ("logprobs", "prompt_logprobs"):
        if getattr(params, name) == ALL_LOGPROBS:
            raise ValueError(
                f"Request.params.{name} must be None or >= 0: {ALL_LOGPROBS} (the whole vocabulary) "
                "is resolved by the engine on add (EngineCore.add_request), got -1"
            )
    if eos_token_id is not None:
        eos_token_id = check_token_id("Request.eos_token_id", eos_token_id)
    if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
        raise ValueError(f"Request.priority must be an int, got {priority!r}")
    cache_key = check_cache_key(cache_key)
    if arrival_time is None:
        arrival = time.monotonic()
    else:
        arrival = check_real("Request", "arrival_time", arrival_time)
    return RequestArgs(request_id, prompt, params, eos_token_id, int(priority), arrival, cache_key)
