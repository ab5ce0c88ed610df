"""worker/skinny_linear.py: the measured cuBLAS-or-Triton choice for the decoder's projections.

On CPU: the candidate launch shapes are valid, the switch reads EngineArgs then the env var, and
a merged decoder whose layers point at `enginespec::linear` sends every projection through the
table and computes what F.linear computes (the kernel under TRITON_INTERPRET, choices set by
hand: timing needs a GPU). On CUDA: install() measures every projection shape and row bucket of
a tiny bf16 model and the decoder still agrees with cuBLAS.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from enginespec.kernels.skinny_gemm import MAX_BROADCAST_ROWS, SkinnyConfig
from enginespec.spec import SamplingParams, SchedulerOutput, build_batch
from enginespec.testing.checkpoints import VOCAB_SIZE, tiny_model_dir
from enginespec.worker import gemm_tuning
from enginespec.worker import skinny_linear as sl
from enginespec.worker.flat_model import FlatModel

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("bucket", [1, 2, 4, 16, 64])
@pytest.mark.parametrize("n,k", [(4096, 1024), (1024, 3072)])
def test_candidates_are_valid_launch_shapes(bucket, n, k):
    found = gemm_tuning.candidates(bucket, n, k, num_sms=132)
    assert found and all(isinstance(c, SkinnyConfig) for c in found)
    assert len(set(found)) == len(found)
    for c in found:
        assert c.use_dot or bucket <= MAX_BROADCAST_ROWS
        assert c.num_splits in (1, 2, 4, 8) and k // c.num_splits >= c.block_k
    # Few output tiles (N = 1024) need K splits to give 132 SMs work; each shape also runs unsplit.
    assert {1} < {c.num_splits for c in found} if n == 1024 else 1 in {c.num_splits for c in found}


def test_row_bucket_and_switch(monkeypatch):
    assert [sl.row_bucket(r) for r in (1, 2, 3, 4, 5, 16, 17, 64)] == [1, 2, 4, 4, 8, 16, 32, 64]
    monkeypatch.delenv(sl.ENV_SWITCH, raising=False)
    assert sl.resolve_switch(None) is False
    monkeypatch.setenv(sl.ENV_SWITCH, "1")
    assert sl.resolve_switch(None) is True and sl.resolve_switch(False) is False
    with pytest.raises(ValueError, match="skinny_gemm"):
        sl.resolve_switch("yes")


def _prefill(model, impl, num_tokens: int):
    from tests.worker.test_flat_model import ShuffledTables

    ids = torch.randint(0, VOCAB_SIZE, (num_tokens,), generator=torch.Generator().manual_seed(3)).tolist()
    req = impl.new_request("r", ids, SamplingParams(max_tokens=1))
    batch = build_batch(SchedulerOutput(scheduled=[(req, num_tokens)]), ShuffledTables(8, 4, ["r"]))
    return model.forward(batch.input_ids, batch.positions, batch.meta, model.allocate_kv(8, 4))


@pytest.mark.parametrize("fused", [False, True], ids=["linear", "linear+gate_up_silu"])
def test_decoder_projections_go_through_the_table(impl, monkeypatch, torch_one_thread, fused):
    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=impl.attention_backend("cpu"))
    layers = model.merged.layers
    assert all(layer.silu_mlp for layer in layers)  # Qwen3's hidden_act
    want = _prefill(model, impl, 11)
    table = sl.LinearTable("cpu", max_rows=16)
    config = SkinnyConfig(block_n=64, block_k=32, num_splits=2)
    for (n, k, dtype, has_bias), _ in sl.weight_groups(layers).items():
        table.choices[(16, n, k, dtype, has_bias, False)] = sl.Choice(config, 1.0, 2.0)
    for (n, k, dtype, has_bias), _ in sl.weight_groups(layers, silu_gate_up=True).items():
        table.choices[(16, n, k, dtype, has_bias, True)] = sl.Choice(config, 1.0, 2.0)
    calls = []
    for name in ("linear", "gate_up_silu"):
        method = getattr(sl.LinearTable, name)
        monkeypatch.setattr(
            table, name, lambda x, w, b, m=method, n=name: calls.append(n) or m(table, x, w, b)
        )
    monkeypatch.setitem(sl._TABLES, torch.device("cpu"), table)
    for layer in layers:
        monkeypatch.setattr(layer, "linear", torch.ops.enginespec.linear)
        if fused:
            monkeypatch.setattr(layer, "gate_up_silu", torch.ops.enginespec.gate_up_silu)
    got = _prefill(model, impl, 11)
    # q|k|v, o, gate|up, down of every layer; with the fused op gate|up + SiLU * up is one call.
    assert calls.count("linear") == (3 if fused else 4) * len(layers)
    assert calls.count("gate_up_silu") == (len(layers) if fused else 0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not table.buffers.counts.any()
    x = torch.randn(17, layers[0].qkv_weight.shape[1])  # over max_rows: F.linear, no kernel
    assert torch.equal(table.linear(x, layers[0].qkv_weight, None), F.linear(x, layers[0].qkv_weight))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_install_measures_every_projection_on_cuda(impl):
    model = FlatModel.from_pretrained(
        tiny_model_dir("qwen3"), attention=impl.attention_backend("cuda"), dtype=torch.bfloat16, device="cuda"
    )
    layers = model.merged.layers
    table = sl.install(model.merged, "cuda", max_rows=8)
    groups = sl.weight_groups(layers)
    for n, k, dtype, has_bias in groups:
        for bucket in (1, 2, 4, 8):
            assert (bucket, n, k, dtype, has_bias, False) in table.choices
    for n, k, dtype, has_bias in sl.weight_groups(layers, silu_gate_up=True):
        assert (8, n, k, dtype, has_bias, True) in table.choices
    assert all(layer.linear is torch.ops.enginespec.linear for layer in layers)
    assert all(layer.gate_up_silu is torch.ops.enginespec.gate_up_silu for layer in layers)
    got = _prefill(model, impl, 7)
    for layer in layers:
        layer.linear, layer.gate_up_silu = F.linear, None
    torch.testing.assert_close(got, _prefill(model, impl, 7), atol=5e-2, rtol=5e-2)
