"""Folded norms (MergedDecoder.fold_norms, worker/folded_ops.py): the in-place residual GEMM, the
checkpoint's own modules after folding, and where folding is refused. The folded decoder's
outputs against transformers, family by family, are in test_flat_model.py ("merged-folded");
its kernels against their references in tests/kernels (row_source)."""

from __future__ import annotations

import pytest
import torch

from enginespec.impls.fast.attention import FastAttention
from enginespec.testing.checkpoints import VOCAB_SIZE, tiny_model_dir
from enginespec.worker import folded_ops  # noqa: F401 - registers the ops
from enginespec.worker.flat_model import FlatModel
from enginespec.worker.merged_decoder import FOLD_NORMS_ENV


def test_add_linear_updates_the_residual_in_place():
    gen = torch.Generator().manual_seed(0)
    hidden, x, weight = (
        torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((5, 8), (5, 12), (8, 12))
    )
    want = hidden + x @ weight.T
    storage = hidden.data_ptr()
    assert torch.ops.enginespec.add_linear_(hidden, x, weight) is None
    assert hidden.data_ptr() == storage
    torch.testing.assert_close(hidden, want, rtol=1e-12, atol=1e-12)


def test_silu_mul_rows_matches_the_reference():
    """The op (the kernel on CUDA or under the interpreter, the reference elsewhere) against
    kernels.reference.silu_mul_ref, and the row scale changed the result."""
    from enginespec.kernels.reference import silu_mul_ref

    gen = torch.Generator().manual_seed(1)
    gate_up, h = torch.randn(4, 10, generator=gen), torch.randn(4, 6, generator=gen) * 3
    got = torch.ops.enginespec.silu_mul_rows(gate_up, h, 1e-6)
    torch.testing.assert_close(got, silu_mul_ref(gate_up, h, 1e-6), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, silu_mul_ref(gate_up), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_the_checkpoint_modules_compute_the_same_model_after_folding(family, monkeypatch):
    """fold_norms rewrites the merged weights in place (the q/k/v and gate/up Linear modules are
    views of them) and sets the norms' weights to 1: transformers' own forward over the folded
    modules still gives the unfolded model's logits."""
    from transformers import AutoModelForCausalLM

    path = tiny_model_dir(family)
    ids = torch.randint(0, VOCAB_SIZE, (1, 13), generator=torch.Generator().manual_seed(2))
    fresh = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    monkeypatch.setenv(FOLD_NORMS_ENV, "1")
    model = FlatModel.from_pretrained(path, attention=FastAttention("cpu"))
    assert model.folded_norms
    layer = model.merged.layers[0]
    assert torch.all(layer.input_layernorm.weight == 1) and torch.all(
        layer.post_attention_layernorm.weight == 1
    )
    assert layer.qkv_weight.data_ptr() == _q_proj(model).weight.data_ptr()
    model.config._attn_implementation = "eager"  # transformers' own attention, not the paged op
    with torch.no_grad():
        torch.testing.assert_close(model.hf_model(ids).logits, fresh(ids).logits, rtol=2e-5, atol=2e-5)


def _q_proj(model):
    return model.hf_model.get_decoder().layers[0].self_attn.q_proj


def test_folding_is_refused_where_it_cannot_hold(monkeypatch):
    """Qwen2's q|k|v bias would need the row scale before it: never folded. A backend without
    folds_norms: never folded. A bad setting: a ValueError that names the variable."""
    monkeypatch.setenv(FOLD_NORMS_ENV, "1")
    qwen2 = FlatModel.from_pretrained(tiny_model_dir("qwen2"), attention=FastAttention("cpu"))
    assert not qwen2.folded_norms and not any(layer.folded for layer in qwen2.merged.layers)
    with pytest.raises(ValueError, match="cannot be folded"):
        qwen2.merged.layers[0].fold_norms()

    class Plain(FastAttention):
        folds_norms = False

    assert not FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=Plain("cpu")).folded_norms
    monkeypatch.setenv(FOLD_NORMS_ENV, "yes")
    with pytest.raises(ValueError, match=FOLD_NORMS_ENV):
        FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=FastAttention("cpu"))


def test_float16_is_never_folded(monkeypatch):
    """Un-normed rows through a float16 GEMM can overflow where normed rows do not: a residual
    row of 300s against weights of ~1 over 1,024 inputs already passes 65,504."""
    monkeypatch.setenv(FOLD_NORMS_ENV, "1")
    model = FlatModel.from_pretrained(
        tiny_model_dir("qwen3"), dtype=torch.float16, attention=FastAttention("cpu")
    )
    assert not model.folded_norms
    assert not any(layer.folded for layer in model.merged.layers)


def test_folding_is_off_on_the_cpu_unless_asked(monkeypatch):
    monkeypatch.delenv(FOLD_NORMS_ENV, raising=False)
    assert not FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=FastAttention("cpu")).folded_norms


def test_a_folded_decoder_takes_the_one_launch_gathers_and_norm_at_every_row_count(impl, monkeypatch):
    """Folded, the decoder runs uncompiled (worker/compiled.py), so its embedding + rope gathers
    and final norm take their one-launch ops (set as skinny_ops.install sets them) at any row
    count, not only on the fused path's rows; same values as the checkpoint's modules."""
    from enginespec.worker import skinny_ops  # noqa: F401 - registers the ops
    from tests.worker.test_skinny_linear import _prefill, recording_norm_and_gathers

    monkeypatch.setenv(FOLD_NORMS_ENV, "1")
    # The fast backend applies the row scales (folds_norms) whichever impl the suite runs.
    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=FastAttention("cpu"))
    merged = model.merged
    assert model.folded_norms and merged.folded and merged.fused_max_rows == 0
    calls = []
    want = _prefill(model, impl, 29)
    merged.fused_norm, merged.fused_embed_rope = recording_norm_and_gathers(calls)
    got = _prefill(model, impl, 29)
    assert calls == ["embed_rope", "final_norm"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    merged.layers[0].folded = False  # one layer unfolded: the decoder is not folded
    assert not merged.folded
    calls.clear()
    _prefill(model, impl, 29)
    assert calls == []
