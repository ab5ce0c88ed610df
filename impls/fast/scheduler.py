"""FastScheduler: spec/SCHEDULING.md's decisions with incremental bookkeeping.

Same policy as every impl (running first in key order, preempt from the back, then swapped, then
waiting; no admission in a step that preempted). What makes it cheap:
- the three queues stay sorted by the policy key through bisect insertion and removal (the key
  lives on the request, `_key`), never re-sorted;
- unfinished requests are found by id in a dict; finishing removes from a queue by bisecting
  on the key (O(log n) search), not by scanning;
- the decode loop reads plain attributes and calls the block manager only when the request's
  mirrors (`_capacity`, `_publish_at`, kept by FastBlockManager) say a call can change
  something; the stop rules are one set lookup and one comparison per token.
The scheduler takes the fast impl's requests (it keeps `_key` and reads the stop-rule fields
FastRequest prepares); any spec.BlockManager works, FastBlockManager makes decodes cheap.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from operator import attrgetter
from typing import cast

from enginespec.impls.fast.request import FastRequest
from enginespec.spec import SchedulerConfig, SchedulerOutput, Status, UpdateOutput
from enginespec.spec.admission import check_add

_key_of = attrgetter("_key")
_RUNNING, _SWAPPED = Status.RUNNING, Status.SWAPPED
_PREEMPTED, _WAITING = Status.PREEMPTED, Status.WAITING
_STOPPED, _LENGTH = Status.FINISHED_STOPPED, Status.FINISHED_LENGTH


def _remove(queue: list, request) -> bool:
    """Remove `request` from a key-sorted queue; False if it is not there."""
    i = bisect_left(queue, request._key, key=_key_of)
    if i < len(queue) and queue[i] is request:
        del queue[i]
        return True
    return False


def _check_fast_request(request) -> None:
    """ValueError unless `request` is a FastRequest: the scheduler reads fields only it has
    (`_key`, `_num_prompt`, `_out_limit`, the block manager mirrors), so a request of another
    class would fail later, inside schedule(), as an AttributeError that fails the whole step."""
    if not isinstance(request, FastRequest):
        raise ValueError(
            f"FastScheduler.add: request_cls must be FastRequest (the fast scheduler reads its own "
            f"fields), got {type(request).__module__}.{type(request).__qualname__}: an impl that "
            f"keeps the fast scheduler keeps the fast impl's requests (any spec.BlockManager works "
            f"with them); one with its own requests needs its own scheduler or the reference's"
        )


class FastScheduler:
    """Spends one token budget per step: running requests first, then swapped, then waiting."""

    def __init__(self, config: SchedulerConfig, block_manager):
        if not isinstance(config, SchedulerConfig):
            raise ValueError(f"Scheduler.config must be a SchedulerConfig, got {type(config).__name__}")
        self.config = config
        self.block_manager = block_manager
        self.requests: dict[str, FastRequest] = {}
        self._num_added = 0
        self._waiting: list = []
        self._swapped: list = []
        self._running: list = []
        self._finished_ids: list[str] = []
        self._threshold = config.long_prefill_token_threshold if config.enable_chunked_prefill else 0
        self._swap = config.preemption_mode == "swap"
        self._priority = config.policy == "priority"

    # -- queues --------------------------------------------------------------------------------

    @property
    def waiting(self) -> list:
        """Swapped requests first (they are tried first), then waiting ones, each in key order."""
        return self._swapped + self._waiting

    @property
    def running(self) -> list:
        return list(self._running)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # -- add -----------------------------------------------------------------------------------

    def add(self, request) -> None:
        """Queue a request as WAITING; ValueError, with nothing changed, if it can never run.
        A prompt of exactly max_model_len is admitted with max_tokens 1 (vLLM's rule): its one
        token is sampled at the last prompt position and needs no KV slot, and the
        max_model_len stop ends it (its _out_limit is 0: any output finishes it)."""
        cfg, bm = self.config, self.block_manager
        _check_fast_request(request)
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already queued or running")
        check_add(request.num_prompt_tokens, request.params.max_tokens, cfg, bm.block_size, bm.num_blocks)
        seq = self._num_added
        self._num_added += 1
        if self._priority:
            request._key = (request.priority, request.arrival_time, seq)
        else:
            request._key = (request.arrival_time, seq)
        if cfg.max_model_len is not None:  # num_tokens >= max_model_len <=> outputs >= this
            request._out_limit = min(request.params.max_tokens, cfg.max_model_len - request.num_prompt_tokens)
        request.status = _WAITING
        self.requests[request.request_id] = request
        insort(self._waiting, request, key=_key_of)

    # -- schedule ------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """One step: running first; swapped and waiting only if nothing was preempted."""
        out = SchedulerOutput(finished=self._finished_ids)
        self._finished_ids = []
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            if self._swapped:
                budget = self._schedule_swapped(out, budget)
            if self._waiting:
                self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Phase 1: running requests in key order; preempt from the back on allocation failure.

        The block manager is called only when its mirrors on the request say the call can do
        something (FastBlockManager keeps `_capacity` / `_publish_at` current; with any other
        block manager they stay 0 and every call is made). Iterating the list directly is
        safe: preemption only pops from its end, which the loop then never reaches."""
        running = self._running
        bm = self.block_manager
        allocate, publish = bm.allocate_slots, bm.cache_full_blocks
        threshold = self._threshold
        scheduled = out.scheduled
        for r in running:
            if budget <= 0:
                break
            c = r.num_computed_tokens
            n = len(r.token_ids) + len(r.spec_token_ids) - c
            if threshold and c < r._num_prompt and n > threshold:
                n = threshold
            if n > budget:
                n = budget
            end = c + n
            if end > r._capacity or n < 0:
                if not allocate(r, n) and not self._make_room(r, n, out):
                    break  # r itself was preempted (it was the last running request)
            scheduled.append((r, n))
            budget -= n
            if end >= r._publish_at:
                publish(r, end)
        return budget

    def _make_room(self, request, n: int, out: SchedulerOutput) -> bool:
        """Preempt from the back of running until `request` gets its n slots (True), or until
        the victim is `request` itself (False)."""
        running, allocate = self._running, self.block_manager.allocate_slots
        while True:
            victim = running.pop()
            self._preempt(victim, out)
            if victim is request:
                return False
            if allocate(request, n):
                return True

    def _preempt(self, victim, out: SchedulerOutput) -> None:
        """Preempt a request already popped from running: recompute drops its blocks and
        progress; swap lists its blocks to copy out and keeps its progress."""
        bm = self.block_manager
        if self._swap:
            out.swap_out.append((victim.request_id, bm.block_table(victim.request_id)))
            bm.free(victim)
            victim.status = _SWAPPED
            victim.swapped_out = True
            insort(self._swapped, victim, key=_key_of)
        else:
            bm.free(victim)
            victim.num_computed_tokens = 0
            victim.num_cached_tokens = 0  # keeps num_cached <= num_computed
            victim.spec_token_ids = []
            victim.status = _PREEMPTED
            insort(self._waiting, victim, key=_key_of)
        victim.num_preemptions += 1
        out.preempted.append(victim)

    def _cap(self, request, position: int, n: int, budget: int) -> int:
        """Cap n by the long-prefill threshold (while `position` is inside the prompt) and budget."""
        if self._threshold and position < request._num_prompt and n > self._threshold:
            n = self._threshold
        return n if n < budget else budget

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        """Phase 2: swap requests back in, in key order, while budget and seats last."""
        bm, cfg = self.block_manager, self.config
        swapped, running = self._swapped, self._running
        while swapped and budget > 0 and len(running) < cfg.max_num_seqs:
            r = swapped[0]
            c = r.num_computed_tokens
            full = len(r.token_ids) - c
            if not cfg.enable_chunked_prefill and full > budget:
                break
            n = self._cap(r, c, full, budget)
            if not bm.allocate_slots(r, n):
                break
            del swapped[0]
            num_kept = -(-c // bm.block_size)
            out.swap_in.append((r.request_id, bm.block_table(r.request_id)[:num_kept]))
            r.swapped_out = False
            budget -= self._start_running(out, r, n, c)
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Phase 3: admit waiting requests in key order, each after its cached prefix, none past
        a request still swapped whose key is better (it would wait behind later arrivals)."""
        bm, cfg = self.block_manager, self.config
        waiting, running = self._waiting, self._running
        bs = bm.block_size
        swapped = self._swapped
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            r = waiting[0]
            if swapped and r._key > swapped[0]._key:
                break  # nothing passes a swapped request of a better key
            cached = bm.find_cached_prefix(r)
            k = len(cached) * bs
            n = len(r.token_ids) - k
            if not cfg.enable_chunked_prefill and n > budget:
                break
            n = self._cap(r, k, n, budget)
            if not bm.allocate_slots(r, n, cached):
                break
            del waiting[0]
            r.num_computed_tokens = k
            r.num_cached_tokens = k
            budget -= self._start_running(out, r, n, k)
        return budget

    def _start_running(self, out: SchedulerOutput, r, n: int, num_computed: int) -> int:
        """A swapped-in or admitted request joins running (in key order) with n tokens this
        step; its blocks that will be full after the step are published. Returns n."""
        r.status = _RUNNING
        insort(self._running, r, key=_key_of)
        out.scheduled.append((r, n))
        self.block_manager.cache_full_blocks(r, num_computed + n)
        return n

    # -- update and finish ---------------------------------------------------------------------

    def update_from_output(self, output: SchedulerOutput, sampled: dict) -> UpdateOutput:
        """Advance each scheduled (unfinished) request by its n; a request that reached the end
        of its known tokens appends its samples (entry in new_token_ids, possibly empty) one at
        a time, stopping at the first stop rule that fires."""
        result = UpdateOutput()
        new_token_ids, finished = result.new_token_ids, result.finished
        publish = self.block_manager.cache_full_blocks
        # The scheduler only ever schedules its own impl's requests (it reads their private
        # stop-rule fields below); the cast tells the type checker so.
        for r, n in cast("list[tuple[FastRequest, int]]", output.scheduled):
            if r.status is not _RUNNING and r.status.is_finished:
                continue
            c = r.num_computed_tokens + n
            r.num_computed_tokens = c
            rid = r.request_id
            if c >= r._publish_at:
                publish(r)
            token_ids = r.token_ids
            if c < len(token_ids):
                continue  # a mid-prompt chunk: nothing sampled
            appended = new_token_ids.setdefault(rid, [])
            output_ids = r._output
            for token in sampled.get(rid, ()):
                if type(token) is not int or token < 0:
                    r.append(token)  # converts a numpy int, or raises the ValueError
                    token = token_ids[-1]
                else:
                    token_ids.append(token)
                    output_ids.append(token)
                appended.append(token)
                # spec.stops.stop_after_token, inlined on precomputed sets (the differential
                # tests hold it equal to the reference): stop ids, EOS, then length.
                num_out = len(output_ids)
                if token in r._stoppers and num_out > r._min_tokens:
                    if token in r._stop_ids:
                        r.stop_reason = token
                    status = _STOPPED
                elif num_out >= r._out_limit:
                    status = _LENGTH
                else:
                    continue
                self.finish(r, status)
                finished.append(r)
                break
        return result

    def finish(self, request, status: Status) -> None:
        """Finish a request from any state: leave its queue, free its blocks, report its id at
        the next schedule(). A no-op for a request that already finished."""
        if not status.is_finished:
            raise ValueError(f"finish: status must be a FINISHED_* status, got {status}")
        if request.status.is_finished:
            return
        if request.request_id not in self.requests or self.requests[request.request_id] is not request:
            raise ValueError(f"finish: request {request.request_id!r} is not in this scheduler")
        self._leave_queue(request)
        self.block_manager.free(request)
        request.status = status
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)

    def _leave_queue(self, request) -> None:
        """Remove from the queue its status names (bisect on the key); scan all as a fallback."""
        status = request.status
        queue = (
            self._running if status is _RUNNING else self._swapped if status is _SWAPPED else self._waiting
        )
        if _remove(queue, request):
            return
        for queue in (self._running, self._waiting, self._swapped):
            if _remove(queue, request):
                return

    def abort(self, request_id: str) -> bool:
        """Finish an unfinished request as FINISHED_ABORTED; False if the id is unknown."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        self.finish(request, Status.FINISHED_ABORTED)
        return True

    def __repr__(self) -> str:
        return (
            f"FastScheduler(running={len(self._running)}, swapped={len(self._swapped)}, "
            f"waiting={len(self._waiting)})"
        )
