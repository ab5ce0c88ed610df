"""Directed traces at the edges of schedule()'s stop conditions (spec/SCHEDULING.md, "Scheduler.schedule()").

Random workloads rarely land exactly on these edges (mutation testing showed two of them
untested): a swap-in loop that runs on with the budget spent, one that stops with exactly the
last budget token left, and a long-prefill cap applied one position too far. Each trace is
short, uses only the spec's API (add, schedule through the Harness, drafts through `propose`)
and asserts the decisions every conforming impl makes; the Harness checks every invariant after
each operation as usual.
"""

from __future__ import annotations

import pytest

from enginespec.conformance.invariants import Harness, cdiv
from enginespec.conformance.rules import spec_rule
from enginespec.conformance.strategies import RequestSpec
from enginespec.spec import SamplingParams, SchedulerConfig, Status

GREEDY = dict(temperature=0.0, ignore_eos=True)


def spec(request_id: str, num_prompt: int, max_tokens: int, arrival_time: float) -> RequestSpec:
    first = 100 * (ord(request_id[0]) - ord("a") + 1)
    prompt = tuple(range(first, first + num_prompt))
    return RequestSpec(
        request_id, prompt, SamplingParams(max_tokens=max_tokens, **GREEDY), arrival_time=arrival_time
    )


def swap_harness(impl, num_blocks: int, block_size: int, **config) -> Harness:
    if "swap" not in getattr(impl, "capabilities", ()):
        pytest.skip(f"{impl.name} does not declare the swap capability")
    cfg = SchedulerConfig(preemption_mode="swap", **config)
    return Harness(impl, cfg, num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=False)


def num_free(h: Harness) -> int:
    return len(h.bm.state().free_queue)


@spec_rule("admission")
def test_swap_in_stops_once_the_budget_is_spent(impl):
    """Swap-in runs only `while budget > 0`: when the first swapped request takes the rest of
    the budget (a chunk of its remaining prefill, chunked prefill on), the next one stays
    swapped even though the pool has room for its kept blocks (it is never swapped in with 0
    tokens).

    Trace (block_size 1, 7 blocks, budget 2, 2 seats): `a` decodes next to `b`, which prefills
    one token per step until it is swapped out; `c` (after `a`, before `b` in fcfs order) is
    admitted, then swapped out too; `a` finishes and frees the pool; `c` comes back first and
    spends the budget on a chunk of 2."""
    h = swap_harness(impl, 7, 1, max_num_batched_tokens=2, max_num_seqs=2, enable_chunked_prefill=True)
    h.add(spec("a", 1, 6, arrival_time=2.0))
    h.add(spec("b", 6, 1, arrival_time=6.0))
    for _ in range(3):
        assert h.step().scheduled == [("a", 1), ("b", 1)]
    assert h.step().preempted == ["b"]
    h.add(spec("c", 6, 1, arrival_time=2.0))
    assert h.step().scheduled == [("a", 1), ("c", 1)], "b cannot fit its 3 kept blocks, c is admitted"
    assert h.step().preempted == ["c"]
    assert "a" not in h.live and num_free(h) == 7, "a finished and freed every block"
    step = h.step()
    assert [rid for rid, _ in step.swap_in] == ["c"] and step.scheduled == [("c", 2)]
    b = h.live["b"]
    assert b.status == Status.SWAPPED
    assert num_free(h) >= cdiv(b.num_computed_tokens, 1), "the edge needs room for b in the pool"
    h.run_to_completion(h.num_steps + 20)


@spec_rule("admission")
def test_swap_in_takes_the_last_budget_token_with_chunked_prefill_off(impl):
    """With chunked prefill off a swapped request is swapped in when its whole remainder fits
    the budget: it stops only if the remainder *exceeds* the budget, so a decode (1 token)
    comes back with exactly 1 budget token left.

    Trace (block_size 2, 4 blocks, budget 3, 3 seats; the harness rejects every draft and
    trims its slots, as the simplest engine would): `a`, `b`, `x` prefill one token each; `a`
    carries drafts that fill the budget; their extra block forces `x` out; `a` finishes; `b`
    carries one draft (2 tokens), leaving 1 token for `x`."""
    h = swap_harness(impl, 4, 2, max_num_batched_tokens=3, max_num_seqs=3, enable_chunked_prefill=False)
    h.add(spec("a", 1, 3, arrival_time=0.0))
    h.add(spec("b", 1, 2, arrival_time=1.0))
    h.add(spec("x", 1, 3, arrival_time=2.0))
    assert h.step().scheduled == [("a", 1), ("b", 1), ("x", 1)]
    h.propose("a", [7, 7, 7])
    assert h.step().scheduled == [("a", 3)], "1 + drafts, cut by the budget"
    h.propose("a", [7, 7, 7])
    step = h.step()
    assert step.scheduled == [("a", 3)] and step.preempted == ["x"]
    assert "a" not in h.live, "a reached max_tokens"
    h.propose("b", [7])
    step = h.step()
    assert [rid for rid, _ in step.swap_in] == ["x"]
    assert step.scheduled == [("b", 2), ("x", 1)], "x takes the last budget token"
    h.run_to_completion(h.num_steps + 20)


@spec_rule("chunking")
def test_threshold_caps_only_chunks_starting_inside_the_prompt(impl):
    """long_prefill_token_threshold caps n only while the chunk starts inside the prompt
    (position < num_prompt_tokens): a first decode starts at the prompt's end, so it is not
    capped even when its draft tokens make it longer than the threshold."""
    cfg = SchedulerConfig(
        max_num_batched_tokens=8, max_num_seqs=2, enable_chunked_prefill=True, long_prefill_token_threshold=2
    )
    h = Harness(impl, cfg, num_blocks=8, block_size=4, enable_prefix_caching=False)
    h.add(spec("a", 4, 4, arrival_time=0.0))
    assert h.step().scheduled == [("a", 2)]
    assert h.step().scheduled == [("a", 2)], "the prompt is prefilled in chunks of the threshold"
    h.propose("a", [7, 7])
    assert h.step().scheduled == [("a", 3)], "a decode with 2 drafts starts at the prompt's end: not capped"
    h.run_to_completion(h.num_steps + 10)


@spec_rule("chunking")
def test_threshold_does_not_cap_a_readmission_that_starts_at_the_prompt_end(impl):
    """The threshold applies from the admission position k (the cached prefix): a request
    preempted by recompute after two outputs is re-admitted after its cached prompt block, so
    its chunk (its outputs) starts at the prompt's end and is not capped.

    Trace (block_size 2, 4 blocks, budget 2, threshold 1, prefix caching, recompute): `v`
    prefills its 2-token prompt one token per step next to `a`, samples two tokens, and is the
    victim when `a` needs a block; once `a` finishes, `v` comes back with k = 2."""
    cfg = SchedulerConfig(
        max_num_batched_tokens=2,
        max_num_seqs=2,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=1,
        preemption_mode="recompute",
    )
    h = Harness(impl, cfg, num_blocks=4, block_size=2, enable_prefix_caching=True)
    h.add(spec("a", 1, 6, arrival_time=0.0))
    assert h.step().scheduled == [("a", 1)]
    h.add(spec("v", 2, 4, arrival_time=1.0))
    for _ in range(3):
        assert h.step().scheduled == [("a", 1), ("v", 1)]
    v = h.live["v"]
    assert (v.num_computed_tokens, v.num_tokens) == (3, 4)
    assert h.step().preempted == ["v"]
    assert h.step().scheduled == [("a", 1)] and "a" not in h.live
    assert h.step().scheduled == [("v", 2)], "2 outputs from position 2 = num_prompt_tokens: not capped"
    assert v.num_cached_tokens == 2
    h.run_to_completion(h.num_steps + 10)


@spec_rule("admission")
def test_swap_in_stops_when_the_seats_are_taken(impl):
    """Swap-in runs only `while len(running) < max_num_seqs`: once a swapped request takes the
    last seat, the next one stays swapped, though budget is left and the pool has room for it.

    Trace (block_size 4, 7 blocks, budget 7, 2 seats, chunked prefill): `x` and `c` are swapped
    out in turn while `a` prefills 19 tokens; `d` (added then, but an earlier arrival than both,
    so it may pass them) is admitted when neither fits; `a` finishes; then `c` (before `x` in fcfs order)
    comes back next to `d` and fills the seats."""
    h = swap_harness(impl, 7, 4, max_num_batched_tokens=7, max_num_seqs=2, enable_chunked_prefill=True)
    h.add(spec("x", 10, 12, arrival_time=8.0))
    assert h.step().scheduled == [("x", 7)]
    h.add(spec("a", 19, 3, arrival_time=1.0))
    h.add(spec("c", 6, 20, arrival_time=5.0))
    assert h.step().scheduled == [("x", 3), ("a", 4)]
    assert h.step().scheduled == [("a", 7)]
    assert h.step().preempted == ["x"]
    assert h.step().scheduled == [("a", 1), ("c", 6)]
    h.propose("c", [7, 7])
    assert h.step().preempted == ["c"]
    h.add(spec("d", 4, 12, arrival_time=4.0))
    assert h.step().scheduled == [("a", 1), ("d", 4)], "c and x do not fit, d does"
    assert "a" not in h.live, "a reached max_tokens"
    step = h.step()
    assert [rid for rid, _ in step.swap_in] == ["c"] and step.scheduled == [("d", 1), ("c", 1)]
    x = h.live["x"]
    assert x.status == Status.SWAPPED
    assert num_free(h) >= cdiv(x.num_computed_tokens + 1, 4), "the edge needs room for x in the pool"
    h.run_to_completion(h.num_steps + 60)


@spec_rule("abort")
def test_a_request_finished_mid_step_takes_nothing_from_the_update(impl):
    """A request finished between schedule() and update_from_output() (the engine aborted it,
    or matched a stop string, while the step ran) is skipped by the update: its
    num_computed_tokens and tokens stay as they were, it gets no entry in new_token_ids, it is
    not finished twice, and nothing of it is published. The other scheduled request advances."""
    h = Harness(impl, SchedulerConfig(), num_blocks=16, block_size=2)
    h.add(spec("a", 4, 4, arrival_time=0.0))
    h.add(spec("b", 4, 4, arrival_time=1.0))
    h.step()  # both prefill
    a, b = h.live["a"], h.live["b"]
    out = h.sched.schedule()
    assert sorted(r.request_id for r, _ in out.scheduled) == ["a", "b"]
    h.sched.finish(h.live.pop("a"), Status.FINISHED_ABORTED)  # mid-step: no invariant check yet
    h.finished_since.append("a")
    computed, tokens = a.num_computed_tokens, list(a.token_ids)
    upd = h.sched.update_from_output(out, {"a": [7], "b": [8]})
    assert a.num_computed_tokens == computed and list(a.token_ids) == tokens
    assert "a" not in upd.new_token_ids and all(r.request_id != "a" for r in upd.finished)
    assert upd.new_token_ids["b"] == [8] and b.num_computed_tokens == 5
    assert "a" not in h.bm.state().tables
    h.check()


@spec_rule("abort")
def test_finish_refuses_a_request_it_does_not_hold(impl):
    """finish() takes only the request object the scheduler holds: an unknown id, or another
    object under a held id, is a ValueError that changes nothing (the held request goes on)."""
    h = Harness(impl, SchedulerConfig(), num_blocks=16, block_size=2)
    h.add(spec("a", 4, 3, arrival_time=0.0))
    h.step()
    for stranger in (
        spec("a", 4, 3, arrival_time=0.0).build(impl),
        spec("z", 4, 3, arrival_time=0.0).build(impl),
    ):
        with pytest.raises(ValueError, match="not in this scheduler"):
            h.sched.finish(stranger, Status.FINISHED_ABORTED)
        assert stranger.status == Status.WAITING
    assert h.live["a"].status == Status.RUNNING
    h.check()
    h.run_to_completion(h.num_steps + 10)


@spec_rule("schedule-order")
def test_a_later_arrival_does_not_pass_a_swapped_request_that_cannot_come_back(impl):
    """Admission from waiting stops at a request whose key is worse than a swapped one's: a
    swapped request that cannot come back yet is not overtaken by later arrivals that would fit
    beside it (else a stream of them keeps it out), while an earlier arrival still may pass.

    Trace (block_size 1, 16 blocks, budget 8, fcfs, chunked prefill): `a` and `b` decode until
    the pool is full and `b` is swapped out; `c` (a one-token prompt, arriving after `b`) fits
    the pool but waits until `b` is back; `e` (arriving before `b`) is admitted at once."""
    h = swap_harness(impl, 16, 1, max_num_batched_tokens=8, max_num_seqs=4, enable_chunked_prefill=True)
    h.add(spec("a", 2, 12, arrival_time=1.0))
    h.add(spec("b", 2, 12, arrival_time=2.0))
    while not h.step().preempted:
        pass
    assert h.live["b"].status == Status.SWAPPED
    h.add(spec("c", 1, 1, arrival_time=3.0))
    while h.live["b"].status == Status.SWAPPED:
        room = num_free(h)
        step = h.step()
        assert "c" not in [rid for rid, _ in step.scheduled], "c passed b, which is swapped out"
        if h.live["b"].status == Status.SWAPPED and room >= 2:
            break  # the edge: room for c, not for b, and c stayed out
    else:
        pytest.fail("the trace must reach a step with room for c while b stays swapped")
    h.add(spec("e", 1, 1, arrival_time=1.5))
    assert "e" in [rid for rid, _ in h.step().scheduled] or "e" not in h.live, "e outranks b"
    h.run_to_completion(h.num_steps + 60)


def test_the_harness_keys_stay_distinct_when_an_id_comes_back(impl):
    """The harness's policy keys break arrival ties by add order, as the impls do: an id added
    again after it finished gets a later seq than every earlier add, never a used one (the keys
    were numbered by how many ids the harness knew, which an id coming back does not grow)."""
    h = swap_harness(impl, 16, 1, max_num_batched_tokens=8, max_num_seqs=4, enable_chunked_prefill=True)
    h.add(spec("a", 1, 1, arrival_time=1.0))
    h.add(spec("b", 1, 3, arrival_time=1.0))
    h.step()
    assert "a" not in h.live, "a reached max_tokens"
    h.add(spec("a", 1, 1, arrival_time=1.0))
    h.add(spec("c", 1, 1, arrival_time=1.0))
    keys = [h.key[rid] for rid in ("a", "b", "c")]
    assert len(set(keys)) == 3 and h.key["b"] < h.key["a"] < h.key["c"], keys
    h.run_to_completion(h.num_steps + 20)
