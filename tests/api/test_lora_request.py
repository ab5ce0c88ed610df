"""vLLM's `lora_request` keyword, which ported programs pass as None when they load no adapter
(lm-evaluation-harness's vLLM backend, `llm.generate(prompts, params, lora_request=self.lora_request)`):
None, or a list of Nones, runs as without it, on LLM.generate, LLM.chat, LLM.beam_search (third
positionally too, as vLLM's), AsyncLLM.generate and AsyncLLM.beam_search; an adapter is a
ValueError naming lora_request (this engine loads no LoRA adapters, as EngineArgs'
enable_lora=False says). It was a TypeError for every value."""

from __future__ import annotations

import asyncio

import pytest

from enginespec import AsyncLLM
from enginespec.beam_search import BeamSearchParams
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", dtype="float32", device="cpu", num_blocks=32)
PROMPTS = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}]
GREEDY = SamplingParams(max_tokens=3, temperature=0)
CHAT = [{"role": "user", "content": "hi"}]
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


class _Adapter:  # stands in for vllm.lora.request.LoRARequest
    lora_name = "adapter"


def _ids(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def llm():
    return LLM(str(tiny_model_dir("qwen3")), **ENGINE)


def test_generate_and_chat_take_lora_request_none(llm):
    want = _ids(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    assert _ids(llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=None)) == want
    assert _ids(llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=[None, None])) == want
    chat = llm.chat(CHAT, GREEDY, use_tqdm=False, chat_template=TEMPLATE)
    assert _ids(llm.chat(CHAT, GREEDY, use_tqdm=False, chat_template=TEMPLATE, lora_request=None)) == _ids(
        chat
    )
    beams = llm.beam_search(PROMPTS[:1], BeamSearchParams(beam_width=2, max_tokens=2))
    again = llm.beam_search(PROMPTS[:1], BeamSearchParams(beam_width=2, max_tokens=2), lora_request=None)
    assert [s.tokens for s in again[0].sequences] == [s.tokens for s in beams[0].sequences]


def test_beam_search_takes_lora_request_third_positionally_as_vllm(llm):
    """vLLM's signature is beam_search(prompts, params, lora_request=None, use_tqdm=False,
    concurrency_limit=None): a ported call passing None third, or all five positionally, runs
    (it was a TypeError: the three were keyword-only), and an adapter third is refused by name."""
    params = BeamSearchParams(beam_width=2, max_tokens=2)
    want = [s.tokens for s in llm.beam_search(PROMPTS[:1], params)[0].sequences]
    assert [s.tokens for s in llm.beam_search(PROMPTS[:1], params, None)[0].sequences] == want
    assert [s.tokens for s in llm.beam_search(PROMPTS[:1], params, None, False, 1)[0].sequences] == want
    with pytest.raises(ValueError, match="lora_request"):
        llm.beam_search(PROMPTS[:1], params, _Adapter())


@pytest.mark.parametrize("lora", [_Adapter(), [None, _Adapter()]])
def test_an_adapter_is_refused_naming_lora_request_before_anything_runs(llm, lora):
    with pytest.raises(ValueError, match="lora_request"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=lora)
    with pytest.raises(ValueError, match="lora_request"):
        llm.chat(CHAT, GREEDY, use_tqdm=False, chat_template=TEMPLATE, lora_request=lora)
    with pytest.raises(ValueError, match="lora_request"):
        llm.beam_search(PROMPTS[:1], BeamSearchParams(beam_width=2, max_tokens=2), lora_request=lora)
    assert not llm.engine.has_unfinished


def test_async_generate_takes_lora_request_none():
    engine = AsyncLLM(str(tiny_model_dir("qwen3")), in_process=True, start_timeout=120, **ENGINE)
    try:

        async def run(lora):
            return [o async for o in engine.generate(PROMPTS[0], GREEDY, "r", lora_request=lora)][-1]

        assert asyncio.run(run(None)).outputs[0].finished()
        with pytest.raises(ValueError, match="lora_request"):
            asyncio.run(run(_Adapter()))
    finally:
        engine.shutdown()


def test_async_beam_search_takes_lora_request_none():
    """vLLM's EngineClient.beam_search(prompt, request_id, params, lora_request=None), which its
    server calls with lora_request= always: None runs as without it, an adapter is a ValueError
    naming lora_request before any step (both were TypeErrors)."""
    engine = AsyncLLM(str(tiny_model_dir("qwen3")), in_process=True, start_timeout=120, **ENGINE)
    params = BeamSearchParams(beam_width=2, max_tokens=2)
    try:

        async def run(request_id, **kwargs):
            return [o async for o in engine.beam_search(PROMPTS[0], request_id, params, **kwargs)][-1]

        want = [s.token_ids for s in asyncio.run(run("b0")).outputs]
        assert [s.token_ids for s in asyncio.run(run("b1", lora_request=None)).outputs] == want
        with pytest.raises(ValueError, match="lora_request"):
            asyncio.run(run("b2", lora_request=_Adapter()))
        assert engine.num_unfinished_requests == 0
    finally:
        engine.shutdown()
