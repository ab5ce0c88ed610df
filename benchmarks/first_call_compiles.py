"""What compiles inside a user's first generate() call: Triton JIT compiles and dynamo
(re)compiles seen after LLM(...) returned, on whatever caches the process starts with.

Run on one GPU from the repository root (cold caches: point both caches at empty folders):
    TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) \
        python benchmarks/first_call_compiles.py --temperature 0.6 --out first_call.json
Prints one line per compile (kernel, its constexprs and specialisations, seconds since the
call started) and the per-step wall times of the first call's first 30 steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_runs import sync, timed_generate, workload_for  # noqa: E402
from enginespec.testing import checkpoints  # noqa: E402

EVENTS: list[dict] = []
_START = [0.0]  # perf_counter() when the first call began


def _triton_hook(*args, **kwargs) -> bool:
    """Triton's JIT cache hook: called before each compile (kwargs carry the key and repr)."""
    repr_ = kwargs.get("repr") or (args[0] if args else "")
    EVENTS.append({"what": "triton", "t": time.perf_counter() - _START[0], "kernel": str(repr_)[:400]})
    return False


def _compile_times(dynamo_utils) -> str:
    """dynamo's per-phase compile times as its own table (empty where this torch lacks it)."""
    try:
        return str(dynamo_utils.compile_times(repr="str"))[:4000]
    except Exception as e:  # noqa: BLE001 - a diagnostic only
        return f"unavailable: {type(e).__name__}: {e}"


def install_hooks() -> str:
    try:
        from triton import knobs

        knobs.runtime.jit_cache_hook = _triton_hook
        where = "triton.knobs.runtime.jit_cache_hook"
    except (ImportError, AttributeError):
        from triton.runtime.jit import JITFunction

        JITFunction.cache_hook = _triton_hook
        where = "JITFunction.cache_hook"
    return where


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen3-0.6b")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--out")
    p.add_argument(
        "--hook-startup",
        action="store_true",
        help="also list the Triton JIT compiles inside LLM(...) (seconds since it started) and dynamo's compile times",
    )
    args = p.parse_args()
    import torch
    import torch._dynamo.utils as dynamo_utils

    from enginespec.kernels import compile_pool, compile_procs
    from enginespec.llm import LLM

    model_dir = checkpoints.make_checkpoint(
        args.shape, checkpoints.default_dir(args.shape), device="cuda", seed=0
    )
    start = time.perf_counter()
    if args.hook_startup:
        _START[0] = start
        install_hooks()
    llm = LLM(str(model_dir), impl="fast", dtype="bfloat16")
    startup = time.perf_counter() - start
    startup_events = list(EVENTS)
    EVENTS.clear()
    llm.engine.stats.step_trace = []
    ns = argparse.Namespace(
        min_input_len=100, max_input_len=1024, min_output_len=100, max_output_len=1024, id_bound=10000, seed=0
    )
    workload = workload_for(ns, args.num_requests, llm.engine.vocab_size)
    where = install_hooks()
    graphs_before = dynamo_utils.counters["stats"]["unique_graphs"]
    sampling = {k: v for k, v in (("top_p", args.top_p), ("top_k", args.top_k)) if v not in (1.0, 0)}
    _START[0] = time.perf_counter()
    first = timed_generate(
        llm, workload, torch.device("cuda"), args.temperature, use_tqdm=False, sampling=sampling
    )
    first_events = list(EVENTS)
    trace_first = list(llm.engine.stats.step_trace or [])[:30]
    second = timed_generate(
        llm, workload, torch.device("cuda"), args.temperature, use_tqdm=False, sampling=sampling
    )
    sync(torch.device("cuda"))
    table = llm.engine.runner.linear_table  # None where the skinny GEMMs are off
    result = {
        "hook": where,
        "startup_s": startup,
        "startup_phases": dict(llm.engine.stats.startup_phases),
        "warm_up": llm.engine.warmup_report.line() if llm.engine.warmup_report else None,
        "precompile_workers": compile_pool.num_workers(),
        "compile_processes": {"processes": compile_procs.num_processes(), **compile_procs.totals},
        "gemm_tuning_seconds": table.seconds if table else None,
        # candidates that failed to build or time, and keys left on the baseline (a broken
        # tuning capture would raise both)
        "gemm_tuning_rejected": len(table.rejected) if table else None,
        "gemm_tuning_on_baseline": sum(c.config is None for c in table.choices.values()) if table else None,
        "compiles_in_startup": startup_events,
        "dynamo_compile_times": _compile_times(dynamo_utils),
        "first_wall_s": first["wall_s"],
        "second_wall_s": second["wall_s"],
        "dynamo_graphs_in_calls": dynamo_utils.counters["stats"]["unique_graphs"] - graphs_before,
        "dynamo_counters": {
            k: dict(v) for k, v in dynamo_utils.counters.items() if k in ("recompiles", "stats")
        },
        "compiles_in_first_call": first_events,
        "compiles_in_second_call": EVENTS[len(first_events) :],
        "first_steps": [repr(s)[:300] for s in trace_first],
    }
    print(
        f"startup {startup:.1f} s; first call {first['wall_s']:.2f} s, second {second['wall_s']:.2f} s; "
        f"dynamo graphs compiled during the calls: {result['dynamo_graphs_in_calls']}"
    )
    print("  " + " ".join(f"{k} {v:.1f} s" for k, v in result["startup_phases"].items()))
    print(f"  {result['warm_up']}; precompile workers {result['precompile_workers']}")
    print(f"  compile processes: {result['compile_processes']}")
    print(
        f"  GEMM tuning by part (s): {result['gemm_tuning_seconds']}; rejected candidates "
        f"{result['gemm_tuning_rejected']}, keys on the baseline {result['gemm_tuning_on_baseline']}"
    )
    for e in startup_events:
        print(f"  startup compile at {e['t']:.2f} s: {e['kernel'][:160]}")
    for e in first_events:
        print(f"  compile at {e['t']:.2f} s: {e['kernel'][:300]}")
    for s in result["first_steps"]:
        print("  step", s)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
