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
