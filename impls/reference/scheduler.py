"""The reference scheduler: SCHEDULING.md's scheduler sections, written as plain Python.

Queues `_waiting`, `_swapped` and `_running` are lists kept sorted by the policy key
(fcfs: (arrival_time, seq); priority: (priority, arrival_time, seq); seq counts add() calls), so
`_running[-1]` is always the next victim. `requests` maps the id of every unfinished request to it.
"""

from __future__ import annotations

import bisect
from typing import Optional

from enginespec.impls.reference.block_manager import cdiv
from enginespec.spec import (
    Request,
    SchedulerConfig,
    SchedulerOutput,
    Status,
    UpdateOutput,
    stop_after_token,
)
from enginespec.spec.admission import check_add


class Scheduler:
    """Spends one token budget per step: running requests first, then swapped, then waiting."""

    def __init__(self, config: SchedulerConfig, block_manager):
        if not isinstance(config, SchedulerConfig):
            raise ValueError(f"Scheduler.config must be a SchedulerConfig, got {type(config).__name__}")
        self.config = config
        self.block_manager = block_manager
        self.requests: dict[str, Request] = {}
        self._keys: dict[str, tuple] = {}
        self._num_added = 0
        self._waiting: list[Request] = []
        self._swapped: list[Request] = []
        self._running: list[Request] = []
        self._finished_ids: list[str] = []

    # ---- queues ----------------------------------------------------------------------------

    def _key(self, request: Request) -> tuple:
        return self._keys[request.request_id]

    def _insert(self, queue: list[Request], request: Request) -> None:
        """Insert keeping the queue sorted by policy key (keys are unique: seq breaks ties)."""
        bisect.insort(queue, request, key=self._key)

    @property
    def waiting(self) -> list[Request]:
        """Swapped requests first (they are tried first), then waiting ones, each in key order."""
        return self._swapped + self._waiting

    @property
    def running(self) -> list[Request]:
        return list(self._running)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # ---- add -------------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a request as WAITING; ValueError, with nothing changed, if it can never run.
        A prompt of exactly max_model_len is admitted with max_tokens 1 (vLLM's rule): its one
        token is sampled at the last prompt position and needs no KV slot, and the
        max_model_len stop ends it."""
        cfg, bm = self.config, self.block_manager
        assert request.params.max_tokens is not None  # a Request's is an int (check_request_args)
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already queued or running")
        check_add(request.num_prompt_tokens, request.params.max_tokens, cfg, bm.block_size, bm.num_blocks)
        seq = self._num_added
        self._num_added += 1
        if cfg.policy == "priority":
            self._keys[request.request_id] = (request.priority, request.arrival_time, seq)
        else:
            self._keys[request.request_id] = (request.arrival_time, seq)
        request.status = Status.WAITING
        self.requests[request.request_id] = request
        self._insert(self._waiting, request)

    # ---- schedule --------------------------------------------------------------------------

    def _cap(self, request: Request, position: int, n: int, budget: int) -> int:
        """Cap n by the long-prefill threshold (while `position` is inside the prompt) and budget."""
        cfg = self.config
        threshold = cfg.long_prefill_token_threshold if cfg.enable_chunked_prefill else 0
        if threshold > 0 and position < request.num_prompt_tokens:
            n = min(n, threshold)
        return min(n, budget)

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        """Preempt a request already popped from running: recompute drops its blocks and
        progress; swap lists its blocks to copy out and keeps its progress."""
        bm = self.block_manager
        if self.config.preemption_mode == "swap":
            out.swap_out.append((victim.request_id, bm.block_table(victim.request_id)))
            bm.free(victim)
            victim.status = Status.SWAPPED
            victim.swapped_out = True
            self._insert(self._swapped, victim)
        else:
            bm.free(victim)
            victim.num_computed_tokens = 0
            victim.num_cached_tokens = 0  # keeps num_cached <= num_computed; reset on admission
            victim.spec_token_ids = []
            victim.status = Status.PREEMPTED
            self._insert(self._waiting, victim)
        victim.num_preemptions += 1
        out.preempted.append(victim)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Phase 1: running requests in key order; preempt from the back on allocation failure."""
        i = 0
        while i < len(self._running) and budget > 0:
            r = self._running[i]
            n = self._cap(r, r.num_computed_tokens, r.num_tokens_with_spec - r.num_computed_tokens, budget)
            preempted_self = False
            while not self.block_manager.allocate_slots(r, n):
                victim = self._running.pop()
                self._preempt(victim, out)
                if victim is r:
                    preempted_self = True
                    break
            if preempted_self:
                break  # r was the last running request
            out.scheduled.append((r, n))
            budget -= n
            self.block_manager.cache_full_blocks(r, r.num_computed_tokens + n)
            i += 1
        return budget

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        """Phase 2: swap requests back in, in key order, while budget and seats last."""
        bm, cfg = self.block_manager, self.config
        while self._swapped and budget > 0 and len(self._running) < cfg.max_num_seqs:
            r = self._swapped[0]
            full = r.num_tokens - r.num_computed_tokens
            if not cfg.enable_chunked_prefill and full > budget:
                break
            n = self._cap(r, r.num_computed_tokens, full, budget)
            if not bm.allocate_slots(r, n):
                break
            self._swapped.pop(0)
            num_kept = cdiv(r.num_computed_tokens, bm.block_size)
            out.swap_in.append((r.request_id, bm.block_table(r.request_id)[:num_kept]))
            r.status = Status.RUNNING
            r.swapped_out = False
            self._insert(self._running, r)
            out.scheduled.append((r, n))
            budget -= n
            bm.cache_full_blocks(r, r.num_computed_tokens + n)
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Phase 3: admit waiting requests in key order, each after its cached prefix, none past
        a request still swapped whose key is better (it would wait behind later arrivals)."""
        bm, cfg = self.block_manager, self.config
        while self._waiting and budget > 0 and len(self._running) < cfg.max_num_seqs:
            r = self._waiting[0]
            if self._swapped and self._key(r) > self._key(self._swapped[0]):
                break  # nothing passes a swapped request of a better key
            cached = bm.find_cached_prefix(r)
            k = len(cached) * bm.block_size
            n = r.num_tokens - k
            if not cfg.enable_chunked_prefill and n > budget:
                break
            n = self._cap(r, k, n, budget)
            if not bm.allocate_slots(r, n, cached):
                break
            self._waiting.pop(0)
            r.num_computed_tokens = k
            r.num_cached_tokens = k
            r.status = Status.RUNNING
            self._insert(self._running, r)
            out.scheduled.append((r, n))
            budget -= n
            bm.cache_full_blocks(r, k + n)
        return budget

    def schedule(self) -> SchedulerOutput:
        """One step: running first; swapped and waiting only if nothing was preempted."""
        out = SchedulerOutput(finished=self._finished_ids)
        self._finished_ids = []
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)
            self._schedule_waiting(out, budget)
        return out

    # ---- update and finish -----------------------------------------------------------------

    def _stop_status(self, r: Request, token: int) -> Optional[Status]:
        """The stop rule (spec.stops, first match wins) the newest token fires, or None; sets
        `stop_reason` when a stop token id fires."""
        stop = stop_after_token(r, token, self.config.max_model_len)
        if stop is None:
            return None
        status, reason = stop
        if reason is not None:
            r.stop_reason = reason
        return status

    def update_from_output(self, output: SchedulerOutput, sampled: dict[str, list[int]]) -> UpdateOutput:
        """Advance each scheduled (unfinished) request by its n; a request that reached the end
        of its known tokens appends its samples (entry in new_token_ids, possibly empty) one at
        a time, stopping at the first stop rule that fires."""
        result = UpdateOutput()
        for r, n in output.scheduled:
            if r.status.is_finished:
                continue
            r.num_computed_tokens += n
            self.block_manager.cache_full_blocks(r)
            if r.num_computed_tokens < r.num_tokens:
                continue  # a mid-prompt chunk: nothing sampled
            appended = result.new_token_ids.setdefault(r.request_id, [])
            for token in sampled.get(r.request_id, []):
                r.append(token)
                appended.append(token)
                status = self._stop_status(r, token)
                if status is not None:
                    self.finish(r, status)
                    result.finished.append(r)
                    break
        return result

    def finish(self, request: Request, status: Status) -> None:
        """Finish a request from any state: leave its queue, free its blocks, report its id at
        the next schedule(). A no-op for a request that already finished."""
        if not status.is_finished:
            raise ValueError(f"finish: status must be a FINISHED_* status, got {status}")
        if request.status.is_finished:
            return
        if self.requests.get(request.request_id) is not request:
            raise ValueError(f"finish: request {request.request_id!r} is not in this scheduler")
        for queue in (self._running, self._waiting, self._swapped):
            if request in queue:
                queue.remove(request)
        self.block_manager.free(request)
        request.status = status
        del self.requests[request.request_id]
        del self._keys[request.request_id]
        self._finished_ids.append(request.request_id)

    def abort(self, request_id: str) -> bool:
        """Finish an unfinished request as FINISHED_ABORTED; False if the id is unknown."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        self.finish(request, Status.FINISHED_ABORTED)
        return True

    def __repr__(self) -> str:
        return (
            f"Scheduler(running={len(self._running)}, swapped={len(self._swapped)}, "
            f"waiting={len(self._waiting)})"
        )
