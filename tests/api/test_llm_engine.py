"""LLMEngine (api/llm_engine.py), vLLM's step-by-step API: a loop of add_request / step gives
what LLM.generate gives for the same prompts and params on every impl, streams cumulative
outputs (DELTA and FINAL_ONLY as asked), and abort, duplicate ids and bad prompts leave the
engine clean and usable. `LLM.llm_engine` is one over the LLM's own engine, sharing its ids
and mailbox with generate()."""

from __future__ import annotations

import time

import pytest

from enginespec import EngineArgs, LLMEngine, RequestOutputKind
from enginespec.conformance.invariants import check_idle
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.9, seed=11, ignore_eos=True)
LONG = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = ["hello there", [7, 8, 9, 10, 3], {"prompt_token_ids": [11, 5, 6, 2], "cache_salt": "a"}]


def engine_args(impl: str = "fast") -> dict:
    return dict(impl=impl, dtype="float32", device="cpu", block_size=4, num_blocks=64, max_num_seqs=4)


def make_llm(impl: str = "fast") -> LLM:
    return LLM(str(tiny_model_dir("qwen3")), **engine_args(impl))


def make_engine(impl: str = "fast") -> LLMEngine:
    return LLMEngine.from_engine_args(EngineArgs(model=str(tiny_model_dir("qwen3")), **engine_args(impl)))


def run_to_end(engine: LLMEngine, max_steps: int = 200) -> dict:
    """Step until idle: request id -> every output step() returned for it, in order. A loop
    that is still unfinished after max_steps (a lost output) fails instead of spinning."""
    seen: dict = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return seen
        for out in engine.step():
            seen.setdefault(out.request_id, []).append(out)
    raise AssertionError(f"still {engine.get_num_unfinished_requests()} unfinished after {max_steps} steps")


def completions(out) -> list:
    return [(c.token_ids, c.text, c.finish_reason) for c in out.outputs]


def check_clean(engine: LLMEngine) -> None:
    core = engine.engine
    assert not engine.has_unfinished_requests() and engine.get_num_unfinished_requests() == 0
    assert not core.has_unfinished and not core.scheduler.has_unfinished
    check_idle(core.block_manager.state(), core.runner.num_blocks)
    assert not engine._llm._owned and not engine._llm._mail


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_step_loop_gives_what_generate_gives(impl, params):
    """Each request's outputs are cumulative (each extends the one before), only the last is
    finished, and the last equals LLM.generate's for the same prompt and params."""
    want = [completions(o) for o in make_llm(impl).generate(PROMPTS, params, use_tqdm=False)]
    engine = make_engine(impl)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    assert engine.get_num_unfinished_requests() == len(PROMPTS)
    seen = run_to_end(engine)
    assert [completions(seen[str(i)][-1]) for i in range(len(PROMPTS))] == want
    for outs in seen.values():
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        ids = [list(o.outputs[0].token_ids) for o in outs]
        assert all(ids[k + 1][: len(ids[k])] == ids[k] for k in range(len(ids) - 1))
    assert seen["0"][-1].prompt == "hello there"
    check_clean(engine)


def test_abort_midway_frees_the_request_and_the_others_finish_unchanged():
    engine = make_engine()
    want = [completions(o) for o in make_llm().generate(PROMPTS, LONG, use_tqdm=False)]
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, LONG)
    for _ in range(3):
        engine.step()
    engine.abort_request("1")
    assert "1" not in engine.engine.block_manager.state().tables
    assert engine.get_num_unfinished_requests() == 2
    engine.abort_request(["no-such-id"])  # ignored
    seen = run_to_end(engine)
    assert "1" not in seen  # an aborted request produces no further output (vLLM's)
    assert [completions(seen[k][-1]) for k in ("0", "2")] == [want[0], want[2]]
    check_clean(engine)


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_abort_between_two_prefill_chunks_frees_its_blocks(impl):
    """A prompt longer than the step budget is prefilled in chunks; aborted after its first
    chunk (no output yet), its blocks go back to the pool at once and the request beside it
    finishes as it would alone."""
    args = {**engine_args(impl), "max_num_batched_tokens": 8, "enable_chunked_prefill": True}
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(tiny_model_dir("qwen3")), **args))
    core = engine.engine
    engine.add_request("long", list(range(5, 45)), LONG)
    assert engine.step() == []  # one chunk of 8 of its 40 prompt tokens: nothing to show
    (running,) = core.scheduler.running
    assert 0 < running.num_computed_tokens < running.num_prompt_tokens
    assert core.block_manager.num_free < core.runner.num_blocks
    engine.add_request("short", PROMPTS[1], GREEDY)
    engine.abort_request("long")
    assert core.block_manager.num_free == core.runner.num_blocks
    want = completions(make_llm(impl).generate(PROMPTS[1], GREEDY, use_tqdm=False)[0])
    seen = run_to_end(engine)
    assert list(seen) == ["short"] and completions(seen["short"][-1]) == want
    check_clean(engine)


def test_a_duplicate_request_id_is_a_value_error_and_the_holder_runs_on():
    engine = make_engine()
    engine.add_request("a", PROMPTS[1], GREEDY)
    with pytest.raises(ValueError, match="request_id 'a'"):
        engine.add_request("a", PROMPTS[2], GREEDY)
    for bad in ("", 5, None):  # vLLM's ids are strs
        with pytest.raises(ValueError, match="request_id must be a non-empty str"):
            engine.add_request(bad, PROMPTS[2], GREEDY)
    want = completions(make_llm().generate(PROMPTS[1], GREEDY, use_tqdm=False)[0])
    assert completions(run_to_end(engine)["a"][-1]) == want
    engine.add_request("a", PROMPTS[1], GREEDY)  # a finished request's id is free again
    assert completions(run_to_end(engine)["a"][-1]) == want
    check_clean(engine)


@pytest.mark.parametrize(
    "prompt", [{"bogus": [1, 2]}, [], [1, 10**9], None, {"prompt_token_ids": "abc"}], ids=repr
)
def test_a_bad_prompt_is_a_value_error_and_the_engine_stays_usable(prompt):
    engine = make_engine()
    with pytest.raises(ValueError):
        engine.add_request("bad", prompt, GREEDY)
    check_clean(engine)
    engine.add_request("bad", PROMPTS[1], GREEDY)  # the id was never taken
    assert run_to_end(engine)["bad"][-1].outputs[0].finish_reason == "length"
    check_clean(engine)


def test_delta_outputs_concatenate_to_the_cumulative_and_final_only_comes_once():
    engine = make_engine()
    kinds = {
        k: SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, output_kind=k)
        for k in RequestOutputKind
    }
    for kind, params in kinds.items():
        engine.add_request(kind.name, "hello there", params)
    seen = run_to_end(engine)
    final = seen["CUMULATIVE"][-1].outputs[0]
    deltas = [o.outputs[0] for o in seen["DELTA"] if o.outputs]
    assert len(deltas) > 1
    assert "".join(d.text for d in deltas) == final.text
    assert [t for d in deltas for t in d.token_ids] == final.token_ids
    assert len(seen["FINAL_ONLY"]) == 1 and completions(seen["FINAL_ONLY"][0]) == completions(
        seen["CUMULATIVE"][-1]
    )
    check_clean(engine)


def test_n_2_is_one_request_output_with_two_completions():
    params = SamplingParams(n=2, max_tokens=5, temperature=0.9, seed=3, ignore_eos=True)
    want = completions(make_llm().generate([PROMPTS[0]], params, use_tqdm=False)[0])
    engine = make_engine()
    engine.add_request("r", PROMPTS[0], params)
    assert engine.get_num_unfinished_requests() == 1
    seen = run_to_end(engine)
    assert list(seen) == ["r"] and all(len(o.outputs) == 2 for o in seen["r"])
    assert completions(seen["r"][-1]) == want
    check_clean(engine)


def test_llm_engine_of_an_llm_shares_its_ids_and_mail_with_generate():
    """Requests added through llm.llm_engine under ids generate() would pick itself ("0", "1")
    do not collide with generate's, and the step generate runs keeps their outputs for the
    step loop (they were dropped: the loop would wait forever)."""
    want = [completions(o) for o in make_llm().generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm = make_llm()
    engine = llm.llm_engine
    engine.add_request("0", PROMPTS[0], LONG)
    engine.add_request("1", PROMPTS[1], GREEDY)
    engine.step()
    assert [completions(o) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == want
    seen = run_to_end(engine)
    assert seen["1"][-1].finished and completions(seen["1"][-1]) == want[1]
    assert seen["0"][-1].finished and len(seen["0"][-1].outputs[0].token_ids) == LONG.max_tokens
    check_clean(engine)
    llm.close()
    with pytest.raises(RuntimeError, match="close"):
        engine.add_request("2", PROMPTS[0], GREEDY)
    with pytest.raises(RuntimeError, match="close"):
        engine.step()


def test_an_id_whose_final_output_waits_in_the_mail_is_still_in_use():
    """A request of the step loop that finished during another call's step (generate() here)
    is gone from the engine, but its final output waits in the mail for the loop's next step():
    its id is still in use, so adding it again is a ValueError, and that step() then hands over
    the first request's final output, not a mix of the two."""
    want = completions(make_llm().generate(PROMPTS[1], GREEDY, use_tqdm=False)[0])
    llm = make_llm()
    engine = llm.llm_engine
    engine.add_request("x", PROMPTS[1], GREEDY)
    llm.generate(PROMPTS[2], LONG, use_tqdm=False)  # steps "x" to its end meanwhile
    assert "x" not in llm.engine.parents
    with pytest.raises(ValueError, match="request_id 'x' is already in use"):
        engine.add_request("x", PROMPTS[0], GREEDY)
    seen = run_to_end(engine)
    assert [o.finished for o in seen["x"]] == [True] and completions(seen["x"][0]) == want
    check_clean(engine)


def test_an_interrupted_step_keeps_the_outputs_generate_mailed_to_the_loop():
    """A KeyboardInterrupt inside step() (the engine re-raises it after its clean-up, and its
    outputs come from the next step) must not lose what a generate() call's steps had mailed
    to the step loop: step() took the mail before stepping, so a final output there was gone
    and its request stayed unfinished forever (the loop spun on an idle engine)."""
    llm = make_llm()
    engine = llm.llm_engine
    engine.add_request("short", PROMPTS[1], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    engine.add_request("long", PROMPTS[0], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    want = completions(make_llm().generate(PROMPTS[1], GREEDY, use_tqdm=False)[0])
    assert (
        completions(llm.generate(PROMPTS[1], GREEDY, use_tqdm=False)[0]) == want
    )  # "short" finished meanwhile
    interrupted = []

    def interrupt_once(phase):
        if phase == "schedule" and not interrupted:
            interrupted.append(phase)
            raise KeyboardInterrupt

    llm.engine.fault_hook = interrupt_once
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    seen = run_to_end(engine)
    assert seen["short"][-1].finished and len(seen["short"][-1].outputs[0].token_ids) == 2
    assert seen["long"][-1].outputs[0].finish_reason == "error"  # the interrupted step's request
    check_clean(engine)


def test_a_ctrl_c_inside_a_step_of_the_loop_is_raised_after_it_and_the_loop_goes_on(ctrl_c):
    """A Ctrl-C that lands inside a step() (here just after the scheduler freed the blocks of
    a request that finished, before it had updated the others) raised KeyboardInterrupt right
    there: the engine's clean-up failed the step's other requests (finish_reason "error",
    though their forward had run) and a loop that went on got those. Now the step runs to its
    end, its outputs wait in the mail, and the KeyboardInterrupt comes after: a loop that goes
    on gets every request's output as generate() gives it."""
    prompts = [[7, 8, 9, 10, 3], [11, 5, 6, 2], [12, 13, 4, 5, 6, 7]]
    want = [completions(out) for out in make_llm().generate(prompts, GREEDY, use_tqdm=False)]
    llm = make_llm()
    engine = llm.llm_engine
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY)
    block_manager = llm.engine.block_manager
    free = block_manager.free

    def then_ctrl_c(request):
        free(request)
        block_manager.free = free
        ctrl_c()

    block_manager.free = then_ctrl_c
    with pytest.raises(KeyboardInterrupt):
        run_to_end(engine)
    seen = run_to_end(engine)  # the script goes on with its loop
    assert [completions(seen[str(i)][-1]) for i in range(len(prompts))] == want
    check_clean(engine)


def test_a_generate_that_ends_as_the_loop_reuses_its_id_leaves_the_loops_request_alone():
    """generate() releases its ids once more on the way out (a no-op for finished requests),
    after its step loop has freed them: another thread's LLMEngine.add_request may take one of
    them in between ("0", vLLM's examples' first id and generate's first one). That late release
    aborted the loop's new request without a report: the loop waited forever for its output.
    The interleaving is forced here: the other thread's add runs right before the release."""
    llm = make_llm()
    engine = llm.llm_engine
    release = llm._release
    added = []

    def other_thread_adds_first(ids):
        if not added and "0" in ids:
            engine.add_request("0", PROMPTS[1], GREEDY)
            added.append("0")
        release(ids)

    llm._release = other_thread_adds_first
    assert llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0].request_id == "0"
    assert added == ["0"]
    want = completions(make_llm().generate(PROMPTS[1], GREEDY, use_tqdm=False)[0])
    assert completions(run_to_end(engine)["0"][-1]) == want
    check_clean(engine)


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_a_wall_clock_arrival_time_orders_fcfs_against_requests_added_without_one(impl):
    """vLLM's arrival_time is a time.time() timestamp; the engine's requests default to
    time.monotonic(). Passed on as it was, a request added with arrival_time=time.time() sorted
    after every request added later without one, so with one seat FCFS ran the later one first."""
    engine = LLMEngine.from_engine_args(
        EngineArgs(model=str(tiny_model_dir("qwen3")), **{**engine_args(impl), "max_num_seqs": 1})
    )
    engine.add_request("first", PROMPTS[1], GREEDY, arrival_time=time.time())
    engine.add_request("second", PROMPTS[2], GREEDY)
    finished = []
    for _ in range(100):
        if not engine.has_unfinished_requests():
            break
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["first", "second"]
    with pytest.raises(ValueError, match="arrival_time"):
        engine.add_request("nan", PROMPTS[1], GREEDY, arrival_time=float("nan"))
    check_clean(engine)


def test_reset_prefix_cache_and_profiling_are_vllms_llm_engine_calls(tmp_path, monkeypatch):
    """vLLM's LLMEngine has reset_prefix_cache (its llm_engine_reset_kv.py example calls it
    between steps), start_profile and stop_profile: all three were an AttributeError here.
    They are LLM's calls on the same engine: the reset is False, changing nothing, while a
    request holds blocks, and True once idle (the next identical prompt is computed in full);
    reset_running_requests=True (preempting the running requests to empty the cache) is a
    ValueError naming it, as no impl's Scheduler offers that preemption."""
    engine = make_engine()
    prompt = {"prompt_token_ids": list(range(5, 25))}  # 20 ids: four full blocks of 4 to cache
    engine.add_request("a", prompt, GREEDY)
    engine.step()
    assert engine.reset_prefix_cache() is False  # "a" holds its blocks
    with pytest.raises(ValueError, match="reset_running_requests"):
        engine.reset_prefix_cache(reset_running_requests=True)
    run_to_end(engine)
    engine.add_request("b", prompt, GREEDY)
    assert run_to_end(engine)["b"][-1].num_cached_tokens == 16  # the refusals forgot nothing
    assert engine.reset_prefix_cache() is True
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))
    engine.start_profile()
    engine.add_request("c", prompt, GREEDY)
    outs = run_to_end(engine)
    engine.stop_profile()
    assert outs["c"][-1].num_cached_tokens == 0  # the reset emptied the cache
    assert list(tmp_path.glob("*.pt.trace.json"))
    check_clean(engine)
