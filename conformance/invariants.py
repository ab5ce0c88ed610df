"""Checkers shared by the tests: pool invariants, request invariants, and the per-step scheduler
invariants, plus `Harness`, which drives one scheduler with the fake model and runs every check
at every step. Each checker raises AssertionError with a message naming the broken rule.

Everything here reads only the spec's observable surface (PoolState, Request attributes,
SchedulerOutput, Scheduler.running/waiting) so it judges any implementation the same way.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from enginespec.conformance.rules import spec_rule
from enginespec.spec import (
    PoolState,
    SchedulerConfig,
    SchedulerOutput,
    Status,
    UpdateOutput,
    hash_request_blocks,
)
from enginespec.testing.fake_model import FakeModel


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------- pool (point 1)


@spec_rule("pool-accounting")
def check_pool(state: PoolState, num_blocks: int) -> None:
    """Point 1: ref counts equal table occurrences, the free queue is exactly the unreferenced
    blocks (no repeats), and `cached` is the exact inverse of `block_hashes`."""
    assert len(state.ref_counts) == num_blocks, (
        f"ref_counts has {len(state.ref_counts)} entries, not {num_blocks}"
    )
    assert len(state.block_hashes) == num_blocks, "block_hashes must have one entry per block"
    counts = Counter(b for table in state.tables.values() for b in table)
    for rid, table in state.tables.items():
        assert table, f"empty table listed for {rid!r}"
        assert len(set(table)) == len(table), f"table of {rid!r} repeats a block: {table}"
        assert all(0 <= b < num_blocks for b in table), f"table of {rid!r} has an out-of-range block: {table}"
    for b in range(num_blocks):
        assert state.ref_counts[b] == counts[b], (
            f"block {b}: ref count {state.ref_counts[b]} but held by {counts[b]} tables (leak or double free)"
        )
    assert len(set(state.free_queue)) == len(state.free_queue), (
        f"free queue repeats a block: {state.free_queue}"
    )
    unreferenced = {b for b in range(num_blocks) if state.ref_counts[b] == 0}
    assert set(state.free_queue) == unreferenced, (
        f"free queue {sorted(state.free_queue)} != unreferenced blocks {sorted(unreferenced)}"
    )
    for h, b in state.cached.items():
        assert 0 <= b < num_blocks and state.block_hashes[b] == h, (
            f"cached maps a hash to block {b}, which holds another"
        )
    for b, h in enumerate(state.block_hashes):
        if h is not None:
            assert state.cached.get(h) == b, f"block {b} has a hash that `cached` does not map back to it"


@spec_rule("idle-pool")
def check_idle(state: PoolState, num_blocks: int) -> None:
    """Point 1, idle: with no unfinished request every block is free and no table is held."""
    assert not state.tables, f"idle pool still holds tables: {state.tables}"
    not_free = sorted(set(range(num_blocks)) - set(state.free_queue))
    refs = {b: n for b, n in enumerate(state.ref_counts) if n}
    assert not not_free and not refs, f"idle pool: blocks {not_free} are not free (ref counts {refs})"
    assert sorted(state.free_queue) == list(range(num_blocks)), f"idle pool: free queue {state.free_queue}"


def check_llm_idle(llm) -> None:
    """An `LLM` between calls: no request unfinished in its engine or scheduler, every block
    free (check_idle), and nothing left in its front end's mailboxes or owned ids (what an
    interrupted or closed call must release)."""
    engine = llm.engine
    assert not engine.has_unfinished and not engine.scheduler.has_unfinished
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    assert not llm._mail and not llm._owned


@spec_rule("no-caching")
def check_no_caching(state: PoolState) -> None:
    """With prefix caching off nothing is ever published."""
    assert not state.cached and all(h is None for h in state.block_hashes), (
        "caching is off but blocks were published"
    )


# --------------------------------------------------------------------------- requests


@spec_rule("request-invariants")
def check_request(r, block_size: int) -> None:
    """Request invariants: one token list, consistent counters, canonical hash chain."""
    output = list(r.output_token_ids)
    assert list(r.token_ids) == list(r.prompt_token_ids) + output, (
        f"{r.request_id}: token_ids != prompt + output"
    )
    for counter, tokens in (
        ("num_tokens", "token_ids"),
        ("num_prompt_tokens", "prompt_token_ids"),
        ("num_output_tokens", "output_token_ids"),
    ):
        value, length = getattr(r, counter), len(getattr(r, tokens))
        assert value == length, f"{r.request_id}: {counter} {value} != len({tokens}) {length}"
    assert 0 <= r.num_cached_tokens <= r.num_computed_tokens <= r.num_tokens, (
        f"{r.request_id}: need 0 <= cached ({r.num_cached_tokens}) <= computed ({r.num_computed_tokens}) "
        f"<= num_tokens ({r.num_tokens})"
    )
    chain = hash_request_blocks(r.token_ids, block_size, r.cache_key)
    assert list(r.block_hashes) == chain[: len(r.block_hashes)], (
        f"{r.request_id}: block_hashes is not the canonical chain"
    )


@spec_rule("hash-chain")
def check_table_hashes(state: PoolState, r, block_size: int) -> None:
    """Every block in the request's table is unpublished or published under exactly the canonical
    hash of that position of this request (a request never reads KV hashed for other content)."""
    chain = hash_request_blocks(r.token_ids, block_size, r.cache_key)
    for i, b in enumerate(state.tables.get(r.request_id, [])):
        h = state.block_hashes[b]
        if h is not None:
            assert i < len(chain) and h == chain[i], (
                f"{r.request_id}: block {b} at position {i} is published under a hash that is not its "
                f"canonical chain hash (parent or cache_key ignored?)"
            )


# --------------------------------------------------------------------------- scheduler snapshots


@dataclass(frozen=True)
class ReqSnap:
    status: Status
    num_computed: int
    num_tokens: int
    num_prompt: int
    num_preemptions: int
    output: tuple


@dataclass
class Snapshot:
    running: list[str]
    waiting: list[str]
    reqs: dict[str, ReqSnap]
    state: PoolState


def snapshot(sched, requests: dict) -> Snapshot:
    reqs = {
        rid: ReqSnap(
            r.status,
            r.num_computed_tokens,
            r.num_tokens,
            r.num_prompt_tokens,
            r.num_preemptions,
            tuple(r.output_token_ids),
        )
        for rid, r in requests.items()
    }
    return Snapshot(
        [r.request_id for r in sched.running],
        [r.request_id for r in sched.waiting],
        reqs,
        sched.block_manager.state(),
    )


@dataclass
class StepView:
    """One schedule() call: config, pool shape, state before, output, live requests and pool
    state right after it (before update_from_output)."""

    config: SchedulerConfig
    block_size: int
    pre: Snapshot
    out: SchedulerOutput
    requests: dict
    post: PoolState
    prefix_caching: bool = True
    keys: Optional[dict] = None  # policy key per request id, where the harness knows the add order

    @property
    def ids(self) -> list[str]:
        return [r.request_id for r, _ in self.out.scheduled]

    @property
    def admitted(self) -> list[str]:
        return [rid for rid in self.ids if rid not in self.pre.running]


# --------------------------------------------------------------------------- step invariants (point 5)


@spec_rule("step-limits")
def check_limits(v: StepView) -> None:
    """Budget, max_num_seqs, n >= 1, no request twice, never past the known tokens."""
    cfg = v.config
    assert v.out.num_scheduled_tokens <= cfg.max_num_batched_tokens, (
        f"budget overrun: {v.out.num_scheduled_tokens} tokens > max_num_batched_tokens {cfg.max_num_batched_tokens}"
    )
    assert len(v.out.scheduled) <= cfg.max_num_seqs, (
        f"{len(v.out.scheduled)} requests > max_num_seqs {cfg.max_num_seqs}"
    )
    assert len(set(v.ids)) == len(v.ids), f"a request is scheduled twice: {v.ids}"
    victims = {id(r) for r in v.out.preempted}  # scheduled, then preempted: check_order names the rule
    for r, n in v.out.scheduled:
        assert n >= 1, f"{r.request_id} scheduled with n={n}"
        assert r.num_computed_tokens + n <= r.num_tokens_with_spec, (
            f"{r.request_id}: computed {r.num_computed_tokens} + n {n} past its {r.num_tokens} known tokens"
        )
        assert r.status == Status.RUNNING or id(r) in victims, f"{r.request_id} scheduled but {r.status}"


@spec_rule("chunking")
def check_chunking(v: StepView) -> None:
    """Threshold caps a prefilling request's chunk; chunked prefill off schedules whole remainders.
    A running request whose chunk starts at or past its prompt's end (a decode and its drafts, a
    re-admission's output tokens) is cut by nothing but the budget, so a cut one spent it all."""
    cfg = v.config
    for r, n in v.out.scheduled:
        start = r.num_computed_tokens
        if cfg.enable_chunked_prefill:
            if cfg.long_prefill_token_threshold and start < r.num_prompt_tokens:
                assert n <= cfg.long_prefill_token_threshold, (
                    f"{r.request_id}: prefill chunk {n} > long_prefill_token_threshold {cfg.long_prefill_token_threshold}"
                )
            wanted = r.num_tokens_with_spec - start
            if r.request_id in v.pre.running and start >= r.num_prompt_tokens and n < wanted:
                assert v.out.num_scheduled_tokens == cfg.max_num_batched_tokens, (
                    f"{r.request_id}: {n} of its {wanted} tokens past the prompt scheduled "
                    f"({r.num_tokens - start} known + {len(r.spec_token_ids)} drafts) with budget left "
                    f"({v.out.num_scheduled_tokens} of {cfg.max_num_batched_tokens}): the threshold "
                    f"({cfg.long_prefill_token_threshold}) caps only chunks starting inside the prompt"
                )
        else:
            # Every known token at once; draft tokens (a decode's spec_token_ids) may be cut by the budget.
            assert r.num_tokens - start <= n <= r.num_tokens_with_spec - start, (
                f"{r.request_id}: chunked prefill is off but only {n} of {r.num_tokens - start} scheduled"
            )


@spec_rule("schedule-order")
def check_order(v: StepView) -> None:
    """Running first, as a prefix of the running queue; victims from its back; admitted requests
    are a prefix (in policy order) of the swapped and of the waiting queue; no waiting request is
    admitted past a request left swapped whose policy key is better (where the keys are known)."""
    ran = [rid for rid in v.ids if rid in v.pre.running]
    assert v.ids[: len(ran)] == ran, f"a newly admitted request precedes a running one: {v.ids}"
    assert ran == v.pre.running[: len(ran)], (
        f"running requests not served in queue order: {ran} vs {v.pre.running}"
    )
    pre_ids = [r.request_id for r in v.out.preempted]
    back = v.pre.running[::-1][: len(pre_ids)]
    assert pre_ids == back, (
        f"victims {pre_ids} are not the back of the running queue {v.pre.running} (expected {back}: "
        f"on allocation failure the victim is running[-1], the latest arrival or lowest priority, "
        f"never a request already scheduled in the step)"
    )
    assert not set(pre_ids) & set(v.ids), "a preempted request was scheduled in the same step"
    if pre_ids:
        assert not v.admitted and not v.out.swap_in, (
            f"admitted {v.admitted} in a step that preempted {pre_ids}"
        )
    swapped = [rid for rid in v.pre.waiting if v.pre.reqs[rid].status == Status.SWAPPED]
    waiting = [rid for rid in v.pre.waiting if v.pre.reqs[rid].status != Status.SWAPPED]
    got_swapped = [rid for rid in v.admitted if rid in swapped]
    got_waiting = [rid for rid in v.admitted if rid not in swapped]
    assert v.admitted == got_swapped + got_waiting, "a waiting request was admitted before a swapped one"
    assert got_swapped == swapped[: len(got_swapped)], f"swap-ins {got_swapped} skip ahead of {swapped}"
    assert got_waiting == waiting[: len(got_waiting)], (
        f"admissions {got_waiting} skip ahead of {waiting} (policy order)"
    )
    left = swapped[len(got_swapped) :]
    if v.keys is not None and left and got_waiting:
        assert v.keys[got_waiting[-1]] < v.keys[left[0]], (
            f"admitted {got_waiting[-1]} from waiting past {left[0]}, left swapped with a better policy key"
        )


@spec_rule("preemption")
def check_preempted(v: StepView) -> None:
    """Recompute resets progress; swap keeps it and lists the victim's blocks to copy out."""
    state = v.post
    swap = v.config.preemption_mode == "swap"
    for r in v.out.preempted:
        before = v.pre.reqs[r.request_id]
        assert r.num_preemptions == before.num_preemptions + 1, (
            f"{r.request_id}: num_preemptions not incremented"
        )
        assert r.request_id not in state.tables, f"preempted {r.request_id} still holds blocks"
        if swap:
            assert r.status == Status.SWAPPED and r.swapped_out, f"{r.request_id}: swap victim is {r.status}"
            assert r.num_computed_tokens == before.num_computed, (
                "swap preemption must keep num_computed_tokens"
            )
        else:
            assert r.status == Status.PREEMPTED, f"{r.request_id}: recompute victim is {r.status}"
            assert r.num_computed_tokens == 0, f"{r.request_id}: recompute victim kept num_computed_tokens"
            assert not r.spec_token_ids, (
                f"{r.request_id}: recompute victim kept its draft tokens {list(r.spec_token_ids)} "
                f"(recompute clears spec_token_ids with the progress)"
            )
    expected_out = (
        [(r.request_id, v.pre.state.tables.get(r.request_id, [])) for r in v.out.preempted] if swap else []
    )
    assert [(rid, list(b)) for rid, b in v.out.swap_out] == expected_out, (
        f"swap_out {v.out.swap_out} != victims' tables {expected_out}"
    )


@spec_rule("admission")
def check_admitted(v: StepView) -> None:
    """Admitted requests start after a whole-block cached prefix (none without caching or with
    prompt_logprobs, one token always left); swap-ins list the blocks covering their kept KV."""
    state, bs = v.post, v.block_size
    swap_in = []
    for rid in v.admitted:
        r, before = v.requests[rid], v.pre.reqs[rid]
        if before.status == Status.SWAPPED:
            assert r.num_computed_tokens == before.num_computed and not r.swapped_out, (
                f"{rid}: swapped in with computed={r.num_computed_tokens} (kept {before.num_computed}), "
                f"swapped_out={r.swapped_out}"
            )
            swap_in.append((rid, state.tables[rid][: cdiv(r.num_computed_tokens, bs)]))
            continue
        k = r.num_computed_tokens
        assert r.num_cached_tokens == k and k % bs == 0 and k <= r.num_tokens - 1, (
            f"{rid}: admitted with computed={k}, cached={r.num_cached_tokens} (bs={bs}, {r.num_tokens} tokens)"
        )
        if not v.prefix_caching or r.params.prompt_logprobs is not None:
            assert k == 0, f"{rid}: cached prefix used with caching off or prompt_logprobs set"
        chain = hash_request_blocks(r.token_ids, bs, r.cache_key)
        for i, b in enumerate(state.tables[rid][: k // bs]):
            assert state.block_hashes[b] == chain[i], f"{rid}: adopted block {b} is not cached under its hash"
    assert [(rid, list(b)) for rid, b in v.out.swap_in] == swap_in, f"swap_in {v.out.swap_in} != {swap_in}"


@spec_rule("tables-after-schedule")
def check_tables_after_schedule(v: StepView) -> None:
    """Each scheduled request's table covers exactly its computed + scheduled tokens, and every
    block that became full this step is published, unless its hash was already published by
    another block before the step (first writer wins; that writer may since have been evicted)."""
    state, bs = v.post, v.block_size
    for r, n in v.out.scheduled:
        table = state.tables.get(r.request_id, [])
        end = r.num_computed_tokens + n
        assert len(table) == cdiv(end, bs), f"{r.request_id}: {len(table)} blocks for {end} tokens (bs={bs})"
        if not v.prefix_caching:
            continue
        chain = hash_request_blocks(r.token_ids, bs, r.cache_key)
        for i in range(r.num_computed_tokens // bs, min(end, r.num_tokens) // bs):
            assert (
                state.block_hashes[table[i]] == chain[i]
                or chain[i] in state.cached
                or chain[i] in v.pre.state.cached
            ), f"{r.request_id}: block {i} became full this step but its hash is not published"


STEP_CHECKS = (
    check_limits,
    check_chunking,
    check_order,
    check_preempted,
    check_admitted,
    check_tables_after_schedule,
)


def check_schedule(v: StepView) -> None:
    for check in STEP_CHECKS:
        check(v)


# --------------------------------------------------------------------------- update invariants


def expected_stop(
    r_params,
    eos: Optional[int],
    max_model_len: Optional[int],
    prior_outputs: int,
    num_prompt: int,
    samples: list[int],
) -> tuple[list[int], Optional[Status], object]:
    """The spec's stop rules applied to `samples`: (tokens kept, final status or None, stop_reason)."""
    kept = []
    for token in samples:
        kept.append(token)
        num_out = prior_outputs + len(kept)
        if num_out > r_params.min_tokens and token in r_params.stop_token_ids:
            return kept, Status.FINISHED_STOPPED, token
        if num_out > r_params.min_tokens and not r_params.ignore_eos and eos is not None and token == eos:
            return kept, Status.FINISHED_STOPPED, None
        if num_out >= r_params.max_tokens or (
            max_model_len is not None and num_prompt + num_out >= max_model_len
        ):
            return kept, Status.FINISHED_LENGTH, None
    return kept, None, None


@spec_rule("update-and-stops")
def check_update(
    config: SchedulerConfig, pre: Snapshot, out: SchedulerOutput, sampled: dict, upd: UpdateOutput
) -> None:
    """Progress advanced by n, samples appended only at the end of known tokens, stop rules
    applied exactly, finished requests reported, the newest token left uncomputed."""
    finished = set()
    for r, n in out.scheduled:
        before = pre.reqs[r.request_id]
        assert r.num_computed_tokens == before.num_computed + n, (
            f"{r.request_id}: num_computed not advanced by {n}"
        )
        new = list(r.output_token_ids)[len(before.output) :]
        assert tuple(r.output_token_ids)[: len(before.output)] == before.output, (
            f"{r.request_id}: outputs rewritten"
        )
        if before.num_computed + n < before.num_tokens:
            assert not new and not r.status.is_finished, (
                f"{r.request_id}: mid-prompt chunk appended or finished"
            )
            continue
        kept, status, reason = expected_stop(
            r.params,
            r.eos_token_id,
            config.max_model_len,
            len(before.output),
            before.num_prompt,
            sampled.get(r.request_id, []),
        )
        assert new == kept, f"{r.request_id}: appended {new}, expected {kept} (stop rules)"
        assert list(upd.new_token_ids.get(r.request_id, [])) == kept, (
            f"{r.request_id}: new_token_ids != appended"
        )
        if status is None:
            assert r.status == Status.RUNNING, f"{r.request_id}: {r.status} but no stop rule fired"
            assert r.num_tokens == r.num_computed_tokens + 1, (
                f"{r.request_id}: newest token must stay uncomputed"
            )
        else:
            assert r.status == status, f"{r.request_id}: status {r.status}, stop rules say {status}"
            if reason is not None:
                assert r.stop_reason == reason, f"{r.request_id}: stop_reason {r.stop_reason!r} != {reason!r}"
            finished.add(r.request_id)
    assert {r.request_id for r in upd.finished} == finished, f"UpdateOutput.finished != {finished}"


# --------------------------------------------------------------------------- whole-scheduler checks


@spec_rule("queues")
def check_scheduler(sched, live: dict, key: dict, block_size: int, prefix_caching: bool) -> None:
    """Pool invariants, request invariants, queue contents and order, tables per status."""
    state = sched.block_manager.state()
    check_pool(state, sched.block_manager.num_blocks)
    if not prefix_caching:
        check_no_caching(state)
    running = [r.request_id for r in sched.running]
    waiting = [r.request_id for r in sched.waiting]
    assert sorted(running + waiting) == sorted(live), (
        f"queues {running} + {waiting} != unfinished {sorted(live)}"
    )
    assert len(running) <= sched.config.max_num_seqs, "running set larger than max_num_seqs"
    assert running == sorted(running, key=key.__getitem__), f"running queue out of policy order: {running}"
    swapped = [rid for rid in waiting if live[rid].status == Status.SWAPPED]
    assert waiting[: len(swapped)] == swapped, "swapped requests must be tried (listed) first"
    rest = waiting[len(swapped) :]
    assert swapped == sorted(swapped, key=key.__getitem__) and rest == sorted(rest, key=key.__getitem__), (
        f"waiting queue out of policy order: {waiting}"
    )
    held_elsewhere = [rid for rid in state.tables if rid not in running]
    assert not held_elsewhere, "non-running requests hold blocks: " + ", ".join(
        f"{rid!r} ({live[rid].status.value if rid in live else 'finished'}) holds {state.tables[rid]}"
        for rid in held_elsewhere
    )
    for rid, r in live.items():
        check_request(r, block_size)
        if rid in running:
            assert r.status == Status.RUNNING, f"{rid} in running but {r.status}"
            assert len(state.tables.get(rid, [])) == cdiv(r.num_computed_tokens, block_size), (
                f"{rid}: table does not cover exactly its {r.num_computed_tokens} computed tokens"
            )
            check_table_hashes(state, r, block_size)
        else:
            assert r.status in (Status.WAITING, Status.PREEMPTED, Status.SWAPPED), (
                f"{rid} waiting but {r.status}"
            )
    assert sched.has_unfinished == bool(live), (
        f"has_unfinished is {sched.has_unfinished} with unfinished {sorted(live)}"
    )
    if not live:
        check_idle(state, sched.block_manager.num_blocks)


# --------------------------------------------------------------------------- abort / finish


@spec_rule("abort")
def check_abort_result(request_id: str, known: bool, before: Optional[Status]) -> None:
    """abort(id) returns True exactly for an unfinished request (`before`: its status, None
    when the id is finished or unknown)."""
    if before is not None:
        assert known is True, (
            f"abort({request_id!r}) returned {known!r} for an unfinished ({before.value}) request"
        )
    else:
        assert known is False, f"abort({request_id!r}) returned {known!r} for a finished or unknown id"


@spec_rule("abort")
def check_released(call: str, r, before: Status, status: Status, state: PoolState) -> None:
    """After abort / finish from any state the request is in `status` and holds no block: its
    blocks must go back to the pool at once, not at the next step (a leak starves others)."""
    rid = r.request_id
    assert r.status == status, (
        f"{call}: request {rid!r} ({before.value}) is {r.status.value}, not {status.value}"
    )
    held = state.tables.get(rid)
    assert not held, (
        f"{call}: request {rid!r} ({before.value}, now {r.status.value}) still holds blocks {held}"
    )


# --------------------------------------------------------------------------- harness


@dataclass
class StepResult:
    """What one step decided, in impl-independent terms (compared in lockstep)."""

    scheduled: list
    preempted: list
    swap_out: list
    swap_in: list
    finished: list
    new_token_ids: dict
    update_finished: list

    @classmethod
    def of(cls, out: SchedulerOutput, upd: UpdateOutput) -> "StepResult":
        return cls(
            [(r.request_id, n) for r, n in out.scheduled],
            [r.request_id for r in out.preempted],
            [(rid, list(b)) for rid, b in out.swap_out],
            [(rid, list(b)) for rid, b in out.swap_in],
            sorted(out.finished),
            {k: list(v) for k, v in upd.new_token_ids.items() if v},
            sorted(r.request_id for r in upd.finished),
        )


def verify_drafts(out: SchedulerOutput, model) -> tuple[SchedulerOutput, dict]:
    """The engine's verification of draft tokens (engine/spec_decode) with the fake model as the
    target, greedy: a request with d scheduled drafts D keeps the longest prefix D[:a] that the
    model itself would produce, then the model's next token. The step is cut back to
    known + a tokens (drafts cleared), so update_from_output sees the accepted drafts as
    computed and appends D[:a] + [next]; the caller gives the rejected drafts' slots back
    (trim). Returns (cut output, samples); requests without scheduled drafts are unchanged."""
    scheduled, sampled = [], {}
    for r, n in out.scheduled:
        known = r.num_tokens - r.num_computed_tokens
        drafts = list(r.spec_token_ids[: max(0, n - known)])
        if r.spec_token_ids:
            r.spec_token_ids = []
        if r.num_computed_tokens + n < r.num_tokens:
            scheduled.append((r, n))  # a mid-prompt chunk: nothing sampled
            continue
        history, accepted = list(r.token_ids), []
        for d in drafts:
            if model.next_token(history) != d:
                break
            history.append(d)
            accepted.append(d)
        scheduled.append((r, known + len(accepted)))
        sampled[r.request_id] = accepted + [model.next_token(history)]
    return dataclasses.replace(out, scheduled=scheduled), sampled


@dataclass
class Harness:
    """Drives one impl's scheduler with the fake model; checks every invariant at every step."""

    impl: object
    config: SchedulerConfig
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    model: FakeModel = field(default_factory=FakeModel)

    @classmethod
    def for_scenario(cls, impl, scn, **overrides) -> "Harness":
        """A harness over the scenario's config (with overrides). Swap preemption is optional
        (capability "swap"): impls without it are tested with recompute instead."""
        config = dataclasses.replace(scn.config, **overrides) if overrides else scn.config
        if config.preemption_mode == "swap" and "swap" not in getattr(impl, "capabilities", frozenset()):
            config = dataclasses.replace(config, preemption_mode="recompute")
        return cls(impl, config, scn.num_blocks, scn.block_size, scn.enable_prefix_caching)

    def __post_init__(self):
        self.bm = self.impl.new_block_manager(self.num_blocks, self.block_size, self.enable_prefix_caching)
        self.sched = self.impl.new_scheduler(self.config, self.bm)
        assert self.sched.block_manager is self.bm and self.sched.config == self.config, (
            "the scheduler must keep its BlockManager as .block_manager and its config as .config"
        )
        self.live: dict = {}  # unfinished requests by id
        self.all: dict = {}  # every request ever added
        self.key: dict = {}  # policy key per id (the harness knows the add order)
        self.num_added = 0  # add() calls that succeeded: the keys' seq (an id may come back)
        self.finished_since: list[str] = []
        self.num_steps = 0

    def add(self, spec) -> None:
        """Build and add a request (ValueError propagates: nothing was added)."""
        r = spec.build(self.impl)
        self.sched.add(r)
        seq = self.num_added
        self.num_added += 1
        self.key[r.request_id] = (
            (r.priority, r.arrival_time, seq) if self.config.policy == "priority" else (r.arrival_time, seq)
        )
        self.live[r.request_id] = self.all[r.request_id] = r
        self.check()

    def abort(self, request_id: str) -> bool:
        r = self.live.get(request_id)
        before = r.status if r is not None else None
        known = self.sched.abort(request_id)
        check_abort_result(request_id, known, before)
        if known:
            self.live.pop(request_id)
            check_released(f"abort({request_id!r})", r, before, Status.FINISHED_ABORTED, self.bm.state())
            self.finished_since.append(request_id)
        self.check()
        return known

    def finish(self, request_id: str, status: Status) -> None:
        """What the engine does when a stop string matches: finish a live request."""
        r = self.live.pop(request_id)
        before = r.status
        self.sched.finish(r, status)
        check_released(f"finish({request_id!r})", r, before, status, self.bm.state())
        self.finished_since.append(request_id)
        self.check()

    def step(self) -> StepResult:
        pre = snapshot(self.sched, self.live)
        out = self.sched.schedule()
        assert sorted(out.finished) == sorted(self.finished_since), (
            f"SchedulerOutput.finished {out.finished} != finished since last step {self.finished_since}"
        )
        self.finished_since = []
        view = StepView(
            self.config,
            self.block_size,
            pre,
            out,
            self.live,
            self.bm.state(),
            self.enable_prefix_caching,
            self.key,
        )
        check_schedule(view)
        check_pool(view.post, self.num_blocks)
        verified, sampled = verify_drafts(out, self.model)
        pre_update = snapshot(self.sched, self.live)
        upd = self.sched.update_from_output(verified, sampled)
        check_update(self.config, pre_update, verified, sampled, upd)
        for r in upd.finished:
            self.live.pop(r.request_id, None)
            self.finished_since.append(r.request_id)
        for (r, n), (_, kept) in zip(out.scheduled, verified.scheduled):
            if kept < n and not r.status.is_finished:  # give back the rejected drafts' slots
                self.bm.trim(r, r.num_computed_tokens)
        self.num_steps += 1
        self.check()
        return StepResult.of(out, upd)

    def propose(self, request_id: str, draft_token_ids) -> None:
        """What a drafter does before schedule(): give a running request draft tokens."""
        self.live[request_id].spec_token_ids = list(draft_token_ids)

    def check(self) -> None:
        check_scheduler(self.sched, self.live, self.key, self.block_size, self.enable_prefix_caching)

    def run_to_completion(self, max_steps: int) -> int:
        """Step until idle; liveness: at most max_steps steps, never two empty steps in a row."""
        empty_in_row = 0
        while self.sched.has_unfinished:
            assert self.num_steps < max_steps, f"not finished after {max_steps} steps (livelock?)"
            result = self.step()
            empty_in_row = 0 if result.scheduled else empty_in_row + 1
            assert empty_in_row < 2, "two steps in a row scheduled nothing while requests are unfinished"
        return self.num_steps


def step_bound(specs) -> int:
    """A generous step bound for liveness: every request that fits finishes within it."""
    total = sum(len(s.prompt_token_ids) + s.params.max_tokens for s in specs)
    return (len(specs) + 1) * (total + 2) + 2


# --------------------------------------------------------------------------- pool transitions (points 2, 3, 4)


def expected_prefix(state: PoolState, r, block_size: int, prefix_caching: bool) -> list[int]:
    """Point 3 from the observable state: the cached blocks of the longest run of the request's
    canonical chain from block 0, stopping at the first miss, leaving the last token uncovered;
    [] with caching off or prompt_logprobs set."""
    if not prefix_caching or r.params.prompt_logprobs is not None:
        return []
    chain = hash_request_blocks(r.token_ids, block_size, r.cache_key)
    found = []
    for h in chain[: (r.num_tokens - 1) // block_size]:
        if h not in state.cached:
            break
        found.append(state.cached[h])
    return found


@spec_rule("allocate-slots")
def check_allocate(
    before: PoolState,
    after: PoolState,
    ok: bool,
    rid: str,
    num_computed: int,
    num_new_tokens: int,
    cached: list[int],
    block_size: int,
) -> None:
    """Points 2 and 4 for one allocate_slots call: feasibility exactly as specified (adopting a
    free cached block costs a free slot); refused => state identical; granted => cached blocks
    adopted, then new blocks popped from the FRONT of the free queue, each losing its hash."""
    table = before.tables.get(rid, [])
    required = cdiv(num_computed + len(cached) * block_size + num_new_tokens, block_size)
    num_new = max(0, required - len(table) - len(cached))
    revived = [b for b in cached if before.ref_counts[b] == 0]
    feasible = num_new + len(revived) <= len(before.free_queue)
    assert ok == feasible, (
        f"allocate_slots returned {ok} but {num_new} new + {len(revived)} revived vs {len(before.free_queue)} free"
    )
    if not ok:
        assert after == before, "a refused allocation changed the pool state"
        return
    rest = [b for b in before.free_queue if b not in revived]
    popped = rest[:num_new]
    assert after.tables.get(rid, []) == table + list(cached) + popped, (
        f"new table {after.tables.get(rid)} != old {table} + cached {cached} + front of free queue {popped}"
    )
    assert after.free_queue == rest[num_new:], "allocation must take blocks from the front of the free queue"
    for b in popped:
        assert after.block_hashes[b] is None, f"block {b} was handed out but kept its hash (no eviction)"
        if before.block_hashes[b] is not None:
            assert before.block_hashes[b] not in after.cached, f"evicted block {b}'s hash is still findable"


@spec_rule("free-order")
def check_release(
    before: PoolState,
    after: PoolState,
    released: list[int],
    kept_table: Optional[list[int]],
    rid: str,
    trim: bool = False,
) -> None:
    """Point 4 for free/trim: blocks reaching ref 0 go to the BACK of the free queue, last
    logical block first, keeping their hashes; nothing else moves. With `trim`, those without a
    hash go to the FRONT instead, in logical order: they hold nothing findable, and a
    speculative step's rejected drafts' block, taken again by the next step, must not evict a
    cached block each time. The pool after the release is
    checked first, so a released block that keeps its reference (a leak) or a double free fails
    as the pool-accounting rule it breaks (point 1), naming the block, not as a free-queue order."""
    check_pool(after, len(before.ref_counts))
    reaching_zero = [b for b in released if before.ref_counts[b] == 1]
    front = [b for b in reaching_zero if trim and before.block_hashes[b] is None]
    back = [b for b in reversed(reaching_zero) if b not in front]
    assert after.free_queue == front + before.free_queue + back, (
        f"free queue {after.free_queue} != unhashed trimmed {front} + {before.free_queue} + tail-first {back}"
    )
    assert after.block_hashes == before.block_hashes and after.cached == before.cached, (
        "freeing must keep hashes"
    )
    assert after.tables.get(rid, []) == (kept_table or []), (
        f"{rid}: table after release is {after.tables.get(rid)}"
    )
