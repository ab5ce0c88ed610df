"""A failed step fails only its own requests and poisons nothing (spec/SCHEDULING.md, "A
failed step"), whatever phase raised, with async scheduling on or off, prefix caching on.

Each test injects one raise through EngineCore.fault_hook at one phase of one step, runs the
workload to the end, then checks: the pool is idle and consistent; every request that did not
fail has exactly the tokens of a fresh engine; the failed ones end with finish_reason "error"
and the message; and a retry of the same prompts on the same engine equals a fresh engine
token for token (the prefix cache holds no block whose KV was never written).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginespec.conformance.invariants import check_idle, check_pool
from enginespec.conformance.strategies import token_lists
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PHASES = ["schedule", "prepare", "execute", "sample", "update", "detokenize"]
SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18, 19]  # a shared prefix: two full blocks of 4
PROMPTS = {f"p{i}": SYSTEM + [30 + i, 40 + 2 * i, 50 + i] for i in range(6)}
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


class Fault:
    """Raises `exc` the `at`-th time phase `phase` starts (once)."""

    def __init__(self, phase: str, at: int, exc: type = RuntimeError):
        self.phase, self.at, self.exc = phase, at, exc
        self.count = 0
        self.fired = False

    def __call__(self, phase: str) -> None:
        if phase != self.phase or self.fired:
            return
        self.count += 1
        if self.count == self.at:
            self.fired = True
            raise self.exc(f"injected fault at {phase}")


def make_engine(impl, async_scheduling: bool, **kwargs):
    from enginespec.llm import LLM

    args = dict(
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=40,
        max_model_len=64,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        enable_prefix_caching=True,
        async_scheduling=async_scheduling,
    )
    return LLM(str(tiny_model_dir("qwen3")), impl=impl, **{**args, **kwargs}).engine


def run(engine, prompts: dict, params=GREEDY, tag: str = "") -> dict:
    for rid, ids in prompts.items():
        engine.add_request(tag + rid, ids, params)
    finals = {}
    for _ in range(400):
        if not engine.has_unfinished:
            break
        finals.update({o.request_id[len(tag) :]: o for o in engine.step() if o.finished})
    assert not engine.has_unfinished, "engine did not finish"
    return finals


_FRESH: dict = {}


def fresh(impl, params=GREEDY) -> dict:
    """Token ids of a fault-free engine (the same for async on and off: test_async_scheduling)."""
    key = (impl.name, params)
    if key not in _FRESH:
        _FRESH[key] = {
            rid: o.outputs[0].token_ids for rid, o in run(make_engine(impl, False), PROMPTS, params).items()
        }
    return _FRESH[key]


def check_clean(engine) -> None:
    state = engine.block_manager.state()
    check_pool(state, engine.runner.num_blocks)
    check_idle(state, engine.runner.num_blocks)
    assert not engine.scheduler.has_unfinished and engine.runner.num_swapped == 0


@pytest.mark.parametrize("at", [1, 3])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
@pytest.mark.parametrize("phase", PHASES)
def test_a_fault_in_any_phase_fails_only_its_step(impl, phase, async_scheduling, at):
    expected = fresh(impl)
    engine = make_engine(impl, async_scheduling)
    fault = engine.fault_hook = Fault(phase, at)
    finals = run(engine, PROMPTS)
    assert fault.fired and engine.stats.num_failed_steps == 1
    errors = [rid for rid, o in finals.items() if o.outputs[0].finish_reason == "error"]
    assert errors or phase == "schedule", "the failed step had requests; they must say so"
    for rid, out in finals.items():
        c = out.outputs[0]
        if c.finish_reason == "error":
            assert c.error == f"RuntimeError: injected fault at {phase}"
            assert c.token_ids == expected[rid][: len(c.token_ids)], "a failed request's tokens are a prefix"
        else:
            assert c.token_ids == expected[rid], f"{rid} did not fail, yet its tokens changed"
    check_clean(engine)
    engine.fault_hook = None
    retry = run(engine, PROMPTS, tag="retry-")
    assert {rid: o.outputs[0].token_ids for rid, o in retry.items()} == expected
    check_clean(engine)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_a_failed_prefill_leaves_no_poisoned_prefix(impl, async_scheduling):
    """The first forward raises after schedule() published the shared prefix's blocks; a
    later request with that prefix must compute them, not adopt KV that was never written."""
    expected = fresh(impl)
    engine = make_engine(impl, async_scheduling)
    engine.fault_hook = Fault("execute", 1)
    first = run(engine, {"p0": PROMPTS["p0"]})
    assert first["p0"].outputs[0].finish_reason == "error"
    assert not engine.block_manager.state().cached, "blocks of a failed forward stay published"
    again = run(engine, {"p0": PROMPTS["p0"], "p1": PROMPTS["p1"]}, tag="again-")
    assert {rid: o.outputs[0].token_ids for rid, o in again.items()} == {
        "p0": expected["p0"],
        "p1": expected["p1"],
    }


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_faults_under_preemption(impl, mode, async_scheduling):
    """A small pool preempts; faults at the first schedule() with swaps pending and at later
    forwards leave the pool clean, and the survivors' tokens unchanged."""
    if mode == "swap" and "swap" not in getattr(impl, "capabilities", ()):
        pytest.skip(f"impl {impl.name!r} has no swap capability")
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    expected = fresh(impl, params)
    engine = make_engine(impl, async_scheduling, num_blocks=12, preemption_mode=mode)
    hooks = [Fault("schedule", 12), Fault("execute", 16), Fault("sample", 22)]
    engine.fault_hook = lambda phase: [h(phase) for h in hooks]
    finals = run(engine, PROMPTS, params)
    assert engine.stats.num_preemptions > 0 and engine.stats.num_failed_steps > 0
    for rid, out in finals.items():
        if out.outputs[0].finish_reason != "error":
            assert out.outputs[0].token_ids == expected[rid]
    check_clean(engine)
    engine.fault_hook = None
    retry = run(engine, PROMPTS, params, tag="retry-")
    assert {rid: o.outputs[0].token_ids for rid, o in retry.items()} == expected


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_keyboard_interrupt_in_a_step_rolls_back_then_propagates(impl, async_scheduling):
    expected = fresh(impl)
    engine = make_engine(impl, async_scheduling)
    engine.fault_hook = Fault("execute", 2, KeyboardInterrupt)
    for rid, ids in PROMPTS.items():
        engine.add_request(rid, ids, GREEDY)
    with pytest.raises(KeyboardInterrupt):
        for _ in range(50):
            engine.step()
    finals = {}
    while engine.has_unfinished:
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert any(o.outputs[0].finish_reason == "error" for o in finals.values())
    for rid, out in finals.items():
        if out.outputs[0].finish_reason != "error":
            assert out.outputs[0].token_ids == expected[rid]
    check_clean(engine)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_a_raising_forward_poisons_nothing_and_wedges_nothing(impl, async_scheduling, monkeypatch):
    """The model runner's forward raises (a transient CUDA OOM, say) on its 1st and 4th call,
    no hook involved: step() returns error outputs for that step's requests, the engine
    finishes every other request with a fresh engine's tokens, and the shared prefix is not
    poisoned for the retry."""
    expected = fresh(impl)
    engine = make_engine(impl, async_scheduling)
    execute, calls = engine.runner.execute, {"n": 0}

    def flaky(batch):
        calls["n"] += 1
        if calls["n"] in (1, 4):
            raise RuntimeError("CUDA out of memory (simulated)")
        return execute(batch)

    monkeypatch.setattr(engine.runner, "execute", flaky)
    finals = run(engine, PROMPTS)
    reasons = {rid: o.outputs[0].finish_reason for rid, o in finals.items()}
    assert "error" in reasons.values() and set(reasons.values()) <= {"error", "length"}
    for rid, out in finals.items():
        if reasons[rid] == "length":
            assert out.outputs[0].token_ids == expected[rid]
    check_clean(engine)
    retry = run(engine, PROMPTS, tag="retry-")
    assert {rid: o.outputs[0].token_ids for rid, o in retry.items()} == expected


@given(
    tokens=token_lists(2, 24, vocab=3),
    other=token_lists(2, 24, vocab=3),
    block_size=st.sampled_from([1, 2, 4]),
    cut=st.integers(0, 24),
)
def test_unpublish_matches_the_reference(impl, tokens, other, block_size, cut):
    """BlockManager.unpublish (spec/SCHEDULING.md): the impl under test and the reference end
    in the same PoolState, and exactly the request's own hashes past the cut are gone."""
    from enginespec.spec import load_impl

    states = []
    for each in (impl, load_impl("reference")):
        bm = each.new_block_manager(64, block_size, True)
        a = each.new_request("a", tokens, SamplingParams(), arrival_time=0.0)
        b = each.new_request("b", other, SamplingParams(), arrival_time=0.0)
        for r in (b, a):  # b first: a adopts what it can of b's published blocks
            cached = bm.find_cached_prefix(r)
            k = len(cached) * block_size
            assert bm.allocate_slots(r, len(r.token_ids) - k, cached)
            r.num_computed_tokens = k  # as the scheduler's admission does
            bm.cache_full_blocks(r, len(r.token_ids))
        before = bm.state()
        bm.unpublish(a, cut)
        after = bm.state()
        first = cut // block_size
        table = bm.block_table("a")
        for i, block in enumerate(table):
            own = i < len(a.block_hashes) and before.block_hashes[block] == a.block_hashes[i]
            if i >= first and own:
                assert after.block_hashes[block] is None
            else:
                assert after.block_hashes[block] == before.block_hashes[block]
        assert after.free_queue == before.free_queue and after.ref_counts == before.ref_counts
        states.append(after)
    assert states[0] == states[1]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_a_failed_step_fails_the_siblings_it_did_not_schedule(impl, async_scheduling):
    """n=2 on an engine that runs one sequence at a time: the step that fails sample 0 cannot
    touch sample 1, still waiting, which then ran on to its end: the request came back with
    one sample "error" and one "length" (and the server, answering the 500, aborted sample 1:
    "abort" in its counters). The user's request failed: both samples end "error" in that
    step (sample 1 naming sample 0's fault, with no tokens), the request queued behind it gets a
    fresh engine's tokens, the pool is idle, and the engine serves n=2 on."""
    expected = fresh(impl)
    engine = make_engine(impl, async_scheduling, max_num_seqs=1)
    engine.fault_hook = Fault("execute", 1)
    params = SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=0, ignore_eos=True)
    engine.add_request("pair", PROMPTS["p0"], params)
    engine.add_request("p1", PROMPTS["p1"], GREEDY)
    first = {o.request_id: o for o in engine.step()}
    assert engine.stats.num_failed_steps == 1
    pair = [(c.finish_reason, c.token_ids, c.error) for c in first["pair"].outputs]
    fault = "RuntimeError: injected fault at execute"
    assert pair == [("error", [], fault), ("error", [], f"sample 0 of this request failed: {fault}")]
    assert first["pair"].finished
    finals = run(engine, {})
    assert finals["p1"].outputs[0].token_ids == expected["p1"]
    check_clean(engine)
    again = run(engine, {"pair": PROMPTS["p0"]}, params)["pair"]
    assert [c.finish_reason for c in again.outputs] == ["length", "length"]
    check_clean(engine)
