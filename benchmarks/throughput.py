"""End-to-end throughput benchmark: the engine, transformers' `generate` on the same prompts, and
the roofline floor of the workload, in one run on one device. The command line of the harness.

Run from the repository root (enginespec installed, e.g. `pip install -e .`):
    python benchmarks/throughput.py --out throughput.json
Smoke run on a CPU in seconds:
    python benchmarks/throughput.py --shape tiny --device cpu --num-requests 4 \
        --max-input-len 32 --max-output-len 16

Workload (DESIGN.md "Performance targets"): enginespec.testing.workload.make_workload, by
default nano-vllm's bench shape: 256 requests, prompt and output lengths randint(100, 1024),
prompt ids below min(10000, vocab), seed 0 (the draw order is in that module). Outputs use
ignore_eos, so every request produces exactly its output length.

Phases, each timed after its own warm-up, each recorded in the JSON (an exception is recorded as
the phase's "error" and the run goes on, unless --strict); the JSON is rewritten after every
phase, so a run cut short still leaves what it measured:
1. device: copy bandwidth (bytes read + written) and matmul rate in the run's dtype (--dtype auto:
   bf16 on CUDA, float32 on CPU, where bf16 matmuls are very slow).
2. engine (phases.py): `LLM.generate` over the workload; output tokens, wall time, engine steps,
   the floor (roofline.py) with the engine's step count and with the fewest possible steps.
   With --repeat N, N timed runs on the same engine (prefix cache emptied before each): the
   median run is the headline, every run's wall time is kept. With --first-call the harness
   does not warm the engine first: the first run is the first generate() on a fresh LLM
   (first_call_s, first_over_warm) and the median is over the later runs; startup_s (LLM
   construction, the engine's own warm-up included) is recorded either way. --chat samples
   at Qwen3's chat settings (temperature 0.7, top_p 0.8, top_k 20); --top-p/--top-k set them. The first run's steps are also
   binned (step_bins.py). With --compare-scheduling, the same workload again on the same engine
   with async_scheduling flipped (prefix cache emptied first), and whether both runs' tokens
   are equal.
3. profile (decode_profile.py): GPU-busy fraction of a few steady decode steps.
4. latency: batch-1 decode ms/token, (time of max_tokens = n + 1) - (time of max_tokens = 1)
   over n, with CUDA graphs (the default) and with enforce_eager=True.
5. hf (hf_baseline.py): transformers `generate`, greedy, left-padded batches of
   `hf_batch_size` in request order, only useful tokens counted.
6. big: the engine on a larger shape (Qwen3-8B on a GPU) with a smaller workload drawn by the
   same recipe (its prompts are the first ones of the main workload's), and its floor.

Checkpoints are random-weight (enginespec.testing.checkpoints), cached under
$ENGINESPEC_SYNTH_DIR (default $TMPDIR/enginespec-synth), unless --model-dir names one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.engine_runs import DTYPES, check_model_dir, checkpoint, guard, shape_of, workload_for  # noqa: E402
from benchmarks.hf_baseline import phase_hf  # noqa: E402
from benchmarks.phases import phase_big, phase_device, phase_engine, phase_latency  # noqa: E402
from benchmarks.report import environment, report, summarize  # noqa: E402
from enginespec.testing import checkpoints  # noqa: E402


def _engine_arg(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--engine-arg must be KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/throughput.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    shapes = sorted(checkpoints.SHAPES)
    p.add_argument("--shape", choices=shapes, default="qwen3-0.6b", help="random-weight model shape")
    p.add_argument(
        "--model-dir",
        help="use this checkpoint (a directory, or a repo id in the local Hugging Face cache) for "
        "--shape instead of a synthetic one",
    )
    p.add_argument("--impl", default="fast", help="implementation: reference, fast or pkg.module:attr")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--dtype",
        choices=["auto"] + sorted(DTYPES),
        default="auto",
        help="auto: bfloat16 on CUDA, float32 on CPU (bf16 matmuls are very slow on most CPUs)",
    )
    p.add_argument("--num-requests", type=int, default=256, help="requests in the workload")
    p.add_argument("--min-input-len", type=int, default=100, help="shortest prompt, in tokens")
    p.add_argument("--max-input-len", type=int, default=1024, help="longest prompt, in tokens")
    p.add_argument(
        "--min-output-len", type=int, default=100, help="shortest output (ignore_eos: exactly its length)"
    )
    p.add_argument("--max-output-len", type=int, default=1024, help="longest output, in tokens")
    p.add_argument("--id-bound", type=int, default=10000, help="prompt ids are below min(this, vocab)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload, the engine and the weights")
    p.add_argument("--temperature", type=float, default=0.0, help="engine sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="engine sampling top_p (Qwen3 chat: 0.8)")
    p.add_argument("--top-k", type=int, default=0, help="engine sampling top_k (Qwen3 chat: 20)")
    p.add_argument(
        "--chat",
        action="store_true",
        help="Qwen3's recommended chat settings: temperature 0.7, top_p 0.8, top_k 20",
    )
    p.add_argument(
        "--first-call",
        action="store_true",
        help="no harness warm-up: the first timed run is the first generate() on a fresh LLM, "
        "reported as first_call_s beside the median of the later runs (needs --repeat >= 2)",
    )
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs in the throughput run")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="timed runs of the workload on one engine; the median run is reported",
    )
    p.add_argument(
        "--engine-arg",
        type=_engine_arg,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra LLM engine argument (JSON value), repeatable",
    )
    p.add_argument(
        "--compare-scheduling",
        action="store_true",
        help="also run the workload with async_scheduling flipped (same engine); report both",
    )
    p.add_argument("--skip-hf", action="store_true", help="no transformers baseline")
    p.add_argument("--hf-batch-size", type=int, default=64, help="requests per transformers generate call")
    p.add_argument("--hf-num-requests", type=int, default=0, help="time HF on the first N requests (0 = all)")
    p.add_argument("--skip-profile", action="store_true", help="no decode profile (GPU-busy fraction)")
    p.add_argument("--profile-steps", type=int, default=10, help="decode steps the profile records")
    p.add_argument("--profile-warm-limit", type=int, default=256, help="most steps to wait for pure decode")
    p.add_argument("--skip-latency", action="store_true", help="no batch-1 decode latency")
    p.add_argument(
        "--latency-prompt-len",
        type=int,
        default=128,
        help="batch-1 prompt: the first request's first N tokens",
    )
    p.add_argument("--latency-tokens", type=int, default=256, help="capped at --max-output-len")
    p.add_argument("--skip-big", action="store_true", help="no run on --big-shape")
    p.add_argument(
        "--big-shape",
        choices=["auto"] + shapes,
        default="auto",
        help="auto: qwen3-8b on CUDA, else the --shape",
    )
    p.add_argument("--big-num-requests", type=int, default=64, help="capped at --num-requests")
    p.add_argument("--copy-bytes", type=int, default=0, help="0: 4 GiB on CUDA, 64 MiB on CPU")
    p.add_argument("--matmul-n", type=int, default=0, help="0: 8192 on CUDA, 256 on CPU")
    p.add_argument("--probe-iters", type=int, default=0, help="0: 20 on CUDA, 3 on CPU")
    p.add_argument("--git-commit", help="record this commit (for machines without the .git folder)")
    p.add_argument("--out", help="write the JSON here (rewritten after every phase)")
    p.add_argument("--strict", action="store_true", help="stop at the first failing phase")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and fill the device-dependent defaults; ValueError for out-of-range numbers."""
    from enginespec.engine_args import resolve_device

    args = build_parser().parse_args(argv)
    for name in (
        "num_requests",
        "hf_batch_size",
        "profile_steps",
        "profile_warm_limit",
        "latency_prompt_len",
        "latency_tokens",
        "big_num_requests",
        "repeat",
    ):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.first_call and args.repeat < 2:  # its one run would be cold, yet reported as the warm median
        raise ValueError(f"--first-call needs --repeat >= 2, got {args.repeat}")
    check_model_dir(args)
    _check_workload_and_probes(args)
    args.device = str(resolve_device(args.device))
    cuda = torch.device(args.device).type == "cuda"
    args.copy_bytes = args.copy_bytes or (4 << 30 if cuda else 64 << 20)
    args.matmul_n = args.matmul_n or (8192 if cuda else 256)
    args.probe_iters = args.probe_iters or (20 if cuda else 3)
    if args.dtype == "auto":
        args.dtype = "bfloat16" if cuda else "float32"
    if args.big_shape == "auto":
        args.big_shape = "qwen3-8b" if cuda else args.shape
    args.engine_args = dict(args.engine_arg)
    if args.chat:
        args.temperature, args.top_p, args.top_k = 0.7, 0.8, 20
    args.sampling = {
        k: v for k, v in (("top_p", args.top_p), ("top_k", args.top_k)) if v != (1.0 if k == "top_p" else 0)
    }
    return args


def _check_workload_and_probes(args: argparse.Namespace) -> None:
    """The workload's lengths and id bound are >= 1 (make_workload's bounds, checked here so a
    bad one is a flag error before any work, not a traceback from run()); the probe sizes and
    --hf-num-requests are >= 0, where 0 means the device's default (all requests for HF)."""
    for name in ("min_input_len", "max_input_len", "min_output_len", "max_output_len", "id_bound"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("copy_bytes", "matmul_n", "probe_iters", "hf_num_requests"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")


def _save(results: dict, path: Optional[str]) -> None:
    results["summary"] = summarize(results)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=2, default=str))
        tmp.replace(path)


def run(args) -> dict:
    """All phases in order (see the module docstring); returns the results dict."""
    config = {k: v for k, v in vars(args).items() if k != "engine_arg"}
    results: dict = {"config": config, "env": environment(args)}
    _save(results, args.out)
    model_dir = checkpoint(args.shape, args)
    workload = workload_for(args, args.num_requests, shape_of(model_dir, args).vocab_size)
    results["workload"] = {
        "model_dir": str(model_dir),
        "num_requests": len(workload.prompts),
        "prompt_tokens": sum(workload.prompt_lens),
        "output_tokens": workload.num_output_tokens,
        "rng": "random.Random(seed)",
    }
    steps = [
        ("device", lambda: phase_device(args)),
        ("engine", lambda: phase_engine(args, model_dir, workload, results.get("device"), results)),
    ]
    if not args.skip_latency:
        steps.append(("latency", lambda: phase_latency(args, model_dir, workload)))
    if not args.skip_hf:
        steps.append(("hf", lambda: phase_hf(args, model_dir, workload)))
    if not args.skip_big:
        steps.append(("big", lambda: phase_big(args, results.get("device"))))
    start = time.perf_counter()
    for name, fn in steps:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        results[name] = guard(args, fn)
        results["total_s"] = time.perf_counter() - start
        _save(results, args.out)
        status = "FAILED: " + results[name]["error"] if "error" in results[name] else "done"
        print(f"[bench] {name} {status} ({results[name]['phase_s']:.1f} s)", file=sys.stderr, flush=True)
    return results


def main(argv=None) -> int:
    """The command line (benchmarks/throughput.py). Exit 1 if a phase failed, 2 on a bad flag."""
    try:
        args = parse_args(argv)
    except ValueError as e:
        print(f"benchmarks/throughput.py: {e}", file=sys.stderr)
        return 2
    results = run(args)
    print(report(results))
    if args.out:
        print(f"results: {args.out}")
    return 1 if any(isinstance(v, dict) and "error" in v for v in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
