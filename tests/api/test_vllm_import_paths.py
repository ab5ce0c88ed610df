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


def test_cleanup_dist_env_and_memory_frees_a_dropped_llm_as_vllms_prefix_caching_example_does():
    """vLLM's prefix_caching example runs an LLM, `del`s it and calls
    `vllm.distributed.cleanup_dist_env_and_memory()` before building the next one; the import
    was a ModuleNotFoundError here. enginespec.distributed has it: the dropped LLM's engine
    and model are collected (its tensor-parallel workers stop with it) and torch's cached CUDA
    memory goes back to the driver, so the next LLM finds the device free."""
    import weakref

    from enginespec.distributed import cleanup_dist_env_and_memory
    from enginespec.llm import LLM

    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    prompts = [{"prompt_token_ids": list(range(5, 30)) + [i]} for i in range(3)]
    regular = LLM(
        str(tiny_model_dir("qwen3")),
        dtype="float32",
        device="cpu",
        num_blocks=32,
        enable_prefix_caching=False,
    )
    texts = [o.outputs[0].token_ids for o in regular.generate(prompts, greedy, use_tqdm=False)]
    engine = weakref.ref(regular.engine)
    del regular
    cleanup_dist_env_and_memory()
    assert engine() is None
    cached = LLM(
        str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", num_blocks=32, enable_prefix_caching=True
    )
    cached.generate(prompts[0], greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in cached.generate(prompts, greedy, use_tqdm=False)] == texts
    cleanup_dist_env_and_memory(shutdown_ray=False)  # vLLM's keyword


def test_cleanup_dist_env_and_memory_empties_torchs_cuda_cache_where_cuda_is_in_use(monkeypatch):
    """Where CUDA is in use (available and initialized: an LLM on the GPU ran), the call gives
    torch's cached CUDA memory back (torch.cuda.empty_cache), so that the next LLM's profile run
    finds it free. Played on the CPU with CUDA's state stood in."""
    import torch

    from enginespec.distributed import cleanup_dist_env_and_memory

    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    cleanup_dist_env_and_memory()
    assert emptied == [True]
