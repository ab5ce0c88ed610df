"""Sleep mode (vLLM's LLM.sleep / wake_up / is_sleeping, enable_sleep_mode=True), offline and
through AsyncLLM's engine process: level 1 frees the KV pool (its storages are 0 bytes) and
moves the weights to host memory (their device storages 0 bytes too), the target's and the
draft model's alike; greedy outputs after wake_up are those before sleep, the prefix cache
starts empty, a request while asleep is refused with nothing queued, tags wake parts, level 3
and a sleep without the flag are refused by name (worker/sleep.py states the rules)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from enginespec.async_llm import AsyncLLM, EngineAsleep, EngineRequestError
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker.sleep import EngineAsleepError, model_tensors

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [{"prompt_token_ids": list(range(5, 45))}, {"prompt_token_ids": [7, 8, 9, 10, 11]}]
GREEDY = SamplingParams(max_tokens=12, temperature=0)
ONE = SamplingParams(max_tokens=1, temperature=0)
FULL_BLOCKS = 32  # PROMPTS[0]'s two full blocks of 16


@pytest.fixture(scope="module")
def llm():
    """With a draft model (the same tiny checkpoint), whose runner sleeps and wakes too."""
    path = str(tiny_model_dir("qwen3"))
    draft = {"method": "draft_model", "model": path, "num_speculative_tokens": 2}
    with LLM(
        path, dtype="float32", device="cpu", num_blocks=32, enable_sleep_mode=True, speculative_config=draft
    ) as llm:
        yield llm


def _greedy(llm) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _runners(llm) -> list:
    return [llm.engine.runner, llm.engine.spec.drafter.runner]  # the target's, the draft's


def _kv_bytes(llm) -> list[int]:
    return [kv.untyped_storage().nbytes() for runner in _runners(llm) for kv in runner.kv_caches]


def _weight_bytes(llm) -> set[int]:
    return {t.untyped_storage().nbytes() for r in _runners(llm) for t in model_tensors(r.model)}


def _merged_decoder_bytes(llm) -> set[int]:
    """The storage sizes of the tensors the merged decoders hold, their tables (rope's cos/sin)
    too: walked here, not by model_tensors, which decides what sleep releases."""
    sizes = set()
    for runner in _runners(llm):
        for module in runner.model.merged.modules():
            for value in (*module._parameters.values(), *module._buffers.values(), *vars(module).values()):
                if isinstance(value, torch.Tensor):
                    sizes.add(value.untyped_storage().nbytes())
    return sizes


def test_level_1_frees_the_pool_and_weights_and_wakes_to_the_same_outputs_and_an_empty_cache(llm):
    want = _greedy(llm)
    assert llm.generate(PROMPTS[0], ONE, use_tqdm=False)[0].num_cached_tokens == FULL_BLOCKS
    weights = {name: p.detach().clone() for name, p in llm.engine.model.hf_model.named_parameters()}
    llm.sleep(level=1)
    assert llm.is_sleeping() and llm.llm_engine.is_sleeping()
    assert set(_kv_bytes(llm)) == {0} and _weight_bytes(llm) == {0}
    assert _merged_decoder_bytes(llm) == {0}  # the merged decoders' own tensors are released too
    assert llm.engine.block_manager.state().cached == {}  # the prefix cache went with the pool
    llm.wake_up()
    assert not llm.is_sleeping() and 0 not in _kv_bytes(llm) and 0 not in _weight_bytes(llm)
    assert not any(kv.any() for r in _runners(llm) for kv in r.kv_caches)  # the pool wakes zeroed, not kept
    for name, p in llm.engine.model.hf_model.named_parameters():
        assert torch.equal(p, weights[name]), name  # exactly the values: not close, equal
    assert llm.generate(PROMPTS[0], ONE, use_tqdm=False)[0].num_cached_tokens == 0
    assert _greedy(llm) == want
    llm.sleep()  # a second cycle too
    llm.wake_up()
    assert _greedy(llm) == want


def test_generate_while_asleep_raises_and_queues_nothing(llm):
    want = _greedy(llm)
    llm.sleep()
    with pytest.raises(EngineAsleepError, match=r"asleep .*call wake_up\(\)"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert isinstance(EngineAsleepError("x"), RuntimeError)
    assert llm.engine.num_unfinished == 0 and llm.engine.block_manager.num_free == 32
    llm.wake_up()
    assert _greedy(llm) == want


def test_tags_wake_parts_and_waking_an_awake_tag_changes_nothing(llm):
    want = _greedy(llm)
    llm.sleep()
    llm.wake_up(tags=["weights"])
    assert llm.is_sleeping() and set(_kv_bytes(llm)) == {0} and 0 not in _weight_bytes(llm)
    with pytest.raises(EngineAsleepError, match=r"\(kv_cache released"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.wake_up(tags=["weights"])  # not asleep: left alone
    assert llm.is_sleeping()
    llm.wake_up(tags=["kv_cache"])
    assert not llm.is_sleeping() and 0 not in _kv_bytes(llm)
    llm.wake_up()  # awake: nothing to do
    assert _greedy(llm) == want


def test_graphs_are_dropped_at_sleep_and_captured_again_once_every_tag_is_awake(llm, monkeypatch):
    """CUDA graphs hold the pool's and the weights' device pointers, which a sleep changes: the
    runner drops them at sleep and captures them again only when nothing sleeps any more (here
    on the CPU the capture is a stub that records its calls)."""
    runner = llm.engine.runner
    captured = []
    monkeypatch.setattr(runner, "_wants_graphs", True)
    monkeypatch.setattr(runner, "graphs", None)
    monkeypatch.setattr(runner, "_capture_graphs", lambda: captured.append(runner.sleeping_tags))
    llm.sleep()
    llm.wake_up(tags=["kv_cache"])
    assert captured == []  # the weights still sleep: no capture over 0-byte storages
    llm.wake_up(tags=["weights"])
    assert captured == [()]
    runner.graphs = object()  # a captured set: a wake with nothing asleep captures nothing more
    llm.wake_up()
    assert len(captured) == 1
    llm.sleep()
    assert runner.graphs is None  # dropped with the storages they point into
    llm.wake_up()
    assert len(captured) == 2


def test_refusals_change_nothing(llm, monkeypatch):
    """Level 3 (levels are 1 and 2; level 2: tests/api/test_weight_update.py), an unknown tag,
    a sleep while a request is unfinished, and sleep mode off: each an error naming what to
    change, the engine still awake."""
    with pytest.raises(ValueError, match=r"level must be one of \[1, 2\]"):
        llm.sleep(level=3)
    with pytest.raises(ValueError, match="tags must be among"):
        llm.wake_up(tags=["kv"])
    stream = llm.stream(PROMPTS[1], GREEDY)
    next(stream)  # running: it holds blocks
    with pytest.raises(RuntimeError, match=r"1 unfinished request\(s\); finish or abort them first"):
        llm.sleep()
    stream.close()
    monkeypatch.setattr(llm.engine.args, "enable_sleep_mode", False)
    for call in (llm.sleep, llm.wake_up):
        with pytest.raises(RuntimeError, match=r"needs sleep mode: .*enable_sleep_mode=True"):
            call()
    assert not llm.is_sleeping() and 0 not in _kv_bytes(llm) and 0 not in _weight_bytes(llm)


# ---- AsyncLLM: the same calls, taken by the engine process between two steps --------------------


def test_async_sleep_wake_up_and_is_sleeping_cross_to_the_engine():
    engine = AsyncLLM(
        str(tiny_model_dir("qwen3")),
        in_process=True,
        start_timeout=120,
        dtype="float32",
        device="cpu",
        num_blocks=32,
        enable_sleep_mode=True,
    )

    async def tokens(request_id: str) -> list[int]:
        outs = [out async for out in engine.generate(PROMPTS[0], GREEDY, request_id)]
        return outs[-1].outputs[0].token_ids

    async def run():
        want = await tokens("a")
        await engine.sleep(1)
        assert await engine.is_sleeping()
        with pytest.raises(EngineAsleep, match="asleep"):
            await tokens("b")
        with pytest.raises(ValueError, match="level must be one of"):
            await engine.sleep(3)
        await engine.wake_up(["weights"])
        assert await engine.is_sleeping()
        await engine.wake_up()
        assert not await engine.is_sleeping()
        assert await tokens("c") == want

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()
    assert issubclass(EngineAsleep, EngineRequestError)
