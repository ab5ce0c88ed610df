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


@pytest.mark.parametrize(
    "prompt, match",
    [
        ({"prompt_token_ids": None}, "prompt_token_ids must be a list of token ids, got NoneType"),
        ({"prompt_token_ids": 5}, "prompt_token_ids must be a list of token ids, got int"),
        ({"prompt_token_ids": {5: 6}}, "prompt_token_ids must be a list of token ids, got dict"),
        ({"prompt_token_ids": {5, 6}}, "prompt_token_ids must be a list of token ids, got set"),
        ({"prompt_token_ids": [5], "prompt": 7}, "'prompt' must be a str"),
        ({"prompt": [5, 6]}, "'prompt' must be a str"),
        ({"prompt": None}, "'prompt' must be a str"),
    ],
    ids=["ids-none", "ids-int", "ids-dict", "ids-set", "ids-with-bad-text", "text-as-ids", "text-none"],
)
def test_a_dict_prompt_of_the_wrong_types_is_a_value_error_naming_the_key(llm, prompt, match):
    # None or an int was a bare "not iterable" TypeError naming no key; a dict or a set of ids was
    # taken as its keys (a prompt nobody wrote), and ids under "prompt" as if a TokensPrompt.
    with pytest.raises(ValueError, match=match):
        llm.generate(prompt, GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished


def test_a_tokens_prompt_takes_any_sequence_of_ids(llm):
    import numpy as np

    want = llm.generate({"prompt_token_ids": [5, 6]}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    for ids in ((5, 6), np.array([5, 6]), range(5, 7)):
        out = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
        assert out.prompt_token_ids == [5, 6] and out.outputs[0].token_ids == want


def test_stream_without_sampling_params_streams_the_default_ones(llm):
    """stream(prompts) takes vLLM's default: sampling_params None, the engine's default
    SamplingParams for every prompt (as generate(prompts) does), cumulative outputs."""
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}]
    outs = [out for step in llm.stream(prompts) for out in step]
    finals = [out for out in outs if out.finished]
    assert len(finals) == 2 and all(f.outputs[0].token_ids for f in finals)
    for final in finals:  # cumulative: each output of a request extends its last one
        seen = [o.outputs[0].token_ids for o in outs if o.request_id == final.request_id]
        assert all(b[: len(a)] == a for a, b in zip(seen, seen[1:]))
