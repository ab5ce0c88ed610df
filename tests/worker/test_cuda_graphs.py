"""CUDA graphs never change outputs: graph replay (over the torch.compile'd decoder, the CUDA
default) and eager runs give the same greedy tokens.

The bucket arithmetic is checked everywhere; replay itself needs a GPU (skipped on CPU: a gap
CI cannot close, run on the H200 with `pytest conformance --impl=fast -m gpu`).
"""

from __future__ import annotations

import pytest
import torch

from enginespec.conformance.invariants import check_idle
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker.cuda_graphs import default_buckets


@pytest.mark.parametrize("max_num_seqs", [1, 3, 8, 20, 256])
def test_buckets_cover_every_batch_size(max_num_seqs):
    buckets = default_buckets(max_num_seqs)
    assert buckets == sorted(set(buckets)) and buckets[0] == 1 and buckets[-1] == max_num_seqs
    for n in range(1, max_num_seqs + 1):
        assert any(b >= n for b in buckets)
    assert all(b % 8 == 0 for b in buckets if b > 8 and b != max_num_seqs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_graph_replay_equals_eager(impl, family):
    from enginespec.llm import LLM

    if "cuda_graphs" not in getattr(impl, "capabilities", ()):
        pytest.skip(f"impl {impl.name!r} does not claim the cuda_graphs capability")
    prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 90 + 1 for j in range(5 + 3 * i)]} for i in range(11)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        llm = LLM(
            tiny_model_dir(family),
            impl=impl,
            dtype="float32",
            device="cuda",
            block_size=4,
            max_num_seqs=16,
            num_gpu_blocks_override=64,
            enforce_eager=eager,
        )
        assert (llm.engine.runner.graphs is None) == eager
        body = llm.engine.runner.body  # default on CUDA: graphs replay an inductor-compiled body
        assert (body is None) == eager and (eager or body.error is None), getattr(body, "error", None)
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
    assert outs[False] == outs[True]
