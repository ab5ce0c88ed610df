"""Steady decode steps by batch size against their floor (issue 19): for each batch size, the
median wall time of an engine step when every request is in decode, the step's floor (weights
plus the K/V of its contexts over the copy bandwidth measured in the same run: step_bins'
step_floor), and the ratio; plus batch-1 decode through `LLM.generate` (ms/token, as the
throughput harness's latency phase measures it). Writes JSON, a PNG (when matplotlib imports)
and prints a markdown table.

    python3 benchmarks/decode_sweep.py --out $OUT/sweep.json            # Qwen3-0.6B shape
    python3 benchmarks/decode_sweep.py --shape qwen3-8b --out $OUT/sweep_8b.json
    python3 benchmarks/decode_sweep.py --profile --out ...   # + batch-1 kernel breakdown
    python benchmarks/decode_sweep.py --plot-from sweep.json  # redraw the PNG (no device)
CPU smoke: --shape tiny --device cpu --batches 1,2 --steps 3 --prompt-len 16

How a batch size is measured: b requests with distinct random prompts of --prompt-len tokens
(with --max-prompt-len, of lengths uniform in [--prompt-len, --max-prompt-len]; no prefix-cache
hit) are added to the LLM's EngineCore, stepped until one step schedules
exactly b tokens (all in decode), stepped --settle more times, then --steps steps are traced
(EngineStats.step_trace). A step's wall is the time between the ends of consecutive steps, so
with async scheduling it is the pipelined step time a long generation sees. The requests are
then aborted. All batch sizes share one LLM (max_num_seqs = the largest batch), so every step
replays a CUDA graph of its padded bucket, as in a real run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.decode_profile import step_until_steady  # noqa: E402
from benchmarks.engine_runs import (  # noqa: E402
    add_model_args,
    check_model_dir,
    checkpoint,
    engine_core,
    make_llm,
    shape_of,
    sync,
)
from benchmarks.phases import decode_latency, decode_latency_steps, phase_device  # noqa: E402
from benchmarks.step_anatomy import graph_replay_ms  # noqa: E402
from benchmarks.step_bins import timed_steps  # noqa: E402
from benchmarks.sweep_profile import profile_steps  # noqa: E402
from benchmarks.throughput import _engine_arg  # noqa: E402  (one KEY=VALUE parser for the harnesses)
from enginespec.spec import SamplingParams  # noqa: E402

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/decode_sweep.py", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)), help="comma-separated")
    p.add_argument("--prompt-len", type=int, default=512, help="context of every request at the start")
    p.add_argument(
        "--max-prompt-len",
        type=int,
        default=0,
        help="if set: each request's context is uniform in [--prompt-len, this] (mixed contexts, as a "
        "real batch has; seeded by the batch size), else every one is --prompt-len",
    )
    p.add_argument("--steps", type=int, default=30, help="traced decode steps per batch size")
    p.add_argument("--settle", type=int, default=3, help="untimed decode steps before the trace")
    p.add_argument("--latency-tokens", type=int, default=128, help="LLM.generate batch-1 tokens (0 = skip)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="per-kernel device time of --profile-batch rows (torch.profiler)",
    )
    p.add_argument("--profile-steps", type=int, default=20)
    p.add_argument("--profile-batch", type=int, default=1, help="requests in the profiled steps")
    p.add_argument("--engine-arg", type=_engine_arg, action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--copy-bytes", type=int, default=0, help="0: 4 GiB on CUDA, 64 MiB on CPU")
    p.add_argument("--git-commit", help="record this commit (machines without .git)")
    p.add_argument("--out", help="JSON path (the PNG and nothing else goes beside it, .png)")
    p.add_argument("--plot-from", help="redraw the PNG of a saved JSON and print its table; runs nothing")
    p.add_argument("--png", help="PNG path (default: the JSON's path with .png)")
    p.add_argument("--compare", help="with --plot-from: a second sweep's JSON drawn beside it (before/after)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and fill the device's defaults; ValueError naming the flag and its bound for a count
    out of range (batches, --prompt-len, --steps and the profile's >= 1; --settle,
    --latency-tokens and --copy-bytes >= 0), checked before any work."""
    from enginespec.engine_args import resolve_device

    args = build_parser().parse_args(argv)
    if args.plot_from:
        return args
    try:
        args.batch_sizes = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    except ValueError:
        raise ValueError(f"--batches must be positive ints, got {args.batches!r}") from None
    for name in ("prompt_len", "steps", "profile_steps", "profile_batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("settle", "latency_tokens", "copy_bytes"):  # 0: none, skip, the device's default
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.max_prompt_len and args.max_prompt_len < args.prompt_len:
        raise ValueError(
            f"--max-prompt-len must be >= --prompt-len ({args.prompt_len}), got {args.max_prompt_len}"
        )
    if not args.batch_sizes or args.batch_sizes[0] < 1:
        raise ValueError(f"--batches must be positive ints, got {args.batches!r}")
    check_model_dir(args)
    args.device = str(resolve_device(args.device))
    cuda = torch.device(args.device).type == "cuda"
    args.copy_bytes = args.copy_bytes or (4 << 30 if cuda else 64 << 20)
    args.matmul_n = 8192 if cuda else 256  # phase_device's fields; the decode floor needs only copy
    args.probe_iters = 20 if cuda else 3
    if args.dtype == "auto":
        args.dtype = "bfloat16" if cuda else "float32"
    args.engine_args = dict(args.engine_arg)
    args.engine_args.setdefault("max_num_seqs", args.batch_sizes[-1])
    return args


def _add_requests(
    core, tag: str, num: int, prompt_len: int, max_tokens: int, vocab: int, seed: int, max_prompt_len: int = 0
):
    """num requests of distinct random prompts: prompt_len tokens each, or with max_prompt_len a
    length uniform in [prompt_len, max_prompt_len] each (drawn from the same seeded stream)."""
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(num)]
    for rid in ids:
        n = rng.randint(prompt_len, max_prompt_len) if max_prompt_len else prompt_len
        core.add_request(rid, [rng.randrange(min(vocab, 10000)) for _ in range(n)], params)
    return ids


def _drain(core, ids) -> None:
    core.abort(ids)
    while core.has_unfinished:
        core.step()


def measure_batch(core, batch: int, shape, rates: dict, args) -> dict:
    """Median wall and floor of `args.steps` steady decode steps of `batch` requests (module doc)."""
    max_tokens = 64 + args.settle + args.steps + 4
    ids = _add_requests(
        core,
        f"sweep{batch}",
        batch,
        args.prompt_len,
        max_tokens,
        shape.vocab_size,
        batch,
        args.max_prompt_len,
    )
    warm = step_until_steady(core, batch, 64)
    for _ in range(args.settle):
        core.step(final_only=True)
    sync(args.device)
    core.stats.step_trace = []
    start = time.perf_counter()
    for _ in range(args.steps):
        core.step(final_only=True)
    sync(args.device)
    trace, core.stats.step_trace = (start, core.stats.step_trace), None
    graph_ms = graph_replay_ms(core, batch) if torch.device(args.device).type == "cuda" else None
    _drain(core, ids)
    steps = list(timed_steps(trace, shape, rates))
    walls = [s[2] * 1e3 for s in steps]
    floors = [s[3] * 1e3 for s in steps]
    ms, floor = statistics.median(walls), statistics.median(floors)
    return {
        "batch": batch,
        "ms_per_step": ms,
        "floor_ms": floor,
        "ratio": ms / floor,
        "min_ms": min(walls),
        # host blocked on the previous step's ids: near zero where the host, not the GPU, sets the pace
        "wait_ms": statistics.median(t[4] for t in trace[1]) * 1e3 if trace[1] else None,
        # the step's decode graph alone, replayed back to back: the decoder's own GPU time
        "graph_ms": graph_ms,
        "all_decode": all(s[0] == batch and s[1] == batch for s in steps),
        "warm_steps": warm,
        "context_tokens_first": trace[1][0][2] if trace[1] else None,
    }


def run(args) -> dict:
    from benchmarks.report import environment

    results: dict = {"config": {k: v for k, v in vars(args).items() if k != "engine_arg"}}
    results["env"] = environment(args)
    results["device_rates"] = rates = phase_device(args)
    model_dir = checkpoint(args.shape, args)
    shape = shape_of(model_dir, args)
    results["weight_floor_ms"] = shape.weight_bytes_per_step / rates["copy_bytes_per_s"] * 1e3
    started = time.perf_counter()
    llm = make_llm(model_dir, args)
    results["startup_s"] = time.perf_counter() - started
    core = engine_core(llm)
    results["rows"] = []
    for batch in args.batch_sizes:
        row = measure_batch(core, batch, shape, rates, args)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        results["rows"].append(row)
        _save(results, args.out)
    if args.latency_tokens:
        rng = random.Random(args.seed)
        prompt = [rng.randrange(min(shape.vocab_size, 10000)) for _ in range(args.prompt_len)]
        ms = decode_latency(llm, prompt, args.latency_tokens, args.device)
        results["generate_batch1"] = {
            "ms_per_token": ms,
            "weight_floor_ms": results["weight_floor_ms"],
            "ratio": ms / results["weight_floor_ms"],
            "num_tokens": args.latency_tokens,
            "steps": decode_latency_steps(llm, prompt, args.latency_tokens, args.device),
        }
    table = getattr(getattr(core, "runner", None), "linear_table", None)
    if table is not None:  # EngineArgs.skinny_gemm: what the startup tuning chose
        results["skinny_gemm"] = {
            "choices": table.report(),
            "rejected": table.rejected,
            "measured": table.measured,
        }
    if args.profile:
        results["profile"] = profile_steps(core, shape, args)
    results["total_s"] = time.perf_counter() - started
    _save(results, args.out)
    return results


def _save(results: dict, path) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(results, indent=1, default=str))


def markdown(results: dict) -> str:
    """The sweep as a markdown table (batch, ms/step, floor, ratio), then batch-1 generate."""
    lines = [
        "| batch | ms/step (median) | floor ms (weights + KV) | ms / floor | host wait ms | decode graph ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results["rows"]:
        flag = "" if r.get("all_decode", True) else " (not all decode)"
        wait = "" if r.get("wait_ms") is None else f"{r['wait_ms']:.3f}"
        gpu = "" if r.get("graph_ms") is None else f"{r['graph_ms']:.3f}"
        lines.append(
            f"| {r['batch']} | {r['ms_per_step']:.3f} | {r['floor_ms']:.3f} | {r['ratio']:.2f}{flag} | {wait} | {gpu} |"
        )
    prof = results.get("profile") or results.get("profile_batch1")
    if prof and "top" in prof:
        lines.append("")
        lines.append(
            f"batch-{prof.get('batch', 1)} profile: {prof['kernels_per_step']:.0f} kernels + {prof['copies_per_step']:.0f} copies a "
            f"step, GPU busy {prof['gpu_busy_ms_per_step']:.3f} of {prof['wall_ms_per_step']:.3f} ms "
            f"({prof['gpu_busy_fraction']:.2f})"
        )
        lines += ["", "| kernel | us/step | launches/step |", "| --- | ---: | ---: |"]
        lines += [
            f"| {r['name'][:70]} | {r['us_per_step']:.1f} | {r['launches_per_step']:.0f} |"
            for r in prof["top"]
        ]
    gen = results.get("generate_batch1")
    if gen:
        lines.append("")
        lines.append(
            f"batch-1 via LLM.generate: {gen['ms_per_token']:.3f} ms/token, weight floor "
            f"{gen['weight_floor_ms']:.3f} ms, ratio {gen['ratio']:.2f}"
        )
        steps = gen.get("steps") or {}
        if steps:
            wall, wait = steps["wall_ms"], steps["wait_ms"]
            lines.append(
                f"its {steps['num_decode_steps']} decode steps, ms: wall median {wall['median']:.3f}, "
                f"mean {wall['mean']:.3f}, p90 {wall['p90']:.3f}, max {wall['max']:.3f}; "
                f"host wait median {wait['median']:.3f}, mean {wait['mean']:.3f}"
            )
    return "\n".join(lines)


def _label(results: dict) -> str:
    extra = results.get("config", {}).get("engine_args", {})
    shown = {k: v for k, v in extra.items() if k != "max_num_seqs"}
    commit = results.get("env", {}).get("git", {}).get("commit")
    return "decode step (median)" + (f", {commit}" if commit else "") + (f", {shown}" if shown else "")


def plot(results: dict, png, other: Optional[dict] = None) -> str:
    """ms/step, the decode graph alone (when recorded) and the floor against batch size (log x)
    into `png`; returns what was done."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no PNG (redraw later with --plot-from JSON)"
    rows = results["rows"]
    batches = [r["batch"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(batches, [r["ms_per_step"] for r in rows], "o-", label=_label(results))
    if other is not None:
        ax.plot(
            [r["batch"] for r in other["rows"]],
            [r["ms_per_step"] for r in other["rows"]],
            "^-",
            label=_label(other),
        )
    gpu = [(r["batch"], r["graph_ms"]) for r in rows if r.get("graph_ms") is not None]
    if gpu:  # the decoder's own GPU time; the step adds the logits, the sampler and the host's pace
        ax.plot(*zip(*gpu), "x-.", label="decode graph alone (replayed back to back)")
    ax.plot(batches, [r["floor_ms"] for r in rows], "s--", label="floor: weights + KV at copy bandwidth")
    ax.plot(batches, [2 * r["floor_ms"] for r in rows], ":", color="gray", label="2x floor (target)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size (requests, all in decode)")
    ax.set_ylabel("ms per step")
    env = results.get("env", {})
    cfg = results.get("config", {})
    ax.set_title(f"{cfg.get('shape', '?')} decode steps, {env.get('gpu') or env.get('device', '?')}")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return f"PNG: {png}"


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as e:
        print(f"benchmarks/decode_sweep.py: {e}", file=sys.stderr)
        return 2
    if args.plot_from:
        try:
            results = json.loads(Path(args.plot_from).read_text())
            other = json.loads(Path(args.compare).read_text()) if args.compare else None
        except (OSError, ValueError) as e:
            print(f"benchmarks/decode_sweep.py: cannot read a saved sweep: {e}", file=sys.stderr)
            return 2
        png = args.png or str(Path(args.plot_from).with_suffix(".png"))
    else:
        results, other = run(args), None
        png = args.png or (str(Path(args.out).with_suffix(".png")) if args.out else None)
    print(markdown(results))
    if other is not None:
        print("\n" + _label(other) + ":\n" + markdown(other))
    print(plot(results, png, other) if png else "no --out or --png: no PNG")
    return 0


if __name__ == "__main__":
    sys.exit(main())
