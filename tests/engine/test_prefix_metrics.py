"""The prefix-cache counters the server's /metrics shows (vllm:prefix_cache_queries / _hits,
engine/core_proc.engine_state), in vLLM's units: every token of each looked-up request, and the
tokens of the cached blocks found. Queries counted only the looked-up full blocks (192 for two
100-token prompts at block 16, where vLLM counts 200), so the hit rate read too high."""

from __future__ import annotations

import pytest

from enginespec.engine.core_proc import engine_state
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_queries_count_every_prompt_token_hits_the_cached_blocks_tokens(impl):
    from enginespec.llm import LLM

    llm = LLM(str(tiny_model_dir("qwen3")), impl=impl, dtype="float32", device="cpu", num_blocks=32)
    prompt = {"prompt_token_ids": [4 + i % 90 for i in range(100)]}
    before = engine_state(llm.engine, False)
    for _ in range(2):
        llm.generate(prompt, SamplingParams(max_tokens=2), use_tqdm=False)
    after = engine_state(llm.engine, False)
    assert after.num_prefix_queries - before.num_prefix_queries == 200
    assert after.num_prefix_hits - before.num_prefix_hits == 96  # (100 - 1) // 16 blocks of 16
    # n = 3: each sample is looked up, as vLLM's child requests are
    llm.generate({"prompt_token_ids": [5] * 40}, SamplingParams(max_tokens=2, n=3), use_tqdm=False)
    assert engine_state(llm.engine, False).num_prefix_queries - after.num_prefix_queries == 120


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_request_is_counted_once_at_its_admission_under_memory_pressure(mode):
    """vLLM records a request's lookup when it is admitted, and leaves out both the lookups of a
    request the pool cannot take yet and the re-admissions of a preempted one (its own blocks
    found again are not prefix-cache hits). Counting every lookup made a pool under pressure show
    queries many times the prompt tokens and a hit rate of distinct prompts well above zero."""
    from enginespec.llm import LLM

    llm = LLM(
        str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu",
        num_blocks=12, block_size=4, preemption_mode=mode,
    )  # fmt: skip
    prompts = [[4 + i] + [10 + (7 * i + j) % 80 for j in range(9)] for i in range(5)]  # distinct first blocks
    before = engine_state(llm.engine, False)
    llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(max_tokens=20, ignore_eos=True),
        use_tqdm=False,
    )
    after = engine_state(llm.engine, False)
    assert after.num_preemptions > before.num_preemptions  # five of 8 blocks each in a pool of 12
    assert after.num_prefix_queries - before.num_prefix_queries == sum(map(len, prompts))
    assert after.num_prefix_hits - before.num_prefix_hits == 0


def test_the_warm_up_leaves_the_prefix_counters_at_zero():
    """The warm-up (on by default on CUDA) leaves no trace in the counters /metrics shows: its
    requests' lookups were kept by the block manager, so a fresh server's
    vllm:prefix_cache_queries started at the warm-up's tokens."""
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs

    args = EngineArgs.from_kwargs(
        str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", block_size=4, num_blocks=40, warmup=True
    )
    engine = EngineCore(args)
    assert engine.warmup_report.num_requests > 0
    state = engine_state(engine, False)
    assert (state.num_prefix_queries, state.num_prefix_hits) == (0, 0)
