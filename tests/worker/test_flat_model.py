"""FlatModel equals transformers' own forward, family by family, through the impl's attention.

Ground truth is the transformers model loaded by transformers itself (eager attention) over each
sequence alone. FlatModel gets the same sequences batched together in one flat batch, in
prefill chunks and then one token per step, through shuffled block tables in the paged pool,
sometimes with padding rows: every row's logits must match the full forward at that position.
Each case runs both decoders FlatModel offers (model_impl "merged" and "transformers").
"""

from __future__ import annotations

import os

import pytest
import torch

from enginespec.spec import SamplingParams, SchedulerOutput, build_batch
from enginespec.testing.checkpoints import FAMILIES, VOCAB_SIZE, tiny_model_dir
from enginespec.worker.flat_model import FlatModel

ATOL = RTOL = 2e-5
CASES = [(family, False) for family in FAMILIES] + [("qwen3", True), ("llama", True)]
# "merged-folded": the merged decoder with its norms folded into the projections (on where the
# backend applies the row scales, `folds_norms`: impls.fast's; the CPU needs ENGINESPEC_FOLD_NORMS=1).
MODEL_IMPLS = ("merged", "transformers", "merged-folded")


def _hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    ).eval()


@torch.no_grad()
def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0].float()


def _load(path, attention, model_impl: str, **kwargs) -> FlatModel:
    """FlatModel.from_pretrained for one of MODEL_IMPLS (folding norms exactly for "merged-folded")."""
    from enginespec.worker.merged_decoder import FOLD_NORMS_ENV

    old = os.environ.get(FOLD_NORMS_ENV)
    os.environ[FOLD_NORMS_ENV] = "1" if model_impl == "merged-folded" else "0"
    try:
        model = FlatModel.from_pretrained(
            path, attention=attention, model_impl=model_impl.split("-")[0], **kwargs
        )
    finally:
        if old is None:
            del os.environ[FOLD_NORMS_ENV]
        else:
            os.environ[FOLD_NORMS_ENV] = old
    assert model.model_impl == model_impl.split("-")[0]
    return model


class ShuffledTables:
    """Block tables drawn from a shuffled pool, so logical and physical order never agree."""

    def __init__(self, num_blocks: int, block_size: int, request_ids, seed: int = 0):
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        per = num_blocks // len(request_ids)
        self.block_size = block_size
        self.tables = {rid: order[i * per : (i + 1) * per] for i, rid in enumerate(request_ids)}

    def block_table(self, request_id: str) -> list[int]:
        return list(self.tables[request_id])


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(family: str, tied: bool, attention, model_impl: str):
        if (family, tied) not in cache:
            path = tiny_model_dir(family, tied)
            cache[family, tied] = (_hf_model(path), path)
        hf, path = cache[family, tied]
        model = _load(path, attention, model_impl)
        can = model_impl == "merged-folded" and getattr(attention, "folds_norms", False)
        assert model.folded_norms == (can and family != "qwen2"), (model_impl, family)  # Qwen2: biases
        return hf, model

    return get


@pytest.mark.parametrize("model_impl", MODEL_IMPLS)
@pytest.mark.parametrize("family,tied", CASES)
def test_full_prefill_matches_transformers(impl, models, family, tied, model_impl):
    hf, model = models(family, tied, impl.attention_backend("cpu"), model_impl)
    ids = torch.randint(0, VOCAB_SIZE, (19,), generator=torch.Generator().manual_seed(1)).tolist()
    req = impl.new_request("r", ids, SamplingParams(max_tokens=1))
    manager = ShuffledTables(12, 5, ["r"], seed=2)
    batch = build_batch(SchedulerOutput(scheduled=[(req, len(ids))]), manager)
    kv = model.allocate_kv(12, 5)
    hidden = model.forward(batch.input_ids, batch.positions, batch.meta, kv)
    logits = model.compute_logits(hidden)
    expected = _hf_logits(hf, ids)
    assert logits.dtype == torch.float32 and logits.shape == (len(ids), VOCAB_SIZE)
    assert torch.allclose(logits, expected, atol=ATOL, rtol=RTOL), (logits - expected).abs().max()
    assert logits.argmax(-1).unique().numel() > 3, "tiny model output is too uniform to test anything"


def _chunk_plan(length: int, first: int) -> list[int]:
    """Prefill in two chunks, then one token per step (the decode path)."""
    second = min(length - first, 3)
    rest = length - first - second
    return [n for n in [first, second] if n > 0] + [1] * rest


@pytest.mark.parametrize("model_impl", MODEL_IMPLS)
@pytest.mark.parametrize("family,tied", CASES)
def test_chunked_prefill_then_decode_matches_transformers(impl, models, family, tied, model_impl):
    hf, model = models(family, tied, impl.attention_backend("cpu"), model_impl)
    gen = torch.Generator().manual_seed(3)
    seqs = {
        rid: torch.randint(0, VOCAB_SIZE, (n,), generator=gen).tolist()
        for rid, n in (("a", 17), ("b", 6), ("c", 12))
    }
    reqs = {rid: impl.new_request(rid, ids, SamplingParams(max_tokens=1)) for rid, ids in seqs.items()}
    plans = {"a": _chunk_plan(17, 9), "b": _chunk_plan(6, 2), "c": _chunk_plan(12, 5)}
    manager, kv = ShuffledTables(18, 3, list(seqs), seed=4), model.allocate_kv(18, 3)
    expected = {rid: _hf_logits(hf, ids) for rid, ids in seqs.items()}
    for step in range(max(len(p) for p in plans.values())):
        scheduled = [(reqs[rid], plan[step]) for rid, plan in plans.items() if step < len(plan)]
        output = SchedulerOutput(scheduled=scheduled)
        pad = output.num_scheduled_tokens + 2 if step % 2 else None
        batch = build_batch(output, manager, pad_to=pad)
        logits = model.compute_logits(model.forward(batch.input_ids, batch.positions, batch.meta, kv))
        row = 0
        for req, n in scheduled:
            c = req.num_computed_tokens
            want = expected[req.request_id][c : c + n]
            got = logits[row : row + n]
            assert torch.allclose(got, want, atol=ATOL, rtol=RTOL), (
                f"step {step} request {req.request_id} positions {c}..{c + n - 1}: {(got - want).abs().max()}"
            )
            row += n
            req.num_computed_tokens = c + n


def test_attributes_and_kv_shape(impl):
    from transformers import AutoConfig

    path = tiny_model_dir("qwen3")
    config = AutoConfig.from_pretrained(str(path))
    model = FlatModel.from_pretrained(path, dtype=torch.float64, attention=impl.attention_backend("cpu"))
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (
        config.num_hidden_layers,
        config.num_key_value_heads,
        config.head_dim,
    )
    assert (model.vocab_size, model.eos_token_id, model.max_position_embeddings) == (
        config.vocab_size,
        config.eos_token_id,
        config.max_position_embeddings,
    )
    assert model.dtype == torch.float64 and model.device.type == "cpu"
    assert model.hf_model.config is model.config
    kv = model.allocate_kv(7, 4)
    assert len(kv) == config.num_hidden_layers
    assert all(
        t.shape == (2, 8, 4, config.num_key_value_heads, config.head_dim) and t.dtype == torch.float64
        for t in kv
    )


@pytest.mark.parametrize("model_impl", MODEL_IMPLS)
def test_float64_is_exact_to_transformers_float64(impl, model_impl):
    from transformers import AutoModelForCausalLM

    path = tiny_model_dir("mistral")
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float64, attn_implementation="eager")
    model = _load(path, impl.attention_backend("cpu"), model_impl, dtype=torch.float64)
    ids = list(range(4, 4 + 21))
    req = impl.new_request("r", ids, SamplingParams(max_tokens=1))
    batch = build_batch(SchedulerOutput(scheduled=[(req, len(ids))]), ShuffledTables(8, 4, ["r"]))
    logits = model.compute_logits(
        model.forward(batch.input_ids, batch.positions, batch.meta, model.allocate_kv(8, 4))
    )
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    assert logits.dtype == expected.dtype == torch.float64  # compute_logits keeps the model's dtype
    assert torch.allclose(logits, expected, atol=1e-6, rtol=1e-6)


def test_wrong_number_of_caches_is_refused(impl):
    model = FlatModel.from_pretrained(tiny_model_dir("llama"), attention=impl.attention_backend("cpu"))
    req = impl.new_request("r", [5, 6], SamplingParams(max_tokens=1))
    batch = build_batch(SchedulerOutput(scheduled=[(req, 2)]), ShuffledTables(2, 4, ["r"]))
    with pytest.raises(ValueError, match="one kv cache per layer"):
        model.forward(batch.input_ids, batch.positions, batch.meta, model.allocate_kv(2, 4)[:1])


@pytest.mark.parametrize("model_impl", MODEL_IMPLS)
def test_per_layer_sliding_window_matches_transformers(impl, tmp_path, model_impl):
    """Qwen2 with sliding layers from max_window_layers on: layer 0 full, layer 1 windowed."""
    from enginespec.testing.checkpoints import make_checkpoint

    path = make_checkpoint(
        "qwen2", tmp_path / "q2w", use_sliding_window=True, sliding_window=5, max_window_layers=1, seed=7
    )
    hf = _hf_model(path)
    assert hf.config.layer_types == ["full_attention", "sliding_attention"]
    model = _load(path, impl.attention_backend("cpu"), model_impl)
    ids = torch.randint(0, VOCAB_SIZE, (16,), generator=torch.Generator().manual_seed(5)).tolist()
    req = impl.new_request("r", ids, SamplingParams(max_tokens=1))
    manager = ShuffledTables(6, 3, ["r"], seed=6)
    kv = model.allocate_kv(6, 3)
    expected = _hf_logits(hf, ids)
    for start, n in ((0, 7), (7, 1), (8, 8)):
        req.num_computed_tokens = start
        batch = build_batch(SchedulerOutput(scheduled=[(req, n)]), manager)
        logits = model.compute_logits(model.forward(batch.input_ids, batch.positions, batch.meta, kv))
        assert torch.allclose(logits, expected[start : start + n], atol=ATOL, rtol=RTOL), start


def test_qwen2_windows_where_its_attention_holds_no_window_attribute(tmp_path):
    """transformers 4.51-4.5x's Qwen2 attention works its window out in the forward
    (use_sliding_window, from max_window_layers on) and keeps no per-layer attribute: the
    merged decoder windows those layers by the same rule, and no layer of a checkpoint without
    use_sliding_window. (With only Mistral's config window honoured, such a Qwen2 lost its
    window on those versions.)"""
    from enginespec.testing.checkpoints import make_checkpoint
    from enginespec.worker.merged_decoder import MergedLayer

    def windows(**config) -> list:
        path = make_checkpoint("qwen2", tmp_path / str(len(list(tmp_path.iterdir()))), seed=7, **config)
        hf = _hf_model(path)
        layers = hf.model.layers
        for layer in layers:  # as 4.51-4.5x build them
            if hasattr(layer.self_attn, "sliding_window"):
                del layer.self_attn.sliding_window
        return [MergedLayer(layer, i, hf.config).window for i, layer in enumerate(layers)]

    assert windows(use_sliding_window=True, sliding_window=5, max_window_layers=1) == [0, 5]
    assert windows(use_sliding_window=False, sliding_window=5, max_window_layers=1) == [0, 0]


@pytest.mark.parametrize("model_impl", MODEL_IMPLS)
def test_a_sliding_window_key_in_a_llama_config_is_not_applied(impl, tmp_path, model_impl):
    """A Llama config.json that carries a stray "sliding_window" (kept by transformers as a plain
    attribute): Llama's attention never reads it, so no layer is windowed. The merged decoder
    used to window every layer with it, and its logits left transformers' past the 5th token."""
    from enginespec.testing.checkpoints import make_checkpoint

    path = make_checkpoint("llama", tmp_path / "llama_sw", sliding_window=5, seed=7)
    hf = _hf_model(path)
    assert hf.config.sliding_window == 5
    model = _load(path, impl.attention_backend("cpu"), model_impl)
    ids = torch.randint(0, VOCAB_SIZE, (16,), generator=torch.Generator().manual_seed(5)).tolist()
    req = impl.new_request("r", ids, SamplingParams(max_tokens=1))
    batch = build_batch(SchedulerOutput(scheduled=[(req, len(ids))]), ShuffledTables(6, 3, ["r"], seed=6))
    logits = model.compute_logits(
        model.forward(batch.input_ids, batch.positions, batch.meta, model.allocate_kv(6, 3))
    )
    assert torch.allclose(logits, _hf_logits(hf, ids), atol=ATOL, rtol=RTOL)


def test_merged_weights_are_shared_with_the_checkpoint_modules(impl):
    """Merging holds no weight twice: q/k/v and gate/up become row slices of the merged tensors,
    so both decoders of one FlatModel read the same memory, and they agree in float64."""
    model = FlatModel.from_pretrained(
        tiny_model_dir("qwen2"), dtype=torch.float64, attention=impl.attention_backend("cpu")
    )
    assert model.model_impl == "merged"  # "auto" picks it for every supported family
    layer, hf_layer = model._merged.layers[0], model._decoder.layers[0]
    attn = hf_layer.self_attn
    rows = [attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]]
    assert attn.q_proj.weight.data_ptr() == layer.qkv_weight.data_ptr()
    assert attn.k_proj.weight.data_ptr() == layer.qkv_weight[rows[0] :].data_ptr()
    assert attn.v_proj.bias.data_ptr() == layer.qkv_bias[sum(rows) :].data_ptr()  # Qwen2's qkv bias
    assert (
        hf_layer.mlp.up_proj.weight.data_ptr()
        == layer.gate_up_weight[hf_layer.mlp.gate_proj.weight.shape[0] :].data_ptr()
    )
    ids = torch.randint(0, VOCAB_SIZE, (13,), generator=torch.Generator().manual_seed(8)).tolist()
    req = impl.new_request("r", ids, SamplingParams(max_tokens=1))
    batch = build_batch(SchedulerOutput(scheduled=[(req, len(ids))]), ShuffledTables(8, 4, ["r"]))
    merged = model.forward(batch.input_ids, batch.positions, batch.meta, model.allocate_kv(8, 4))
    model._merged = None  # the same modules through transformers' own decoder forward
    hf_path = model.forward(batch.input_ids, batch.positions, batch.meta, model.allocate_kv(8, 4))
    assert torch.allclose(merged, hf_path, atol=1e-12, rtol=1e-12)


def test_unknown_model_impl_is_refused(impl):
    with pytest.raises(ValueError, match="model_impl"):
        FlatModel.from_pretrained(
            tiny_model_dir("llama"), attention=impl.attention_backend("cpu"), model_impl="vllm"
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_joint_qk_norm_and_rope_equal_the_family_modules(impl, family):
    """MergedLayer norms (Qwen3) and rotates q|k as one tensor with its own two helpers: they must
    compute exactly what the family's q_norm/k_norm modules and apply_rotary_pos_emb compute."""
    import sys

    from enginespec.worker.merged_decoder import rms_norm, rotate_neox

    model = FlatModel.from_pretrained(tiny_model_dir(family), attention=impl.attention_backend("cpu"))
    attn, layer = model._decoder.layers[0].self_attn, model._merged.layers[0]
    assert model._merged.rope_table is not None  # default and llama3 rope are position-only: tabled
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(5, layer.num_q, layer.head_dim, generator=gen)
    k = torch.randn(5, layer.num_kv, layer.head_dim, generator=gen)
    positions = torch.tensor([0, 3, 17, 64, 200])
    cos, sin = model._merged.rope(q, positions)  # views of one gathered [5, 2, D] table row each
    want_cos, want_sin = model._merged.rotary_emb(q, positions[None])  # the family's own module
    assert torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0])
    expected = sys.modules[type(attn).__module__].apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    assert torch.equal(rotate_neox(torch.cat([q, k], 1), cos, sin), torch.cat(expected, 1))
    if family == "qwen3":
        joint = rms_norm(torch.cat([q, k], 1), layer.qk_norm_weight, layer.qk_norm_eps)
        assert torch.equal(joint, torch.cat([attn.q_norm(q), attn.k_norm(k)], 1))
    else:
        assert layer.qk_norm_weight is None


def _check_19_positions(impl, model, hf) -> None:
    """One prefill of 19 random ids through `model` (past the 12 positions the rope tests'
    checkpoints state) gives transformers' logits."""
    ids = torch.randint(0, VOCAB_SIZE, (19,), generator=torch.Generator().manual_seed(4)).tolist()
    req = impl.new_request("r", ids, SamplingParams(max_tokens=1))
    batch = build_batch(SchedulerOutput(scheduled=[(req, len(ids))]), ShuffledTables(8, 4, ["r"]))
    logits = model.compute_logits(
        model.forward(batch.input_ids, batch.positions, batch.meta, model.allocate_kv(8, 4))
    )
    assert torch.allclose(logits, _hf_logits(hf, ids), atol=ATOL, rtol=RTOL)


# Config fields real checkpoints carry that the tiny families (GQA 2:1, head_dim 16 over hidden
# 32, Qwen2's qkv bias only) do not: family, config overrides.
CONFIG_VARIANTS = {
    "mha": ("llama", dict(num_key_value_heads=4)),
    "gqa-4-to-1": ("qwen3", dict(num_key_value_heads=1)),
    "head-dim-past-hidden": ("mistral", dict(head_dim=32)),  # 4 x 32 > hidden 32, as Qwen3-0.6B's
    "llama-attention-and-mlp-bias": ("llama", dict(attention_bias=True, mlp_bias=True)),
    "qwen3-attention-bias": ("qwen3", dict(attention_bias=True)),
    "large-rms-norm-eps": ("qwen2", dict(rms_norm_eps=0.1)),
}


@pytest.mark.parametrize("model_impl", MODEL_IMPLS)
@pytest.mark.parametrize("variant", list(CONFIG_VARIANTS))
def test_config_variants_match_transformers(impl, tmp_path, variant, model_impl):
    """Head groupings (MHA, 4 q heads over 1 kv head), a head_dim whose heads span more than the
    hidden size, Llama's attention and MLP biases (the merged decoder concatenates them with the
    weights; the checkpoint writer randomizes them), Qwen3's attention bias and a large
    rms_norm_eps: every decoder gives transformers' logits."""
    from enginespec.testing.checkpoints import make_checkpoint

    family, overrides = CONFIG_VARIANTS[variant]
    path = make_checkpoint(family, tmp_path / variant, seed=5, **overrides)
    model = _load(path, impl.attention_backend("cpu"), model_impl)
    _check_19_positions(impl, model, _hf_model(path))


def test_dynamic_rope_is_computed_per_step(impl, tmp_path):
    """A rope type that rescales with the longest position (dynamic NTK) gets no cos/sin table,
    and still matches transformers past the original context (where the rescaling starts)."""
    from enginespec.testing.checkpoints import make_checkpoint

    path = make_checkpoint(
        "llama",
        tmp_path / "dyn",
        max_position_embeddings=12,
        seed=3,
        rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0),
    )
    hf = _hf_model(path)
    model = FlatModel.from_pretrained(path, attention=impl.attention_backend("cpu"))
    assert model.model_impl == "merged" and model._merged.rope_table is None
    _check_19_positions(impl, model, hf)


PER_REQUEST_ROPES = {
    "dynamic": dict(
        max_position_embeddings=12, rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)
    ),
    "longrope": dict(
        max_position_embeddings=24,
        rope_parameters=dict(
            rope_type="longrope",
            rope_theta=1e4,
            short_factor=[1.0] * 8,
            long_factor=[2.0] * 8,
            original_max_position_embeddings=12,
        ),
    ),
}


@pytest.mark.parametrize("model_impl", ["merged", "transformers"])
@pytest.mark.parametrize("rope", list(PER_REQUEST_ROPES))
def test_length_scaled_rope_is_computed_request_by_request(impl, tmp_path, rope, model_impl):
    """Dynamic NTK and longrope scale by the context length: transformers' module takes it as the
    longest position it is called with (and dynamic keeps the largest it has seen). Over a flat
    batch that scaled a short request by its neighbour's length; now three requests in one step
    (longest first, so a kept scaling would reach the others) each get transformers' logits over
    that request alone, through either decoder, and the model refuses CUDA graphs."""
    from enginespec.testing.checkpoints import make_checkpoint
    from enginespec.worker.cuda_graphs import DecodeGraphs

    path = make_checkpoint("llama", tmp_path / rope, seed=3, **PER_REQUEST_ROPES[rope])
    model = _load(path, impl.attention_backend("cpu"), model_impl)
    gen = torch.Generator().manual_seed(11)
    prompts = {
        rid: torch.randint(0, VOCAB_SIZE, (n,), generator=gen).tolist()
        for rid, n in [("a", 19), ("b", 15), ("c", 5)]
    }
    reqs = [impl.new_request(rid, ids, SamplingParams(max_tokens=1)) for rid, ids in prompts.items()]
    manager = ShuffledTables(18, 4, list(prompts), seed=12)
    batch = build_batch(SchedulerOutput(scheduled=[(r, r.num_tokens) for r in reqs]), manager)
    logits = model.compute_logits(
        model.forward(batch.input_ids, batch.positions, batch.meta, model.allocate_kv(18, 4))
    )
    start = 0
    for rid, ids in prompts.items():
        expected = _hf_logits(_hf_model(path), ids)  # a fresh model: dynamic's keeps its scaling
        got = logits[start : start + len(ids)]
        assert torch.allclose(got, expected, atol=ATOL, rtol=RTOL), (rid, (got - expected).abs().max())
        start += len(ids)
    assert model.rope_per_request
    with pytest.raises(ValueError, match="request by request"):
        DecodeGraphs(model, [], block_size=4, max_model_len=24, max_num_seqs=4)


@pytest.mark.parametrize(
    "rope, reach",
    [
        (dict(rope_type="linear", rope_theta=10000.0, factor=2.0), 24),
        (dict(rope_type="yarn", rope_theta=10000.0, factor=2.0, original_max_position_embeddings=10), 20),
    ],
    ids=["linear", "yarn"],
)
def test_stretching_rope_scalings_serve_past_max_position_embeddings(impl, tmp_path, rope, reach):
    """A linear or yarn rope scaling serves factor x the positions it stretches, as vLLM derives
    the context (Qwen's yarn x4 over 32,768 positions: 131,072): the cos/sin table covers them
    and the logits match transformers past max_position_embeddings (they used to index past the
    table's 12 rows); the engine's default max_model_len is that reach, and one more is refused."""
    from enginespec.engine_args import EngineArgs
    from enginespec.testing.checkpoints import make_checkpoint

    path = make_checkpoint(
        "llama", tmp_path / "stretched", max_position_embeddings=12, seed=3, rope_parameters=rope
    )
    hf = _hf_model(path)
    model = FlatModel.from_pretrained(path, attention=impl.attention_backend("cpu"))
    assert model.max_positions == reach and model._merged.rope_table.shape[0] == reach
    _check_19_positions(impl, model, hf)
    assert EngineArgs(model=str(path)).resolve_max_model_len(model.max_positions) == reach
    with pytest.raises(ValueError, match=rf"max_model_len must be .* an int in \[2, {reach}\]"):
        EngineArgs(model=str(path), max_model_len=reach + 1).resolve_max_model_len(model.max_positions)


def test_rope_scalings_that_state_their_length_are_not_stretched():
    """llama3 (and longrope) checkpoints give their extended length in max_position_embeddings
    already; an unscaled rope, or a factor of 1, changes nothing."""
    from types import SimpleNamespace

    from enginespec.worker.merged_decoder import max_positions

    def config(rope, key="rope_parameters"):
        return SimpleNamespace(max_position_embeddings=100, **{key: rope})

    assert max_positions(config(dict(rope_type="llama3", factor=8.0))) == 100
    assert max_positions(config(dict(rope_type="default"))) == 100
    assert max_positions(config(dict(rope_type="linear", factor=1.0))) == 100
    assert max_positions(config(None)) == 100
    assert max_positions(config(dict(type="dynamic", factor=4), key="rope_scaling")) == 400  # older configs


def test_fused_qkv_route_equals_the_composed_one(impl):
    """A backend with write_qkv gets each layer's raw q|k|v rows (enginespec::paged_attention_qkv:
    norm, rotary and K/V write in the backend); the result, pool included, is what the decoder's
    own norm + rotary + paged_attention route computes. Backends without it keep that route."""
    backend = impl.attention_backend("cpu")
    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=backend, model_impl="merged")
    fused = callable(getattr(backend, "write_qkv", None))
    layers = model._merged.layers
    assert all(layer.fuse_qkv_rope == fused for layer in layers)
    ids = torch.randint(0, VOCAB_SIZE, (13,), generator=torch.Generator().manual_seed(5)).tolist()
    req = impl.new_request("r", ids, SamplingParams(max_tokens=1))
    batch = build_batch(SchedulerOutput(scheduled=[(req, len(ids))]), ShuffledTables(8, 4, ["r"]))
    runs = []
    for route in (fused, False):
        for layer in layers:
            layer.fuse_qkv_rope = route
        kv = model.allocate_kv(8, 4)
        runs.append((model.forward(batch.input_ids, batch.positions, batch.meta, kv), kv))
    (hidden_a, kv_a), (hidden_b, kv_b) = runs
    torch.testing.assert_close(hidden_a, hidden_b, atol=1e-5, rtol=1e-5)
    for a, b in zip(kv_a, kv_b):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
