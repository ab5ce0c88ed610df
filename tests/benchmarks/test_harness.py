"""The throughput harness (benchmarks/throughput.py and the modules it runs) on a CPU: a tiny
shape and a tiny workload, end to end, plus the pieces it is built from (workload draw,
roofline arithmetic, shape checkpoints).

No timing is asserted: only that the JSON holds every field, that counts are exact (each
request produces exactly its requested output length under ignore_eos, in the engine and in
transformers), and that derived numbers agree with the ones they are derived from.
"""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import engine_runs, roofline, throughput
from benchmarks.decode_profile import device_busy_us
from enginespec.testing import checkpoints
from enginespec.testing.workload import Workload, make_workload

SMOKE = [
    "--shape",
    "tiny",
    "--device",
    "cpu",
    "--num-requests",
    "4",
    "--max-input-len",
    "32",
    "--max-output-len",
    "16",
    "--big-num-requests",
    "2",
    "--profile-steps",
    "2",
    "--latency-tokens",
    "4",
    "--compare-scheduling",
    "--repeat",
    "3",
]


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synth")


@pytest.fixture(scope="module")
def smoke(request, synth_dir, tmp_path_factory):
    """One harness run; torch on one thread (a shared CPU box thrashes with more)."""
    impl = request.config.getoption("--impl", default=None) or "reference"
    out = tmp_path_factory.mktemp("bench") / "throughput.json"
    mp = pytest.MonkeyPatch()
    mp.setenv("ENGINESPEC_SYNTH_DIR", str(synth_dir))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = throughput.main(SMOKE + ["--impl", impl, "--out", str(out), "--strict"])
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    return code, json.loads(out.read_text())


def _expected_workload(vocab_size: int) -> Workload:
    return make_workload(
        4,
        min_input_len=100,
        max_input_len=32,
        min_output_len=100,
        max_output_len=16,
        id_bound=min(10000, vocab_size),
        seed=0,
    )


def test_harness_json_has_every_phase_and_exact_counts(smoke):
    code, res = smoke
    assert code == 0
    for phase in (
        "config",
        "env",
        "workload",
        "device",
        "engine",
        "profile",
        "latency",
        "hf",
        "big",
        "summary",
    ):
        assert phase in res, phase
        assert "error" not in res[phase], res[phase].get("traceback")
    expected = _expected_workload(checkpoints.SHAPES["tiny"]["vocab_size"])
    assert res["workload"]["output_tokens"] == expected.num_output_tokens
    assert res["workload"]["prompt_tokens"] == sum(expected.prompt_lens)
    for phase in ("engine", "hf"):
        assert res[phase]["output_tokens"] == expected.num_output_tokens, phase
        assert res[phase]["num_requests"] == 4
        assert res[phase]["wall_s"] > 0
    assert res["big"]["output_tokens"] == sum(expected.output_lens[:2])
    other = res["engine"]["other_scheduling"]  # the same workload, async_scheduling flipped, same engine
    assert "error" not in other, other.get("traceback")
    assert other["async_scheduling"] != res["engine"]["async_scheduling"]
    assert other["output_tokens"] == expected.num_output_tokens and other["tokens_match_first_run"]
    summary = res["summary"]
    assert summary["scheduling_tokens_match"] is True
    assert summary["serial_output_tok_s"] > 0 and summary["async_output_tok_s"] > 0
    # Each step samples at most one token per request, so the longest request bounds the steps.
    assert res["engine"]["num_steps"] >= max(expected.output_lens)
    runs = res["engine"]["runs"]  # --repeat 3: three timed runs, the median one reported
    assert len(runs) == 3 and res["engine"]["tokens_match_across_runs"]
    assert res["engine"]["wall_s"] == sorted(r["wall_s"] for r in runs)[1]
    assert summary["runs_wall_over_floor"] == pytest.approx(
        [r["wall_s"] / res["engine"]["floor"]["floor_s"] for r in runs]
    )
    kinds = res["engine"]["by_step_kind"]  # the first run's steps, binned, against per-step floors
    assert kinds[0]["kind"] == "prefill" and all(k["kind"].startswith("decode <=") for k in kinds[1:])
    assert sum(k["steps"] for k in kinds) == runs[0]["num_steps"]
    assert 0.5 * runs[0]["wall_s"] < sum(k["wall_s"] for k in kinds) < runs[0]["wall_s"] + 0.05
    assert all(
        k["floor_s"] > 0 and k["wall_over_floor"] == pytest.approx(k["wall_s"] / k["floor_s"]) for k in kinds
    )
    assert all(0 <= k["host_wait_s"] <= k["wall_s"] for k in kinds)
    first = res["engine"]["first_steps"]  # the same trace, step by step, from the start
    assert len(first) == min(40, runs[0]["num_steps"]) and first[0]["num_tokens"] > first[0]["num_reqs"]
    assert sum(r["num_tokens"] for r in first) <= sum(expected.prompt_lens) + sum(expected.output_lens)
    assert all(r["wall_ms"] > 0 and r["floor_ms"] > 0 and r["host_wait_ms"] >= 0 for r in first)
    # Greedy steps are drawn on the device under async scheduling; the serial run has none.
    assert 0 < res["engine"]["num_async_steps"] <= res["engine"]["num_steps"]
    assert other["num_async_steps"] == 0


def test_harness_derived_numbers_agree(smoke):
    _, res = smoke
    eng, hf, s = res["engine"], res["hf"], res["summary"]
    assert eng["output_tok_s"] == pytest.approx(eng["output_tokens"] / eng["wall_s"])
    assert s["ratio_vs_hf"] == pytest.approx(eng["output_tok_s"] / hf["output_tok_s"])
    floor = eng["floor"]
    assert floor["num_steps"] == eng["num_steps"]
    assert floor["floor_s"] == pytest.approx(floor["memory_s"] + floor["compute_s"])
    assert floor["memory_s"] == pytest.approx(
        (floor["kv_bytes"] + floor["weight_bytes"]) / res["device"]["copy_bytes_per_s"]
    )
    assert s["wall_over_floor"] == pytest.approx(eng["wall_s"] / floor["floor_s"])
    assert res["device"]["copy_bytes_per_s"] > 0 and res["device"]["matmul_flops_per_s"] > 0
    assert res["latency"]["default_ms_per_token"] is not None
    assert res["profile"]["steps"] == 2 and res["profile"]["gpu_busy_fraction"] is None  # no CUDA here
    assert res["env"]["versions"]["torch"] == torch.__version__
    assert s["date"] and s["impl"] == res["config"]["impl"]


def test_bad_flag_is_a_clear_error(capsys):
    assert throughput.main(["--num-requests", "0", "--device", "cpu"]) == 2
    assert "--num-requests must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value, bound",
    [
        ("--max-input-len", "-1", ">= 1"),
        ("--min-input-len", "0", ">= 1"),
        ("--max-output-len", "-5", ">= 1"),
        ("--min-output-len", "0", ">= 1"),
        ("--id-bound", "0", ">= 1"),
        ("--copy-bytes", "-1", ">= 0"),
        ("--matmul-n", "-4", ">= 0"),
        ("--probe-iters", "-1", ">= 0"),
        ("--hf-num-requests", "-1", ">= 0"),
    ],
)
def test_a_bad_size_is_a_flag_error_before_any_work(flag, value, bound, capsys, monkeypatch):
    """A workload length or id bound below 1 was a traceback out of run() (exit 1) after the JSON
    was started; a negative probe size failed the device phase and the run went on without a
    floor. Each is now exit 2 and one line naming the flag and its bound, before any work."""
    monkeypatch.setattr(throughput, "run", lambda args: pytest.fail("ran with a bad flag"))
    assert throughput.main(["--shape", "tiny", "--device", "cpu", flag + "=" + value]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"benchmarks/throughput.py: {flag} must be {bound}, got {value}"


@pytest.mark.parametrize("script", ["throughput", "decode_sweep", "constrained_cost", "serving"])
def test_a_missing_model_dir_is_named_before_any_work(script, tmp_path, capsys, monkeypatch):
    """--model-dir that is not a local checkpoint: one line naming the flag and the path, exit 2,
    before any phase (it was a transformers traceback about Hub repo ids, exit 1)."""
    import importlib

    mod = importlib.import_module(f"benchmarks.{script}")
    went_on = lambda *a, **k: pytest.fail("went on with a bad --model-dir")  # noqa: E731
    monkeypatch.setattr(mod, "checkpoint" if hasattr(mod, "checkpoint") else "_workloads", went_on)
    missing = tmp_path / "no-such-checkpoint"
    assert mod.main(["--shape", "tiny", "--device", "cpu", "--model-dir", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"benchmarks/{script}.py: --model-dir '{missing}' does not exist")
    assert "\n" not in err
    (tmp_path / "empty").mkdir()
    assert mod.main(["--shape", "tiny", "--device", "cpu", "--model-dir", str(tmp_path / "empty")]) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_a_model_dir_may_be_a_repo_id_in_the_local_hub_cache(tmp_path, monkeypatch):
    """--model-dir takes what LLM's model takes: a repo id whose snapshot is in the local cache
    becomes that snapshot's directory before any phase reads it (a directory-only check said
    it does not exist); an uncached id names the download."""
    import argparse

    from benchmarks import engine_runs
    from enginespec.testing.checkpoints import make_checkpoint, write_hub_cache

    snapshot = write_hub_cache(make_checkpoint("qwen3", tmp_path / "src"), tmp_path / "hub", "org/tiny")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    args = argparse.Namespace(model_dir="org/tiny", shape="qwen3-0.6b")
    engine_runs.check_model_dir(args)
    assert args.model_dir == str(snapshot)
    assert engine_runs.checkpoint("qwen3-0.6b", args) == snapshot
    with pytest.raises(ValueError, match=r"^--model-dir 'org/none' does not exist.*hf download org/none"):
        engine_runs.check_model_dir(argparse.Namespace(model_dir="org/none"))


def test_workload_is_seeded_and_within_bounds():
    kw = dict(min_input_len=5, max_input_len=9, min_output_len=2, max_output_len=7, id_bound=50)
    a, b = make_workload(20, **kw), make_workload(20, **kw)
    assert a == b
    assert a != make_workload(20, seed=1, **kw)
    assert all(5 <= n <= 9 for n in a.prompt_lens) and all(2 <= n <= 7 for n in a.output_lens)
    assert all(0 <= t < 50 for p in a.prompts for t in p)
    with pytest.raises(ValueError, match="num_requests"):
        make_workload(0, **kw)


def _shape(**kw) -> roofline.ModelShape:
    base = dict(
        num_layers=2,
        hidden_size=8,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=2,
        vocab_size=10,
        num_params=1000,
        tied=True,
        dtype_bytes=2,
    )
    return roofline.ModelShape(**{**base, **kw})


def test_the_floors_shape_is_the_checkpoint_with_the_runs_hf_overrides(tmp_path):
    """`--engine-arg hf_overrides=JSON` reaches the engine (make_llm), so the floor's shape
    (shape_of) reads the config with the same overrides, through the loader's one reader:
    it is the shape of the checkpoint saved with those values. It read config.json alone, so
    an overridden model's floor and roofline counted the checkpoint's shape."""
    import shutil

    model_dir = checkpoints.make_checkpoint("qwen3", tmp_path / "plain")
    saved = tmp_path / "saved"
    shutil.copytree(model_dir, saved)
    config = json.loads((saved / "config.json").read_text())
    config.update(num_key_value_heads=4, tie_word_embeddings=True)
    (saved / "config.json").write_text(json.dumps(config))
    base = ["--device", "cpu", "--dtype", "float32", "--model-dir"]
    overrides = '{"num_key_value_heads": 4, "tie_word_embeddings": true}'
    args = throughput.parse_args([*base, str(model_dir), "--engine-arg", f"hf_overrides={overrides}"])
    shape = engine_runs.shape_of(model_dir, args)
    assert shape == engine_runs.shape_of(saved, throughput.parse_args([*base, str(saved)]))
    assert (shape.num_kv_heads, shape.tied, shape.dtype_bytes) == (4, True, 4)
    assert shape != engine_runs.shape_of(model_dir, throughput.parse_args([*base, str(model_dir)]))


def test_roofline_terms_by_hand():
    shape = _shape()
    assert shape.kv_bytes_per_token == 2 * 2 * 2 * 2 * 2
    # p=3, o=4: decodes read contexts of 4, 5 and 6 tokens.
    assert roofline.decode_kv_bytes([3], [4], shape) == 15 * 32
    assert roofline.decode_kv_bytes([3], [1], shape) == 0  # the only token came from the prefill
    assert shape.weight_bytes_per_step == 2000
    assert _shape(tied=False).weight_bytes_per_step == (1000 - 80) * 2  # the untied embedding is gathered
    # body = 1000 - 80 (one tied matrix); head on one row per prompt; causal attention 2 p^2 Hq d L.
    assert roofline.prefill_flops([3], shape) == 2 * 920 * 3 + 2 * 80 + 2 * 9 * 4 * 2 * 2
    r = roofline.roofline([3], [4], shape, num_steps=4, copy_bytes_per_s=100.0, matmul_flops_per_s=10.0)
    assert r.memory_s == pytest.approx((15 * 32 + 4 * 2000) / 100.0)
    assert r.floor_s == pytest.approx(r.memory_s + r.prefill_flops / 10.0)
    with pytest.raises(ValueError, match="num_steps"):
        roofline.roofline([3], [4], shape, num_steps=0, copy_bytes_per_s=1.0, matmul_flops_per_s=1.0)
    with pytest.raises(ValueError, match="one entry per request"):
        roofline.decode_kv_bytes([3, 4], [4], shape)


def test_param_count_matches_published_shapes():
    assert roofline.ModelShape.from_config(checkpoints.shape_config("qwen3-0.6b")).num_params == 596_049_920
    assert roofline.ModelShape.from_config(checkpoints.shape_config("qwen3-8b")).num_params == 8_190_735_360


def test_synthetic_checkpoint_shards_and_loads(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoints.make_checkpoint("tiny", tmp_path / "ckpt", max_shard_bytes=40_000)
    config = checkpoints.shape_config("tiny")
    specs = checkpoints.tensor_specs(config)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {s.name for s in specs}
    assert "lm_head.weight" not in index["weight_map"]  # tied: stored once, as save_pretrained does
    assert len(set(index["weight_map"].values())) > 1
    model = AutoModelForCausalLM.from_pretrained(str(path))
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert torch.all(model.model.norm.weight == 1)
    assert 0.01 < model.model.layers[0].mlp.up_proj.weight.float().std().item() < 0.03
    tok = AutoTokenizer.from_pretrained(str(path))
    assert len(tok) == config.vocab_size and tok.eos_token_id == config.eos_token_id
    mtime = (path / "config.json").stat().st_mtime_ns
    assert checkpoints.make_checkpoint("tiny", path, max_shard_bytes=40_000) == path
    assert (path / "config.json").stat().st_mtime_ns == mtime  # a finished checkpoint is reused


def test_shard_plan_respects_the_cap():
    specs = checkpoints.tensor_specs(checkpoints.shape_config("qwen3-8b"))
    shards = checkpoints._plan_shards(specs, 2, 2 * 1024**3)
    assert [s.name for shard in shards for s in shard] == [s.name for s in specs]
    assert all(sum(s.numel for s in shard) * 2 <= 2 * 1024**3 for shard in shards)


def test_device_busy_is_the_union_of_cuda_intervals():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def ev(device, start, end):
        return SimpleNamespace(device_type=device, time_range=SimpleNamespace(start=start, end=end))

    events = [
        ev(DeviceType.CUDA, 10, 20),
        ev(DeviceType.CUDA, 15, 25),
        ev(DeviceType.CPU, 0, 100),
        ev(DeviceType.CUDA, 40, 41),
        ev(DeviceType.CUDA, 0, 5),
    ]
    assert device_busy_us(events) == (5 + 15 + 1, 4)
    assert device_busy_us([]) == (0.0, 0)


def test_warm_up_samples_like_the_timed_run(monkeypatch):
    """The warm-up runs at the timed run's sampling settings (temperature, top-k/top-p), so a
    sampled run's one-time costs (the draw kernels' compilation) fall in the warm-up, not in the
    timed window."""
    seen = []
    monkeypatch.setattr(
        engine_runs,
        "timed_generate",
        lambda llm, workload, device, temperature=0.0, use_tqdm=True, sampling=None: seen.append(
            (temperature, sampling)
        ),
    )
    monkeypatch.setattr(engine_runs, "reset_prefix_cache", lambda llm: None)
    workload = make_workload(
        3, min_input_len=2, max_input_len=4, min_output_len=1, max_output_len=2, id_bound=50, seed=0
    )
    engine_runs.warm_up(object(), workload, "cpu", 0.8, {"top_k": 20})
    assert seen == [(0.8, {"top_k": 20})]


def test_host_phases_probe_bins_every_step(synth_dir, monkeypatch, torch_one_thread):
    """benchmarks/host_phases.py: every step lands in one bin with its phases timed, and the
    engine module's span helper is restored afterwards."""
    from benchmarks import host_phases
    from enginespec.engine import engine_core

    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(synth_dir))
    span = engine_core._span
    table = host_phases.main(
        [
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--num-requests",
            "4",
            "--max-input-len",
            "32",
            "--max-output-len",
            "16",
            "--impl",
            "fast",
        ]
    )
    assert engine_core._span is span
    assert "prefill" in table and any(kind.startswith("<=") for kind in table)
    steps = sum(n for n, _ in table.values())
    assert steps >= 16  # the longest request alone needs one step per output token
    for n, phases in table.values():
        assert n > 0 and {"schedule", "prepare", "execute", "update"} <= set(phases)
        assert all(ms >= 0 for ms in phases.values())


def test_host_phases_tail_prints_the_last_steps(synth_dir, monkeypatch, torch_one_thread, capsys):
    """--tail N prints the run's last N steps one by one, each with its rows and phases."""
    from benchmarks import host_phases

    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(synth_dir))
    args = ["--shape", "tiny", "--device", "cpu", "--num-requests", "4", "--max-input-len", "32"]
    host_phases.main(args + ["--max-output-len", "16", "--impl", "fast", "--tail", "3"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("step of")]
    assert len(lines) == 3
    assert all("prepare" in line and "execute" in line for line in lines)
    assert all(1 <= int(line.split()[2]) <= 4 for line in lines)  # "step of   4 rows, ..."


def test_host_phases_gc_and_finish_profile(synth_dir, monkeypatch, torch_one_thread, capsys, tmp_path):
    """--gc prints the cyclic GC's pauses in generate() and removes its callback; --gc-freeze
    freezes the heap first (undone here); --profile-finishes profiles only the resolves that
    finish a request: every request finishes, so there is at least one, and the file says how
    many."""
    import gc

    from benchmarks import host_phases

    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(synth_dir))
    callbacks = list(gc.callbacks)
    path = tmp_path / "finishes.txt"
    args = ["--shape", "tiny", "--device", "cpu", "--num-requests", "4", "--max-input-len", "32"]
    try:
        host_phases.main(
            args
            + ["--max-output-len", "16", "--impl", "fast", "--gc", "--gc-freeze", "--alloc-stats"]
            + ["--profile-finishes", str(path)]
        )
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert gc.callbacks == callbacks
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "cyclic GC in generate()" in line)
    assert "objects frozen" in line and "ms by kind of step" in line
    import torch

    counters = "num_alloc_retries" if torch.cuda.is_available() else "no CUDA"  # (the H200 suite)
    assert f"CUDA allocator in generate(): {counters}" in out
    head = path.read_text().splitlines()[0]
    count = int(head.split()[0])
    assert 1 <= count <= 4 and head.endswith("(profiled)")
    assert "_resolve" in path.read_text()


def test_host_phases_prefill_profile_and_sync(synth_dir, monkeypatch, torch_one_thread, capsys, tmp_path):
    """--profile-prefill profiles only the prefill steps' executes (at least one: every prompt
    is prefilled; no decode step's), --prefill-sync times a `presync` phase in the prefill bin
    only (the device's sync stood in for on the CPU) and takes it out of that bin's `execute`."""
    from benchmarks import host_phases

    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(synth_dir))
    synced = []
    monkeypatch.setattr(host_phases, "_device_sync", lambda: lambda: synced.append(1))
    path = tmp_path / "prefill.txt"
    args = ["--shape", "tiny", "--device", "cpu", "--num-requests", "4", "--max-input-len", "32"]
    table = host_phases.main(
        args + ["--max-output-len", "8", "--impl", "fast", "--prefill-sync", "--profile-prefill", str(path)]
    )
    steps, phases = table["prefill"]
    assert steps >= 1 and {"presync", "postsync"} <= set(phases) and len(synced) == 2 * steps
    assert phases["execute"] >= 0.0
    assert all("presync" not in p for kind, (_, p) in table.items() if kind != "prefill")
    head = path.read_text().splitlines()[0]
    assert int(head.split()[0]) == steps and "prefill executes" in head
    assert "execute" in path.read_text()
    assert "prefill executes profiled into" in capsys.readouterr().out


def test_host_phases_torch_profile_of_the_prefill_steps(
    synth_dir, monkeypatch, torch_one_thread, capsys, tmp_path
):
    """--torch-profile-prefill writes the profiler's table once the first decode step starts,
    with the engine's execute span in it."""
    from benchmarks import host_phases

    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(synth_dir))
    path = tmp_path / "prefill_torch.txt"
    args = ["--shape", "tiny", "--device", "cpu", "--num-requests", "4", "--max-input-len", "32"]
    host_phases.main(args + ["--max-output-len", "8", "--impl", "fast", "--torch-profile-prefill", str(path)])
    assert "Self CPU" in path.read_text()
    assert "torch-profiled into" in capsys.readouterr().out


def test_alloc_counters_read_the_allocator_events_and_nothing_without_cuda(monkeypatch):
    """--alloc-stats reads the caching allocator's event counters (a retry means a cudaFree,
    which synchronizes the device unseen by the sync debug mode); no CUDA: nothing."""
    import torch

    from benchmarks import host_phases

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert host_phases._alloc_counters() == {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda: {"num_alloc_retries": 3, "num_device_free": 7})
    counters = host_phases._alloc_counters()
    assert set(counters) == set(host_phases.ALLOC_COUNTERS)
    assert counters["num_alloc_retries"] == 3 and counters["num_device_free"] == 7
    assert counters["num_device_alloc"] == 0


def test_gc_summary_sums_by_generation_and_kind_of_step():
    from benchmarks.host_phases import gc_summary

    text = gc_summary([(0, 0.001, "<=8"), (0, 0.003, "<=8"), (2, 0.010, "prefill")])
    assert text.startswith("gen0 2 x, 4.0 ms (max 3.00); gen2 1 x, 10.0 ms (max 10.00)")
    assert text.endswith("ms by kind of step: prefill 10.0, <=8 4.0")
    assert gc_summary([]) == "none; ms by kind of step: -"


def test_host_phases_sync_debug_without_cuda_names_the_need(monkeypatch):
    from benchmarks import host_phases

    monkeypatch.setattr(host_phases, "_cuda_available", lambda: False)
    with pytest.raises(SystemExit):
        host_phases.main(["--sync-debug", "--device", "cpu"])


def test_detokenizer_probe_settles_a_whole_output(capsys):
    """benchmarks/detokenizer_probe.py runs the update + flush it times and says for how many ids."""
    from benchmarks import detokenizer_probe

    ms = detokenizer_probe.main(["--ids", "10", "--number", "1", "--repeat", "1"])
    assert ms > 0
    assert capsys.readouterr().out.startswith("10 ids: ")


def test_environment_records_the_hosts_fingerprint(monkeypatch):
    """A run's JSON says how fast and how busy its host was: CPUs, the load average, a fixed
    Python loop's median microseconds (positive; a host slowed in the test reads slower)."""
    import time
    from types import SimpleNamespace

    from benchmarks import report

    env = report.environment(SimpleNamespace(device="cpu", git_commit="abc1234"))
    host = env["host"]
    assert host["cpu_count"] >= 1 and host["python_loop_us"] > 0
    assert host["load_avg"] is None or len(host["load_avg"]) == 3
    clock = iter(range(0, 10**9, 1000))  # every perf_counter reading 1 ms after the last
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock) / 1e6)
    assert report.host_fingerprint(reps=3)["python_loop_us"] == 1000.0


def test_environment_records_the_enginespec_settings(monkeypatch):
    """A run's JSON names the ENGINESPEC_* variables it ran under (an A/B variant may differ by
    them alone), and nothing else from the environment."""
    from types import SimpleNamespace

    from benchmarks import report

    monkeypatch.setenv("ENGINESPEC_DECODE_PRELOAD_ROWS", "0")
    monkeypatch.setenv("NOT_OURS_SECRET", "x")
    env = report.environment(SimpleNamespace(device="cpu", git_commit="abc1234"))
    assert env["settings"]["ENGINESPEC_DECODE_PRELOAD_ROWS"] == "0"
    assert all(k.startswith("ENGINESPEC_") for k in env["settings"])


def test_first_call_with_one_run_is_a_flag_error(capsys, monkeypatch):
    """--first-call skips the warm-up; with --repeat 1 its one cold run was reported as the warm
    headline (tok/s, wall/floor) with no first_call_s, compile time and all. Now exit 2 naming
    both flags, before any work."""
    monkeypatch.setattr(throughput, "run", lambda args: pytest.fail("ran with a bad flag"))
    assert throughput.main(["--shape", "tiny", "--device", "cpu", "--first-call"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "benchmarks/throughput.py: --first-call needs --repeat >= 2, got 1"
    args = throughput.parse_args(["--shape", "tiny", "--device", "cpu", "--first-call", "--repeat", "2"])
    assert args.first_call and args.repeat == 2


def test_help_describes_every_flag():
    """--help showed 13 flags (--num-requests, the workload lengths, --seed, the --skip-* and
    probe sizes) with neither a description nor their default."""
    parser = throughput.build_parser()
    assert [a.option_strings for a in parser._actions if not a.help] == []
