"""Sleep mode on a GPU, where it is for (worker/sleep.py states the rules): level 1 gives the
weights' and the KV pool's device memory back to the driver, and after wake_up the engine, its
CUDA graphs captured again over the new storages (decode graphs and mixed ones, the compiled
body, the skinny GEMM's tuned kernels, a draft model's runner), answers greedy requests exactly as
before the sleep. The CPU checks are tests/api/test_sleep_mode.py; these need CUDA (skipped on
the CPU: a gap CI cannot close, run on the device with `pytest tests/api/test_sleep_mode_cuda.py`)."""

from __future__ import annotations

import pytest
import torch

from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker.sleep import model_tensors

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# prompts of several lengths: prefill chunks, mixed steps and decode-only steps all run
PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * j) % 90 + 1 for j in range(5 + 9 * i)]} for i in range(6)]
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


def _greedy(llm) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _device_bytes(runner) -> int:
    """The bytes of the distinct device storages behind the runner's weights and KV pool."""
    storages = {}
    for t in [*model_tensors(runner.model), *runner.kv_caches]:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "draft"])
def test_level_1_gives_the_memory_back_and_wakes_to_the_same_outputs_with_graphs(speculative):
    from enginespec.llm import LLM

    path = str(tiny_model_dir("qwen3"))
    draft = {"method": "draft_model", "model": path, "num_speculative_tokens": 2} if speculative else None
    with LLM(
        path,
        impl="fast",
        dtype="bfloat16",
        device="cuda",
        max_num_seqs=8,
        num_gpu_blocks_override=256,
        enable_sleep_mode=True,
        speculative_config=draft,
    ) as llm:
        runner = llm.engine.runner
        runners = [runner] + ([llm.engine.spec.drafter.runner] if speculative else [])
        assert runner.graphs is not None  # the CUDA default: graphs captured at construction
        want = _greedy(llm)
        held = sum(_device_bytes(r) for r in runners)
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated()
        llm.sleep(level=1)
        assert runner.graphs is None
        freed = allocated - torch.cuda.memory_allocated()
        assert freed >= held  # every weight and pool byte is given back (the graphs' pools too)
        llm.wake_up()
        assert runner.graphs is not None  # captured again over the new storages
        assert _greedy(llm) == want
        llm.sleep()
        llm.wake_up(tags=["kv_cache"])
        llm.wake_up(tags=["weights"])
        assert _greedy(llm) == want
