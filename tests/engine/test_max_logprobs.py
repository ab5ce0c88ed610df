"""EngineArgs.max_logprobs (vLLM's, default 20): logprobs and prompt_logprobs above it are refused
on add, in vLLM's words; -1 lifts the cap to the vocabulary (SamplingParams.validate_logprobs_cap)."""

from __future__ import annotations

import pytest

from enginespec.engine_args import EngineArgs
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import VOCAB_SIZE, tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _llm(**kwargs):
    from enginespec.llm import LLM

    args = dict(impl="fast", dtype="float32", device="cpu", block_size=4, num_blocks=32)
    return LLM(str(tiny_model_dir("qwen3")), **args, **kwargs)


def _run(llm, **params):
    out = llm.generate(
        {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=2, **params), use_tqdm=False
    )
    return out[0]


def test_the_default_cap_is_20_for_sample_and_prompt_logprobs():
    llm = _llm()
    assert llm.engine.max_logprobs == 20
    with pytest.raises(ValueError, match=r"logprobs: requested sample logprobs of 21, .*max allowed: 20"):
        _run(llm, logprobs=21)
    with pytest.raises(
        ValueError, match=r"prompt_logprobs: requested prompt logprobs of 21, .*max allowed: 20"
    ):
        _run(llm, prompt_logprobs=21)
    assert not llm.engine.has_unfinished
    out = _run(llm, logprobs=20, prompt_logprobs=20)
    assert all(len(entry) >= 20 for entry in out.outputs[0].logprobs)


def test_a_chosen_cap_and_no_cap():
    llm = _llm(max_logprobs=2)
    with pytest.raises(ValueError, match="max allowed: 2"):
        _run(llm, logprobs=3)
    assert len(_run(llm, logprobs=2).outputs[0].logprobs) == 2
    llm = _llm(max_logprobs=-1)  # the vocabulary is the bound
    assert llm.engine.max_logprobs == VOCAB_SIZE
    assert len(_run(llm, logprobs=VOCAB_SIZE).outputs[0].logprobs[0]) == VOCAB_SIZE
    with pytest.raises(ValueError, match="vocab_size"):
        _run(llm, logprobs=VOCAB_SIZE + 1)


def test_a_cap_of_0_still_warms_up_and_takes_logprobs_0():
    llm = _llm(max_logprobs=0, warmup=True)
    assert len(_run(llm, logprobs=0).outputs[0].logprobs[0]) == 1


@pytest.mark.parametrize("value", [-2, 1.5, True, "20", None])
def test_max_logprobs_must_be_an_int_from_minus_1(value):
    with pytest.raises(ValueError, match="max_logprobs"):
        EngineArgs(max_logprobs=value)
