"""vLLM users' import paths for params and prompts: `enginespec.sampling_params` and
`enginespec.inputs` stand where `vllm.sampling_params` and `vllm.inputs` do, with the same
objects as the top-level names, and the prompt TypedDicts drive LLM.generate and beam_search as
the plain dicts they are."""

from __future__ import annotations

import pytest

import enginespec
from enginespec.inputs import TextPrompt, TokensPrompt
from enginespec.sampling_params import (
    BeamSearchParams,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_the_params_module_holds_the_top_level_objects():
    assert SamplingParams is enginespec.SamplingParams
    assert BeamSearchParams is enginespec.BeamSearchParams
    assert RequestOutputKind is enginespec.RequestOutputKind
    assert StructuredOutputsParams is enginespec.StructuredOutputsParams


def test_prompt_types_are_the_dicts_generate_takes():
    from enginespec.llm import LLM

    llm = LLM(str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", num_blocks=32)
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    ids = list(range(5, 25))
    by_type = llm.generate([TokensPrompt(prompt_token_ids=ids, cache_salt="a")], greedy, use_tqdm=False)
    by_dict = llm.generate([{"prompt_token_ids": ids, "cache_salt": "a"}], greedy, use_tqdm=False)
    assert by_type[0].outputs[0].token_ids == by_dict[0].outputs[0].token_ids
    text = llm.generate(TextPrompt(prompt="hello there"), greedy, use_tqdm=False)[0]
    assert text.prompt == "hello there" and len(text.outputs[0].token_ids) == 4
    beams = llm.beam_search(
        [TokensPrompt(prompt_token_ids=ids)], BeamSearchParams(beam_width=2, max_tokens=3)
    )
    assert len(beams[0].sequences) == 2 and beams[0].sequences[0].tokens[: len(ids)] == ids


def test_vllm_top_level_names_import_from_enginespec():
    """vLLM's examples import their output and prompt types from the top (`from vllm import
    EngineArgs, LLMEngine, RequestOutput, SamplingParams` in llm_engine_example.py,
    `AsyncEngineArgs` beside AsyncLLM): each was an ImportError here. They are the objects of
    enginespec.outputs, enginespec.inputs and EngineArgs itself (AsyncLLM.from_engine_args
    takes an EngineArgs)."""
    from enginespec import (
        AsyncEngineArgs,
        CompletionOutput,
        EngineArgs,
        PromptType,
        RequestOutput,
        inputs,
        outputs,
    )

    assert RequestOutput is outputs.RequestOutput and CompletionOutput is outputs.CompletionOutput
    assert enginespec.TextPrompt is TextPrompt and enginespec.TokensPrompt is TokensPrompt
    assert PromptType is inputs.PromptType
    assert AsyncEngineArgs is EngineArgs
    for name in (
        "AsyncEngineArgs",
        "CompletionOutput",
        "PromptType",
        "RequestOutput",
        "TextPrompt",
        "TokensPrompt",
    ):
        assert name in enginespec.__all__
