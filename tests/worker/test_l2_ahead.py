"""worker/l2_ahead.py: the plan ENGINESPEC_L2_AHEAD names, the (address, bytes) tables of a
merged decoder's weights, and the route a table takes to the backend's decode attention (only
a backend's attend_qkv, only up to the plan's rows, only on CUDA). The kernel side (the merge's
bulk prefetches, before its wait, no value changed) is tested in tests/kernels/test_pdl.py and
test_decode_attention.py."""

from __future__ import annotations

import pytest
import torch

from enginespec.impls.fast import FastRequest
from enginespec.impls.fast.attention import FastAttention
from enginespec.spec import SamplingParams, SchedulerOutput, build_batch
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker import l2_ahead
from enginespec.worker.flat_model import FlatModel
from enginespec.worker.step_context import StepContext, active


@pytest.mark.parametrize(
    "raw, parts, rows",
    [
        ("gate_up,down", ("gate_up", "down"), 1),
        (" o , next_qkv ,rows=4", ("o", "next_qkv"), 4),
        ("rows=2,down", ("down",), 2),
    ],
)
def test_plan_from_env(raw, parts, rows):
    assert l2_ahead.plan_from_env(raw) == l2_ahead.AheadPlan(parts, rows)


@pytest.mark.parametrize("raw", ["", "  ", ","])
def test_no_plan_when_unset_or_empty(raw, monkeypatch):
    assert l2_ahead.plan_from_env(raw) is None
    monkeypatch.delenv(l2_ahead.ENV, raising=False)
    assert l2_ahead.plan_from_env() is None


@pytest.mark.parametrize("raw", ["qkv", "down,down", "rows=0,down", "rows=x,o", "o=1", "rows=4"])
def test_bad_plans_name_the_variable(raw):
    with pytest.raises(ValueError, match=l2_ahead.ENV):
        l2_ahead.plan_from_env(raw)


def _model(monkeypatch, raw: str) -> FlatModel:
    monkeypatch.setenv(l2_ahead.ENV, raw)
    return FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=FastAttention(), model_impl="merged")


def test_tables_hold_each_layers_weights_in_plan_order(monkeypatch):
    model = _model(monkeypatch, "down,o,next_qkv")
    layers = model.merged.layers
    tables = l2_ahead.tables(layers, l2_ahead.plan_from_env(), torch.device("cpu"))
    assert sorted(tables) == [layer.layer_idx for layer in layers]
    for i, layer in enumerate(layers):
        want = [layer.down_proj.weight, layer.o_proj.weight] + (
            [layers[i + 1].qkv_weight] if i + 1 < len(layers) else []
        )
        got = tables[layer.layer_idx]
        assert got.dtype == torch.int64 and got.shape == (len(want), 2)
        assert got.tolist() == [[w.data_ptr(), w.numel() * w.element_size()] for w in want]
    last = l2_ahead.tables(layers, l2_ahead.AheadPlan(("next_qkv",)), torch.device("cpu"))
    assert layers[-1].layer_idx not in last and len(last) == len(layers) - 1


def test_tables_refuse_weights_elsewhere(monkeypatch):
    model = _model(monkeypatch, "o")
    with pytest.raises(ValueError, match="contiguous on meta"):
        l2_ahead.tables(model.merged.layers, l2_ahead.AheadPlan(("o",)), torch.device("meta"))


def test_the_model_asks_only_on_cuda(monkeypatch):
    """On the CPU there is no bulk prefetch: the model hands no table to its StepContext."""
    model = _model(monkeypatch, "gate_up,rows=8")
    assert model._ahead_plan == l2_ahead.AheadPlan(("gate_up",), 8)
    assert model._l2_ahead() == (None, 0)


class _Recorder(FastAttention):
    """The fast backend, recording the l2_ahead each attend_qkv call got (absent: None)."""

    def __init__(self):
        super().__init__()
        self.got: list = []

    def attend_qkv(self, *args, l2_ahead=None, **kwargs):
        self.got.append(l2_ahead)
        return super().attend_qkv(*args, **kwargs)


@pytest.mark.parametrize("num_reqs, rows, hands", [(1, 1, True), (2, 1, False), (2, 2, True)])
def test_the_op_hands_a_layers_table_to_small_batches_only(num_reqs, rows, hands):
    backend = _Recorder()
    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=backend, model_impl="merged")
    table = torch.zeros(1, 2, dtype=torch.int64)
    reqs = [FastRequest(f"r{i}", [5 + i], SamplingParams(max_tokens=1)) for i in range(num_reqs)]
    batch = build_batch(SchedulerOutput(scheduled=[(r, 1) for r in reqs]), _Tables())  # one row each
    kv = model.allocate_kv(8, 4)
    ctx = StepContext(batch.meta, kv, backend, l2_ahead={1: table}, l2_ahead_rows=rows)
    with active(ctx):
        model.body(batch.input_ids, batch.positions)
    assert len(backend.got) == model.num_layers
    want = [table if hands and i == 1 else None for i in range(model.num_layers)]
    assert [g is w for g, w in zip(backend.got, want)] == [True] * model.num_layers


class _Tables:
    block_size = 4

    def block_table(self, request_id: str) -> list[int]:
        return [int(request_id[1:])]
