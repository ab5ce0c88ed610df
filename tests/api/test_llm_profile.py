"""vLLM's LLM.start_profile / stop_profile (its offline simple_profiling.py example): a
torch.profiler trace of the engine's steps, written to the directory VLLM_TORCH_PROFILER_DIR
names. Both were an AttributeError here."""

from __future__ import annotations

import json

import pytest

from enginespec import LLM, SamplingParams
from enginespec import profiler as profiler_module
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def llm(impl):
    with LLM(str(tiny_model_dir("qwen3")), impl=impl, dtype="float32", device="cpu", num_blocks=32) as llm:
        yield llm


def test_a_profile_traces_the_steps_between_start_and_stop(llm, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path / "trace"))
    llm.start_profile()
    out = llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
    llm.stop_profile()
    assert len(out[0].outputs[0].token_ids) == 3
    (trace,) = (tmp_path / "trace").glob("*.pt.trace.json")
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert "enginespec.schedule" in names  # the engine's own ranges, recorded while profiling


def test_without_the_directory_start_is_a_runtime_error_naming_it(llm, monkeypatch):
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_TORCH_PROFILER_DIR"):
        llm.start_profile()
    assert llm.generate(["Hi"], SamplingParams(max_tokens=2), use_tqdm=False)[0].finished


def test_stop_without_start_and_a_second_start_are_runtime_errors(llm, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="no profile is running"):
        llm.stop_profile()
    llm.start_profile()
    with pytest.raises(RuntimeError, match="already running"):
        llm.start_profile()
    llm.stop_profile()
    assert list(tmp_path.glob("*.pt.trace.json"))


def test_a_profile_left_running_is_stopped_and_written_by_the_exit_hook(tmp_path, monkeypatch):
    """Left running to the interpreter's exit, torch's profiler crashed it (SIGSEGV, status 139,
    no trace) after a script that never called stop_profile: start registers an exit hook that
    stops the profile and writes its trace; stop removes it."""
    import torch

    hooks = []
    monkeypatch.setattr(profiler_module.atexit, "register", hooks.append)
    monkeypatch.setattr(profiler_module.atexit, "unregister", hooks.remove)
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))
    profiler = profiler_module.Profiler()
    profiler.start(torch.device("cpu"))
    (at_exit,) = hooks
    at_exit()
    assert hooks == [] and len(list(tmp_path.glob("*.pt.trace.json"))) == 1
    with pytest.raises(RuntimeError, match="no profile is running"):
        profiler.stop()
