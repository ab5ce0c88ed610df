"""Running the workload through the engine: the engine under test, timed `generate` runs, the
warm-up, and what every phase shares (checkpoint, model shape, workload, floors, phase guard).

A timed run is one `LLM.generate` over the whole workload, synchronised on the device before
and after; greedy runs are compared across runs by a digest of every output token.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

import torch

from benchmarks import roofline as rl
from enginespec.testing import checkpoints
from enginespec.testing.workload import Workload, make_workload

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def release() -> None:
    """Give memory back between phases, so each phase starts with the device to itself."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def guard(args, fn: Callable[[], dict]) -> dict:
    """Run one phase; its exception becomes {"error", "traceback"} unless --strict."""
    start = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - one failed phase must not lose the others' numbers
        if args.strict:
            raise
        out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    out["phase_s"] = time.perf_counter() - start
    release()
    return out


def engine_supports(name: str) -> bool:
    from enginespec.engine_args import EngineArgs

    return name in {f.name for f in dataclasses.fields(EngineArgs)}


def own_args(own, argv=None):
    """(this script's options, the rest): `own` (built with add_help=False) takes what it knows
    of argv (None: sys.argv[1:]) and the rest goes to the shared parser the script builds on
    (throughput's, decode_sweep's). With -h or --help, own's options are printed first: the shared
    parser's help, which then exits, lists only its own flags."""
    mine, rest = own.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        print(own.format_help().replace("options:", "this script's own options:", 1), flush=True)
    return mine, rest


def add_model_args(p) -> None:
    """The arguments every single-engine probe shares: which synthetic shape (or checkpoint),
    impl, device, dtype and seed (decode_sweep.py, step_anatomy.py)."""
    from enginespec.testing import checkpoints

    p.add_argument("--shape", choices=sorted(checkpoints.SHAPES), default="qwen3-0.6b")
    p.add_argument(
        "--model-dir",
        help="use this checkpoint (a directory, or a repo id in the local Hugging Face cache) for "
        "--shape instead of a synthetic one",
    )
    p.add_argument("--impl", default="fast")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", choices=["auto"] + sorted(DTYPES), default="auto")
    p.add_argument("--seed", type=int, default=0)


def make_llm(model_dir, args, **extra):
    """The engine under test: LLM(model_dir, impl=..., dtype=args.dtype, ...) plus --engine-arg."""
    from enginespec.llm import LLM

    kwargs = dict(impl=args.impl, dtype=args.dtype, seed=args.seed, device=args.device)
    kwargs.update(args.engine_args)
    kwargs.update(extra)
    return LLM(str(model_dir), **kwargs)


def engine_core(llm):
    """The LLM's EngineCore (it carries `stats`), or None if this LLM does not expose one."""
    for name in ("engine_core", "engine", "core", "llm_engine"):
        core = getattr(llm, name, None)
        if core is not None and hasattr(core, "step"):
            return core
    return None


def _stat(llm, name: str) -> Optional[int]:
    core = engine_core(llm)
    stats = getattr(core, "stats", None)
    return getattr(stats, name, None)


def timed_generate(
    llm, workload: Workload, device, temperature: float = 0.0, use_tqdm: bool = True, sampling=None
) -> dict:
    """Run the workload through `llm.generate` once; tokens, wall seconds and engine steps.
    `sampling`: further SamplingParams fields for every request (top_p, top_k: --top-p/--top-k)."""
    prompts, params = workload.prompt_inputs(), workload.sampling_params(temperature)
    if sampling:
        params = [dataclasses.replace(p, **sampling) for p in params]
    steps_before = _stat(llm, "num_steps")
    async_before = _stat(llm, "num_async_steps")
    sync(device)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=use_tqdm)
    sync(device)
    wall = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    steps_after = _stat(llm, "num_steps")
    steps = None if steps_before is None or steps_after is None else steps_after - steps_before
    async_after = _stat(llm, "num_async_steps")
    async_steps = None if async_before is None or async_after is None else async_after - async_before
    digest = hashlib.blake2b(repr([c.token_ids for o in outputs for c in o.outputs]).encode(), digest_size=8)
    return {
        "wall_s": wall,
        "output_tokens": tokens,
        "requested_output_tokens": workload.num_output_tokens,
        "num_requests": len(outputs),
        "output_tok_s": tokens / wall,
        "num_steps": steps,
        "num_async_steps": async_steps,
        "tokens_digest": digest.hexdigest(),
    }


def warm_up(llm, workload: Workload, device, temperature: float = 0.0, sampling=None) -> None:
    """One-time costs (lazy init, compilation, graph capture, kernel variants for the
    workload's step shapes and sampling mode: the run's temperature, so a sampled run's draw
    kernels are compiled here) are not timed: run the first requests of the workload for two
    tokens each, then empty the prefix cache so the timed run gets no hit from them."""
    head = workload.head(min(len(workload.prompts), 32))
    timed_generate(llm, Workload(head.prompts, [2] * len(head.prompts)), device, temperature, False, sampling)
    reset_prefix_cache(llm)


def reset_prefix_cache(llm) -> None:
    core = engine_core(llm)
    manager = getattr(core, "block_manager", None)
    if manager is not None and not manager.reset_prefix_cache():
        raise RuntimeError("reset_prefix_cache refused: blocks still referenced on an idle engine (a bug)")


def timed_runs(llm, workload: Workload, args) -> dict:
    """`--repeat` timed runs of the workload on one engine, the prefix cache emptied before
    each: the median run's figures (the upper middle one for an even count), plus every run's
    wall time and token digest under "runs" when there is more than one. Greedy runs must
    produce the same tokens every time (`tokens_match_across_runs`). The first run's steps are
    traced (EngineStats.step_trace) and returned as "step_trace" = (start time, steps).
    With args.first_call (no harness warm-up before the first run, --first-call), the first run
    is the first generate() on a fresh LLM: it is reported as "first_call_s" (with the ratio to
    the warm median, "first_over_warm") and the median is taken over the later runs."""
    stats = getattr(engine_core(llm), "stats", None)
    traced = stats is not None and hasattr(stats, "step_trace")
    if traced:
        stats.step_trace = []
    start = time.perf_counter()
    sampling = getattr(args, "sampling", None)
    runs = [timed_generate(llm, workload, args.device, args.temperature, sampling=sampling)]
    trace = (start, stats.step_trace) if traced else None
    if traced:
        stats.step_trace = None
    for _ in range(args.repeat - 1):
        reset_prefix_cache(llm)
        runs.append(timed_generate(llm, workload, args.device, args.temperature, sampling=sampling))
    first_call = getattr(args, "first_call", False) and len(runs) > 1
    warm = runs[1:] if first_call else runs
    out = dict(sorted(warm, key=lambda r: r["wall_s"])[len(warm) // 2])
    if first_call:
        out["first_call_s"] = runs[0]["wall_s"]
        out["first_over_warm"] = runs[0]["wall_s"] / out["wall_s"]
    out["startup_s"] = _stat(llm, "startup_seconds")
    out["warmup_s"] = _stat(llm, "warmup_seconds")
    out["startup_phases"] = _stat(llm, "startup_phases")
    if len(runs) > 1:
        out["runs"] = [
            {k: r[k] for k in ("wall_s", "output_tok_s", "num_steps", "tokens_digest")} for r in runs
        ]
        out["tokens_match_across_runs"] = len({r["tokens_digest"] for r in runs}) == 1
    if trace is not None:
        out["step_trace"] = trace
    return out


def workload_for(args, num_requests: int, vocab_size: int) -> Workload:
    return make_workload(
        num_requests,
        min_input_len=args.min_input_len,
        max_input_len=args.max_input_len,
        min_output_len=args.min_output_len,
        max_output_len=args.max_output_len,
        id_bound=min(args.id_bound, vocab_size),
        seed=args.seed,
    )


def check_model_dir(args) -> None:
    """--model-dir, when given, is a local checkpoint directory holding config.json, or the repo
    id of one in the local Hugging Face cache (as LLM's model; worker/hub_cache.py), replaced by
    its snapshot's directory here so every phase (the floor's config read, transformers'
    baseline) reads the same files; else a ValueError naming the flag, raised by a parse_args
    before any work (reading its config later went to transformers, whose answer for a missing
    path is a traceback about Hub repo ids)."""
    from enginespec.worker.hub_cache import resolve_checkpoint
    from enginespec.worker.loader import check_checkpoint_dir

    if getattr(args, "model_dir", None) is None:
        return
    try:
        args.model_dir = resolve_checkpoint(args.model_dir, field="--model-dir")
    except ValueError as e:
        raise ValueError(str(e)) from None  # it names --model-dir itself
    try:
        check_checkpoint_dir(args.model_dir)
    except ValueError as e:
        raise ValueError(f"--model-dir: {e}") from None


def checkpoint(shape: str, args) -> Path:
    if args.model_dir and shape == args.shape:
        return Path(args.model_dir)
    return checkpoints.make_checkpoint(
        shape, checkpoints.default_dir(shape), device=args.device, seed=args.seed
    )


def shape_of(model_dir, args) -> rl.ModelShape:
    """The floor's view of the model `make_llm(model_dir, args)` builds: the checkpoint's config
    as the engine reads it (the loader's load_config, with the run's hf_overrides from
    --engine-arg merged, so an overridden shape field is the floor's too), at the run's dtype
    (args.dtype: bytes per weight and K/V value)."""
    from enginespec.worker.loader import load_config

    overrides = (getattr(args, "engine_args", None) or {}).get("hf_overrides")
    nbytes = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    return rl.ModelShape.from_config(load_config(model_dir, hf_overrides=overrides), dtype_bytes=nbytes)


def floors(workload: Workload, shape: rl.ModelShape, rates: dict, num_steps: Optional[int]) -> dict:
    """Floors with the engine's steps (when known) and with the fewest possible steps."""
    if not rates or "copy_bytes_per_s" not in rates:
        return {"floor": None, "floor_min_steps": None}
    kw = dict(copy_bytes_per_s=rates["copy_bytes_per_s"], matmul_flops_per_s=rates["matmul_flops_per_s"])
    fewest = max(workload.output_lens)
    floor_min = rl.roofline(workload.prompt_lens, workload.output_lens, shape, num_steps=fewest, **kw)
    floor = (
        floor_min
        if not num_steps
        else rl.roofline(workload.prompt_lens, workload.output_lens, shape, num_steps=num_steps, **kw)
    )
    return {
        "floor": floor.to_dict(),
        "floor_min_steps": floor_min.to_dict(),
        "floor_steps_source": "engine" if num_steps else "max output len",
    }
