"""The engine phases of a throughput run: device rates, the engine on the workload (timed runs,
floors, step bins, the other scheduling mode, the decode profile), batch-1 latency, and the
engine on the big shape. Each returns the dict recorded under its name in the JSON.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

from benchmarks import roofline as rl
from benchmarks.decode_profile import profile_decode
from benchmarks.engine_runs import (
    DTYPES,
    checkpoint,
    engine_core,
    engine_supports,
    floors,
    guard,
    make_llm,
    release,
    reset_prefix_cache,
    shape_of,
    timed_generate,
    timed_runs,
    warm_up,
    workload_for,
)
from benchmarks.step_bins import first_steps, step_breakdown
from enginespec.testing.workload import Workload


def phase_device(args) -> dict:
    """Copy bandwidth and matmul rate (in the run's dtype, bf16 on a GPU) of the device, measured now."""
    copy = rl.measure_copy_bandwidth(args.device, args.copy_bytes, iters=args.probe_iters)
    matmul = rl.measure_matmul_rate(
        args.device, args.matmul_n, iters=args.probe_iters, dtype=DTYPES[args.dtype]
    )
    return {
        "copy_bytes_per_s": copy,
        "copy_nbytes": args.copy_bytes,
        "matmul_flops_per_s": matmul,
        "matmul_n": args.matmul_n,
        "matmul_dtype": args.dtype,
        "iters": args.probe_iters,
    }


def phase_engine(args, model_dir, workload: Workload, rates: dict, results: dict) -> dict:
    """Throughput of the engine on the workload, its floor, then the decode profile (same LLM)."""
    extra = {"enforce_eager": True} if args.enforce_eager else {}
    llm = make_llm(model_dir, args, **extra)
    if not args.first_call:
        warm_up(llm, workload, args.device, args.temperature, args.sampling)
    out = timed_runs(llm, workload, args)
    shape = shape_of(model_dir, args)
    out.update(floors(workload, shape, rates, out["num_steps"]))
    trace = out.pop("step_trace", None)
    if trace is not None and rates and "copy_bytes_per_s" in rates:
        out["by_step_kind"] = step_breakdown(trace, shape, rates)
        out["first_steps"] = first_steps(trace, shape, rates)
    out["enforce_eager"] = bool(args.enforce_eager)
    core = engine_core(llm)
    out["async_scheduling"] = bool(getattr(getattr(core, "args", None), "async_scheduling", False))
    if args.compare_scheduling:
        out["other_scheduling"] = guard(args, lambda: _other_scheduling_run(llm, workload, args, rates, out))
    if not args.skip_profile:
        results["profile"] = guard(args, lambda: profile_decode(llm, workload, args))
    llm = None  # free the engine (and its KV pool) before the next run
    return out


def _other_scheduling_run(llm, workload: Workload, args, rates: dict, first: dict) -> dict:
    """The same workload on the same engine with async_scheduling flipped, after emptying the
    prefix cache; the steps are then the first run's, so its greedy tokens must equal the first
    run's bit for bit, which the digest compares."""
    core = engine_core(llm)
    if core is None or not engine_supports("async_scheduling"):
        return {"skipped": "this engine has no async_scheduling"}
    reset_prefix_cache(llm)  # no hit from the first run: both runs compute every prompt
    before = core.args
    core.args = dataclasses.replace(before, async_scheduling=not before.async_scheduling)
    try:
        out = timed_generate(llm, workload, args.device, args.temperature, sampling=args.sampling)
    finally:
        core.args = before
    out.update(floors(workload, shape_of(Path(before.model), args), rates, out["num_steps"]))
    out["async_scheduling"] = not before.async_scheduling
    out["tokens_match_first_run"] = out["tokens_digest"] == first["tokens_digest"]
    return out


def decode_latency(llm, prompt: list[int], num_tokens: int, device, reps: int = 3) -> float:
    """ms per decode token at batch 1: (t(n + 1 tokens) - t(1 token)) / n, after a warm-up, each
    t the median of `reps` calls, interleaved. (Until 2026-12-05 t(n + 1) was one call and t(1)
    the min of two: one slow call, 70 ms more in one of five 129-token calls on an H100 and
    about 14 ms in the H200's sweep that day, moved the figure by 0.1 ms/token while the
    call's own decode steps, traced, held at the sweep's step; generate_b1_probe.py.)"""
    one, many = Workload([prompt], [1]), Workload([prompt], [num_tokens + 1])
    timed_generate(llm, many, device, use_tqdm=False)
    t_one, t_many = [], []
    for _ in range(reps):
        t_one.append(timed_generate(llm, one, device, use_tqdm=False)["wall_s"])
        t_many.append(timed_generate(llm, many, device, use_tqdm=False)["wall_s"])
    return (statistics.median(t_many) - statistics.median(t_one)) / num_tokens * 1e3


def decode_latency_steps(llm, prompt: list[int], num_tokens: int, device) -> dict:
    """Where batch-1 `LLM.generate`'s ms/token goes: one more generate of num_tokens + 1 tokens
    with the engine's step trace on, its decode steps' walls (time since the previous step
    ended) and host waits as median, mean, p90 and max, in ms. A mean well above the median
    says a few slow steps (outliers) carry the gap to the sweep's median step; a wait near zero
    says the host, not the GPU, set the pace."""
    core = engine_core(llm)
    if core is None or not hasattr(core, "stats"):
        return {}
    core.stats.step_trace = []
    start = time.perf_counter()
    timed_generate(llm, Workload([prompt], [num_tokens + 1]), device, use_tqdm=False)
    steps, core.stats.step_trace = core.stats.step_trace, None
    walls, waits, previous = [], [], start
    for num_reqs, num_tokens_step, _kv, end, wait in steps:
        if num_tokens_step == num_reqs:  # decode steps only (the prefill is the first)
            walls.append((end - previous) * 1e3)
            waits.append(wait * 1e3)
        previous = end
    if not walls:
        return {}

    def stats(xs: list[float]) -> dict:
        xs = sorted(xs)
        return {
            "median": statistics.median(xs),
            "mean": statistics.fmean(xs),
            "p90": xs[int(0.9 * (len(xs) - 1))],
            "max": xs[-1],
        }

    return {"num_decode_steps": len(walls), "wall_ms": stats(walls), "wait_ms": stats(waits)}


def phase_latency(args, model_dir, workload: Workload) -> dict:
    """Batch-1 decode latency with CUDA graphs (default) and with enforce_eager=True."""
    prompt = workload.prompts[0][: args.latency_prompt_len]
    num_tokens = min(args.latency_tokens, args.max_output_len)
    out = {"prompt_len": len(prompt), "num_tokens": num_tokens}
    modes = [("default", {})]
    if engine_supports("enforce_eager"):
        modes.append(("eager", {"enforce_eager": True}))
    else:
        out["eager"] = "this engine's EngineArgs has no enforce_eager; only the default was measured"
    for name, extra in modes:
        llm = make_llm(model_dir, args, **extra)
        out[f"{name}_ms_per_token"] = decode_latency(llm, prompt, num_tokens, args.device)
        del llm
        release()
    if "eager_ms_per_token" in out:
        out["eager_over_default"] = out["eager_ms_per_token"] / out["default_ms_per_token"]
    return out


def phase_big(args, rates: dict) -> dict:
    """The engine on the larger shape with a smaller workload (same draw recipe), and its floor."""
    model_dir = checkpoint(args.big_shape, args)
    shape = shape_of(model_dir, args)
    workload = workload_for(args, min(args.big_num_requests, args.num_requests), shape.vocab_size)
    llm = make_llm(model_dir, args)
    warm_up(llm, workload, args.device, args.temperature, args.sampling)
    out = timed_generate(llm, workload, args.device, args.temperature, sampling=args.sampling)
    del llm
    out.update(floors(workload, shape, rates, out["num_steps"]))
    out["shape"] = args.big_shape
    if out.get("floor"):
        out["wall_over_floor"] = out["wall_s"] / out["floor"]["floor_s"]
    return out
