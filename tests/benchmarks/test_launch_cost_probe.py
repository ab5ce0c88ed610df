"""benchmarks/launch_cost_probe.py on a CPU: every projection of the shape is timed and written,
the in-place ops really add into the residual, and bad counts are refused."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import launch_cost_probe as probe


def test_a_cpu_run_times_every_projection(tmp_path, torch_one_thread):
    out = tmp_path / "launch.json"
    assert (
        probe.main(["--rows", "2", "--calls", "2", "--repeats", "1", "--device", "cpu", "--out", str(out)])
        == 0
    )
    report = json.loads(out.read_text())
    assert [r["op"] for r in report["rows"]] == [name for name, _, _ in probe.SHAPES]
    for row in report["rows"]:
        assert row["rows"] == 2 and row["host_us_idle"] > 0
        assert row["device_us"] is None and "host_us_busy" not in row  # no device on a CPU


def test_the_residual_ops_add_in_place():
    ops = probe.make_ops(2, torch.device("cpu"), torch.float32)
    first, second = ops["o"](), ops["o"]()
    assert first.data_ptr() == second.data_ptr()  # the one residual, added into twice
    assert ops["qkv"]().shape == (2, 4096)


@pytest.mark.parametrize("flag", ["--rows", "--calls", "--repeats"])
def test_counts_below_one_are_refused(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        probe.main([flag, "0"])
    assert exit_info.value.code == 2 and f"{flag}: must be >= 1, got 0" in capsys.readouterr().err
