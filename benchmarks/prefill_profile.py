"""Where a prefill step's time goes: the workload's prompt-only steps, timed one by one and
profiled by kernel (issue 16).

In DESIGN's 256-request workload the 9 prefill steps (about 16,000 prompt tokens each) take
0.48 s against a 0.18 s floor (2.7x), the largest excess of any step kind. This probe adds the
workload's prompts with max_tokens 1 (so every step is prompt work, chunked at the engine's
max_num_batched_tokens), runs them once to warm up, then:

- times every step with a device sync on each side (its whole cost, no overlap with the next);
- against the step's floor: its dense, logits-head and causal attention FLOPs at the measured
  matmul rate (benchmarks/roofline.py's prefill_flops, per chunk);
- profiles the first --profile-steps steps (torch.profiler) and writes the top kernels by
  device time, grouped by name, to --out's .profile.txt, and the device-busy time per step.

    python3 benchmarks/prefill_profile.py --out $OUT/prefill.json [--engine-arg KEY=VALUE]

CPU smoke: --shape tiny --device cpu --num-requests 8 --max-input-len 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import roofline as rl  # noqa: E402
from benchmarks.decode_profile import device_busy_us, profiled_steps  # noqa: E402
from benchmarks.engine_runs import (  # noqa: E402
    add_model_args,
    checkpoint,
    engine_core,
    make_llm,
    reset_prefix_cache,
    shape_of,
    sync,
)
from benchmarks.sweep_profile import kernel_table  # noqa: E402
from enginespec.spec import SamplingParams  # noqa: E402
from enginespec.testing.workload import make_workload  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/prefill_profile.py", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--min-input-len", type=int, default=100)
    p.add_argument("--max-input-len", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--profile-steps", type=int, default=2)
    p.add_argument(
        "--output-len",
        type=int,
        default=1,
        help="each request's max_tokens (ignore_eos): above 1 the later prompt steps carry the decodes "
        "of the prompts done before them, as in the workload",
    )
    p.add_argument(
        "--unsynced",
        action="store_true",
        help="time the steps as generate() runs them (no device sync around a step: a step's wall "
        "is the time between two step() returns, so host and GPU overlap as in the workload)",
    )
    p.add_argument("--matmul-n", type=int, default=8192, help="square bf16 matmul size of the rate probe")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE", help="JSON values")
    p.add_argument(
        "--host-probe",
        action="store_true",
        help="also run one prefill step under CUDA's sync debug mode (every host sync reported with "
        "its stack) and one under cProfile; both to --out's .host.txt",
    )
    p.add_argument("--git-commit")
    p.add_argument("--out")
    return p


def add_prompts(core, prompts, temperature: float, tag: str, output_len: int = 1) -> list[str]:
    """Every prompt as a request of output_len tokens (1: each step is prompt work); their ids."""
    params = SamplingParams(max_tokens=output_len, temperature=temperature, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        core.add_request(rid, prompt, params)
    return ids


def run_prompts(core, prompts, args, tag: str) -> list[dict]:
    """Add every prompt and step until all finish; per step its scheduled tokens, the host's
    time until step() returned (the GPU may still run: async scheduling) and its wall time:
    between two device syncs, or with args.unsynced between two step() returns."""
    add_prompts(core, prompts, args.temperature, tag, args.output_len)
    steps, synced = [], not args.unsynced
    sync(args.device)
    last = time.perf_counter()
    while core.has_unfinished:
        before = core.stats.num_scheduled_tokens
        if synced:
            sync(args.device)
        start = time.perf_counter()
        core.step(final_only=True)
        host = time.perf_counter() - start
        if synced:
            sync(args.device)
        end = time.perf_counter()
        wall, last = end - (start if synced else last), end
        steps.append({"tokens": core.stats.num_scheduled_tokens - before, "host_s": host, "wall_s": wall})
    return steps


def finish(core, ids: list[str]) -> None:
    """Abort what is left of a probe's requests and step until the engine is idle."""
    core.abort(ids)
    while core.has_unfinished:
        core.step()


def chunk_floors(prompt_lens, budget: int, shape, rate: float) -> list[float]:
    """Each step's FLOP floor, the prompts cut into chunks of the step budget in order (as the
    scheduler's FCFS chunked prefill does): a chunk of a prompt costs its dense FLOPs plus the
    causal attention of its rows over the prompt's earlier keys."""
    floors, left, flops = [], budget, 0.0
    for p in prompt_lens:
        done = 0
        while done < p:
            take = min(p - done, left)
            lo, hi = done, done + take
            attn = 2 * (hi * hi - lo * lo) * shape.num_q_heads * shape.head_dim * shape.num_layers
            flops += 2 * shape.body_params * take + attn
            if hi == p:
                flops += 2 * shape.embedding_params
            done, left = hi, left - take
            if left == 0:
                floors.append(flops / rate)
                left, flops = budget, 0.0
    if flops:
        floors.append(flops / rate)
    return floors


def profile_steps(core, prompts, args) -> dict:
    cuda = torch.device(args.device).type == "cuda"
    ids = add_prompts(core, prompts, args.temperature, "prof", args.output_len)
    prof, wall_us = profiled_steps(core, args.device, args.profile_steps)
    finish(core, ids)
    busy_us = device_busy_us(prof.events())[0] if cuda else None
    table = kernel_table(prof.events(), args.profile_steps, top=30) if cuda else []
    if args.out:
        text = prof.key_averages().table(
            sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=40
        )
        Path(args.out).with_suffix(".profile.txt").write_text(text)
    return {
        "steps": args.profile_steps,
        "wall_ms_per_step": wall_us / 1e3 / args.profile_steps,
        "device_busy_ms_per_step": None if busy_us is None else busy_us / 1e3 / args.profile_steps,
        "kernels": table,
    }


def host_probe(core, prompts, args) -> str:
    """One prefill step (the run's second) with torch.cuda's sync debug mode on, each reported
    synchronisation's stack kept; then the next step under cProfile. Text for the report."""
    import cProfile
    import io
    import pstats
    import traceback
    import warnings

    ids = add_prompts(core, prompts, args.temperature, "host")
    core.step(final_only=True)
    syncs: list[str] = []
    shown = warnings.showwarning

    def keep(message, category, filename, lineno, file=None, line=None):
        syncs.append(f"{message}\n" + "".join(traceback.format_stack(limit=14)[:-2]))

    warnings.showwarning = keep
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = keep
            cuda = torch.device(args.device).type == "cuda"  # (CPU: no syncs to report; a plain step)
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                core.step(final_only=True)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = shown
    prof = cProfile.Profile()
    prof.enable()
    core.step(final_only=True)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(60)
    finish(core, ids)
    return (
        f"# {len(syncs)} host syncs in one prefill step\n"
        + "\n".join(syncs[:20])
        + "\n# cProfile\n"
        + text.getvalue()
    )


def main(argv=None) -> int:
    from enginespec.engine_args import resolve_device

    args = build_parser().parse_args(argv)
    args.engine_args = {k: json.loads(v) for k, v in (a.split("=", 1) for a in args.engine_arg)}
    args.device = str(resolve_device(args.device))
    args.dtype = (
        ("bfloat16" if args.device.startswith("cuda") else "float32") if args.dtype == "auto" else args.dtype
    )
    model_dir = checkpoint(args.shape, args)
    llm = make_llm(model_dir, args)
    core = engine_core(llm)
    shape = shape_of(model_dir, args)
    vocab = shape.vocab_size
    work = make_workload(
        args.num_requests, min_input_len=args.min_input_len, max_input_len=args.max_input_len,
        min_output_len=1, max_output_len=1, id_bound=min(10000, vocab), seed=args.seed,
    )  # fmt: skip
    prompts = [list(p) for p in work.prompts]
    prompt_lens = [len(p) for p in prompts]
    run_prompts(core, prompts, args, "warm")
    reset_prefix_cache(llm)
    steps = run_prompts(core, prompts, args, "timed")
    reset_prefix_cache(llm)
    device = torch.device(args.device)
    rate = rl.measure_matmul_rate(device, args.matmul_n) if device.type == "cuda" else 1e12
    budget = core.scheduler_config.max_num_batched_tokens
    floors = chunk_floors(prompt_lens, budget, shape, rate)
    for s, f in zip(steps, floors):
        s["floor_s"], s["wall_over_floor"] = f, s["wall_s"] / f
    if args.host_probe:
        report = host_probe(core, prompts, args)
        reset_prefix_cache(llm)
        print(report.split("\n# cProfile")[0][:6000])
        if args.out:
            Path(args.out).with_suffix(".host.txt").write_text(report)
    prof = profile_steps(core, prompts, args)
    out = {
        "config": {k: v for k, v in vars(args).items() if k != "engine_args"}
        | {"engine_args": args.engine_args},
        "prompt_tokens": sum(prompt_lens),
        "matmul_flops_per_s": rate,
        "step_budget": budget,
        "steps": steps,
        "total_wall_s": sum(s["wall_s"] for s in steps),
        "total_floor_s": sum(floors),
        "median_wall_over_floor": statistics.median(s["wall_over_floor"] for s in steps if "floor_s" in s),
        "profile": prof,
    }
    print_report(out)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


def print_report(out: dict) -> None:
    """Each step's tokens, synced wall, host part and floor; the totals; the profiled kernels."""
    for s in out["steps"]:
        print(
            f"{s['tokens']:6d} tokens  {s['wall_s'] * 1e3:7.2f} ms (host {s['host_s'] * 1e3:6.2f})  "
            f"floor {s.get('floor_s', 0) * 1e3:6.2f} ms"
        )
    prof = out["profile"]
    print(f"total {out['total_wall_s']:.3f} s over a floor of {out['total_floor_s']:.3f} s")
    print(
        f"profiled: {prof['wall_ms_per_step']:.2f} ms a step, device busy {prof['device_busy_ms_per_step']}"
    )
    for k in prof["kernels"]:
        print(f"  {k['us_per_step']:9.1f} us  x{k['launches_per_step']:5.1f}  {k['name']}")


if __name__ == "__main__":
    sys.exit(main())
