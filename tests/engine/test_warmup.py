"""The warm-up at construction (engine/warmup.py) leaves no trace: an engine warmed up with
EngineArgs.warmup=True generates exactly what a cold one does (seeded and unseeded rows under a
fixed engine seed, penalties, logprobs), with stats from zero, the pool idle and the startup
figures recorded. On the CPU the warm-up is off by default and tiny when forced."""

from __future__ import annotations

import pytest

from enginespec.conformance.invariants import check_idle
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

PROMPTS = [{"prompt_token_ids": [(3 * i + j) % 90 + 4 for j in range(4 + 3 * i)]} for i in range(4)]
PARAMS = [
    SamplingParams(max_tokens=5, temperature=0.0),
    SamplingParams(max_tokens=6, temperature=0.8, seed=3, logprobs=2),
    SamplingParams(max_tokens=4, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.3),
    SamplingParams(max_tokens=5, temperature=1.0),
]


def _run(warmup, model=None):
    """An LLM (over `model`'s loaded weights when given: no second load) and its outputs."""
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs
    from enginespec.llm import LLM

    args = EngineArgs.from_kwargs(
        str(tiny_model_dir("qwen3")),
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=40,
        seed=0,
        warmup=warmup,
    )
    llm = LLM.from_engine(EngineCore(args, model=model))
    stats = llm.engine.stats
    assert stats.num_steps == 0 and stats.num_generated_tokens == 0
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
    assert llm.startup_seconds > 0 and (stats.warmup_seconds > 0) == bool(warmup)
    phases = stats.startup_phases  # every phase that ran, adding up to the whole
    assert list(phases)[0] == "load" and list(phases)[-2:] == ["warm_up", "other"]
    assert phases["warm_up"] == stats.warmup_seconds
    assert sum(phases.values()) == pytest.approx(llm.startup_seconds)
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return llm, [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


def test_warm_engine_generates_what_a_cold_one_does():
    cold, cold_out = _run(None)
    assert cold.engine.warmup_report is None  # off by default on the CPU
    warm, warm_out = _run(True, cold.engine.model)
    assert warm.engine.warmup_report.num_requests > 0
    assert warm_out == cold_out


def test_warm_up_fits_a_tiny_pool():
    """A pool of 3 one-token blocks (as GPU tests configure): warm-up prompts shrink to fit
    alone in the pool instead of failing the engine's construction; the pool is idle after."""
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs

    args = EngineArgs.from_kwargs(
        str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", block_size=1, num_blocks=3, warmup=True
    )
    engine = EngineCore(args)
    report = engine.warmup_report
    assert report.num_requests > 0 and report.num_steps > 0
    assert 0 <= report.precompile_seconds <= report.seconds  # on the CPU: no sampler precompile
    assert f"{report.precompile_seconds:.1f} s compiling the sampler" in report.line()
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)


def test_warm_up_fits_a_small_budget_without_chunked_prefill():
    """With chunked prefill off, a request must prefill in one step (prompt + max_tokens - 1 <=
    max_num_batched_tokens, the scheduler's add() rule): warm-up prompts shrink to it too. The
    H200 parity test's workloads (budget 12, chunked prefill off) failed construction before; on
    the CPU the warm-up's 3-token prompts need a budget of 3 to show it."""
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs

    args = EngineArgs.from_kwargs(
        str(tiny_model_dir("qwen3")),
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=64,
        max_num_batched_tokens=3,
        max_num_seqs=3,
        enable_chunked_prefill=False,
        warmup=True,
    )
    engine = EngineCore(args)
    assert engine.warmup_report.num_requests > 0
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)


# Drafts and rejections both happen on these: a prompt that repeats (the n-gram drafter finds
# it) and random rows (temperature 1.0), whose drafts are mostly rejected (the back-off then
# depends on the decoder's step clock).
SPEC_PROMPTS = [{"prompt_token_ids": ([5, 6, 7, 8] * 6)[: 10 + i]} for i in range(4)]
SPEC_PARAMS = SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True)


def _speculating(config: dict, model, draft_model=None):
    """An engine (cold: no warm-up) with speculative_config `config` over `model`."""
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs

    args = EngineArgs.from_kwargs(
        str(tiny_model_dir("qwen3")),
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=40,
        max_model_len=64,
        seed=0,
        warmup=False,
        speculative_config={**config, "disable_by_batch_size": None},
    )
    return EngineCore(args, model=model, draft_model=draft_model)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_a_warm_engine_speculates_as_a_cold_one_does(method):
    """Under speculation too, the warm-up leaves no trace: unseeded random rows (drafted, mostly
    rejected, backed off) come out as a cold engine's. The warm-up here is the CUDA one (longer
    prompts, four tokens each), whose drafted random rows draw from the verifier's generator;
    the decoder's step clock, which times the re-probes of backed-off requests, advances in any
    warm-up. Both must be as constructed after it (they were not: the outputs differed)."""
    from enginespec.engine.warmup import warm_up
    from enginespec.llm import LLM

    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    cold = _speculating(config, None)
    draft = None
    if method == "draft_model":  # the target itself as the draft: every row is drafted
        config = {"method": "draft_model", "model": str(tiny_model_dir("qwen3")), "num_speculative_tokens": 3}
        draft = cold.model
        cold = _speculating(config, cold.model, draft)
    warm = _speculating(config, cold.model, draft)
    assert warm_up(warm, tiny=False, progress=False).num_requests > 0
    assert warm.stats.spec_decode is warm.spec.stats and warm.stats.spec_decode.num_drafts == 0
    outputs = []
    for engine in (cold, warm):
        outs = LLM.from_engine(engine).generate(SPEC_PROMPTS, SPEC_PARAMS, use_tqdm=False)
        outputs.append([o.outputs[0].token_ids for o in outs])
        check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    assert cold.stats.spec_decode.num_drafts > 0
    assert outputs[1] == outputs[0]
