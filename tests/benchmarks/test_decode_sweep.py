"""benchmarks/decode_sweep.py on a CPU: a tiny shape, two batch sizes, a few steps; every traced
step is a pure decode of the batch, the ratio is the wall over the floor, and a saved JSON redraws
(PNG when matplotlib is there) and prints the same table."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import decode_sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    import torch

    out = tmp_path_factory.mktemp("sweep") / "sweep.json"
    mp = pytest.MonkeyPatch()
    mp.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path_factory.mktemp("synth")))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        argv = ["--shape", "tiny", "--device", "cpu", "--batches", "2,1", "--steps", "3"]
        argv += ["--prompt-len", "8", "--latency-tokens", "3", "--out", str(out), "--png", str(out) + ".png"]
        code = decode_sweep.main(argv)
    finally:
        torch.set_num_threads(threads)
        mp.undo()
    return code, out


def test_sweep_rows_are_pure_decode_steps(sweep):
    code, out = sweep
    assert code == 0
    res = json.loads(out.read_text())
    assert [r["batch"] for r in res["rows"]] == [1, 2]
    for row in res["rows"]:
        assert row["all_decode"], row
        assert row["ratio"] == pytest.approx(row["ms_per_step"] / row["floor_ms"])
        assert row["context_tokens_first"] >= row["batch"] * 9  # prompt + at least one output each
    # Two requests read twice the K/V of one: the floor grows with the batch.
    assert res["rows"][1]["floor_ms"] > res["rows"][0]["floor_ms"]
    gen = res["generate_batch1"]
    assert gen["ratio"] == pytest.approx(gen["ms_per_token"] / res["weight_floor_ms"])
    # The traced generate: every one of its 3 decode steps after the prefill, ordered stats.
    steps = gen["steps"]
    assert steps["num_decode_steps"] == 3
    for name in ("wall_ms", "wait_ms"):
        s = steps[name]
        assert 0 <= s["median"] <= s["max"] and s["p90"] <= s["max"] and 0 <= s["mean"] <= s["max"], s


def test_plot_from_json_prints_the_table(sweep, tmp_path, capsys):
    _, out = sweep
    png = tmp_path / "redrawn.png"
    assert decode_sweep.main(["--plot-from", str(out), "--png", str(png)]) == 0
    text = capsys.readouterr().out
    assert "| 1 |" in text and "| 2 |" in text and "LLM.generate" in text and "decode steps, ms" in text
    assert png.exists() or "matplotlib is not installed" in text


def test_bad_batches_is_a_clear_error(capsys):
    assert decode_sweep.main(["--batches", "0,4", "--device", "cpu"]) == 2
    assert "--batches" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--batches=1,a", "--batches must be positive ints, got '1,a'"),
        ("--settle=-2", "--settle must be >= 0, got -2"),
        ("--latency-tokens=-3", "--latency-tokens must be >= 0, got -3"),
        ("--copy-bytes=-1", "--copy-bytes must be >= 0, got -1"),
        ("--profile-steps=-1", "--profile-steps must be >= 1, got -1"),
        ("--profile-batch=0", "--profile-batch must be >= 1, got 0"),
    ],
)
def test_a_bad_count_is_one_line_and_exit_2_before_any_work(flag, message, capsys, monkeypatch):
    """--latency-tokens -3 and --copy-bytes -1 were tracebacks after the sweep had started, a
    non-int batch an int() message naming no flag, and --settle -2 or a profile count below 1
    ran as if valid. Each is now refused before a model is built."""
    monkeypatch.setattr(decode_sweep, "run", lambda args: pytest.fail("ran with a bad flag"))
    assert decode_sweep.main(["--shape", "tiny", "--device", "cpu", flag]) == 2
    assert capsys.readouterr().err.strip() == f"benchmarks/decode_sweep.py: {message}"


def test_plot_from_a_missing_file_is_one_line(tmp_path, capsys):
    missing = tmp_path / "nope.json"
    assert decode_sweep.main(["--plot-from", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("benchmarks/decode_sweep.py: cannot read a saved sweep:") and str(missing) in err
    assert "\n" not in err


def test_mixed_contexts_draw_seeded_lengths_in_the_range():
    """--max-prompt-len: each request's prompt length uniform in [--prompt-len, it], the same
    for the same seed; without it every prompt is --prompt-len long."""

    class Core:
        def __init__(self):
            self.lens = []

        def add_request(self, rid, prompt, params):
            self.lens.append(len(prompt))

    def lens(max_prompt_len, seed=16):
        core = Core()
        decode_sweep._add_requests(core, "t", 16, 10, 4, 1000, seed, max_prompt_len)
        return core.lens

    mixed = lens(200)
    assert all(10 <= n <= 200 for n in mixed) and len(set(mixed)) > 4
    assert lens(200) == mixed and lens(200, seed=3) != mixed
    assert lens(0) == [10] * 16


def test_max_prompt_len_below_prompt_len_is_a_clear_error(capsys):
    argv = ["--device", "cpu", "--prompt-len", "64", "--max-prompt-len", "32"]
    assert decode_sweep.main(argv) == 2
    assert "--max-prompt-len" in capsys.readouterr().err


def test_kernel_table_sums_device_time_per_name_and_step():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from benchmarks.sweep_profile import kernel_table

    def ev(device, name, start, end, annotation=False):
        return SimpleNamespace(
            device_type=device,
            name=name,
            time_range=SimpleNamespace(start=start, end=end),
            is_user_annotation=annotation,
        )

    events = [
        ev(DeviceType.CUDA, "enginespec.execute", 0, 16, annotation=True),  # a phase, not device work
        ev(DeviceType.CUDA, "gemm", 0, 6),
        ev(DeviceType.CUDA, "norm", 6, 8),
        ev(DeviceType.CUDA, "gemm", 10, 16),
        ev(DeviceType.CPU, "gemm", 0, 100),  # host-side: not device time
    ]
    table = kernel_table(events, num_steps=2)
    assert table == [
        {"name": "gemm", "us_per_step": 6.0, "critical_us_per_step": 6.0, "launches_per_step": 1.0},
        {"name": "norm", "us_per_step": 1.0, "critical_us_per_step": 1.0, "launches_per_step": 0.5},
    ]


def test_critical_time_charges_each_kernel_what_it_adds_to_the_chain():
    """PDL: the GEMV starts (and waits) while the attention runs; it is charged its end minus
    the attention's; a kernel wholly inside another adds nothing; an idle gap is nobody's."""
    from types import SimpleNamespace

    from benchmarks.sweep_profile import critical_us

    def ev(name, start, end):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end))

    charged = critical_us(
        [ev("gemv", 3, 10), ev("attn", 0, 5), ev("tiny", 4, 6), ev("gemv", 12, 14), ev("attn", 13, 20)]
    )
    assert charged == {"attn": 5 + 6, "gemv": 5 + 2, "tiny": 0}
    assert sum(charged.values()) == 18  # the union of [0, 10] and [12, 20]


def test_slot_table_splits_a_layers_launches_of_one_name_by_their_order():
    """Two steps of two layers, each layer: gemv (slot 0), attn, gemv (slot 1); a norm once a
    step (not a per-layer name: left out), attn once a layer (k = 1: left out). Slot 1's
    launches are charged what they add past the attention they overlap."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from benchmarks.sweep_profile import slot_table

    def ev(name, start, end):
        return SimpleNamespace(
            device_type=DeviceType.CUDA, name=name, time_range=SimpleNamespace(start=start, end=end)
        )

    events, t = [], 0
    for _step in range(2):
        for _layer in range(2):
            events += [ev("gemv", t, t + 3), ev("attn", t + 3, t + 8), ev("gemv", t + 6, t + 10)]
            t += 10
        events.append(ev("norm", t, t + 1))
        t += 1
    rows = slot_table(events, num_steps=2, num_layers=2)
    assert rows == [
        {"name": "gemv", "slot": 0, "per_layer": 2, "us_per_step": 6.0, "critical_us_per_step": 6.0},
        {"name": "gemv", "slot": 1, "per_layer": 2, "us_per_step": 8.0, "critical_us_per_step": 4.0},
    ]


def test_print_top_orders_by_critical_time_and_skips_a_json_without_profile(tmp_path, capsys):
    from benchmarks.sweep_profile import print_top

    top = [
        {"name": "a", "us_per_step": 9.0, "critical_us_per_step": 1.0, "launches_per_step": 2.0},
        {"name": "b", "us_per_step": 3.0, "critical_us_per_step": 3.0, "launches_per_step": 1.0},
    ]
    slots = [{"name": "a", "slot": 1, "per_layer": 4, "us_per_step": 2.0, "critical_us_per_step": 0.5}]
    prof = {"batch": 4, "gpu_busy_ms_per_step": 0.5, "kernels_per_step": 3, "top": top, "slots": slots}
    with_prof, without = tmp_path / "p.json", tmp_path / "n.json"
    with_prof.write_text(json.dumps({"profile": prof}))
    without.write_text(json.dumps({"rows": []}))
    print_top(str(with_prof))
    print_top(str(without))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("batch 4: busy 0.500 ms/step")
    assert [line.split()[-1] for line in lines[1:3]] == ["b", "a"]  # the larger critical time first
    assert "slot 1 of 4 a layer: a" in lines[3]
    assert lines[4].endswith("no profile")


def test_decode_attention_probe_dry_run(tmp_path, monkeypatch):
    """The probe's dry run: every config of its tiny grid runs decode_attention (under the
    interpreter on a CPU-only machine, compiled on CUDA: a kernel module imported compiled cannot
    switch to the interpreter) and the JSON names the graph's config and the best."""
    from benchmarks import decode_attention_probe

    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "probe.json"
    decode_attention_probe.main(["--dry-run", "--batches", "2", "--contexts", "40", "--max-model-len", "64",
                                 "--out", str(out)])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["context"]) for r in rows] == [(2, 40)]
    assert {(c["tile"], c["splits"]) for c in rows[0]["all"]} >= {(16, 1), (16, 2)}
    assert rows[0]["graph"]["tile"] >= 16


def test_print_choices_names_the_kind_kept_per_fused_norm(tmp_path, capsys):
    from benchmarks.sweep_profile import print_choices

    def pick(rows, variant, choice):
        return {
            "rows": rows,
            "n": 4096,
            "k": 1024,
            "variant": variant,
            "choice": choice,
            "us": 5.0,
            "baseline_us": 6.0,
        }

    choices = [
        pick(4, "norm", "SkinnyConfig(block_n=4, gemv=True)"),
        pick(16, "norm_silu", "SkinnyConfig(block_n=64, gemv=False)"),
        pick(2, "norm", "baseline"),  # how LinearTable.report names a kept baseline
        pick(8, "norm", None),
        pick(2, "plain", "SkinnyConfig(block_n=1, gemv=True)"),  # not a fused norm: left out
    ]
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"skinny_gemm": {"choices": choices}}))
    print_choices(str(path))
    lines = capsys.readouterr().out.splitlines()
    assert "4 picks" in lines[0]
    assert [line.split()[3:5] for line in lines[1:]] == [
        ["norm", "baseline"],
        ["norm", "gemv"],
        ["norm", "baseline"],
        ["norm_silu", "tiled"],
    ]
