"""LLM.reset_prefix_cache (vLLM's name and return): after it, a prompt the cache served is
computed in full again (RequestOutput.num_cached_tokens drops from its full blocks to 0); while a
request holds blocks it returns False and changes nothing (the same prompt still hits once that
request is gone). Both impls: each BlockManager enforces the rule (spec/block_manager.py), the
engine and LLM only pass it on."""

from __future__ import annotations

import asyncio

import pytest

from enginespec.async_llm import AsyncLLM, EngineDead
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


# ---- AsyncLLM: the same call, taken by the engine process between two steps --------------------


@pytest.fixture(scope="module")
def async_llm():
    engine = AsyncLLM(
        str(tiny_model_dir("qwen3")),
        in_process=True,
        start_timeout=120,
        dtype="float32",
        device="cpu",
        num_blocks=32,
    )
    yield engine
    engine.shutdown()


async def _async_cached(engine, request_id: str) -> int:
    outs = [out async for out in engine.generate(PROMPT, ONE, request_id)]
    return outs[-1].num_cached_tokens


def test_async_reset_makes_the_next_prefill_cold(async_llm):
    async def run():
        assert await async_llm.reset_prefix_cache() is True
        first, second = await _async_cached(async_llm, "a1"), await _async_cached(async_llm, "a2")
        assert await async_llm.reset_prefix_cache() is True
        return first, second, await _async_cached(async_llm, "a3")

    assert asyncio.run(run()) == (0, FULL_BLOCKS, 0)


def test_async_reset_while_a_request_holds_blocks_is_refused(async_llm):
    """A request past its first step holds blocks: the engine is paused there (it takes
    commands, runs no step), so the reset meets it running; it is refused and forgets nothing."""

    async def run():
        assert await async_llm.reset_prefix_cache() is True
        await _async_cached(async_llm, "warm")  # PROMPT's blocks are cached now
        gen = async_llm.generate([7] * 20, SamplingParams(max_tokens=200, temperature=0), "long")
        await gen.__anext__()  # its first step ran
        await async_llm._client.pause()
        assert async_llm.num_unfinished_requests == 1  # still running (200 tokens to go)
        refused = await async_llm.reset_prefix_cache()
        await gen.aclose()  # aborts it: its blocks go back to the free queue
        await async_llm._client.resume()
        return refused, await _async_cached(async_llm, "after")

    assert asyncio.run(run()) == (False, FULL_BLOCKS)


def test_async_reset_after_shutdown_raises_engine_dead():
    engine = AsyncLLM(
        str(tiny_model_dir("qwen3")), in_process=True, start_timeout=120, dtype="float32", device="cpu"
    )
    engine.shutdown()
    with pytest.raises(EngineDead):
        asyncio.run(engine.reset_prefix_cache())


def test_reset_running_requests_true_is_a_value_error_naming_it(llm, async_llm):
    """vLLM's keyword: False is taken (the call as it was), True (preempt the running requests
    to empty the cache) is refused naming it, on LLM and AsyncLLM alike; it was a TypeError
    (unexpected keyword), and the refusal forgets nothing."""
    assert llm.reset_prefix_cache(reset_running_requests=False) is True
    _cached(llm)
    with pytest.raises(ValueError, match="reset_running_requests"):
        llm.reset_prefix_cache(reset_running_requests=True)
    assert _cached(llm) == FULL_BLOCKS

    async def run():
        assert await async_llm.reset_prefix_cache(reset_running_requests=False) is True
        with pytest.raises(ValueError, match="reset_running_requests"):
            await async_llm.reset_prefix_cache(reset_running_requests=True)

    asyncio.run(run())
