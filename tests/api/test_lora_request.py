"""vLLM's `lora_request` keyword, which ported programs pass as None when they load no adapter
(lm-evaluation-harness's vLLM backend, `llm.generate(prompts, params, lora_request=self.lora_request)`):
None, or a list of Nones, runs as without it, on LLM.generate, LLM.chat, LLM.beam_search and
AsyncLLM.generate; an adapter is a ValueError naming lora_request (this engine loads no LoRA
adapters, as EngineArgs' enable_lora=False says). It was a TypeError for every value."""

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
