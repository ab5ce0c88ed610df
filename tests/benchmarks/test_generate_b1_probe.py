"""benchmarks/generate_b1_probe.py on a CPU: a tiny shape, a few tokens; each call's parts add up
to its wall, the long call has one traced step per token (the prefill, then decodes), and the
summary's per-token figure is (many - one) / n of the medians."""

from __future__ import annotations

import json

import pytest

from benchmarks import generate_b1_probe


def test_probe_splits_each_call(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path / "synth"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path / "probe.json"
        argv = ["--shape", "tiny", "--device", "cpu", "--tokens", "4", "--reps", "2", "--prompt-len", "8"]
        assert generate_b1_probe.main([*argv, "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    res = json.loads(out.read_text())
    for run in res["runs"]["one"] + res["runs"]["many"]:
        parts = run["first_step_end_ms"] + run["steps_after_first_ms"] + run["after_last_step_ms"]
        assert parts == pytest.approx(run["wall_ms"], rel=1e-6)
    assert [r["num_steps"] for r in res["runs"]["many"]] == [5, 5]  # the prefill and 4 decodes
    assert [r["num_steps"] for r in res["runs"]["one"]] == [1, 1]
    wall = res["wall_ms"]
    assert wall["per_token"] == pytest.approx((wall["many"] - wall["one"]) / 4)
