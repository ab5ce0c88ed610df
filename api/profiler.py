"""LLM.start_profile / stop_profile (vLLM's): a torch.profiler trace of what the engine runs.

As vLLM's workers did before its profiler_config: the trace goes to the directory the
environment variable VLLM_TORCH_PROFILER_DIR names, read when start_profile is called; unset,
start_profile is a RuntimeError saying to set it (vLLM's "Profiler is not enabled"), and nothing
starts. CPU activity always, CUDA's where the model runs on a GPU; the engine's own phases show
as `enginespec.<phase>` ranges (engine_core._span). stop_profile writes one Chrome / Perfetto
trace, `<host>_<pid>.<ms>.pt.trace.json`, torch's tensorboard_trace_handler's name (profile_prefix,
when given, replaces `<host>_<pid>`). Only this process is traced: under tensor parallelism the
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
import os
from typing import Optional

import torch

PROFILER_DIR_ENV = "VLLM_TORCH_PROFILER_DIR"


def profiler_dir() -> str:
    """The trace directory VLLM_TORCH_PROFILER_DIR names now ("" when unset: profiling is off)."""
    return os.environ.get(PROFILER_DIR_ENV, "")


class ProfilerStateError(RuntimeError):
    """start while a profile runs, or stop while none does: the caller's order, not a fault."""


class Profiler:
    """At most one running torch.profiler.profile."""

    def __init__(self) -> None:
        self._running: Optional[torch.profiler.profile] = None

    def start(self, device: torch.device, profile_prefix: Optional[str] = None) -> None:
        if self._running is not None:
            raise ProfilerStateError("a profile is already running: call stop_profile() first")
        directory = profiler_dir()
        if not directory:
            raise RuntimeError(
                f"profiling is not enabled: set {PROFILER_DIR_ENV} to the directory the trace goes to"
            )
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profile = torch.profiler.profile(
            activities=activities,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(directory, worker_name=profile_prefix),
        )
        profile.start()
        self._running = profile
        atexit.register(self.close)

    def stop(self) -> None:
        """Stop the running profile and write its trace."""
        if self._running is None:
            raise ProfilerStateError("no profile is running: call start_profile() first")
        atexit.unregister(self.close)
        profile, self._running = self._running, None
        profile.stop()

    def close(self) -> None:
        """Stop the running profile, writing its trace; nothing when none runs (module doc:
        the exit hook that keeps a forgotten profile from crashing the interpreter's exit)."""
        if self._running is not None:
            self.stop()
