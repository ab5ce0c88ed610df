"""The engine's phase spans (engine_core._span): named ranges in a torch.profiler trace while
one records, and nothing at all otherwise (a record_function costs microseconds even unprofiled,
and every step opens several)."""

from __future__ import annotations

import contextlib

import torch

from enginespec.engine import engine_core


def test_spans_cost_nothing_unprofiled_and_name_phases_in_a_trace():
    assert isinstance(engine_core._span("prepare"), contextlib.nullcontext)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with engine_core._span("prepare"):
            torch.ones(3).sum()
    assert "enginespec.prepare" in {e.key for e in prof.key_averages()}
