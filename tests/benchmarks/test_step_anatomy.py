"""benchmarks/step_anatomy.py on a CPU: a tiny shape, one request, a few steps; every phase is
timed, the host's own time is the step less its wait, and the engine comes back unpatched
(the module's span, InFlight._read and the runner's methods), so later engines time nothing."""

from __future__ import annotations

import json

import pytest

from benchmarks import step_anatomy
from enginespec.engine import async_scheduling
from enginespec.engine import engine_core as core_module


def test_anatomy_times_each_phase_and_puts_everything_back(tmp_path, monkeypatch, torch_one_thread):
    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path / "synth"))
    span, read = core_module._span, async_scheduling.InFlight._read
    out = tmp_path / "anatomy.json"
    argv = ["--shape", "tiny", "--device", "cpu", "--steps", "4", "--prompt-len", "8"]
    assert step_anatomy.main(argv + ["--generate-tokens", "3", "--out", str(out)]) == 0
    ms = json.loads(out.read_text())["ms_per_step"]
    for phase in ("step", "schedule", "prepare", "execute", "sample", "update", "logits_gemm"):
        assert ms[phase] > 0, phase
    assert ms["host_own"] == pytest.approx(ms["step"] - ms.get("ids_wait_read", 0.0))
    assert json.loads(out.read_text())["generate_batch1_ms_per_token"] > 0
    assert core_module._span is span and async_scheduling.InFlight._read is read


def test_the_trace_is_of_live_steps_and_taken_last(tmp_path, monkeypatch, torch_one_thread):
    """--trace records 8 steps that do work (each with its execute span), after everything else
    was timed, and leaves the engine idle."""
    import gzip

    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path / "synth"))
    out, trace = tmp_path / "anatomy.json", tmp_path / "trace.json.gz"
    argv = [
        "--shape",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        "3",
        "--prompt-len",
        "8",
        "--generate-tokens",
        "2",
    ]
    assert step_anatomy.main(argv + ["--trace", str(trace), "--out", str(out)]) == 0
    events = json.loads(gzip.open(trace).read())["traceEvents"]
    names = [e.get("name") for e in events if e.get("ph") == "X"]
    assert names.count("enginespec.execute") == 8 and names.count("enginespec.prepare") == 8
    assert json.loads(out.read_text())["trace"] == str(trace)
