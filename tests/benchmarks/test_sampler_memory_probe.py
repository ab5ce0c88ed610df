"""benchmarks/sampler_memory_probe.py: every sampling setting it serves is a valid request, and
on a CPU it stops at once with a message saying it needs a GPU (it reads the CUDA allocator)."""

from __future__ import annotations

import pytest

from benchmarks import sampler_memory_probe
from enginespec.spec import SamplingParams


def test_settings_are_valid_requests():
    for name, settings in sampler_memory_probe.SETTINGS.items():
        params = SamplingParams(max_tokens=4, ignore_eos=True, seed=0, **settings)
        assert params.temperature == settings["temperature"], name
    every = sampler_memory_probe.SETTINGS["all of them"]
    assert every["logprobs"] == 20 and every["repetition_penalty"] > 1 and every["top_p"] < 1


def test_cpu_run_refuses_before_building_a_model(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path / "synth"))
    with pytest.raises(SystemExit, match="GPU"):
        sampler_memory_probe.main(["--shape", "tiny", "--device", "cpu", "--rows", "4"])
    assert not (tmp_path / "synth").exists()
