"""worker/skinny_linear.py: the measured cuBLAS-or-Triton choice for the decoder's projections.

On CPU: the candidate launch shapes are valid, the switch reads EngineArgs then the env var, and
a merged decoder whose layers point at `enginespec::linear` sends every projection through the
table and computes what F.linear computes (the kernel under TRITON_INTERPRET, choices set by
hand: timing needs a GPU). On CUDA: install() measures every projection shape and row bucket of
a tiny bf16 model and the decoder still agrees with cuBLAS.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F

from enginespec.kernels import compile_pool
from enginespec.kernels.skinny_gemm import MAX_GEMV_ROWS, SkinnyConfig, launch_grid
from enginespec.spec import SamplingParams, SchedulerOutput, build_batch
from enginespec.testing.checkpoints import VOCAB_SIZE, tiny_model_dir
from enginespec.worker import gemm_tuning, skinny_ops
from enginespec.worker import skinny_linear as sl
from enginespec.worker.flat_model import FlatModel

CUDA = torch.cuda.is_available()
# The tests that set choices by hand run the kernel on CPU tensors, which needs the interpreter;
# on a GPU machine test_install_measures_every_projection_on_cuda covers the path instead.
interpreted = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors through the Triton interpreter"
)


@pytest.mark.parametrize("bucket", [1, 2, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("n,k", [(4096, 1024), (1024, 3072)])
def test_candidates_are_valid_launch_shapes(bucket, n, k):
    found = gemm_tuning.candidates(bucket, n, k, num_sms=132)
    assert found and all(isinstance(c, SkinnyConfig) for c in found)
    assert len(set(found)) == len(found)
    # 4-32 rows: tensor-core tiles of one K step a split (the whole weight tile before the wait)
    one_step = [c for c in found if c.use_dot and c.num_stages == 1]
    assert bool(one_step) == (bucket in gemm_tuning.ONE_STEP_ROWS)
    for c in one_step:  # K in slices of at most ONE_STEP_MAX_K, every split exactly one step
        assert c.block_k <= gemm_tuning.ONE_STEP_MAX_K
        assert launch_grid(c, n, k) == (-(-n // c.block_n), c.num_splits, c.block_k)
        assert (c.num_splits - 1) * c.block_k < k <= c.num_splits * c.block_k
    for c in found:
        assert c.max_rows is None or bucket <= c.max_rows
        if c.gemv:  # one tile holds a whole row: the least power of two >= K
            assert c.num_splits == 1 and c.block_k >= k > c.block_k // 2
        elif c not in one_step:
            assert c.num_splits in (1, 2, 4, 8) and k // c.num_splits >= c.block_k
    # up to 4 rows (within the kernel's 8), the one-tile (gemv) shapes are among those timed
    assert gemm_tuning.GEMV_TUNE_ROWS <= MAX_GEMV_ROWS
    assert any(c.gemv for c in found) == (bucket <= gemm_tuning.GEMV_TUNE_ROWS)
    # Few output tiles (N = 1024) need K splits to give 132 SMs work; each shape also runs unsplit.
    assert {1} < {c.num_splits for c in found} if n == 1024 else 1 in {c.num_splits for c in found}
    # and each tiled shape with its most splits (<= 8): slices of one step where K allows
    for c in found:
        if not c.gemv and c not in one_step:
            most = max(s for s in (1, 2, 4, 8) if k // s >= c.block_k)
            assert SkinnyConfig(c.block_n, c.block_k, most, c.use_dot, c.num_warps, c.num_stages) in found


def test_gemv_tune_rows_env_widens_the_one_tile_shapes(monkeypatch):
    """ENGINESPEC_GEMV_TUNE_ROWS (an A/B knob) offers the one-tile shapes up to its rows, at most
    the kernel's MAX_GEMV_ROWS, and is part of the table file's fingerprint (a table tuned with
    one setting is never loaded under another)."""
    from enginespec.worker import skinny_table_file

    assert not any(c.gemv for c in gemm_tuning.candidates(8, 1024, 2048, num_sms=132))
    before = skinny_table_file.fingerprint("cpu")
    monkeypatch.setenv(gemm_tuning.GEMV_ROWS_ENV, "8")
    assert gemm_tuning.gemv_tune_rows() == 8
    wide = [c for c in gemm_tuning.candidates(8, 1024, 2048, num_sms=132) if c.gemv]
    assert wide and all(c.max_rows >= 8 and c.block_k == 2048 for c in wide)
    assert not any(c.gemv for c in gemm_tuning.candidates(16, 1024, 2048, num_sms=132))
    assert skinny_table_file.fingerprint("cpu") != before
    for bad in ("3", "16", "0", "x"):
        monkeypatch.setenv(gemm_tuning.GEMV_ROWS_ENV, bad)
        with pytest.raises(
            ValueError, match=f"{gemm_tuning.GEMV_ROWS_ENV} must be a power of two from 1 to 8"
        ):
            gemm_tuning.gemv_tune_rows()


def test_no_one_step_tile_with_silu_mul():
    """Two weight tiles (gate and up) a step spill registers (3-7 KB on sm_90): not offered."""
    found = gemm_tuning.candidates(8, 3072, 1024, num_sms=132, silu_mul=True)
    assert found and not any(c.use_dot and c.num_stages == 1 for c in found)


def test_no_one_tile_candidate_past_its_row_bound():
    """K = 12,288 (the 8B shape's down projection): a one-tile row that long measured 1.5x the
    tiled kernel on the H200, so only tiled shapes are timed for it."""
    assert not any(c.gemv for c in gemm_tuning.candidates(1, 4096, 12288, num_sms=132))
    assert any(c.gemv for c in gemm_tuning.candidates(1, 4096, 4096, num_sms=132))


def test_fused_variants_time_the_plain_variants_best_shapes():
    table = sl.LinearTable("cpu", max_rows=4)
    every = gemm_tuning.candidates(4, 6144, 1024, num_sms=132)
    assert table._candidates(4, 6144, 1024, 132, "norm_silu") == gemm_tuning.candidates(
        4, 3072, 1024, num_sms=132, silu_mul=True
    )  # nothing ranked yet: every shape, for the silu variant's output columns
    table.ranked[(4, 6144, 1024)] = every[::-1]
    assert table._candidates(4, 6144, 1024, 132, "plain") == every
    assert table._candidates(4, 6144, 1024, 132, "norm_silu") == every[::-1][: sl.FUSED_TRIES]


def test_pick_breaks_ties_toward_the_smaller_per_thread_tile():
    from enginespec.kernels.skinny_gemm import SkinnyConfig

    small = SkinnyConfig(4, 1024, use_dot=False, gemv=True)  # 32 weight elements a thread
    big = SkinnyConfig(8, 1024, use_dot=False, gemv=True)  # 64
    wide = SkinnyConfig(8, 1024, use_dot=False, num_warps=8, gemv=True)  # 32, slower than small
    assert sl.per_thread(small) == sl.per_thread(wide) == 32 and sl.per_thread(big) == 64
    # within TIE_MARGIN of the fastest: the smaller tile, though it timed slower
    assert sl.pick([(4.00, big), (4.10, small)], 10.0) == sl.Choice(small, 4.10, 10.0)
    # past TIE_MARGIN: the fastest
    assert sl.pick([(4.00, big), (4.20, small)], 10.0).config == big
    # equal tiles: the faster; equal times too: the earlier
    assert sl.pick([(4.10, wide), (4.05, small), (4.00, big)], 10.0).config == small
    assert sl.pick([(4.0, wide), (4.0, small)], 10.0).config == wide
    # nothing beats the baseline by WIN_MARGIN: the baseline, untouched by the tie rule
    assert sl.pick([(9.8, small)], 10.0) == sl.Choice(None, 10.0, 10.0)
    assert sl.pick([], 10.0).config is None
    # a tie only among winners: a loser within the margin of the fastest winner is not taken
    assert sl.pick([(9.6, big), (9.75, small)], 10.0).config == big


def test_refine_takes_the_shape_the_step_graph_times_fastest():
    """refine's choice for one key: each close shape timed in the step graph (here a fake
    timer reading which shape the table holds), two rounds, the faster of each; the pick stays
    unless beaten by REFINE_WIN, and a pick outside the options is timed too."""
    from enginespec.kernels.skinny_gemm import SkinnyConfig

    a, b, c = (SkinnyConfig(n, 1024, use_dot=False, gemv=True) for n in (4, 8, 16))
    key = (1, 64, 1024, torch.bfloat16, False, "norm_silu")
    table = sl.LinearTable("cpu", max_rows=1)
    options = [(10.0, a), (10.5, b), (10.8, c)]

    def refine(step_us, current=a, opts=options):
        table.choices[key] = sl.Choice(current, 10.0, 20.0)
        seen = []

        def time_step():
            seen.append(table.choices[key].config)
            return step_us[table.choices[key].config] + 0.5 * (len(seen) <= 3)  # round 1 slower

        got = table._refine_key(key, opts, time_step)
        assert table.choices[key] == got
        return got, seen

    got, seen = refine({a: 100.0, b: 90.0, c: 99.9})
    assert got == sl.Choice(b, 10.5, 20.0) and seen == [a, b, c, a, b, c]
    assert refine({a: 100.0, b: 99.8, c: 100.2})[0].config == a  # within REFINE_WIN: kept
    got, seen = refine({a: 100.0, b: 95.0, c: 80.0}, current=c, opts=options[:2])
    assert got.config == c and seen == [a, b, c, a, b, c]
    rows = [m for m in table.measured if "step_us" in m]
    assert len(rows) == 9 and rows[-1] == {"rows": 1, "n": 64, "k": 1024, "variant": "norm_silu",
                                           "config": str(c), "step_us": 80.0}  # fmt: skip
    # the baseline (config None: its separate launches) is an option like a shape, and wins
    got, seen = refine({a: 100.0, None: 90.0}, opts=[(10.0, a), (10.9, None)])
    assert got == sl.Choice(None, 10.9, 20.0) and seen == [a, None, a, None]


@pytest.mark.parametrize("baseline_us,refined", [(10.2, True), (11.5, False)])
def test_a_baseline_close_to_the_pick_is_refined_with_it(monkeypatch, baseline_us, refined):
    """_tune_one keeps, for refine, the shapes within REFINE_MARGIN of the fastest and the
    baseline when it is within REFINE_MARGIN of the pick: the tuning graph times a kernel after
    itself, and a fused launch that wins there by a little may lose in the step's order to the
    separate launches it replaces (an H100, 44fcb6c: a 32-row q|k|v with its row scale won its
    tuning 7.37 against 8.0 us, and the 32-row decode graph ran 2.3% slower with it)."""
    from enginespec.kernels.skinny_gemm import SkinnyConfig

    a, b = SkinnyConfig(16, 1024, num_stages=1), SkinnyConfig(32, 1024, num_stages=1)
    table = sl.LinearTable("cpu", max_rows=32)
    monkeypatch.setattr(sl, "graph_us", lambda fn, n: (baseline_us, []))
    monkeypatch.setattr(table, "_candidates", lambda *args: [a, b])
    monkeypatch.setattr(table, "_time_candidate", lambda config, x, calls, want: {a: 9.5, b: 10.0}[config])
    layers = [{"weight": torch.zeros(64, 16), "bias": None, "norm_weight": torch.ones(16), "eps": 1e-6}]
    table._tune_one(32, layers, 132, "norm")
    key = (32, 64, 16, torch.float32, False, "norm")
    assert table.choices[key].config == a
    assert table.close[key] == [(9.5, a), (10.0, b)] + ([(baseline_us, None)] if refined else [])


def test_folded_layers_tune_the_norm_variants_as_the_row_scale_baseline(monkeypatch):
    """With ENGINESPEC_ROW_SCALE=1 a folded layer's fused calls are the row-scale variants; the
    norm variants are tuned over the same calls (the norm's unit weight, no row_scale), so that
    an rscale key with no winning kernel runs what the layer ran before: the norm variant's
    choice."""
    from enginespec.impls.fast.attention import FastAttention
    from enginespec.worker.merged_decoder import FOLD_NORMS_ENV, ROW_SCALE_ENV

    monkeypatch.setenv(FOLD_NORMS_ENV, "1")
    monkeypatch.setenv(ROW_SCALE_ENV, "1")
    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=FastAttention("cpu"))
    layers = model.merged.layers
    for norm, scaled in (("norm", "rscale"), ("norm_silu", "rscale_silu")):
        plain_calls = [c for g in skinny_ops.tuning_groups(layers, norm).values() for c in g]
        scaled_calls = [c for g in skinny_ops.tuning_groups(layers, scaled).values() for c in g]
        assert len(plain_calls) == len(scaled_calls) == len(layers)
        assert not any(c.get("row_scale") for c in plain_calls) and all(c["row_scale"] for c in scaled_calls)
        for p, q in zip(plain_calls, scaled_calls):
            assert p["weight"] is q["weight"] and torch.all(p["norm_weight"] == 1)


def test_engine_max_rows_reads_its_variable_and_rejects_bad_values(monkeypatch):
    monkeypatch.delenv(sl.MAX_ROWS_ENV, raising=False)
    assert sl.engine_max_rows() == sl.ENGINE_MAX_ROWS
    monkeypatch.setenv(sl.MAX_ROWS_ENV, "32")
    assert sl.engine_max_rows() == 32
    for bad in ("0", "24", "128", "many"):
        monkeypatch.setenv(sl.MAX_ROWS_ENV, bad)
        with pytest.raises(ValueError, match=f"{sl.MAX_ROWS_ENV} must be a power of two from 1 to 64"):
            sl.engine_max_rows()


@pytest.mark.parametrize("processes", ["0", "2"])
def test_precompile_runs_every_job_and_swallows_failures(monkeypatch, processes):
    """Every job runs and a failing one is counted; with compile workers on (not under the
    interpreter, which compiles nothing) each job runs once more first, in the recording pass."""
    monkeypatch.setenv("ENGINESPEC_COMPILE_PROCESSES", processes)
    ran = []
    failed = compile_pool.precompile([lambda: ran.append(1), lambda: 1 / 0, lambda: ran.append(3)])
    try:
        from triton.runtime._async_compile import AsyncCompileMode  # noqa: F401
    except ImportError:  # this Triton has no AsyncCompileMode: precompile runs nothing
        assert (ran, failed) == ([], 0)
        return
    recorded = processes != "0" and os.environ.get("TRITON_INTERPRET", "0") != "1"
    assert (ran, failed) == ([1, 3, 1, 3] if recorded else [1, 3], 1)
    assert sl.precompile is compile_pool.precompile  # the tuning's pool is the shared one


def test_row_bucket_and_switch(monkeypatch):
    assert [sl.row_bucket(r) for r in (1, 2, 3, 4, 5, 16, 17, 64)] == [1, 2, 4, 4, 8, 16, 32, 64]
    monkeypatch.delenv(sl.ENV_SWITCH, raising=False)
    assert sl.resolve_switch(None) is True  # on by default
    monkeypatch.setenv(sl.ENV_SWITCH, "0")
    assert sl.resolve_switch(None) is False and sl.resolve_switch(True) is True
    monkeypatch.setenv(sl.ENV_SWITCH, "1")
    assert sl.resolve_switch(None) is True and sl.resolve_switch(False) is False
    with pytest.raises(ValueError, match="skinny_gemm"):
        sl.resolve_switch("yes")


def recording_norm_and_gathers(calls: list) -> tuple:
    """(final norm, embed + rope) one-launch ops, as skinny_ops.install sets them on the merged
    decoder, that append "final_norm" / "embed_rope" to `calls` when they run."""

    def final_norm(x, weight, eps):
        calls.append("final_norm")
        return torch.ops.enginespec.rms_norm(x, weight, eps)

    def embed_rope(*args):
        calls.append("embed_rope")
        return torch.ops.enginespec.embed_rope(*args)

    return final_norm, embed_rope


def _prefill(model, impl, num_tokens: int, body=None):
    from tests.worker.test_flat_model import ShuffledTables

    ids = torch.randint(0, VOCAB_SIZE, (num_tokens,), generator=torch.Generator().manual_seed(3)).tolist()
    req = impl.new_request("r", ids, SamplingParams(max_tokens=1))
    batch = build_batch(SchedulerOutput(scheduled=[(req, num_tokens)]), ShuffledTables(8, 4, ["r"]))
    dev = model.device
    meta = dataclasses.replace(
        batch.meta,
        **{
            k: getattr(batch.meta, k).to(dev)
            for k in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
        },
    )
    kv = model.allocate_kv(8, 4)
    return model.forward(batch.input_ids.to(dev), batch.positions.to(dev), meta, kv, body=body)


@interpreted
def test_one_row_through_the_one_tile_gemv_equals_the_plain_decoder(impl, monkeypatch, torch_one_thread):
    """A decode row (bucket 1) with the one-tile GEMV chosen for every fused call of every layer:
    the same hidden states as the plain decoder (float32)."""
    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=impl.attention_backend("cpu"))
    layers = model.merged.layers
    want = _prefill(model, impl, 1)
    table = sl.LinearTable("cpu", max_rows=1)
    gemv = SkinnyConfig(block_n=2, block_k=512, use_dot=False, gemv=True)
    assert max(layers[0].gate_up_weight.shape[1], layers[0].down_proj.weight.shape[1]) <= gemv.block_k
    for variant in sl.VARIANTS:
        for group in skinny_ops.tuning_groups(layers, variant):
            table.choices[(1, *group, variant)] = sl.Choice(gemv, 1.0, 2.0)
    monkeypatch.setitem(skinny_ops._TABLES, torch.device("cpu"), table)
    monkeypatch.setattr(model.merged, "fused_max_rows", 1)
    for layer in layers:
        monkeypatch.setattr(layer, "linear", torch.ops.enginespec.linear)
        monkeypatch.setattr(layer, "fused_linear", torch.ops.enginespec.fused_linear)
    torch.testing.assert_close(_prefill(model, impl, 1), want, atol=1e-5, rtol=1e-5)


def _recording_table(monkeypatch, layers, chosen: bool = True) -> tuple[sl.LinearTable, list]:
    """The CPU's table for 16-row buckets, installed for the ops: one tiled shape chosen for
    every variant's key (none when not chosen: every baseline), and the list its run() appends
    each call's variant to."""
    table = sl.LinearTable("cpu", max_rows=16)
    config = SkinnyConfig(block_n=64, block_k=32, num_splits=2)
    for variant in sl.VARIANTS if chosen else ():
        for group in skinny_ops.tuning_groups(layers, variant):
            table.choices[(16, *group, variant)] = sl.Choice(config, 1.0, 2.0)
    calls = []

    def record(x, w, b, norm_weight=None, eps=0.0, residual=None, silu_mul=False, row_scale=False):
        calls.append(sl.variant_of(norm_weight, residual, silu_mul, row_scale))
        return sl.LinearTable.run(table, x, w, b, norm_weight, eps, residual, silu_mul, row_scale)

    monkeypatch.setattr(table, "run", record)
    monkeypatch.setitem(skinny_ops._TABLES, torch.device("cpu"), table)
    return table, calls


@interpreted
@pytest.mark.parametrize(
    "fused,chosen", [(False, True), (True, True), (True, False)], ids=["linear", "fused", "baselines"]
)
def test_decoder_projections_go_through_the_table(impl, monkeypatch, torch_one_thread, fused, chosen):
    """Every projection reaches the table: four `linear` calls a layer, or with fused_linear the
    layer's four fused calls (norm + q|k|v, o + residual, norm + gate|up + SiLU * up, down +
    residual); each computes what the plain decoder computes (float32), with the kernel chosen
    for every key by hand, or with no choice (every variant's baseline: separate kernels)."""
    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=impl.attention_backend("cpu"))
    layers = model.merged.layers
    assert all(layer.can_fuse() for layer in layers)  # Qwen3: SiLU MLP, RMSNorms, plain Linears
    want = _prefill(model, impl, 11)
    table, calls = _recording_table(monkeypatch, layers, chosen)
    final_norm, embed_rope = recording_norm_and_gathers(calls)
    monkeypatch.setattr(model.merged, "fused_max_rows", 16)
    monkeypatch.setattr(model.merged, "fused_norm", final_norm)
    assert model.merged.embed_rope_fusable()
    monkeypatch.setattr(model.merged, "fused_embed_rope", embed_rope)
    for layer in layers:
        monkeypatch.setattr(layer, "linear", torch.ops.enginespec.linear)
        if fused:
            monkeypatch.setattr(layer, "fused_linear", torch.ops.enginespec.fused_linear)
    got = _prefill(model, impl, 11)
    per_layer = ["norm", "residual", "norm_silu", "residual"] if fused else ["plain"] * 4
    assert calls.count("final_norm") == 1 and calls[-1] == "final_norm"  # the final norm: one op
    assert calls.count("embed_rope") == 1 and calls[0] == "embed_rope"  # both gathers: one op
    calls = calls[1:-1]
    if chosen:
        assert calls == per_layer * len(layers)
    else:  # each baseline runs the plain (or silu) choice through run() again
        assert [c for c in calls if c in per_layer] == per_layer * len(layers)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not table.buffers.counts.any()
    x = torch.randn(17, layers[0].qkv_weight.shape[1])  # over max_rows: the baseline, F.linear
    assert torch.equal(table.run(x, layers[0].qkv_weight, None), F.linear(x, layers[0].qkv_weight))


@interpreted
@pytest.mark.parametrize("row_scale_env", ["1", "", "0"], ids=["row-scale", "default-on", "env-off"])
def test_a_folded_decoder_scales_rows_in_the_gemm_epilogue(
    impl, monkeypatch, torch_one_thread, row_scale_env
):
    """With ENGINESPEC_ROW_SCALE unset (the default) or 1, folded layers (fold_norms) take the
    rscale variants: the kernel chosen for them applies each row's norm scale after its dot
    products instead of norming x first, and the hidden states equal the unfolded plain
    decoder's (float32). 0: the norm variants. With no choice the baseline (the module's unit-weight
    norm) runs, so an untuned table computes the same too."""
    from enginespec.impls.fast.attention import FastAttention
    from enginespec.worker.merged_decoder import FOLD_NORMS_ENV, ROW_SCALE_ENV

    monkeypatch.setenv(FOLD_NORMS_ENV, "0")
    plain = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=FastAttention("cpu"))
    want = _prefill(plain, impl, 11)
    monkeypatch.setenv(FOLD_NORMS_ENV, "1")
    monkeypatch.setenv(ROW_SCALE_ENV, row_scale_env)
    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=FastAttention("cpu"))
    assert model.folded_norms
    layers = model.merged.layers
    table, calls = _recording_table(monkeypatch, layers)
    monkeypatch.setattr(model.merged, "fused_max_rows", 16)
    for layer in layers:
        monkeypatch.setattr(layer, "linear", torch.ops.enginespec.linear)
        monkeypatch.setattr(layer, "fused_linear", torch.ops.enginespec.fused_linear)
    got = _prefill(model, impl, 11)
    norm = "norm" if row_scale_env == "0" else "rscale"
    assert calls == [norm, "residual", f"{norm}_silu", "residual"] * len(layers)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert not table.buffers.counts.any()
    table.choices.clear()  # every key its baseline: the unit-weight norm, then the GEMM
    torch.testing.assert_close(_prefill(model, impl, 11), want, atol=1e-4, rtol=1e-4)


@interpreted
def test_compiled_decoder_switches_route_by_row_count(impl, monkeypatch, torch_one_thread):
    """Under torch.compile (aot_eager: traced, no code generated) the ops stay opaque and the
    decoder takes the fused calls up to fused_max_rows rows and the plain route above; both
    compute what the eager plain decoder computes. ShuffledTables(8, 4) holds up to 32 tokens."""
    from enginespec.worker.compiled import CompiledBody

    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=impl.attention_backend("cpu"))
    layers = model.merged.layers
    want = {n: _prefill(model, impl, n) for n in (1, 9, 20)}
    table = sl.LinearTable("cpu", max_rows=16)
    config = SkinnyConfig(block_n=64, block_k=32, num_splits=1)
    for variant in sl.VARIANTS:
        for group in skinny_ops.tuning_groups(layers, variant):
            for bucket in (1, 16):
                table.choices[(bucket, *group, variant)] = sl.Choice(config, 1.0, 2.0)
    seen = []
    run = sl.LinearTable.run

    def record(x, *a):
        seen.append((x.shape[0], sl.variant_of(a[2], a[4], a[5], a[6]) if len(a) == 7 else "plain"))
        return run(table, x, *a)

    monkeypatch.setattr(table, "run", record)
    monkeypatch.setitem(skinny_ops._TABLES, torch.device("cpu"), table)
    monkeypatch.setattr(model.merged, "fused_max_rows", 16)
    monkeypatch.setattr(model.merged, "fused_norm", torch.ops.enginespec.rms_norm)  # traced opaque too
    monkeypatch.setattr(model.merged, "fused_embed_rope", torch.ops.enginespec.embed_rope)
    for layer in layers:
        monkeypatch.setattr(layer, "linear", torch.ops.enginespec.linear)
        monkeypatch.setattr(layer, "fused_linear", torch.ops.enginespec.fused_linear)
    body = CompiledBody(model, backend="aot_eager")
    for n in (9, 20, 1):
        seen.clear()
        torch.testing.assert_close(_prefill(model, impl, n, body=body), want[n], atol=1e-5, rtol=1e-5)
        assert body.error is None
        route = ["norm", "residual", "norm_silu", "residual"] if n <= 16 else ["plain"] * 4
        assert seen == [(n, v) for v in route] * len(layers)


def test_tuning_seconds_split_compile_from_timing(monkeypatch):
    """LinearTable.seconds sums, over tune() calls, the candidates' compile pool's wall time
    ("compile") and the timing loop's ("time"); refine's goes to "refine". A fake clock: the
    pool takes 2 s, each (group, bucket) timing 0.5 s."""
    clock = [0.0]
    monkeypatch.setattr(sl.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(sl, "precompile", lambda jobs: clock.__setitem__(0, clock[0] + 2.0))
    monkeypatch.setattr(sl.LinearTable, "_tune_one", lambda self, *a: clock.__setitem__(0, clock[0] + 0.5))
    monkeypatch.setattr(
        sl.torch.cuda, "get_device_properties", lambda d: type("P", (), {"multi_processor_count": 132})
    )
    table = sl.LinearTable("cpu", max_rows=2)
    assert table.seconds == {"compile": 0.0, "time": 0.0, "refine": 0.0}
    weight = torch.zeros(8, 16)
    groups = {(8, 16, torch.float32, False): [{"weight": weight, "bias": None}]}
    table.tune(groups)  # buckets 1 and 2
    assert table.seconds == {"compile": 2.0, "time": 1.0, "refine": 0.0}
    table.tune(groups, "residual", buckets=[1])
    assert table.seconds == {"compile": 4.0, "time": 1.5, "refine": 0.0}
    table.refine([], buckets=[])  # nothing to refine: no time passes on the fake clock
    assert table.seconds["refine"] == 0.0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_install_measures_every_projection_on_cuda(impl):
    model = FlatModel.from_pretrained(
        tiny_model_dir("qwen3"), attention=impl.attention_backend("cuda"), dtype=torch.bfloat16, device="cuda"
    )
    layers = model.merged.layers
    table = skinny_ops.install(model.merged, "cuda", max_rows=8)
    # the variants the layers call (a row-scale call's baseline is its norm variant's choice);
    # the row-scale ones only for folded layers (ENGINESPEC_ROW_SCALE=0 turns them off)
    called = {"plain", "silu"} | {call["variant"] for layer in layers for call in layer.fused_calls()}
    called |= {"norm" + v[6:] for v in called if v.startswith("rscale")}
    assert {"plain", "silu", "norm", "norm_silu", "residual"} <= called
    for variant in sl.VARIANTS:
        groups = skinny_ops.tuning_groups(layers, variant)
        assert bool(groups) == (variant in called), variant
        for group in groups:
            for bucket in (1, 2, 4, 8):
                assert (bucket, *group, variant) in table.choices
    assert all(layer.linear is torch.ops.enginespec.linear for layer in layers)
    assert all(layer.fused_linear is torch.ops.enginespec.fused_linear for layer in layers)
    assert model.merged.fused_norm is torch.ops.enginespec.rms_norm
    assert model.merged.fused_embed_rope is torch.ops.enginespec.embed_rope
    got = _prefill(model, impl, 7)
    model.merged.fused_norm = model.merged.fused_embed_rope = None
    for layer in layers:
        layer.linear, layer.fused_linear = F.linear, None
    torch.testing.assert_close(got, _prefill(model, impl, 7), atol=5e-2, rtol=5e-2)


def test_tune_variants_compiles_the_fused_variants_in_one_call_after_the_plain_timing(monkeypatch):
    """tune_variants: one precompile call for the plain variant, then one for every fused
    variant together, whose candidates are the plain variant's fastest shapes (so the plain
    timing comes before that call); the timings run in the work's order, every variant's
    (group, bucket) once."""
    events = []
    monkeypatch.setattr(sl, "precompile", lambda jobs: events.append(("compile", [job() for job in jobs])))
    monkeypatch.setattr(sl.LinearTable, "_compile", lambda self, b, call, config, v: (b, config, v))

    def fake_tune_one(self, bucket, layers, num_sms, variant):
        events.append(("time", bucket, variant))
        if variant == "plain":  # ranked as the real timing leaves it: fastest first
            self.ranked[(bucket, *layers[0]["weight"].shape)] = [f"shape{i}" for i in range(5)]

    monkeypatch.setattr(sl.LinearTable, "_tune_one", fake_tune_one)
    monkeypatch.setattr(
        sl.torch.cuda, "get_device_properties", lambda d: type("P", (), {"multi_processor_count": 132})
    )
    table = sl.LinearTable("cpu", max_rows=2)
    groups = {(8, 16, torch.float32, False): [{"weight": torch.zeros(8, 16), "bias": None}]}
    table.tune_variants([(groups, "plain"), (groups, "norm"), (groups, "residual")])
    kinds = [e[0] for e in events]
    assert kinds == ["compile", "time", "time", "compile", "time", "time", "time", "time"]
    plain_jobs, fused_jobs = events[0][1], events[3][1]
    assert sorted(map(str, plain_jobs)) == sorted(
        str((b, c, "plain")) for b in (1, 2) for c in sl.candidates(b, 8, 16, 132)
    )  # every launch shape of the plain variant
    shapes = [f"shape{i}" for i in range(sl.FUSED_TRIES)]
    assert sorted(fused_jobs) == sorted(
        (b, c, v) for v in ("norm", "residual") for b in (1, 2) for c in shapes
    )
    assert [e[1:] for e in events if e[0] == "time"] == [
        (1, "plain"), (2, "plain"), (1, "norm"), (2, "norm"), (1, "residual"), (2, "residual")
    ]  # fmt: skip
    assert table.seconds["compile"] >= 0.0  # both calls' walls summed (a real clock here)


def test_run_sends_only_dense_rows_up_to_max_rows_to_the_chosen_kernel(monkeypatch):
    """run() without fusion arguments is the plain variant (row_scale off unless asked): a row
    count from 1 to max_rows whose bucket has a choice launches the kernel, with no fusion; 0
    rows, more than max_rows (even where a wider bucket holds a choice), and an x or residual
    whose last dim is strided take the baseline. The decoder tests route by hand-set choices
    through a recording run(), so the table's own defaults and bounds went unchecked there."""
    import enginespec.kernels.skinny_gemm as sg

    launched = []

    def kernel(x, weight, bias, config, buffers, silu_mul, norm_weight, eps, residual, row_scale=False):
        launched.append((x.shape[0], silu_mul, norm_weight is not None, residual is not None, row_scale))
        return F.linear(x, weight, bias) + (0 if residual is None else residual)

    monkeypatch.setattr(sg, "skinny_linear", kernel)
    table = sl.LinearTable("cpu", max_rows=16)
    w = torch.randn(8, 32)
    for bucket in (1, 2, 4, 8, 16, 32):
        for variant in ("plain", "residual"):
            table.choices[table.key(bucket, w, None, variant)] = sl.Choice(SkinnyConfig(64, 32), 1.0, 2.0)
    for rows in (1, 16, 0, 17):
        x = torch.randn(rows, 32)
        launched.clear()
        assert torch.equal(table.run(x, w, None), F.linear(x, w))
        assert launched == ([(rows, False, False, False, False)] if rows in (1, 16) else []), rows
    x = torch.randn(4, 64)[:, ::2]  # a strided last dim: the kernel reads rows as contiguous
    launched.clear()
    assert torch.equal(table.run(x, w, None), F.linear(x, w)) and launched == []
    x, residual = torch.randn(4, 32), torch.randn(4, 16)[:, ::2]
    launched.clear()
    torch.testing.assert_close(table.run(x, w, None, residual=residual), F.linear(x, w) + residual)
    assert launched == [(4, False, False, False, False)]  # the baseline: the plain choice, then the add


def test_tune_one_times_each_variant_s_own_calls_and_keeps_the_close_shapes_at_the_margin(monkeypatch):
    """_tune_one times a variant's calls with its own fusions (SiLU * up for the _silu ones, a
    residual only for "residual"), ranks the launch shapes for the fused variants only from the
    plain one, and keeps for refine, of a step variant whose pick is a kernel, the shapes up to
    exactly REFINE_MARGIN past the fastest and the baseline up to exactly REFINE_MARGIN past the
    pick (both bounds inclusive); the plain variant is not refined."""
    a, b, c = (SkinnyConfig(n, 1024, num_stages=1) for n in (16, 32, 64))
    edge = 9.5 * (1 + sl.REFINE_MARGIN)
    times = {a: 9.5, b: edge, c: edge * 1.01}  # c: past the fastest's margin, within b's
    table = sl.LinearTable("cpu", max_rows=32)
    seen = []

    def time_candidate(config, x, calls, want):
        seen.append([(call["silu_mul"], call["residual"] is not None) for call in calls])
        return times[config]

    monkeypatch.setattr(sl, "graph_us", lambda fn, n: (edge, []))  # the baseline: the pick's margin
    monkeypatch.setattr(table, "_candidates", lambda *args: [a, b, c])
    monkeypatch.setattr(table, "_time_candidate", time_candidate)
    norm = {"norm_weight": torch.ones(16), "eps": 1e-6}
    for variant in ("norm", "norm_silu", "residual", "plain"):
        layers = [{"weight": torch.zeros(64, 16), "bias": None, **(norm if "norm" in variant else {})}]
        seen.clear()
        table._tune_one(32, layers, 132, variant)
        assert seen == [[("silu" in variant, variant == "residual")]] * 3, variant
        key = (32, 64, 16, torch.float32, False, variant)
        assert table.choices[key].config == a
        if variant == "plain":
            assert key not in table.close and table.ranked == {(32, 64, 16): [a, b, c]}
        else:
            assert table.close[key] == [(9.5, a), (edge, b), (edge, None)] and table.ranked == {}, variant


def test_refine_keeps_the_pick_against_a_shape_exactly_refine_win_faster():
    """Another option replaces the pick only when the step graph runs more than REFINE_WIN faster
    with it: at exactly REFINE_WIN the pick stays (the strict bound of the docstring)."""
    a, b = (SkinnyConfig(n, 1024, use_dot=False, gemv=True) for n in (4, 8))
    key = (1, 64, 1024, torch.bfloat16, False, "norm")
    table = sl.LinearTable("cpu", max_rows=1)
    for b_us, winner in ((100.0 * (1 - sl.REFINE_WIN), a), (100.0 * (1 - sl.REFINE_WIN) - 0.01, b)):
        step = {a: 100.0, b: b_us}
        table.choices[key] = sl.Choice(a, 10.0, 20.0)
        got = table._refine_key(
            key, [(10.0, a), (10.5, b)], lambda step=step: step[table.choices[key].config]
        )
        assert got.config == winner, b_us


def test_a_tuning_call_without_fusion_keys_runs_no_fusion():
    """The plain variant's tuning calls are {"weight", "bias"} alone (tuning_groups): the keys
    they lack read as no norm, no residual, no SiLU * up and no row scale, which is what the
    baseline, the compile pass and every timed candidate of those calls run."""
    w = torch.zeros(4, 8)
    args = sl._args({"weight": w, "bias": None})
    assert args.pop("weight") is w
    assert args == {
        "bias": None,
        "norm_weight": None,
        "eps": 0.0,
        "residual": None,
        "silu_mul": False,
        "row_scale": False,
    }


def test_a_row_scale_call_without_a_kernel_pick_runs_the_norm_variant_s_choice(monkeypatch):
    """A folded layer's row-scale call whose bucket kept its baseline (no rscale kernel won)
    runs what the layer ran unfolded: the norm variant's choice, one fused launch with the
    norm's unit weight. It had run the norm variant's own baseline instead (an RMSNorm launch,
    then the plain choice): one launch more a call, which made the one-row decode graph 14%
    slower on an H100 with the row scale on (benchmarks/RESULTS.md, fifty-first session),
    though the tuning had timed the norm choice as the row-scale baseline."""
    import enginespec.kernels.skinny_gemm as sg

    launched = []

    def kernel(x, weight, bias, config, buffers, silu_mul, norm_weight, eps, residual, row_scale=False):
        launched.append((config, silu_mul, norm_weight is not None, row_scale))
        return F.linear(x, weight, bias)

    monkeypatch.setattr(sg, "skinny_linear", kernel)
    monkeypatch.setattr(sl, "rms_norm_any", lambda x, w, eps: launched.append("rms_norm") or x)
    table = sl.LinearTable("cpu", max_rows=8)
    w, ones, fused = torch.randn(8, 32), torch.ones(32), SkinnyConfig(64, 32)
    for silu in (False, True):
        for variant in ("norm_silu", "rscale_silu") if silu else ("norm", "rscale"):
            pick = None if variant.startswith("rscale") else fused
            table.choices[table.key(1, w, None, variant)] = sl.Choice(pick, 1.0, 1.0)
        launched.clear()
        table.run(torch.randn(1, 32), w, None, ones, 1e-6, silu_mul=silu, row_scale=True)
        assert launched == [(fused, silu, True, False)], silu


def test_table_fingerprint_changes_with_the_picker_source(monkeypatch):
    """The picker's rules (worker/skinny_linear.py: WIN_MARGIN, TIE_MARGIN, which keys are
    offered which shapes) decide what a table holds as much as the kernel and the candidates do:
    a file picked under other rules is not loaded after an upgrade. Each hashed module changes
    the fingerprint on its own."""
    from enginespec.worker import skinny_linear, skinny_table_file

    before = skinny_table_file.fingerprint("cpu")
    real = skinny_table_file._source_hash

    def edited(module):
        digest = real(module)
        return digest[::-1] if module is skinny_linear else digest

    monkeypatch.setattr(skinny_table_file, "_source_hash", edited)
    after = skinny_table_file.fingerprint("cpu")
    assert after != before
    assert [k for k in after if after[k] != before[k]] == ["picker"]
