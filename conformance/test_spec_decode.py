"""Speculative decoding through the engine: greedy output under speculation equals plain greedy
(transformers' `generate`, as in test_parity), with drafts accepted, cut short by the budget
and rejected, under chunked prefill, prefix caching, and preemption by recompute and by swap;
the pool ends idle (rejected drafts' blocks were trimmed, nothing leaked).

Two drafters: the engine's n-gram prompt lookup (random tiny models often fall into loops it
predicts), and an oracle that proposes transformers' own continuation with a seeded chance of
corrupting one draft (so acceptance, partial acceptance and rejection all happen every run).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from enginespec.conformance.invariants import check_idle
from enginespec.conformance.strategies import engine_workloads
from enginespec.conformance.test_parity import (
    MAX_TOKENS,
    _forced,
    check_outputs,
    engine_for,
    hf_greedy,
    run_workload,
    tiny_vocab,
)
from enginespec.engine.spec_decode import Drafter

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
pytestmark = pytest.mark.usefixtures("torch_one_thread")


class OracleDrafter(Drafter):
    """Drafts = transformers' greedy continuation of the prompt from the request's output
    position on, one of them replaced by a wrong id with probability `corrupt` (not the first
    of several: a rejected proposal backs the request off, and the forced paths are short;
    whole rejections still come from single drafts and the n-gram drafter)."""

    def __init__(self, family: str, vocab: int, rng: random.Random, corrupt: float = 0.3):
        self.family, self.vocab, self.rng, self.corrupt = family, vocab, rng, corrupt

    def propose(self, request, num_real: int, max_drafts: int) -> list[int]:
        ref, _ = hf_greedy(self.family, tuple(request.prompt_token_ids))
        done = num_real - request.num_prompt_tokens
        drafts = list(ref[done : done + min(3, max_drafts)])
        if drafts and self.rng.random() < self.corrupt:
            i = self.rng.randrange(1, len(drafts)) if len(drafts) > 1 else 0  # a prefix survives
            drafts[i] = (drafts[i] + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
        return drafts

    def forget(self, request_id: str) -> None:
        pass


def spec_engine(impl, family, workload, drafter_seed=None, disable_by_batch_size=None, **engine_args):
    config = {**NGRAM, "disable_by_batch_size": disable_by_batch_size}
    engine = engine_for(impl, family, workload, speculative_config=config, **engine_args)
    if drafter_seed is not None:
        engine.spec.drafter = OracleDrafter(family, tiny_vocab(family), random.Random(drafter_seed))
    return engine


def check_run(engine, workload, family: str) -> dict:
    finals = run_workload(engine, workload)
    check_outputs(workload, finals, family)
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    assert engine.runner.num_swapped == 0, "a host swap copy outlived its request"
    assert not any(r.spec_token_ids for r in engine.scheduler.running)
    return finals


def run_sampled(engine, workload, params) -> None:
    """Every request of the workload with `params`, stepped to the end (200 steps at most):
    each finishes with exactly max_tokens ids, all in the tiny qwen3 vocabulary."""
    for r in workload.requests:
        engine.add_request(r.request_id, list(r.prompt_token_ids), params)
    finals = {}
    for _ in range(200):
        finals.update((out.request_id, out) for out in engine.step() if out.finished)
        if not engine.has_unfinished:
            break
    vocab = tiny_vocab("qwen3")
    for r in workload.requests:
        tokens = finals[r.request_id].outputs[0].token_ids
        assert len(tokens) == params.max_tokens and all(0 <= t < vocab for t in tokens), tokens


def test_greedy_parity_under_speculation(impl):
    """Hypothesis workloads (preemption by recompute and swap common), n-gram or oracle drafts,
    adaptive drafting (always on) and sometimes a disable_by_batch_size."""
    swap = "swap" in getattr(impl, "capabilities", ())
    totals = [0, 0]  # drafts verified, accepted: over all examples

    # Half the profile's count (ci: 6, each a few engine runs); the forced paths below add
    # workloads sure to preempt.
    @seed(20)
    @settings(max_examples=max(1, settings.default.max_examples // 2))
    @given(
        workload=engine_workloads(
            vocab=tiny_vocab("qwen3"), max_requests=5, max_tokens=MAX_TOKENS, swap=swap
        ),
        drafter=st.sampled_from([None, 0, 1]),
        async_scheduling=st.booleans(),
        disable=st.sampled_from([None, None, 2, 3]),
    )
    def check(workload, drafter, async_scheduling, disable):
        engine = spec_engine(impl, "qwen3", workload, drafter, disable, async_scheduling=async_scheduling)
        check_run(engine, workload, "qwen3")
        totals[0] += engine.stats.spec_decode.num_draft_tokens
        totals[1] += engine.stats.spec_decode.num_accepted_tokens

    check()
    assert 0 < totals[1] < totals[0], f"drafts verified/accepted over the examples: {totals}"


@pytest.mark.parametrize("name", ["recompute", "swap", "prefix_hit", "chunk_priority_abort"])
def test_speculation_on_forced_paths(impl, name):
    """The parity test's forced workloads with oracle drafts: each takes its path (preemption,
    prefix hit, chunks under a threshold, an abort) and drafts are accepted and rejected."""
    if name == "swap" and "swap" not in getattr(impl, "capabilities", ()):
        pytest.skip(f"impl {impl.name!r} has no 'swap' capability")
    workload = _forced(name, True)
    engine = spec_engine(impl, "qwen3", workload, drafter_seed=7)
    finals = check_run(engine, workload, "qwen3")
    stats = engine.stats.spec_decode
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, stats
    per_sample = [c.spec_decode for out in finals.values() for c in out.outputs]
    assert sum(p.num_draft_tokens for p in per_sample) == stats.num_draft_tokens
    assert sum(p.num_accepted_tokens for p in per_sample) == stats.num_accepted_tokens
    if name in ("recompute", "swap"):
        assert engine.stats.num_preemptions > 0, "the pool was meant to force a preemption"


@pytest.mark.parametrize("phase", ["sample", "update"])
def test_a_failed_speculative_step_fails_only_its_requests(impl, phase):
    """A fault while drafts are being verified (or the cut step applied) fails that step's
    requests with finish_reason "error", leaves the pool consistent (nothing published that
    was not computed: the idle check after the run), and later requests still follow greedy."""
    from enginespec.conformance.strategies import EngineRequestSpec as R

    workload = dataclasses.replace(
        _forced("prefix_hit", True),
        requests=(R("a", tuple(range(10, 22)), 6), R("b", tuple(range(10, 22)), 6)),
    )
    engine = spec_engine(impl, "qwen3", workload, drafter_seed=3)
    fired = []

    def hook(name):
        if name == phase and not fired and any(r.spec_token_ids for r in engine.scheduler.running):
            fired.append(name)
            raise RuntimeError("injected")

    engine.fault_hook = hook
    finals = run_workload(engine, workload)
    assert fired, "no speculative step ran"
    assert {c.finish_reason for out in finals.values() for c in out.outputs} == {"error"}
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    engine.fault_hook = None
    again = dataclasses.replace(workload, requests=(R("c", tuple(range(10, 22)), 6),))
    check_run(engine, again, "qwen3")  # the prefix cache the failed step left is sound


def test_sampled_requests_under_speculation_and_preemption(impl):
    """Sampled rows (temperature, top-k, a penalty) are verified by rejection sampling through
    the whole engine while the pool forces preemption: every request ends with its length,
    tokens in the vocabulary, the pool idle, and drafts were verified."""
    from enginespec.spec import SamplingParams

    workload = _forced("recompute", True)
    engine = spec_engine(impl, "qwen3", workload, drafter_seed=5)
    params = SamplingParams(max_tokens=6, temperature=0.8, top_k=5, repetition_penalty=1.2, ignore_eos=True)
    run_sampled(engine, workload, params)
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    assert engine.stats.num_preemptions > 0 and engine.stats.spec_decode.num_draft_tokens > 0


class WrongDrafter(OracleDrafter):
    """The oracle's drafts, every one shifted to a wrong id: each proposal is rejected outright."""

    def propose(self, request, num_real: int, max_drafts: int) -> list[int]:
        ref, _ = hf_greedy(self.family, tuple(request.prompt_token_ids))
        done = num_real - request.num_prompt_tokens
        return [(t + 1) % self.vocab for t in ref[done : done + min(3, max_drafts)]]


def recorded(engine) -> list[tuple[int, list[str]]]:
    """(running requests, ids of the drafted ones) of every proposal the engine makes from
    now on, the i-th entry being the decoder's step i + 1."""
    log: list[tuple[int, list[str]]] = []
    propose = engine.spec.propose

    def wrapper(running, placeholder):
        num = propose(running, placeholder)
        drafted = [r.request_id for r in running if r.spec_token_ids]
        assert num == len(drafted)
        log.append((len(running), drafted))
        return num

    engine.spec.propose = wrapper
    return log


def _staggered(lengths=(2, 5, 8)):
    """Three requests arriving together whose outputs end at different steps."""
    from enginespec.conformance.strategies import EngineRequestSpec as R

    requests = tuple(R(f"r{i}", tuple(range(10 + 5 * i, 16 + 5 * i)), n) for i, n in enumerate(lengths))
    return dataclasses.replace(_forced("prefix_hit", True), requests=requests)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_no_drafts_while_running_requests_reach_disable_by_batch_size(impl, async_scheduling):
    """disable_by_batch_size=2: while two or three requests run, no request carries drafts (the
    oracle would draft every step); once one runs alone it is drafted again; greedy parity."""
    workload = _staggered()
    config = {**NGRAM, "disable_by_batch_size": 2}
    engine = engine_for(impl, "qwen3", workload, speculative_config=config, async_scheduling=async_scheduling)
    engine.spec.drafter = OracleDrafter("qwen3", tiny_vocab("qwen3"), random.Random(0), corrupt=0.0)
    log = recorded(engine)
    check_run(engine, workload, "qwen3")
    assert log and all(not ids for running, ids in log if running >= 2), log
    assert any(ids for running, ids in log if running == 1), f"never drafted alone: {log}"
    assert engine.spec.num_disabled_steps == sum(1 for running, _ in log if running >= 2)
    assert engine.stats.spec_decode.num_accepted_tokens > 0


def test_drafts_always_rejected_are_proposed_less_and_output_stays_greedy(impl):
    """A drafter that is always wrong: after the first miss each request is drafted only on the
    aligned probe steps (1, 2, 4, 8 of the decoder's clock), with one draft each; greedy parity."""
    workload = _staggered((8, 8, 8))
    engine = engine_for(impl, "qwen3", workload, speculative_config=NGRAM)
    engine.spec.drafter = WrongDrafter("qwen3", tiny_vocab("qwen3"), random.Random(0))
    log = recorded(engine)
    check_run(engine, workload, "qwen3")
    stats = engine.stats.spec_decode
    assert stats.num_accepted_tokens == 0 and stats.num_drafts > 0
    for r in workload.requests:
        steps = [i + 1 for i, (_, ids) in enumerate(log) if r.request_id in ids]
        # its first decode, then only the shared probe steps: powers of two of the clock
        assert steps and all(s & (s - 1) == 0 for s in steps[1:]), (r.request_id, steps, log)
        assert len(steps) <= 4 < r.max_tokens - 1, (r.request_id, steps)
    assert stats.num_draft_tokens <= 3 * 3 + (stats.num_drafts - 3), "a probe carries one draft"


class ReplayDrafter(Drafter):
    """Drafts = a plain run's own greedy output from the request's position on: every draft is
    accepted, so a stop string can complete in the middle of an accepted run."""

    def __init__(self, outputs: dict):
        self.outputs = outputs  # prompt ids (tuple) -> that prompt's greedy output ids

    def propose(self, request, num_real: int, max_drafts: int) -> list[int]:
        done = num_real - request.num_prompt_tokens
        return list(self.outputs[tuple(request.prompt_token_ids)][done : done + max_drafts])

    def forget(self, request_id: str) -> None:
        pass


class HalfRightDrafter(ReplayDrafter):
    """Two drafts a step: the plain run's next id, then a wrong one (so each verification
    accepts one and rejects one, and adaptive drafting keeps proposing two)."""

    def propose(self, request, num_real: int, max_drafts: int) -> list[int]:
        drafts = super().propose(request, num_real, min(2, max_drafts))
        return drafts[:1] + [(t + 1) % 90 + 4 for t in drafts[1:]]


def test_rejected_drafts_evict_no_cached_prefix_that_plain_decoding_keeps(impl):
    """A speculative step's rejected drafts' blocks are trimmed and the next step allocates
    again: a block handed back without a hash must be handed out again before any cached block,
    or every such step evicts one more idle cached prefix block than plain decoding does (here
    a prompt computed earlier loses its cache hit to a decode that never needed its blocks)."""
    from enginespec.llm import LLM
    from enginespec.spec import SamplingParams
    from enginespec.testing.checkpoints import tiny_model_dir

    cached_prompt = [(5 * j) % 90 + 4 for j in range(24)]  # 6 full blocks, 20 tokens findable
    decode = [7, 8, 9, 10]  # even: a step computes 2, so every other step trims a block
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    kwargs = dict(impl=impl, dtype="float32", device="cpu", block_size=4, num_blocks=14)
    one = SamplingParams(max_tokens=1)

    def hit_after_decoding(llm) -> tuple:
        llm.generate([{"prompt_token_ids": cached_prompt}], one, use_tqdm=False)
        out = llm.generate([{"prompt_token_ids": decode}], params, use_tqdm=False)[0].outputs[0]
        again = llm.generate([{"prompt_token_ids": cached_prompt}], one, use_tqdm=False)[0]
        check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
        return again.num_cached_tokens, out.token_ids

    plain_hit, free = hit_after_decoding(LLM(str(tiny_model_dir("qwen3")), **kwargs))
    llm = LLM(str(tiny_model_dir("qwen3")), speculative_config=NGRAM, **kwargs)
    llm.engine.spec.drafter = HalfRightDrafter({tuple(decode): free})
    hits = {"plain": plain_hit, "spec": hit_after_decoding(llm)[0]}
    stats = llm.engine.stats.spec_decode
    assert stats.num_accepted_tokens > 4 and stats.num_draft_tokens - stats.num_accepted_tokens > 4
    assert hits == {"plain": 20, "spec": 20}


def _stops_in_replayed_drafts(impl, async_scheduling, stops_of):
    """Greedy outputs of four prompts with the stops `stops_of(free outputs)` gives (one
    SamplingParams a prompt), from a plain LLM and from an n-gram speculating one whose drafter
    replays the free run's own outputs (so drafts are accepted up to and past each stop).
    Returns (plain outputs, speculative outputs, the speculative LLM)."""
    from enginespec.llm import LLM
    from enginespec.spec import SamplingParams
    from enginespec.testing.checkpoints import tiny_model_dir

    prompts = [[(7 * i + 3 * j) % 90 + 4 for j in range(6 + 3 * i)] for i in range(4)]
    base = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    kwargs = dict(impl=impl, dtype="float32", device="cpu", block_size=4, num_blocks=64)
    plain = LLM(str(tiny_model_dir("qwen3")), **kwargs)
    free = plain.generate([{"prompt_token_ids": p} for p in prompts], base, use_tqdm=False)
    params = [dataclasses.replace(base, **stop) for stop in stops_of(free)]
    config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    spec = LLM(
        str(tiny_model_dir("qwen3")), speculative_config=config, async_scheduling=async_scheduling, **kwargs
    )
    spec.engine.spec.drafter = ReplayDrafter(
        {tuple(p): o.outputs[0].token_ids for p, o in zip(prompts, free)}
    )
    want = plain.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    got = spec.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return want, got, spec


def _seen(outs):
    return [(c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in (o.outputs[0] for o in outs)]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_stop_string_inside_accepted_drafts_ends_the_ids_where_a_plain_run_does(impl, async_scheduling):
    """A stop string completed by an accepted draft (not the step's last id): the output's
    text, ids, finish and stop reasons equal a plain run's (the ids after the one that
    completed it were appended by the scheduler but are not shown), and the pool ends idle."""

    def stops(free):  # stops end inside the output (chars 1-2, 3-4, ...): with 4 drafts a
        # step, most are completed by a draft that has accepted ids after it
        return [{"stop": (o.outputs[0].text[1 + 2 * i : 3 + 2 * i],)} for i, o in enumerate(free)]

    want, got, spec = _stops_in_replayed_drafts(impl, async_scheduling, stops)
    assert _seen(got) == _seen(want)
    assert all(o.outputs[0].finish_reason == "stop" for o in want)
    assert spec.engine.stats.spec_decode.num_accepted_tokens > 0
    check_idle(spec.engine.block_manager.state(), spec.engine.runner.num_blocks)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_generation_tokens_count_only_the_ids_a_stop_string_leaves_shown(impl, async_scheduling):
    """vllm:generation_tokens (LLM.get_metrics) counts the ids the outputs carry: a stop string
    completed inside an accepted run hides the ids after it (they would never have been
    sampled one at a time), so they are not generated tokens either, as the server's counter
    (which counts the ids it streams) and the outputs' usage already say."""

    def stops(free):
        return [{"stop": (o.outputs[0].text[1 + 2 * i : 3 + 2 * i],)} for i, o in enumerate(free)]

    _, got, spec = _stops_in_replayed_drafts(impl, async_scheduling, stops)
    counted = {m.name: m.value for m in spec.get_metrics() if m.name == "vllm:generation_tokens"}
    assert counted["vllm:generation_tokens"] == sum(len(o.outputs[0].token_ids) for o in got)
    assert spec.engine.stats.spec_decode.num_accepted_tokens > 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_stop_token_inside_accepted_drafts_hides_only_itself_from_the_text(impl, async_scheduling):
    """A stop token accepted with other ids in one speculative step: the text leaves out that
    token alone (include_stop_str_in_output off), so text, ids and reasons equal a plain run's.
    The step hands the output processor several ids at once, where a plain run hands one; the
    ids before the stop token in that step must still show."""

    def stops(free):  # each prompt stops at the first id of its output not seen before, from
        # position 3 on (a step of drafts holds ids 1-5: the stop token has accepted ids before it)
        out = []
        for o in free:
            ids = o.outputs[0].token_ids
            k = next(k for k in range(3, len(ids)) if ids[k] not in ids[:k])
            out.append({"stop_token_ids": (ids[k],)})
        return out

    want, got, spec = _stops_in_replayed_drafts(impl, async_scheduling, stops)
    assert _seen(got) == _seen(want)
    assert all(o.outputs[0].finish_reason == "stop" and o.outputs[0].text for o in want)
    assert spec.engine.stats.spec_decode.num_accepted_tokens > 0
    check_idle(spec.engine.block_manager.state(), spec.engine.runner.num_blocks)
