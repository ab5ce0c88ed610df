"""What a vLLM user's offline code passes to SamplingParams and LLM.generate, answered the way
vLLM answers it. Tiny float32 models on CPU, through the `impl` fixture."""

from __future__ import annotations

import pytest

from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def make_llm(impl, **kwargs):
    from enginespec.llm import LLM

    args = dict(dtype="float32", device="cpu", block_size=4, num_blocks=32, max_model_len=64)
    return LLM(str(tiny_model_dir("qwen3")), impl=impl, **{**args, **kwargs})


def test_priority_needs_the_priority_policy(impl):
    """vLLM refuses a priority under fcfs ("priority scheduling is not enabled"); it used to be
    ignored here."""
    llm = make_llm(impl)
    prompts = [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7, 8]}]
    greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    with pytest.raises(ValueError, match="priority.*'fcfs'"):
        llm.generate(prompts, greedy, use_tqdm=False, priority=[0, 1])
    assert not llm.engine.has_unfinished
    assert len(llm.generate(prompts, greedy, use_tqdm=False, priority=[0, 0])) == 2
    ranked = make_llm(impl, scheduling_policy="priority")
    assert len(ranked.generate(prompts, greedy, use_tqdm=False, priority=[0, 1])) == 2


@pytest.mark.parametrize("best_of", [2, 4])
def test_best_of_is_refused_pointing_to_n(best_of):
    """vLLM V1 dropped best_of; a ported call gets a ValueError naming it and n (it was a
    TypeError about an unexpected keyword). None and 1, which change nothing, are accepted."""
    with pytest.raises(ValueError, match=r"best_of.*\bn\b"):
        SamplingParams(best_of=best_of)
    assert SamplingParams(best_of=1) == SamplingParams(best_of=None) == SamplingParams()
