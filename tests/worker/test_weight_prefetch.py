"""worker/weight_prefetch.py and kernels/l2_prefetch.py: the L2 prefetch of a fused layer's
weights while it attends. On any machine: the mode switch, the wrapper's argument checks, and
the kernel compiled for sm_90 (one bulk prefetch instruction, no load or store). On CUDA: a
one-row step captured in a CUDA graph with prefetch on computes exactly what the same step
computes without it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from enginespec.kernels import l2_prefetch as lp
from enginespec.spec import SamplingParams, SchedulerOutput, build_batch
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker import skinny_ops, weight_prefetch
from enginespec.worker.flat_model import FlatModel

CUDA = torch.cuda.is_available()

COMPILE = r"""
from enginespec.kernels import l2_prefetch as lp
fn = lp._l2_prefetch_kernel
consts = dict(NUM_TENSORS=4, THREADS=128, CHUNK_BYTES=2048)
sig = {n: "constexpr" if n in consts else ("*u8" if n.startswith("p") else "i64") for n in fn.arg_names}
ptx = ptx_of(fn, sig, consts, {"num_warps": 4})
print(ptx.count("cp.async.bulk.prefetch.L2.global"), ptx.count("ld.global"), ptx.count("st.global"))
"""


def test_prefetch_kernel_compiles_for_sm90_to_bulk_prefetches_only():
    from tests.kernels.sm90 import compile_script

    prefetches, loads, stores = (int(v) for v in compile_script(COMPILE).split())
    assert prefetches >= 1 and loads == 0 and stores == 0


def test_mode_switch(monkeypatch):
    monkeypatch.setenv(weight_prefetch.PREFETCH_ENV, "sometimes")
    with pytest.raises(ValueError, match=weight_prefetch.PREFETCH_ENV):
        weight_prefetch.resolve_mode()
    monkeypatch.setenv(weight_prefetch.PREFETCH_ENV, "next")
    assert weight_prefetch.resolve_mode() == "next"
    monkeypatch.delenv(weight_prefetch.PREFETCH_ENV)
    assert weight_prefetch.resolve_mode() == weight_prefetch.DEFAULT_MODE


def test_wrapper_refuses_what_the_instruction_cannot_take():
    x = torch.zeros(64, 64)
    for bad in ([], [x] * (lp.MAX_TENSORS + 1), [x[:, ::2]]):
        with pytest.raises(ValueError, match="l2_prefetch"):
            lp.l2_prefetch(bad)
    assert not lp.supported(torch.device("cpu"))


def test_nothing_to_build_off_cuda(impl):
    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=impl.attention_backend("cpu"))
    assert weight_prefetch.build(model.merged, torch.device("cpu"), mode="next") is None


def _decode_inputs(model, impl):
    from tests.worker.test_flat_model import ShuffledTables

    req = impl.new_request("r", [5], SamplingParams(max_tokens=1))
    batch = build_batch(SchedulerOutput(scheduled=[(req, 1)]), ShuffledTables(8, 4, ["r"]))
    fields = ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
    meta = dataclasses.replace(batch.meta, **{k: getattr(batch.meta, k).cuda() for k in fields})
    return batch.input_ids.cuda(), batch.positions.cuda(), meta, model.allocate_kv(8, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["1", "next"])
def test_captured_step_with_prefetch_equals_the_step_without(impl, monkeypatch, mode):
    if not lp.supported(torch.device("cuda")):
        pytest.skip("the bulk prefetch needs sm_90")
    monkeypatch.setenv(weight_prefetch.PREFETCH_ENV, mode)
    model = FlatModel.from_pretrained(
        tiny_model_dir("qwen3"), attention=impl.attention_backend("cuda"), dtype=torch.bfloat16, device="cuda"
    )
    skinny_ops.install(model.merged, "cuda", max_rows=4)
    prefetch = model.merged.weight_prefetch
    assert prefetch is not None and all(layer.prefetch == prefetch.start for layer in model.merged.layers)
    ids, positions, meta, kv = _decode_inputs(model, impl)
    want = model.forward(ids, positions, meta, kv).clone()  # eager: no prefetch issued
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model.forward(ids, positions, meta, kv)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model.forward(ids, positions, meta, kv)
    assert not prefetch.pending  # joined before the capture closed
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
