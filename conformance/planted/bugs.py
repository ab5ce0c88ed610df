"""Planted bugs: the reference implementation with one defect each (a mutation test of the suite).

Each bug is a small subclass of one reference part plus an Implementation subclass pointing at
it, exported as an instance in UPPER_CASE, so `pytest conformance
--impl=conformance.planted.bugs:HEAD_FIRST_FREE` runs the suite against it. `test_meta.py`
asserts the suite fails on every one of them (and passes on the unmodified reference).

The reference is reached through `spec.load_impl`, like any outside user of enginespec would.
The defects use the reference's internal attributes (free_queue, cached, _running ...): they
are deliberately tied to it.
"""

from __future__ import annotations

from enginespec.spec import SchedulerOutput, Status, hash_block, load_impl

_REFERENCE = load_impl("reference")
ReferenceImpl = type(_REFERENCE)
RefBlockManager = _REFERENCE.block_manager_cls
RefScheduler = _REFERENCE.scheduler_cls


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------- block manager bugs


class OneTokenLeftDroppedBM(RefBlockManager):
    """Matches every full block, even the one holding the last token (nothing left to compute)."""

    def find_cached_prefix(self, request):
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None:
            return []
        self._extend_hashes(request)
        found = []
        for h in request.block_hashes[: request.num_tokens // self.block_size]:
            if h not in self.cached:
                break
            found.append(self.cached[h])
        return found


class MatchPastMissBM(RefBlockManager):
    """Skips a missing block and keeps matching the rest of the chain."""

    def find_cached_prefix(self, request):
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None:
            return []
        self._extend_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        return [self.cached[h] for h in request.block_hashes[:max_blocks] if h in self.cached]


class HalfDoneAllocationBM(RefBlockManager):
    """On failure, keeps the blocks it managed to take (not all-or-nothing)."""

    def allocate_slots(self, request, num_new_tokens, cached_blocks=()):
        if super().allocate_slots(request, num_new_tokens, cached_blocks):
            return True
        table = self.tables.setdefault(request.request_id, [])
        self.cursors.setdefault(request.request_id, 0)
        for b in cached_blocks:
            if self.ref_counts[b] == 0 and b in self.free_queue:
                self.free_queue.remove(b)
            self.ref_counts[b] += 1
            table.append(b)
        while self.free_queue:
            table.append(self._pop_free())
        if not table:
            del self.tables[request.request_id]
        return False


class RevivedCachedBlocksFreeBM(RefBlockManager):
    """Adopting a cached block from the free queue is not counted against the free slots (so a
    'granted' allocation can run out of blocks half-way)."""

    def allocate_slots(self, request, num_new_tokens, cached_blocks=()):
        table = self.tables.get(request.request_id, [])
        required = _cdiv(
            request.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens,
            self.block_size,
        )
        num_new = max(0, required - len(table) - len(cached_blocks))
        if num_new > len(self.free_queue):
            return False
        for b in cached_blocks:
            if self.ref_counts[b] == 0:
                self.free_queue.remove(b)
            self.ref_counts[b] += 1
            table.append(b)
        for _ in range(num_new):
            table.append(self._pop_free())  # IndexError when revived blocks took the last slots
        if table:
            self.tables[request.request_id] = table
            self.cursors.setdefault(request.request_id, 0)
        return True


class HeadFirstFreeBM(RefBlockManager):
    """Frees a request's blocks head first, so shared prefixes are evicted before their tails."""

    def _release(self, blocks):
        for b in blocks:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue.append(b)


class NoEvictionBM(RefBlockManager):
    """Hands a block out without dropping its hash: the cache then serves overwritten KV."""

    def _pop_free(self):
        block = self.free_queue.pop(0)
        self.ref_counts[block] = 1
        return block


class HashIgnoresParentBM(RefBlockManager):
    """Hashes each block on its own tokens only: equal blocks at different depths collide."""

    def _extend_hashes(self, request):
        bs, done = self.block_size, len(request.block_hashes)
        for i in range(done, request.num_tokens // bs):
            request.block_hashes.append(
                hash_block(None, request.token_ids[i * bs : (i + 1) * bs], request.cache_key)
            )


class HashIgnoresCacheKeyBM(RefBlockManager):
    """Leaves the cache_key out of the hash: one tenant can hit another's cache."""

    def _extend_hashes(self, request):
        bs, done = self.block_size, len(request.block_hashes)
        parent = request.block_hashes[-1] if done else None
        for i in range(done, request.num_tokens // bs):
            parent = hash_block(parent, request.token_ids[i * bs : (i + 1) * bs], ())
            request.block_hashes.append(parent)


# --------------------------------------------------------------------------- scheduler bugs


class AbortLeaksBlockScheduler(RefScheduler):
    """abort() drops the request's table without releasing its blocks."""

    def abort(self, request_id):
        if request_id in self.requests:
            self.block_manager.tables.pop(request_id, None)
        return super().abort(request_id)


class StaleComputedScheduler(RefScheduler):
    """Recompute preemption keeps num_computed_tokens (the dropped KV is treated as still there)."""

    def _preempt(self, victim, out):
        computed = victim.num_computed_tokens
        super()._preempt(victim, out)
        victim.num_computed_tokens = computed


class AdmitAfterPreemptScheduler(RefScheduler):
    """Admits swapped and waiting requests even in a step that preempted."""

    def schedule(self):
        out = SchedulerOutput(finished=self._finished_ids)
        self._finished_ids = []
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        budget = self._schedule_swapped(out, budget)
        self._schedule_waiting(out, budget)
        return out


class BudgetOverrunScheduler(RefScheduler):
    """Spends one token more than max_num_batched_tokens per step."""

    def schedule(self):
        out = SchedulerOutput(finished=self._finished_ids)
        self._finished_ids = []
        budget = self._schedule_running(out, self.config.max_num_batched_tokens + 1)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)
            self._schedule_waiting(out, budget)
        return out


class WrongVictimScheduler(RefScheduler):
    """On allocation failure preempts the FIRST running request (the oldest / highest priority,
    possibly already scheduled this step) instead of the last one."""

    def _schedule_running(self, out, budget):
        i = 0
        while i < len(self._running) and budget > 0:
            r = self._running[i]
            n = self._cap(r, r.num_computed_tokens, r.num_tokens_with_spec - r.num_computed_tokens, budget)
            preempted_self = False
            while not self.block_manager.allocate_slots(r, n):
                victim = self._running.pop(0 if self._running[0] is not r else -1)
                self._preempt(victim, out)
                if victim is r:
                    preempted_self = True
                    break
            if preempted_self:
                break
            out.scheduled.append((r, n))
            budget -= n
            self.block_manager.cache_full_blocks(r, r.num_computed_tokens + n)
            i = self._running.index(r) + 1
        return budget


class ThresholdIgnoredScheduler(RefScheduler):
    """Ignores long_prefill_token_threshold: long prompts take the whole budget."""

    def _cap(self, request, position, n, budget):
        return min(n, budget)


class MinTokensIgnoredScheduler(RefScheduler):
    """Lets a stop token or EOS end the request before min_tokens outputs."""

    def _stop_status(self, r, token):
        p = r.params
        if token in p.stop_token_ids:
            r.stop_reason = token
            return Status.FINISHED_STOPPED
        if not p.ignore_eos and r.eos_token_id is not None and token == r.eos_token_id:
            return Status.FINISHED_STOPPED
        return super()._stop_status(r, token)


class ThresholdCapsDecodesScheduler(RefScheduler):
    """Applies long_prefill_token_threshold to every chunk, a decode's draft tokens (and a
    re-admission's output tokens) included: the threshold is for prompt positions only."""

    def _cap(self, request, position, n, budget):
        cfg = self.config
        if cfg.enable_chunked_prefill and cfg.long_prefill_token_threshold > 0:
            n = min(n, cfg.long_prefill_token_threshold)
        return min(n, budget)


class RecomputeKeepsDraftsScheduler(RefScheduler):
    """Recompute preemption resets the victim's progress but keeps its spec_token_ids."""

    def _preempt(self, victim, out):
        drafts = list(victim.spec_token_ids)
        super()._preempt(victim, out)
        if victim.status == Status.PREEMPTED:
            victim.spec_token_ids = drafts


# --------------------------------------------------------------------------- implementations


def _planted(name: str, **parts):
    """An Implementation subclass of the reference with the given parts swapped in."""
    cls = type(f"Planted_{name}", (ReferenceImpl,), {"name": f"planted:{name}", **parts})
    return cls()


ONE_TOKEN_LEFT_DROPPED = _planted("ONE_TOKEN_LEFT_DROPPED", block_manager_cls=OneTokenLeftDroppedBM)
MATCH_PAST_MISS = _planted("MATCH_PAST_MISS", block_manager_cls=MatchPastMissBM)
HALF_DONE_ALLOCATION = _planted("HALF_DONE_ALLOCATION", block_manager_cls=HalfDoneAllocationBM)
REVIVED_CACHED_BLOCKS_FREE = _planted(
    "REVIVED_CACHED_BLOCKS_FREE", block_manager_cls=RevivedCachedBlocksFreeBM
)
HEAD_FIRST_FREE = _planted("HEAD_FIRST_FREE", block_manager_cls=HeadFirstFreeBM)
NO_EVICTION = _planted("NO_EVICTION", block_manager_cls=NoEvictionBM)
HASH_IGNORES_PARENT = _planted("HASH_IGNORES_PARENT", block_manager_cls=HashIgnoresParentBM)
HASH_IGNORES_CACHE_KEY = _planted("HASH_IGNORES_CACHE_KEY", block_manager_cls=HashIgnoresCacheKeyBM)
ABORT_LEAKS_BLOCK = _planted("ABORT_LEAKS_BLOCK", scheduler_cls=AbortLeaksBlockScheduler)
STALE_COMPUTED_AFTER_RECOMPUTE = _planted(
    "STALE_COMPUTED_AFTER_RECOMPUTE", scheduler_cls=StaleComputedScheduler
)
ADMIT_AFTER_PREEMPT = _planted("ADMIT_AFTER_PREEMPT", scheduler_cls=AdmitAfterPreemptScheduler)
BUDGET_OVERRUN = _planted("BUDGET_OVERRUN", scheduler_cls=BudgetOverrunScheduler)
WRONG_VICTIM = _planted("WRONG_VICTIM", scheduler_cls=WrongVictimScheduler)
THRESHOLD_IGNORED = _planted("THRESHOLD_IGNORED", scheduler_cls=ThresholdIgnoredScheduler)
MIN_TOKENS_IGNORED = _planted("MIN_TOKENS_IGNORED", scheduler_cls=MinTokensIgnoredScheduler)
THRESHOLD_CAPS_DECODES = _planted("THRESHOLD_CAPS_DECODES", scheduler_cls=ThresholdCapsDecodesScheduler)
RECOMPUTE_KEEPS_DRAFTS = _planted("RECOMPUTE_KEEPS_DRAFTS", scheduler_cls=RecomputeKeepsDraftsScheduler)

BUGS = sorted(
    name
    for name, value in globals().items()
    if isinstance(value, ReferenceImpl) and name.isupper() and not name.startswith("_")
)
