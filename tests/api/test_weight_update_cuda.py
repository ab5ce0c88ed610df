"""Weight updates on a GPU (worker/weight_update.py states the rules): an engine loaded from
checkpoint A, its CUDA graphs captured (decode and mixed graphs, the skinny GEMM's tuned path,
folded norms by default; the compiled body with folding off), answers greedy requests exactly
as an engine loaded from B does after load_weights(every tensor of B), in one call or in
buckets, without capturing its graphs again: the copies are in place, so the captured pointers see the new values. Then a
sleep(level=2) cycle (vLLM's RLHF recipe) with reload_weights. The CPU checks are
tests/api/test_weight_update.py; these need CUDA (skipped on the CPU: run on the device with
`pytest tests/api/test_weight_update_cuda.py`)."""

from __future__ import annotations

import pytest
import torch

from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker.loader import iter_tensors
from tests.api.test_sleep_mode_cuda import _greedy  # the same prompts: prefill, mixed and decode steps

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _llm(path: str):
    from enginespec.llm import LLM

    return LLM(
        path,
        impl="fast",
        dtype="bfloat16",
        device="cuda",
        max_num_seqs=8,
        num_gpu_blocks_override=256,
        enable_sleep_mode=True,
    )


@pytest.mark.parametrize("fold", ["default", "0"], ids=["folded", "compiled-unfolded"])
def test_load_weights_reaches_the_captured_graphs_and_a_level_2_cycle_refills_them(fold, monkeypatch):
    from enginespec.worker.merged_decoder import FOLD_NORMS_ENV

    if fold != "default":
        monkeypatch.setenv(FOLD_NORMS_ENV, fold)
    a, b = str(tiny_model_dir("qwen3")), str(tiny_model_dir("qwen3", seed=1))
    with _llm(b) as llm_b:
        want_b = _greedy(llm_b)
    with _llm(a) as llm:
        runner = llm.engine.runner
        graphs = runner.graphs
        assert graphs is not None  # the CUDA default: graphs captured at construction
        assert llm.engine.model.folded_norms == (fold == "default")
        want_a = _greedy(llm)
        assert want_a != want_b
        llm.load_weights(iter_tensors(b, device="cuda"))
        assert runner.graphs is graphs  # not captured again: the same pointers, new values
        assert _greedy(llm) == want_b
        llm.reload_weights()
        assert _greedy(llm) == want_a
        weights = list(iter_tensors(b, device="cuda"))
        for start in range(0, len(weights), 3):  # buckets: a norm in a later call than its rows
            llm.load_weights(weights[start : start + 3])
        assert _greedy(llm) == want_b and runner.graphs is graphs
        llm.reload_weights()
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated()
        llm.sleep(level=2)
        assert torch.cuda.memory_allocated() < allocated
        kept = [t for g in runner._asleep["weights"].groups if g.keep for t in g.tensors]
        assert not any(isinstance(t, torch.nn.Parameter) for t in kept)  # no host copy of a weight
        llm.wake_up(tags=["weights"])
        llm.reload_weights(b)
        llm.wake_up(tags=["kv_cache"])
        assert runner.graphs is not None  # captured again once both tags are awake
        assert _greedy(llm) == want_b
