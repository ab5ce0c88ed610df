"""The prompts argument of LLM.generate, stream, beam_search and chat as vLLM users pass it:
something that is neither a prompt nor a list of prompts (None, a number) is a ValueError
naming the argument, raised before any request is queued."""

from __future__ import annotations

import pytest

from enginespec.beam_search import BeamSearchParams
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GREEDY = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(
        str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", block_size=4, num_blocks=32
    )


@pytest.mark.parametrize("prompts", [None, 5, 2.5], ids=["none", "int", "float"])
def test_a_prompts_argument_that_is_no_prompt_is_a_value_error_naming_it(llm, prompts):
    calls = [
        lambda: llm.generate(prompts, GREEDY, use_tqdm=False),
        lambda: list(llm.stream(prompts, GREEDY)),
        lambda: llm.beam_search(prompts, BeamSearchParams(beam_width=2, max_tokens=2)),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="prompts"):
            call()
    with pytest.raises(ValueError, match="messages"):
        llm.chat(prompts, GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished
    assert llm.generate([[5, 6]], GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_a_text_prompt_that_encodes_to_no_tokens_names_the_prompt(llm):
    # The engine's own refusal named prompt_token_ids, a field a text caller never passed.
    for call in (
        lambda: llm.generate(["hi", ""], GREEDY, use_tqdm=False),
        lambda: list(llm.stream({"prompt": ""}, GREEDY)),
    ):
        with pytest.raises(ValueError, match="prompt '' encodes to no tokens"):
            call()
    assert not llm.engine.has_unfinished
    assert llm.generate("hi", GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"
