"""LLM.reset_prefix_cache (vLLM's name and return): after it, a prompt the cache served is
computed in full again (RequestOutput.num_cached_tokens drops from its full blocks to 0); while a
request holds blocks it returns False and changes nothing (the same prompt still hits once that
request is gone). Both impls: each BlockManager enforces the rule (spec/block_manager.py), the
engine and LLM only pass it on."""

from __future__ import annotations

import pytest

from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPT = {"prompt_token_ids": list(range(5, 45))}  # 40 ids: two full blocks of 16 to cache
FULL_BLOCKS = 32
ONE = SamplingParams(max_tokens=1, temperature=0)


@pytest.fixture(scope="module", params=["reference", "fast"])
def llm(request):
    return LLM(str(tiny_model_dir("qwen3")), impl=request.param, dtype="float32", device="cpu", num_blocks=32)


def _cached(llm, prompt=PROMPT) -> int:
    return llm.generate(prompt, ONE, use_tqdm=False)[0].num_cached_tokens


def test_reset_makes_the_next_prefill_cold(llm):
    assert llm.reset_prefix_cache() is True
    assert _cached(llm) == 0
    assert _cached(llm) == FULL_BLOCKS  # the second identical prompt hits the cache
    assert llm.reset_prefix_cache() is True
    assert _cached(llm) == 0  # ... and after a reset it does not
    assert llm.reset_prefix_cache() is True  # idempotent on an idle engine


def test_reset_while_a_request_holds_blocks_is_refused_and_changes_nothing(llm):
    assert llm.reset_prefix_cache() is True
    _cached(llm)  # PROMPT's blocks are cached now
    bm = llm.engine.block_manager
    stream = llm.stream({"prompt_token_ids": [7] * 20}, SamplingParams(max_tokens=8, temperature=0))
    next(stream)  # running: its blocks are referenced
    free_before = bm.num_free
    assert llm.reset_prefix_cache() is False
    assert bm.num_free == free_before
    stream.close()  # aborted: its blocks go back to the free queue
    assert _cached(llm) == FULL_BLOCKS  # the refused reset forgot nothing
    assert llm.reset_prefix_cache() is True
    assert _cached(llm) == 0
