"""LLM.start_profile / stop_profile (vLLM's): a torch.profiler trace of what the engine runs.

Two switches, as vLLM has had: its profiler_config (ProfilerConfig: `--profiler-config`, the
engine argument `profiler_config`), whose {"profiler": "torch", "torch_profiler_dir": DIR} sends
the traces to DIR with its torch_profiler_* options; else the older environment variable
VLLM_TORCH_PROFILER_DIR, read when start_profile is called, the trace going to the directory it
names with torch.profiler's defaults (no stack, no gzip). A config that names a profiler wins
over the variable (vLLM, while the variable lasted, let the variable win). Neither set:
start_profile is a RuntimeError naming both (vLLM's "Profiler is not enabled"), and nothing
starts. CPU activity always, CUDA's where the model runs on a GPU; the engine's own phases show
as `enginespec.<phase>` ranges (engine_core._span). stop_profile writes one Chrome / Perfetto
trace, `<host>_<pid>.<ms>.pt.trace.json` (`.gz` added under a config's torch_profiler_use_gzip,
its default), torch's tensorboard_trace_handler's name (profile_prefix, when given, replaces
`<host>_<pid>`); under a config's torch_profiler_dump_cuda_time_total (its default), or where
only the CPU is traced, also vLLM's op table `profiler_out_0.txt` beside it (by device time,
else the first 50 by host time). Only this process is traced: under tensor parallelism the
other ranks' work is not (vLLM traces each worker). One profile at a time: a second start, or a
stop with none running, is a ProfilerStateError (a RuntimeError) that changes nothing; the server
answers it 409 (entrypoints/openai/api_server.py), where vLLM's current workers log a warning and
answer 200.

A profile still running when the process exits is stopped then, its trace written (close(), an
exit hook start registers): left running, torch's profiler crashed the interpreter's exit
(SIGSEGV, status 139) after a script that never called stop_profile, or a server stopped
mid-profile. The engine loop closes its Profiler as it ends.

Where the engine core runs in a process of its own (AsyncLLM, the server), the Profiler lives
there, in the engine loop (engine/core_proc.py), started and stopped between two steps on the
thread that steps, so the trace holds the model's work; the front end's process is not traced.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch

log = logging.getLogger(__name__)

PROFILER_DIR_ENV = "VLLM_TORCH_PROFILER_DIR"
# vLLM's ProfilerConfig fields this engine cannot honour -> the one value accepted (vLLM's
# default) and why no other: refused by name rather than dropped without a word.
UNHONOURED_FIELDS = {
    "delay_iterations": (0, "a profile starts at start_profile"),
    "max_iterations": (0, "a profile runs until stop_profile"),
    "warmup_iterations": (0, "no torch.profiler schedule: every step between start and stop is recorded"),
    "wait_iterations": (0, "no torch.profiler schedule: every step between start and stop is recorded"),
    "capture_torch_profiler": (False, "CUDA graph capture is not traced"),
    "detailed_trace_annotation": (False, "the engine's ranges are its phases (enginespec.<phase>)"),
}
_TEXT_BOOLS = dict.fromkeys(("true", "1", "yes", "on"), True) | dict.fromkeys(
    ("false", "0", "no", "off"), False
)


def profiler_dir() -> str:
    """The trace directory VLLM_TORCH_PROFILER_DIR names now ("" when unset: profiling is off)."""
    return os.environ.get(PROFILER_DIR_ENV, "")


@dataclass(frozen=True)
class ProfilerConfig:
    """vLLM's profiler_config, the fields honoured here, at vLLM's defaults. `profiler`: None
    (off) or "torch" ("cuda", vLLM's cudaProfilerStart for nsys, is refused); torch_profiler_dir:
    where the traces go (absolute, `~` expanded; required with "torch", refused without it); the
    torch_profiler_* switches go to torch.profiler.profile as vLLM's workers pass them.
    ignore_frontend is taken either way (the front end's process is never traced here) and
    active_iterations (>= 1) does nothing without the schedule the refused *_iterations make.
    Build with `of`, which checks every field (a ValueError naming it)."""

    profiler: Optional[str] = None
    torch_profiler_dir: str = ""
    torch_profiler_with_stack: bool = True
    torch_profiler_with_flops: bool = False
    torch_profiler_use_gzip: bool = True
    torch_profiler_dump_cuda_time_total: bool = True
    torch_profiler_record_shapes: bool = False
    torch_profiler_with_memory: bool = False
    ignore_frontend: bool = False
    active_iterations: int = 5

    @classmethod
    def of(cls, value: Any) -> Optional["ProfilerConfig"]:
        """vLLM's forms: None (no config), a ProfilerConfig, or a dict of its fields (the CLI's
        JSON or dotted keys, whose values may arrive as text: "true", "3"). A ValueError naming
        `profiler_config.<field>` and what is accepted for anything else."""
        if value is None:
            return None
        if isinstance(value, ProfilerConfig):
            return value._checked()  # built directly: checked as a dict's fields are
        if not isinstance(value, dict):
            raise ValueError(
                f"profiler_config must be None or a dict of vLLM's ProfilerConfig fields, got {value!r}"
            )
        fields = dict(value)
        for name, (accepted, why) in UNHONOURED_FIELDS.items():
            if name in fields and _coerce(name, fields.pop(name), type(accepted)) != accepted:
                raise ValueError(
                    f"profiler_config.{name}={value[name]!r} is not supported by enginespec ({why}); "
                    f"accepted: {accepted!r}"
                )
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise ValueError(
                f"profiler_config: unknown field(s) {unknown}; known: {sorted([*known, *UNHONOURED_FIELDS])}"
            )
        kwargs = {name: _coerce(name, v, _field_type(known[name])) for name, v in fields.items()}
        return cls(**kwargs)._checked()

    def _checked(self) -> "ProfilerConfig":
        """vLLM's rules between the fields; the directory made absolute (self when it is)."""
        if self.profiler not in (None, "torch"):
            why = (
                "'cuda' (vLLM's CUDA profiler, for nsys) is not supported"
                if self.profiler == "cuda"
                else "unknown"
            )
            raise ValueError(f"profiler_config.profiler={self.profiler!r}: {why}; accepted: None, 'torch'")
        directory = self.torch_profiler_dir
        if self.profiler == "torch" and not directory:
            raise ValueError("profiler_config.torch_profiler_dir must be set when profiler is 'torch'")
        if directory and self.profiler != "torch":
            raise ValueError("profiler_config.torch_profiler_dir is only applicable when profiler is 'torch'")
        if "://" in directory and len(directory.split("://")[0]) > 1:
            raise ValueError(
                f"profiler_config.torch_profiler_dir={directory!r}: a URI is not supported by enginespec "
                "(traces are written to a local directory)"
            )
        if self.active_iterations < 1:
            raise ValueError(f"profiler_config.active_iterations must be >= 1, got {self.active_iterations}")
        absolute = os.path.abspath(os.path.expanduser(directory)) if directory else directory
        return self if absolute == directory else dataclasses.replace(self, torch_profiler_dir=absolute)


def _field_type(field: dataclasses.Field) -> type:
    return {"bool": bool, "int": int}.get(str(field.type), str)


def _coerce(name: str, value: Any, kind: type) -> Any:
    """value as a `kind` (bool, int or str; None kept for the optional profiler), text taken as
    pydantic takes it for vLLM ("True", "off", "3"); a ValueError naming the field otherwise."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (str, int)) and str(value).strip().lower() in _TEXT_BOOLS:
            return _TEXT_BOOLS[str(value).strip().lower()]
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
    elif isinstance(value, str) or (value is None and name == "profiler"):
        return value
    raise ValueError(f"profiler_config.{name} must be a {kind.__name__}, got {value!r}")


def profiling_enabled(config: Optional[ProfilerConfig]) -> bool:
    """Whether start_profile can start: a config naming a profiler, or VLLM_TORCH_PROFILER_DIR
    set (not empty) now."""
    return (config is not None and config.profiler is not None) or bool(profiler_dir())


class ProfilerStateError(RuntimeError):
    """start while a profile runs, or stop while none does: the caller's order, not a fault."""


class Profiler:
    """At most one running torch.profiler.profile, set up by `config` (ProfilerConfig; None or
    profiler None: VLLM_TORCH_PROFILER_DIR's way, the module docstring)."""

    def __init__(self, config: Optional[ProfilerConfig] = None) -> None:
        self._config = config if config is not None and config.profiler is not None else None
        self._running: Optional[torch.profiler.profile] = None
        self._table: Optional[tuple[str, str, Optional[int]]] = None  # (path, sort key, rows)

    def start(self, device: torch.device, profile_prefix: Optional[str] = None) -> None:
        if self._running is not None:
            raise ProfilerStateError("a profile is already running: call stop_profile() first")
        config = self._config
        directory = config.torch_profiler_dir if config is not None else profiler_dir()
        if not directory:
            raise RuntimeError(
                f"profiling is not enabled: set {PROFILER_DIR_ENV} to the directory the trace goes to, "
                'or give profiler_config={"profiler": "torch", "torch_profiler_dir": DIR} (--profiler-config)'
            )
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profile = torch.profiler.profile(
            activities=activities, **_profile_options(config, directory, profile_prefix)
        )
        self._table = _table_plan(config, directory, len(activities) == 1)
        profile.start()
        self._running = profile
        atexit.register(self.close)

    def stop(self) -> None:
        """Stop the running profile and write its trace (and its op table, _table_plan)."""
        if self._running is None:
            raise ProfilerStateError("no profile is running: call start_profile() first")
        atexit.unregister(self.close)
        profile, self._running = self._running, None
        profile.stop()
        if self._table is not None:
            _write_table(profile, *self._table)

    def close(self) -> None:
        """Stop the running profile, writing its trace; nothing when none runs (module doc:
        the exit hook that keeps a forgotten profile from crashing the interpreter's exit)."""
        if self._running is not None:
            self.stop()


def _write_table(profile: torch.profiler.profile, path: str, sort_by: str, row_limit: Optional[int]) -> None:
    """The op table (_table_plan), written after the trace. Where torch cannot decode an event's
    name (with_stack's Python tracer keeps pointers to code objects' names, and one freed during
    the profile reads back as bytes that are no UTF-8: pytorch/pytorch#64345), the file says so
    and a warning is logged: the trace is already written, and stop_profile must not fail for
    the table alone."""
    try:
        table = profile.key_averages().table(sort_by=sort_by, row_limit=row_limit or 100)
    except UnicodeDecodeError as exc:
        table = (
            f"no op table: torch's profiler returned an event name that is not UTF-8 ({exc}); "
            "with torch_profiler_with_stack its Python tracer can name a code object freed during "
            "the profile (pytorch/pytorch#64345). The trace beside this file was written."
        )
        log.warning("profiler: %s", table)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        print(table, file=f)


def _profile_options(config: Optional[ProfilerConfig], directory: str, prefix: Optional[str]) -> dict:
    """torch.profiler.profile's keywords but activities: the config's switches, as vLLM's
    workers pass them (the variable's way: torch's defaults, the trace uncompressed)."""
    use_gzip = config is not None and config.torch_profiler_use_gzip
    handler = torch.profiler.tensorboard_trace_handler(directory, worker_name=prefix, use_gzip=use_gzip)
    if config is None:
        return dict(on_trace_ready=handler)
    return dict(
        on_trace_ready=handler,
        record_shapes=config.torch_profiler_record_shapes,
        profile_memory=config.torch_profiler_with_memory,
        with_stack=config.torch_profiler_with_stack,
        with_flops=config.torch_profiler_with_flops,
    )


def _table_plan(config: Optional[ProfilerConfig], directory: str, cpu_only: bool):
    """Where vLLM's workers write their op table as a profile stops, and how sorted: only the
    CPU traced, the first 50 ops by host time; else, under torch_profiler_dump_cuda_time_total,
    by device time. None: no table (the variable's way writes none)."""
    path = os.path.join(directory, "profiler_out_0.txt")
    if config is None:
        return None
    if cpu_only:
        return path, "self_cpu_time_total", 50
    return (path, "self_cuda_time_total", None) if config.torch_profiler_dump_cuda_time_total else None
