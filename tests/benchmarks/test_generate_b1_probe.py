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


def test_cpu_delta_names_the_busy_threads_and_the_main_ones_share():
    """Who used the CPU between two snapshots: threads by CPU ms (the busiest first, idle ones
    left out), the main thread (this pid's task) apart, and the rest of the machine's busy time."""
    import os

    pid = os.getpid()
    before = {
        "threads": {pid: ("python", 10.0, 1), 7: ("worker", 0.0, 0), 8: ("idle", 5.0, 0)},
        "busy_ms": 100.0,
    }
    after = {
        "threads": {
            pid: ("python", 40.0, 4),
            7: ("worker", 50.0, 2),
            8: ("idle", 5.0, 0),
            9: ("new", 3.0, 0),
        },
        "busy_ms": 300.0,
    }
    got = generate_b1_probe.cpu_delta(before, after)
    assert got == {
        "main_cpu_ms": 30.0,
        "main_involuntary": 3,
        "threads": [("worker", 50.0, 2), ("python", 30.0, 3), ("new", 3.0, 0)],
        "other_processes_cpu_ms": 117.0,  # 200 busy, 83 of them ours
    }


def test_cpu_snapshot_sees_this_thread():
    """On Linux the snapshot holds this process's main thread with a CPU time that grows."""
    import os
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    first = generate_b1_probe.cpu_snapshot()
    sum(i * i for i in range(2_000_000))
    second = generate_b1_probe.cpu_snapshot()
    assert (
        os.getpid() in first["threads"]
        and second["threads"][os.getpid()][1] >= first["threads"][os.getpid()][1]
    )
    assert second["busy_ms"] >= first["busy_ms"] > 0
