"""The decode profile: the GPU-busy fraction of a few steady decode steps (every request
prefilled), the union of CUDA kernel/memcpy intervals from torch.profiler over the wall time of
those steps, plus the profiler's top-op tables beside the JSON.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.engine_runs import engine_core, sync
from enginespec.spec import SamplingParams
from enginespec.testing.workload import Workload


def device_events(events) -> list:
    """The CUDA-side kernels, memcpys and memsets among profiler `events`: not the GPU-side
    copies of `record_function` spans (user annotations, which cover whole phases such as
    enginespec.execute and would be counted as device work)."""
    from torch.autograd import DeviceType

    return [
        e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]


def device_busy_us(events) -> tuple[float, int]:
    """Union of the CUDA-side (kernel, memcpy, memset) intervals among profiler `events`, in
    microseconds, and how many there were. A union, so overlapping streams are not counted twice."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in device_events(events))
    busy, cur_start, cur_end = 0.0, None, None
    for start, end in spans:
        if cur_end is None or start > cur_end:
            busy += 0.0 if cur_end is None else cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        busy += cur_end - cur_start
    return busy, len(spans)


def step_until_steady(core, num_live: int, limit: int) -> int:
    """Step until one step schedules exactly one token per live request (pure decode)."""
    for i in range(limit):
        before = core.stats.num_scheduled_tokens
        core.step()
        if core.stats.num_scheduled_tokens - before == num_live:
            return i + 1
    return limit


def profiled_steps(core, device, num_steps: int):
    """torch.profiler over `num_steps` engine steps (CPU activity, plus CUDA on a CUDA device),
    synced on both sides as generate() steps them (final outputs only): (profile, wall us)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        sync(device)
        start = time.perf_counter()
        for _ in range(num_steps):
            core.step(final_only=True)
        sync(device)
        wall_us = (time.perf_counter() - start) * 1e6
    return prof, wall_us


def _write_profile_tables(prof, args, cuda: bool) -> None:
    """Beside --out: the profiler's top ops by host time and by device time (where a step's
    time goes is the first question when wall time is far above the floor)."""
    if not args.out:
        return
    tables = [
        "# top ops by self CPU time",
        prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40),
    ]
    if cuda:
        tables += [
            "# top ops by self device time",
            prof.key_averages().table(sort_by="self_device_time_total", row_limit=40),
        ]
    Path(args.out).with_suffix(".profile.txt").write_text("\n".join(tables))


def profile_decode(llm, workload: Workload, args) -> dict:
    """GPU-busy fraction over `profile_steps` steady decode steps of up to 256 running requests."""

    core = engine_core(llm)
    if core is None or not hasattr(core, "stats"):
        return {"skipped": "the LLM exposes no EngineCore with stats"}
    part = workload.head(min(len(workload.prompts), 256))
    max_tokens = args.profile_warm_limit + args.profile_steps + 2
    ids = [f"profile-{i}" for i in range(len(part.prompts))]
    for rid, prompt in zip(ids, part.prompts):
        core.add_request(
            rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=args.temperature, ignore_eos=True)
        )
    warm = step_until_steady(core, len(ids), args.profile_warm_limit)
    cuda = torch.device(args.device).type == "cuda"
    sync(args.device)
    start = time.perf_counter()
    for _ in range(args.profile_steps):  # the same steps without the profiler's overhead
        core.step(final_only=True)  # as generate() steps: no cumulative outputs of running requests
    sync(args.device)
    plain_ms = (time.perf_counter() - start) * 1e3 / args.profile_steps
    prof, wall_us = profiled_steps(core, args.device, args.profile_steps)
    core.abort(ids)
    while core.has_unfinished:
        core.step()
    busy_us, num_events = device_busy_us(prof.events()) if cuda else (None, 0)
    _write_profile_tables(prof, args, cuda)
    return {
        "num_requests": len(ids),
        "warm_steps": warm,
        "steps": args.profile_steps,
        "wall_ms_per_step": wall_us / 1e3 / args.profile_steps,
        "unprofiled_ms_per_step": plain_ms,
        "gpu_busy_fraction": None if busy_us is None else busy_us / wall_us,
        "gpu_busy_ms_per_step": None if busy_us is None else busy_us / 1e3 / args.profile_steps,
        "num_device_events": num_events,
        "note": "wall includes profiler overhead" if cuda else "no CUDA device: busy fraction n/a",
    }
