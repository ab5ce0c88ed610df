"""The Scheduler protocol and its boundary objects (plain dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

from enginespec.spec.block_manager import BlockManager
from enginespec.spec.config import SchedulerConfig
from enginespec.spec.request import Request, Status


@dataclass
class SchedulerOutput:
    """What one step computes, and the KV moves the model runner does before it.

    - scheduled: (request, num_new_tokens) in batch order: running requests first, then newly
      admitted ones. The tokens are request.token_ids[num_computed : num_computed + n], where
      num_computed is the request's num_computed_tokens at schedule time (update_from_output
      advances it afterwards).
    - preempted: requests that lost their place this step (recompute or swap).
    - swap_out: (request_id, device block ids in logical order) to copy to host memory before
      the step; those blocks are already free in the pool.
    - swap_in: (request_id, device block ids in logical order) to fill from host memory before
      the step; they cover the request's computed tokens.
    - finished: ids of requests that finished or were aborted since the last schedule() (so the
      runner can drop per-request state, host swap copies included).
    """

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swap_out: list[tuple[str, list[int]]] = field(default_factory=list)
    swap_in: list[tuple[str, list[int]]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class UpdateOutput:
    """What update_from_output changed: tokens appended per request, and requests that finished
    in this update (their status says why, their stop_reason which token)."""

    new_token_ids: dict[str, list[int]] = field(default_factory=dict)
    finished: list[Request] = field(default_factory=list)


@runtime_checkable
class Scheduler(Protocol):
    """Spends one token budget per step over running and waiting requests.

    Invariants every step (conformance point 5): sum of scheduled tokens <= max_num_batched_tokens;
    len(scheduled) <= max_num_seqs; a prefilling request gets at most long_prefill_token_threshold
    tokens (when set); running requests come before newly admitted ones; on allocation failure the
    victim is the last running request (lowest priority); nobody is admitted (or swapped in) in a
    step that preempted; waiting requests are admitted in policy order. Liveness: every request
    that fits the pool alone finishes.
    """

    config: SchedulerConfig
    block_manager: BlockManager

    def add(self, request: Request) -> None:
        """Queue a request. ValueError (and nothing changes) for a duplicate id, a prompt +
        max_tokens over the pool or max_model_len (save a prompt of exactly max_model_len with
        max_tokens 1, whose one token needs no KV slot: vLLM's rule), or a prompt over the
        budget with chunked prefill off; the message names the bound and states its value and
        the request's count (spec/SCHEDULING.md, Scheduler.add)."""
        ...

    def schedule(self) -> SchedulerOutput: ...

    def update_from_output(self, output: SchedulerOutput, sampled: dict[str, list[int]]) -> UpdateOutput:
        """Advance num_computed_tokens by what was scheduled, append the sampled tokens of
        requests that reached the end of their known tokens, publish newly full blocks, apply the
        stop rules (stop ids, EOS unless ignore_eos, none before min_tokens; max_tokens;
        max_model_len), finish and free."""
        ...

    def abort(self, request_id: str) -> bool:
        """Finish the request as FINISHED_ABORTED from any state, freeing its blocks. False if unknown."""
        ...

    def finish(self, request: Request, status: Status) -> None:
        """Finish a request (e.g. a stop string matched by the engine) and free its blocks. A
        no-op for a finished request; one this scheduler does not hold (an unknown id, or
        another object under a held id) is a ValueError that changes nothing. A request
        finished between schedule() and update_from_output() is skipped by the update."""
        ...

    @property
    def has_unfinished(self) -> bool: ...

    @property
    def waiting(self) -> Sequence[Request]:
        """Waiting requests (preempted and swapped ones included) in the order they will be tried."""
        ...

    @property
    def running(self) -> Sequence[Request]:
        """Running requests in scheduling order (the last one is the next victim)."""
        ...
