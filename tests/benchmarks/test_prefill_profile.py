"""benchmarks/prefill_profile.py on a CPU: the per-chunk FLOP floors add up to the roofline's
prefill FLOPs (however the prompts are cut), and a tiny run times every prompt token once,
writes its JSON and its host report, and leaves the engine idle."""

from __future__ import annotations

import json
import random

import pytest

from benchmarks import prefill_profile
from benchmarks import roofline as rl

SHAPE = rl.ModelShape(
    num_layers=3, hidden_size=64, num_q_heads=4, num_kv_heads=2, head_dim=16, vocab_size=500,
    num_params=100_000, tied=True,
)  # fmt: skip


@pytest.mark.parametrize("budget", [7, 16, 100, 4096])
def test_chunk_floors_sum_to_the_prefill_flops(budget):
    rng = random.Random(budget)
    prompts = [rng.randint(1, 60) for _ in range(9)]
    floors = prefill_profile.chunk_floors(prompts, budget, SHAPE, rate=1.0)
    assert sum(floors) == pytest.approx(rl.prefill_flops(prompts, SHAPE))
    assert len(floors) == -(-sum(prompts) // budget)  # full steps, then the remainder
    dense = 2 * SHAPE.body_params
    assert all(f > 0 for f in floors) and max(floors) >= dense * min(budget, sum(prompts))


def test_a_tiny_run_times_every_prompt_token(tmp_path, monkeypatch, torch_one_thread):
    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path / "synth"))
    out = tmp_path / "prefill.json"
    argv = [
        "--shape", "tiny", "--device", "cpu", "--num-requests", "6", "--min-input-len", "20",
        "--max-input-len", "50", "--engine-arg", "max_num_batched_tokens=64", "--engine-arg",
        "max_num_seqs=8", "--profile-steps", "1", "--host-probe", "--out", str(out),
    ]  # fmt: skip
    assert prefill_profile.main(argv) == 0
    report = json.loads(out.read_text())
    steps = report["steps"]
    assert sum(s["tokens"] for s in steps) == report["prompt_tokens"]
    assert all(s["tokens"] <= report["step_budget"] for s in steps)
    timed = [s for s in steps if s["tokens"]]
    assert all(0 < s["host_s"] <= s["wall_s"] and s["floor_s"] > 0 for s in timed)
    assert report["total_floor_s"] == pytest.approx(sum(s["floor_s"] for s in timed))
    host = out.with_suffix(".host.txt").read_text()
    assert host.startswith("# 0 host syncs") and "# cProfile" in host and "step" in host


def test_an_unsynced_run_with_outputs_times_the_decodes_too(tmp_path, monkeypatch, torch_one_thread):
    """--output-len 3 --unsynced: every prompt token and every request's two later tokens are
    scheduled once, and each step's wall (between two step() returns) holds its host part."""
    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path / "synth"))
    out = tmp_path / "prefill.json"
    argv = [
        "--shape", "tiny", "--device", "cpu", "--num-requests", "5", "--min-input-len", "20",
        "--max-input-len", "40", "--engine-arg", "max_num_batched_tokens=48", "--engine-arg",
        "max_num_seqs=8", "--output-len", "3",
        "--unsynced", "--profile-steps", "1", "--out", str(out),
    ]  # fmt: skip
    assert prefill_profile.main(argv) == 0
    report = json.loads(out.read_text())
    steps = report["steps"]
    assert sum(s["tokens"] for s in steps) == report["prompt_tokens"] + 2 * 5
    assert all(0 < s["host_s"] <= s["wall_s"] for s in steps)
