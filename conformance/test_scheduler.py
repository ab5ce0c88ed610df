"""Scheduler conformance (DESIGN points 1 and 5): every invariant at every step, and liveness.

`Harness` (invariants.py) checks after each schedule() the budget, max_num_seqs, the chunk
threshold, running-first order, the victim choice, no admission in a step that preempted,
policy order of admissions, swap lists and the tables; after each update_from_output the exact
stop rules; and after each call the pool invariants (idle => every block free). The tests here
choose workloads that make each of those situations happen.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginespec.conformance.invariants import Harness, check_idle, step_bound
from enginespec.conformance.rules import spec_rule
from enginespec.conformance.strategies import (
    RequestSpec,
    drafting,
    drafts_for,
    pressure_scenarios,
    scenarios,
)
from enginespec.spec import SamplingParams, SchedulerConfig, Status


def run(impl, scn, **overrides):
    h = Harness.for_scenario(impl, scn, **overrides)
    for spec in scn.requests:
        h.add(spec)
    h.run_to_completion(step_bound(scn.requests))
    check_idle(h.bm.state(), scn.num_blocks)
    for r in h.all.values():
        assert r.status in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH), f"{r.request_id}: {r.status}"
        assert 1 <= r.num_output_tokens <= r.params.max_tokens
    return h


@given(scn=scenarios())
@spec_rule("liveness")
def test_every_step_invariants_and_liveness(impl, scn):
    """Random configs and shared-prefix workloads: all invariants hold and every request finishes."""
    run(impl, scn)


@given(scn=pressure_scenarios())
@spec_rule("preemption")
def test_preemption_under_pressure(impl, scn):
    """Requests that cannot all grow together force preemptions (victim = back of the running
    queue, nobody admitted in that step, swap lists = the victims' tables); all still finish."""
    h = run(impl, scn)
    assert sum(r.num_preemptions for r in h.all.values()) > 0, "the workload was built to force a preemption"
    for r in h.all.values():
        assert r.status == Status.FINISHED_LENGTH and r.num_output_tokens == r.params.max_tokens


@given(scn=scenarios(max_requests=5))
@spec_rule("schedule-order")
def test_policy_order_with_one_seat(impl, scn):
    """With one seat nothing is preempted by others, so requests run one after another, in
    policy order: (arrival, add order) for fcfs, (priority, arrival, add order) for priority."""
    h = Harness.for_scenario(impl, scn, max_num_seqs=1)
    for spec in scn.requests:
        h.add(spec)
    order = []
    while h.sched.has_unfinished:
        assert h.num_steps < step_bound(scn.requests)
        for rid, _ in h.step().scheduled:
            if rid not in order:
                order.append(rid)
    assert order == sorted(h.key, key=h.key.__getitem__), (
        f"served {order}, policy order is {sorted(h.key, key=h.key.get)}"
    )


@given(scn=scenarios(), data=st.data())
@spec_rule("abort")
def test_abort_from_any_state(impl, scn, data):
    """abort() finishes a request from whatever state it is in, frees its blocks, reports it in the
    next SchedulerOutput.finished; unknown ids return False; the rest still finishes."""
    h = Harness.for_scenario(impl, scn)
    for spec in scn.requests:
        h.add(spec)
    for _ in range(data.draw(st.integers(0, 6))):
        if h.sched.has_unfinished:
            h.step()
    victim = data.draw(st.sampled_from(sorted(h.all)))
    was_live = victim in h.live
    assert h.abort(victim) == was_live
    assert h.abort("no-such-request") is False
    h.run_to_completion(h.num_steps + step_bound(scn.requests))
    check_idle(h.bm.state(), scn.num_blocks)


@given(scn=scenarios(), data=st.data())
@spec_rule("step-limits")
def test_draft_tokens_are_scheduled_within_the_limits(impl, scn, data):
    """Before every step a drafter gives some decoding requests 1-3 draft tokens
    (spec_token_ids): they are scheduled within budget and seats, their slots are allocated but
    never published, the verifier keeps a prefix (the fake model's own continuation) and gives
    the rejected drafts' slots back (trim), and every request finishes."""
    h = Harness.for_scenario(impl, scn)
    for spec in scn.requests:
        h.add(spec)
    bound = step_bound(scn.requests)
    while h.sched.has_unfinished:
        assert h.num_steps < bound, "not finished (livelock?)"
        for rid in sorted(rid for rid, r in h.live.items() if drafting(r)):
            if data.draw(st.booleans(), label=f"draft for {rid}"):
                h.propose(rid, data.draw(drafts_for(h.live[rid], h.model), label="drafts"))
        h.step()
    check_idle(h.bm.state(), scn.num_blocks)


GREEDY = dict(temperature=0.0, ignore_eos=True)


@spec_rule("chunking")
def test_the_prefill_threshold_never_caps_a_decodes_drafts(impl):
    """long_prefill_token_threshold caps chunks that start inside the prompt only: a decode
    with 3 drafts is scheduled 1 + 3 tokens under a threshold of 1 (spec/SCHEDULING.md, "Draft
    tokens", Budget). Trace: one request prefills its 4-token prompt a token a step, then decodes."""
    config = SchedulerConfig(
        max_num_batched_tokens=16, max_num_seqs=2, enable_chunked_prefill=True, long_prefill_token_threshold=1
    )
    h = Harness(impl, config, num_blocks=16, block_size=4, enable_prefix_caching=False)
    h.add(RequestSpec("a", (10, 11, 12, 13), SamplingParams(max_tokens=8, **GREEDY)))
    while h.live["a"].num_computed_tokens < 4:  # past the prompt: a decode, not its last chunk
        assert h.num_steps < 8, "the prompt must be prefilled within 8 steps"
        h.step()
    h.propose("a", [1, 2, 3])
    result = h.step()
    assert result.scheduled == [("a", 4)], (
        f"a decode with 3 drafts under threshold 1 scheduled {result.scheduled}, expected [('a', 4)]"
    )


@spec_rule("preemption")
def test_recompute_preemption_clears_the_victims_drafts(impl):
    """A recompute victim loses its spec_token_ids with its progress (spec/SCHEDULING.md, "Draft
    tokens", Preemption). Trace (block_size 1, 8 blocks): `a` and `b` prefill 3 tokens each (6
    blocks); then `a` gets 2 drafts and `b` 1; `a` needs 3 slots with 2 free, so `b` (the back of
    the running queue) is preempted while holding its draft."""
    config = SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=2, preemption_mode="recompute")
    h = Harness(impl, config, num_blocks=8, block_size=1, enable_prefix_caching=False)
    h.add(RequestSpec("a", (10, 11, 12), SamplingParams(max_tokens=4, **GREEDY), arrival_time=0.0))
    h.add(RequestSpec("b", (20, 21, 22), SamplingParams(max_tokens=4, **GREEDY), arrival_time=1.0))
    h.step()
    h.propose("a", [1, 2])
    h.propose("b", [3])
    result = h.step()
    assert result.preempted == ["b"], f"the trace must preempt b, got {result.preempted}"
    assert h.live["b"].spec_token_ids == [], (
        f"recompute victim b kept its drafts {h.live['b'].spec_token_ids}"
    )


@spec_rule("admission")
def test_swapped_request_waits_while_the_budget_is_spent(impl):
    """A swapped request is swapped back in only while budget is left: in a step where the
    running requests spend the budget exactly, it stays swapped (never scheduled with n=0).

    Trace (block_size 1, 17 blocks, budget 4, chunked prefill, fcfs, swap): `a` (arrival 1)
    prefills and decodes; `b` (arrival 0, so first in fcfs order and never the victim) is
    admitted behind it and prefills 16 tokens in chunks of 4; when its chunk does not fit, `a`
    is swapped out; in the next step `b` spends the whole budget again while `a` is swapped."""
    if "swap" not in getattr(impl, "capabilities", ()):
        pytest.skip(f"{impl.name} does not declare the swap capability")
    config = SchedulerConfig(
        max_num_batched_tokens=4, max_num_seqs=2, enable_chunked_prefill=True, preemption_mode="swap"
    )
    h = Harness(impl, config, num_blocks=17, block_size=1, enable_prefix_caching=False)
    greedy = dict(temperature=0.0, ignore_eos=True)
    h.add(RequestSpec("a", tuple(range(10, 16)), SamplingParams(max_tokens=8, **greedy), arrival_time=1.0))
    h.step()
    h.step()
    h.add(RequestSpec("b", tuple(range(20, 36)), SamplingParams(max_tokens=1, **greedy), arrival_time=0.0))
    spent_while_swapped = 0
    while h.sched.has_unfinished:
        assert h.num_steps < 40, "not finished"
        swapped = h.live.get("a") is not None and h.live["a"].status == Status.SWAPPED
        result = h.step()
        if (
            swapped
            and not result.preempted
            and sum(n for _, n in result.scheduled) == config.max_num_batched_tokens
        ):
            spent_while_swapped += 1
            assert "a" not in [rid for rid, _ in result.scheduled]
    assert spent_while_swapped, "the trace must reach a step that spends the budget while `a` is swapped"
