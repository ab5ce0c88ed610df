"""vLLM's profiler_config (`--profiler-config`, `LLM(profiler_config=...)`), its newer way to
switch profiling on than VLLM_TORCH_PROFILER_DIR: {"profiler": "torch", "torch_profiler_dir":
DIR} sends the traces of start_profile / stop_profile to DIR, with the torch_profiler_* fields
vLLM's workers pass to torch.profiler. LLM(profiler_config=...) was a TypeError ("unknown engine
argument"); the fields this engine cannot honour are ValueErrors naming them, never ignored."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from enginespec import LLM, SamplingParams
from enginespec import profiler as profiler_module
from enginespec.engine_args import EngineArgs
from enginespec.profiler import Profiler, ProfilerConfig, profiling_enabled
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _events(trace) -> set:
    """A trace's event names; bytes that are no UTF-8 replaced (with_stack's Python tracer can
    name a code object freed during the profile: test_an_undecodable_event_name_...)."""
    opener = gzip.open if trace.name.endswith(".gz") else open
    with opener(trace, "rt", errors="replace") as f:
        return {event.get("name") for event in json.load(f)["traceEvents"]}


def test_the_config_takes_vllms_fields_and_defaults(tmp_path):
    config = ProfilerConfig.of({"profiler": "torch", "torch_profiler_dir": str(tmp_path / "t")})
    assert config.profiler == "torch" and config.torch_profiler_dir == str(tmp_path / "t")
    assert config.torch_profiler_with_stack and config.torch_profiler_use_gzip  # vLLM's defaults
    assert not config.torch_profiler_record_shapes and not config.torch_profiler_with_memory
    assert ProfilerConfig.of(None) is None and ProfilerConfig.of(config) is config
    assert ProfilerConfig.of({}) == ProfilerConfig()  # profiler None: off, as vLLM's default
    relative = ProfilerConfig.of({"profiler": "torch", "torch_profiler_dir": "~/traces"})
    assert relative.torch_profiler_dir.startswith("/") and "~" not in relative.torch_profiler_dir
    # the CLI's dotted values arrive as text where they are no JSON ("True", as vLLM's docs write it)
    shapes = ProfilerConfig.of(
        {"profiler": "torch", "torch_profiler_dir": "/t", "torch_profiler_record_shapes": "True"}
    )
    assert shapes.torch_profiler_record_shapes is True


@pytest.mark.parametrize(
    "fields, names",
    [
        ({"profiler": "cuda"}, "profiler"),
        ({"profiler": "nsys"}, "profiler"),
        ({"profiler": "torch"}, "torch_profiler_dir"),
        ({"torch_profiler_dir": "/t"}, "torch_profiler_dir"),
        ({"profiler": "torch", "torch_profiler_dir": "gs://bucket/t"}, "torch_profiler_dir"),
        ({"profiler": "torch", "torch_profiler_dir": "/t", "delay_iterations": 2}, "delay_iterations"),
        ({"profiler": "torch", "torch_profiler_dir": "/t", "max_iterations": 3}, "max_iterations"),
        ({"profiler": "torch", "torch_profiler_dir": "/t", "warmup_iterations": 1}, "warmup_iterations"),
        ({"profiler": "torch", "torch_profiler_dir": "/t", "wait_iterations": 1}, "wait_iterations"),
        (
            {"profiler": "torch", "torch_profiler_dir": "/t", "capture_torch_profiler": True},
            "capture_torch_profiler",
        ),
        (
            {"profiler": "torch", "torch_profiler_dir": "/t", "detailed_trace_annotation": True},
            "detailed_trace_annotation",
        ),
        ({"profiler": "torch", "torch_profiler_dir": "/t", "active_iterations": 0}, "active_iterations"),
        (
            {"profiler": "torch", "torch_profiler_dir": "/t", "torch_profiler_with_stack": "maybe"},
            "torch_profiler_with_stack",
        ),
        (
            {"profiler": "torch", "torch_profiler_dir": "/t", "torch_profiler_with_modules": True},
            "torch_profiler_with_modules",
        ),
    ],
)
def test_what_cannot_be_honoured_is_a_value_error_naming_the_field(fields, names):
    with pytest.raises(ValueError, match=f"profiler_config.*{names}"):
        ProfilerConfig.of(fields)
    with pytest.raises(ValueError, match=names):  # the engine's argument too, before any model loads
        EngineArgs(model=None, profiler_config=fields)


def test_a_config_that_is_no_object_is_refused_naming_it():
    with pytest.raises(ValueError, match="profiler_config must be"):
        ProfilerConfig.of(["torch"])
    with pytest.raises(ValueError, match="profiler_config.profiler='cuda'"):  # built directly: checked too
        EngineArgs(profiler_config=ProfilerConfig(profiler="cuda"))


def test_profiling_is_on_with_a_profiler_or_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    on = ProfilerConfig.of({"profiler": "torch", "torch_profiler_dir": str(tmp_path)})
    assert profiling_enabled(on) and not profiling_enabled(None) and not profiling_enabled(ProfilerConfig())
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))
    assert profiling_enabled(None)  # the variable keeps working


def test_the_profiler_writes_to_the_configs_directory_with_its_options(tmp_path, monkeypatch):
    """A gzipped trace (vLLM's default), with input shapes recorded when asked, and the op
    table vLLM's workers write beside it (profiler_out_0.txt); the variable is not read."""
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path / "env"))
    fields = {
        "profiler": "torch",
        "torch_profiler_dir": str(tmp_path / "cfg"),
        "torch_profiler_record_shapes": True,
    }
    profiler = Profiler(ProfilerConfig.of(fields))
    profiler.start(torch.device("cpu"))
    torch.ones(3, 3) @ torch.ones(3, 3)
    profiler.stop()
    (trace,) = (tmp_path / "cfg").glob("*.pt.trace.json.gz")
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any("Input Dims" in e.get("args", {}) for e in events if e.get("name") == "aten::mm")
    assert "aten::mm" in (tmp_path / "cfg" / "profiler_out_0.txt").read_text()
    assert not (tmp_path / "env").exists()
    plain = {**fields, "torch_profiler_use_gzip": False, "torch_profiler_dump_cuda_time_total": False}
    profiler = Profiler(ProfilerConfig.of({**plain, "torch_profiler_dir": str(tmp_path / "plain")}))
    profiler.start(torch.device("cpu"))
    profiler.stop()
    assert len(list((tmp_path / "plain").glob("*.pt.trace.json"))) == 1


def test_an_undecodable_event_name_costs_the_op_table_not_the_trace(tmp_path, monkeypatch, caplog):
    """With torch_profiler_with_stack (vLLM's default) torch's Python tracer keeps a pointer to
    each code object's name; one freed during the profile reads back as bytes that are no UTF-8
    (pytorch/pytorch#64345), and key_averages() raises UnicodeDecodeError. That failed the whole
    stop_profile (a 500 from the server's /stop_profile, seen under load in test_serve.py). Now
    the trace, written before the table, stays; the table file says why it is missing; a warning
    is logged; the profiler is stopped and can start again."""
    config = ProfilerConfig.of({"profiler": "torch", "torch_profiler_dir": str(tmp_path / "cfg")})

    def undecodable(self, *args, **kwargs):
        raise UnicodeDecodeError("utf-8", b"\x93", 0, 1, "invalid start byte")

    monkeypatch.setattr(torch.profiler.profile, "key_averages", undecodable)
    profiler = Profiler(config)
    profiler.start(torch.device("cpu"))
    torch.ones(3, 3) @ torch.ones(3, 3)
    with caplog.at_level("WARNING", logger="enginespec.profiler"):
        profiler.stop()
    assert len(list((tmp_path / "cfg").glob("*.pt.trace.json.gz"))) == 1
    assert "not UTF-8" in (tmp_path / "cfg" / "profiler_out_0.txt").read_text()
    assert any("op table" in r.getMessage() for r in caplog.records)
    profiler.start(torch.device("cpu"))  # not left running
    profiler.stop()


def test_without_a_profiler_the_error_names_both_ways_on(monkeypatch):
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_TORCH_PROFILER_DIR.*profiler_config"):
        Profiler(ProfilerConfig()).start(torch.device("cpu"))
    hooks = []
    monkeypatch.setattr(profiler_module.atexit, "register", hooks.append)
    with pytest.raises(RuntimeError):
        Profiler(None).start(torch.device("cpu"))
    assert hooks == []  # nothing started


def test_llm_takes_vllms_profiler_config_and_traces_its_steps(impl, tmp_path, monkeypatch):
    """LLM(profiler_config=...) was a TypeError; now its start_profile / stop_profile write
    the steps' trace into torch_profiler_dir, VLLM_TORCH_PROFILER_DIR unset."""
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    config = {"profiler": "torch", "torch_profiler_dir": str(tmp_path / "trace")}
    kw = dict(impl=impl, dtype="float32", device="cpu", num_blocks=32)
    with LLM(str(tiny_model_dir("qwen3")), profiler_config=config, **kw) as llm:
        llm.start_profile()
        out = llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
        llm.stop_profile()
    assert len(out[0].outputs[0].token_ids) == 3
    (trace,) = (tmp_path / "trace").glob("*.pt.trace.json.gz")
    assert "enginespec.schedule" in _events(trace)
