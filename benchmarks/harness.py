"""`enginespec bench`: end-to-end throughput of the engine, transformers' `generate` on the same
prompts, and the roofline floor of the workload, in one run on one device.

Workload (DESIGN.md "Performance targets"): `num_requests` requests drawn with Python's
`random.Random(seed)` in this order: for each request a prompt length randint(min_input_len,
max_input_len) then its ids randint(0, id_bound - 1) (id_bound = min(10000, vocab)); then, for
each request, an output length randint(min_output_len, max_output_len). A min above its max is
lowered to the max, so small smoke runs need only the max flags. Outputs use ignore_eos, so
every request produces exactly its output length.

Phases, each timed after its own warm-up, each recorded in the JSON (an exception is recorded as
the phase's "error" and the run goes on, unless --strict); the JSON is rewritten after every
phase, so a run cut short still leaves what it measured:
1. device: copy bandwidth (bytes read + written) and matmul rate in the run's dtype (--dtype auto:
   bf16 on CUDA, float32 on CPU, where bf16 matmuls are very slow).
2. engine: `LLM.generate` over the workload; output tokens, wall time, engine steps, the floor
   (benchmarks/roofline.py) with the engine's step count and with the fewest possible steps.
   With --repeat N, N timed runs on the same engine (prefix cache emptied before each): the
   median run is the headline, every run's wall time is kept. The first run's steps are also
   binned (prefill steps, then decode steps by batch size), each bin's wall time against the
   sum of its steps' floors: where the gap to the floor lives. With --compare-scheduling, the
   same workload again on the same engine with async_scheduling
   flipped (prefix cache emptied first), and whether both runs' tokens are equal.
3. profile: GPU-busy fraction of a few steady decode steps (all requests prefilled): the union
   of CUDA kernel/memcpy intervals from torch.profiler over the wall time of those steps.
4. latency: batch-1 decode ms/token, (time of max_tokens = n + 1) - (time of max_tokens = 1)
   over n, with CUDA graphs (the default) and with enforce_eager=True.
5. hf: transformers `generate`, greedy, left-padded batches of `hf_batch_size` in request
   order; each batch runs to its longest requested output (min_new_tokens = max_new_tokens), and
   only useful tokens count: min(requested, generated) per request.
6. big: the engine on a larger shape (Qwen3-8B on a GPU) with a smaller workload drawn by the same
   recipe (its prompts are the first ones of the main workload's), and its floor.

Checkpoints are random-weight (testing/synthetic.py), cached under $ENGINESPEC_SYNTH_DIR
(default $TMPDIR/enginespec-synth), unless --model-dir names one for --shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import random
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from benchmarks import roofline as rl
from enginespec.spec import SamplingParams
from enginespec.testing import synthetic

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---- workload -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Prompts (token ids) and the output length each request asks for (ignore_eos)."""

    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def prompt_lens(self) -> list[int]:
        return [len(p) for p in self.prompts]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    def head(self, n: int) -> "Workload":
        return Workload(self.prompts[:n], self.output_lens[:n])


def make_workload(
    num_requests: int,
    *,
    min_input_len: int,
    max_input_len: int,
    min_output_len: int,
    max_output_len: int,
    id_bound: int,
    seed: int = 0,
) -> Workload:
    """The benchmark workload (draw order in the module docstring)."""
    for name, value in (
        ("num_requests", num_requests),
        ("max_input_len", max_input_len),
        ("max_output_len", max_output_len),
        ("id_bound", id_bound),
        ("min_input_len", min_input_len),
        ("min_output_len", min_output_len),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    rng = random.Random(seed)
    lo_in, lo_out = min(min_input_len, max_input_len), min(min_output_len, max_output_len)
    prompts = []
    for _ in range(num_requests):
        length = rng.randint(lo_in, max_input_len)
        prompts.append([rng.randint(0, id_bound - 1) for _ in range(length)])
    output_lens = [rng.randint(lo_out, max_output_len) for _ in range(num_requests)]
    return Workload(prompts, output_lens)


# ---- helpers --------------------------------------------------------------------------------------


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _release() -> None:
    """Give memory back between phases, so each phase starts with the device to itself."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _engine_supports(name: str) -> bool:
    from enginespec.engine_args import EngineArgs

    return name in {f.name for f in dataclasses.fields(EngineArgs)}


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


def _params(output_lens, temperature: float) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=o, temperature=temperature, ignore_eos=True) for o in output_lens]


def timed_generate(llm, workload: Workload, device, temperature: float = 0.0, use_tqdm: bool = True) -> dict:
    """Run the workload through `llm.generate` once; tokens, wall seconds and engine steps."""
    prompts = [{"prompt_token_ids": p} for p in workload.prompts]
    params = _params(workload.output_lens, temperature)
    steps_before = _stat(llm, "num_steps")
    async_before = _stat(llm, "num_async_steps")
    _sync(device)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=use_tqdm)
    _sync(device)
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


def _floors(workload: Workload, shape: rl.ModelShape, rates: dict, num_steps: Optional[int]) -> dict:
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


def _checkpoint(shape: str, args) -> Path:
    if args.model_dir and shape == args.shape:
        return Path(args.model_dir)
    return synthetic.make_synthetic_checkpoint(
        shape, synthetic.default_dir(shape), device=args.device, seed=args.seed
    )


def _shape_of(model_dir, dtype: str) -> rl.ModelShape:
    """The floor's view of the checkpoint, at the run's dtype (bytes per weight and K/V value)."""
    from transformers import AutoConfig

    nbytes = torch.empty((), dtype=_DTYPES[dtype]).element_size()
    return rl.ModelShape.from_config(AutoConfig.from_pretrained(str(model_dir)), dtype_bytes=nbytes)


# ---- phases ---------------------------------------------------------------------------------------


def phase_device(args) -> dict:
    """Copy bandwidth and matmul rate (in the run's dtype, bf16 on a GPU) of the device, measured now."""
    copy = rl.measure_copy_bandwidth(args.device, args.copy_bytes, iters=args.probe_iters)
    matmul = rl.measure_matmul_rate(
        args.device, args.matmul_n, iters=args.probe_iters, dtype=_DTYPES[args.dtype]
    )
    return {
        "copy_bytes_per_s": copy,
        "copy_nbytes": args.copy_bytes,
        "matmul_flops_per_s": matmul,
        "matmul_n": args.matmul_n,
        "matmul_dtype": args.dtype,
        "iters": args.probe_iters,
    }


def _warm_up(llm, workload: Workload, device, temperature: float = 0.0) -> None:
    """One-time costs (lazy init, compilation, graph capture, kernel variants for the
    workload's step shapes and sampling mode: the run's temperature, so a sampled run's draw
    kernels are compiled here) are not timed: run the first requests of the workload for two
    tokens each, then empty the prefix cache so the timed run gets no hit from them."""
    head = workload.head(min(len(workload.prompts), 32))
    timed_generate(llm, Workload(head.prompts, [2] * len(head.prompts)), device, temperature, use_tqdm=False)
    _reset_prefix_cache(llm)


def _reset_prefix_cache(llm) -> None:
    core = engine_core(llm)
    manager = getattr(core, "block_manager", None)
    if manager is not None and not manager.reset_prefix_cache():
        raise RuntimeError("reset_prefix_cache refused: blocks still referenced on an idle engine (a bug)")


def phase_engine(args, model_dir, workload: Workload, rates: dict, results: dict) -> dict:
    """Throughput of the engine on the workload, its floor, then the decode profile (same LLM)."""
    extra = {"enforce_eager": True} if args.enforce_eager else {}
    llm = make_llm(model_dir, args, **extra)
    _warm_up(llm, workload, args.device, args.temperature)
    out = _timed_runs(llm, workload, args)
    shape = _shape_of(model_dir, args.dtype)
    out.update(_floors(workload, shape, rates, out["num_steps"]))
    trace = out.pop("step_trace", None)
    if trace is not None and rates and "copy_bytes_per_s" in rates:
        out["by_step_kind"] = step_breakdown(trace, shape, rates)
        out["first_steps"] = first_steps(trace, shape, rates)
    out["enforce_eager"] = bool(args.enforce_eager)
    core = engine_core(llm)
    out["async_scheduling"] = bool(getattr(getattr(core, "args", None), "async_scheduling", False))
    if args.compare_scheduling:
        out["other_scheduling"] = _guard(args, lambda: _other_scheduling_run(llm, workload, args, rates, out))
    if not args.skip_profile:
        results["profile"] = _guard(args, lambda: profile_decode(llm, workload, args))
    llm = None  # free the engine (and its KV pool) before the next run
    return out


def _timed_runs(llm, workload: Workload, args) -> dict:
    """`--repeat` timed runs of the workload on one engine, the prefix cache emptied before
    each: the median run's figures (the upper middle one for an even count), plus every run's
    wall time and token digest under "runs" when there is more than one. Greedy runs must
    produce the same tokens every time (`tokens_match_across_runs`). The first run's steps are
    traced (EngineStats.step_trace) and returned as "step_trace" = (start time, steps)."""
    stats = getattr(engine_core(llm), "stats", None)
    traced = stats is not None and hasattr(stats, "step_trace")
    if traced:
        stats.step_trace = []
    start = time.perf_counter()
    runs = [timed_generate(llm, workload, args.device, args.temperature)]
    trace = (start, stats.step_trace) if traced else None
    if traced:
        stats.step_trace = None
    for _ in range(args.repeat - 1):
        _reset_prefix_cache(llm)
        runs.append(timed_generate(llm, workload, args.device, args.temperature))
    out = dict(sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2])
    if len(runs) > 1:
        out["runs"] = [
            {k: r[k] for k in ("wall_s", "output_tok_s", "num_steps", "tokens_digest")} for r in runs
        ]
        out["tokens_match_across_runs"] = len({r["tokens_digest"] for r in runs}) == 1
    if trace is not None:
        out["step_trace"] = trace
    return out


# Decode steps are binned by their number of requests (upper bounds); steps with prompt rows
# form their own bin.
BATCH_BINS = (8, 32, 64, 128, 256)


def _step_floor(shape: rl.ModelShape, rates: dict, prompt_tokens: int, kv_tokens: int) -> float:
    """One step's floor: (weights + K/V of its contexts) / copy bandwidth + 2 * body params *
    prompt tokens / matmul rate."""
    return (shape.weight_bytes_per_step + kv_tokens * shape.kv_bytes_per_token) / rates[
        "copy_bytes_per_s"
    ] + 2 * shape.body_params * prompt_tokens / rates["matmul_flops_per_s"]


def _timed_steps(trace: tuple, shape: rl.ModelShape, rates: dict):
    """(num_reqs, num_tokens, wall s, floor s, host wait s) per traced step; a step's wall is the
    time since the previous step's work ended (the first: since the trace started)."""
    previous, steps = trace
    for num_reqs, num_tokens, kv_tokens, end, wait in steps:
        yield (
            num_reqs,
            num_tokens,
            end - previous,
            _step_floor(shape, rates, num_tokens - num_reqs, kv_tokens),
            wait,
        )
        previous = end


def step_breakdown(trace: tuple, shape: rl.ModelShape, rates: dict) -> list[dict]:
    """Wall time against a per-step floor (_step_floor), by kind of step: "prefill" (some
    prompt rows), then decode steps by batch size; walls as in _timed_steps. Per-step floors sum
    to about the workload's floor (they count the K/V of the new tokens too). host_wait_s: how
    long the host blocked on the GPU in those steps (async scheduling); a bin whose wait is far
    below its wall was bound by the host."""
    bins: dict[str, dict] = {}
    for num_reqs, num_tokens, wall, floor, wait in _timed_steps(trace, shape, rates):
        name = (
            "prefill"
            if num_tokens > num_reqs
            else next((f"decode <= {b}" for b in BATCH_BINS if num_reqs <= b), f"decode > {BATCH_BINS[-1]}")
        )
        row = bins.setdefault(name, {"steps": 0, "wall_s": 0.0, "floor_s": 0.0, "host_wait_s": 0.0})
        row["steps"] += 1
        row["wall_s"] += wall
        row["floor_s"] += floor
        row["host_wait_s"] += wait
    order = ["prefill"] + [f"decode <= {b}" for b in BATCH_BINS] + [f"decode > {BATCH_BINS[-1]}"]
    return [
        {"kind": k, **bins[k], "wall_over_floor": bins[k]["wall_s"] / bins[k]["floor_s"]}
        for k in order
        if k in bins
    ]


def first_steps(trace: tuple, shape: rl.ModelShape, rates: dict, num: int = 40) -> list[dict]:
    """The first `num` steps of a trace one by one (the prefill phase and the start of decode):
    requests, tokens, wall and floor in ms, floored as in step_breakdown."""
    start, steps = trace
    return [
        {
            "num_reqs": num_reqs,
            "num_tokens": num_tokens,
            "wall_ms": round(wall * 1e3, 3),
            "floor_ms": round(floor * 1e3, 3),
            "host_wait_ms": round(wait * 1e3, 3),
        }
        for num_reqs, num_tokens, wall, floor, wait in _timed_steps((start, steps[:num]), shape, rates)
    ]


def _other_scheduling_run(llm, workload: Workload, args, rates: dict, first: dict) -> dict:
    """The same workload on the same engine with async_scheduling flipped, after emptying the
    prefix cache; the steps are then the first run's, so its greedy tokens must equal the first
    run's bit for bit, which the digest compares."""
    core = engine_core(llm)
    if core is None or not _engine_supports("async_scheduling"):
        return {"skipped": "this engine has no async_scheduling"}
    _reset_prefix_cache(llm)  # no hit from the first run: both runs compute every prompt
    before = core.args
    core.args = dataclasses.replace(before, async_scheduling=not before.async_scheduling)
    try:
        out = timed_generate(llm, workload, args.device, args.temperature)
    finally:
        core.args = before
    out.update(_floors(workload, _shape_of(Path(before.model), args.dtype), rates, out["num_steps"]))
    out["async_scheduling"] = not before.async_scheduling
    out["tokens_match_first_run"] = out["tokens_digest"] == first["tokens_digest"]
    return out


def device_busy_us(events) -> tuple[float, int]:
    """Union of the CUDA-side (kernel, memcpy, memset) intervals among profiler `events`, in
    microseconds, and how many there were. A union, so overlapping streams are not counted twice."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA)
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


def _step_until_steady(core, num_live: int, limit: int) -> int:
    """Step until one step schedules exactly one token per live request (pure decode)."""
    for i in range(limit):
        before = core.stats.num_scheduled_tokens
        core.step()
        if core.stats.num_scheduled_tokens - before == num_live:
            return i + 1
    return limit


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
    from torch.profiler import ProfilerActivity, profile

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
    warm = _step_until_steady(core, len(ids), args.profile_warm_limit)
    cuda = torch.device(args.device).type == "cuda"
    _sync(args.device)
    start = time.perf_counter()
    for _ in range(args.profile_steps):  # the same steps without the profiler's overhead
        core.step(final_only=True)  # as generate() steps: no cumulative outputs of running requests
    _sync(args.device)
    plain_ms = (time.perf_counter() - start) * 1e3 / args.profile_steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        _sync(args.device)
        start = time.perf_counter()
        for _ in range(args.profile_steps):
            core.step(final_only=True)
        _sync(args.device)
        wall_us = (time.perf_counter() - start) * 1e6
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


def _decode_latency(llm, prompt: list[int], num_tokens: int, device) -> float:
    """ms per decode token at batch 1: (t(n + 1 tokens) - t(1 token)) / n, after a warm-up."""
    one, many = Workload([prompt], [1]), Workload([prompt], [num_tokens + 1])
    timed_generate(llm, many, device, use_tqdm=False)
    t_one = min(timed_generate(llm, one, device, use_tqdm=False)["wall_s"] for _ in range(2))
    t_many = timed_generate(llm, many, device, use_tqdm=False)["wall_s"]
    return (t_many - t_one) / num_tokens * 1e3


def phase_latency(args, model_dir, workload: Workload) -> dict:
    """Batch-1 decode latency with CUDA graphs (default) and with enforce_eager=True."""
    prompt = workload.prompts[0][: args.latency_prompt_len]
    num_tokens = min(args.latency_tokens, args.max_output_len)
    out = {"prompt_len": len(prompt), "num_tokens": num_tokens}
    modes = [("default", {})]
    if _engine_supports("enforce_eager"):
        modes.append(("eager", {"enforce_eager": True}))
    else:
        out["eager"] = "this engine's EngineArgs has no enforce_eager; only the default was measured"
    for name, extra in modes:
        llm = make_llm(model_dir, args, **extra)
        out[f"{name}_ms_per_token"] = _decode_latency(llm, prompt, num_tokens, args.device)
        del llm
        _release()
    if "eager_ms_per_token" in out:
        out["eager_over_default"] = out["eager_ms_per_token"] / out["default_ms_per_token"]
    return out


def _hf_batch(model, prompts: list[list[int]], output_lens: list[int], pad_id: int, device) -> int:
    """Generate one left-padded batch to its longest requested output; return useful tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    new = max(output_lens)
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        pad_token_id=pad_id,
    )
    generated = out.shape[1] - width
    return sum(min(o, generated) for o in output_lens)


def phase_hf(args, model_dir, workload: Workload) -> dict:
    """transformers `generate` on the same prompts, in batches of hf_batch_size (request order)."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    part = workload.head(min(args.hf_num_requests or len(workload.prompts), len(workload.prompts)))
    model = (
        AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=_DTYPES[args.dtype]).to(args.device).eval()
    )
    pad_id = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0
    bs = args.hf_batch_size
    chunks = [
        (part.prompts[i : i + bs], part.output_lens[i : i + bs]) for i in range(0, len(part.prompts), bs)
    ]
    with torch.inference_mode():
        warm = [p[:16] for p in part.prompts[:2]]
        _hf_batch(model, warm, [2] * len(warm), pad_id, args.device)  # warm-up: lazy init, kernels
        _sync(args.device)
        start = time.perf_counter()
        tokens = sum(
            _hf_batch(model, prompts, outs, pad_id, args.device)
            for prompts, outs in tqdm(chunks, desc="transformers generate", file=sys.stderr)
        )
        _sync(args.device)
        wall = time.perf_counter() - start
    attn = getattr(model.config, "_attn_implementation", None)
    del model
    return {
        "wall_s": wall,
        "output_tokens": tokens,
        "requested_output_tokens": part.num_output_tokens,
        "num_requests": len(part.prompts),
        "batch_size": bs,
        "output_tok_s": tokens / wall,
        "attn_implementation": attn,
        "order": "request order, left padding, greedy",
    }


def phase_big(args, rates: dict) -> dict:
    """The engine on the larger shape with a smaller workload (same draw recipe), and its floor."""
    model_dir = _checkpoint(args.big_shape, args)
    shape = _shape_of(model_dir, args.dtype)
    workload = _workload(args, min(args.big_num_requests, args.num_requests), shape.vocab_size)
    llm = make_llm(model_dir, args)
    _warm_up(llm, workload, args.device, args.temperature)
    out = timed_generate(llm, workload, args.device, args.temperature)
    del llm
    out.update(_floors(workload, shape, rates, out["num_steps"]))
    out["shape"] = args.big_shape
    if out.get("floor"):
        out["wall_over_floor"] = out["wall_s"] / out["floor"]["floor_s"]
    return out


def _workload(args, num_requests: int, vocab_size: int) -> Workload:
    return make_workload(
        num_requests,
        min_input_len=args.min_input_len,
        max_input_len=args.max_input_len,
        min_output_len=args.min_output_len,
        max_output_len=args.max_output_len,
        id_bound=min(args.id_bound, vocab_size),
        seed=args.seed,
    )


# ---- environment and summary ----------------------------------------------------------------------


def _git_commit(override: Optional[str]) -> dict:
    if override:
        return {"commit": override, "source": "--git-commit"}
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = (
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            != ""
        )
        return {"commit": commit, "dirty": dirty, "source": "git"}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "source": "unavailable (no git checkout here; pass --git-commit)"}


def environment(args) -> dict:
    """Device, library versions, commit and date of this run."""
    import datetime
    import platform

    import transformers

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        versions["triton"] = None
    dev = torch.device(args.device)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    return {
        "device": str(dev),
        "gpu": gpu,
        "cpu": platform.processor() or platform.machine(),
        "versions": versions,
        "git": _git_commit(args.git_commit),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _ratio(a, b):
    return a / b if a and b else None


def _by_scheduling(eng: dict, hf_tok_s) -> dict:
    """serial_* and async_* figures from the engine run and its --compare-scheduling twin."""
    out = {}
    for run in (eng, eng.get("other_scheduling") or {}):
        if "output_tok_s" not in run:
            continue
        mode = "async" if run.get("async_scheduling") else "serial"
        out[f"{mode}_output_tok_s"] = run["output_tok_s"]
        out[f"{mode}_wall_over_floor"] = _ratio(run.get("wall_s"), (run.get("floor") or {}).get("floor_s"))
        out[f"{mode}_ratio_vs_hf"] = _ratio(run["output_tok_s"], hf_tok_s)
    other = eng.get("other_scheduling") or {}
    out["scheduling_tokens_match"] = other.get("tokens_match_first_run")
    return out


def summarize(results: dict) -> dict:
    """The headline numbers (None where a phase did not run or failed)."""
    eng, hf, env = results.get("engine") or {}, results.get("hf") or {}, results.get("env") or {}
    lat, big = results.get("latency") or {}, results.get("big") or {}
    floor = (eng.get("floor") or {}).get("floor_s")
    floor_min = (eng.get("floor_min_steps") or {}).get("floor_s")
    tok_s, hf_tok_s = eng.get("output_tok_s"), hf.get("output_tok_s")
    wall = eng.get("wall_s")
    return {
        "impl": results["config"]["impl"],
        "shape": results["config"]["shape"],
        "output_tok_s": tok_s,
        "hf_output_tok_s": hf_tok_s,
        "ratio_vs_hf": tok_s / hf_tok_s if tok_s and hf_tok_s else None,
        "wall_s": wall,
        "floor_s": floor,
        "wall_over_floor": wall / floor if wall and floor else None,
        "floor_min_steps_s": floor_min,
        "num_steps": eng.get("num_steps"),
        "runs_wall_over_floor": [r["wall_s"] / floor for r in eng["runs"]]
        if floor and eng.get("runs")
        else None,
        "gpu_busy_fraction": (results.get("profile") or {}).get("gpu_busy_fraction"),
        "tokens_match": eng.get("output_tokens") == eng.get("requested_output_tokens") if eng else None,
        "batch1_ms_per_token": lat.get("default_ms_per_token"),
        "batch1_eager_ms_per_token": lat.get("eager_ms_per_token"),
        **_by_scheduling(eng, hf_tok_s),
        "big_output_tok_s": big.get("output_tok_s"),
        "big_wall_over_floor": big.get("wall_over_floor"),
        "gpu": env.get("gpu"),
        "versions": env.get("versions"),
        "git_commit": (env.get("git") or {}).get("commit"),
        "date": env.get("date"),
    }


# ---- command line ---------------------------------------------------------------------------------


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
        prog="enginespec bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    shapes = sorted(synthetic.SHAPES)
    p.add_argument("--shape", choices=shapes, default="qwen3-0.6b", help="random-weight model shape")
    p.add_argument("--model-dir", help="use this checkpoint for --shape instead of a synthetic one")
    p.add_argument("--impl", default="fast", help="implementation: reference, fast or pkg.module:attr")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--dtype",
        choices=["auto"] + sorted(_DTYPES),
        default="auto",
        help="auto: bfloat16 on CUDA, float32 on CPU (bf16 matmuls are very slow on most CPUs)",
    )
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--min-input-len", type=int, default=100)
    p.add_argument("--max-input-len", type=int, default=1024)
    p.add_argument("--min-output-len", type=int, default=100)
    p.add_argument("--max-output-len", type=int, default=1024)
    p.add_argument("--id-bound", type=int, default=10000, help="prompt ids are below min(this, vocab)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0, help="engine sampling temperature (0 = greedy)")
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
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--hf-batch-size", type=int, default=64)
    p.add_argument("--hf-num-requests", type=int, default=0, help="time HF on the first N requests (0 = all)")
    p.add_argument("--skip-profile", action="store_true")
    p.add_argument("--profile-steps", type=int, default=10)
    p.add_argument("--profile-warm-limit", type=int, default=256, help="most steps to wait for pure decode")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--latency-prompt-len", type=int, default=128)
    p.add_argument("--latency-tokens", type=int, default=256, help="capped at --max-output-len")
    p.add_argument("--skip-big", action="store_true")
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
    return args


def _guard(args, fn: Callable[[], dict]) -> dict:
    """Run one phase; its exception becomes {"error", "traceback"} unless --strict."""
    start = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - one failed phase must not lose the others' numbers
        if args.strict:
            raise
        out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    out["phase_s"] = time.perf_counter() - start
    _release()
    return out


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
    model_dir = _checkpoint(args.shape, args)
    workload = _workload(args, args.num_requests, _shape_of(model_dir, args.dtype).vocab_size)
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
        results[name] = _guard(args, fn)
        results["total_s"] = time.perf_counter() - start
        _save(results, args.out)
        status = "FAILED: " + results[name]["error"] if "error" in results[name] else "done"
        print(f"[bench] {name} {status} ({results[name]['phase_s']:.1f} s)", file=sys.stderr, flush=True)
    return results


def _fmt(value, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def report(results: dict) -> str:
    """A few human-readable lines of the summary."""
    s = results["summary"]
    lines = [
        f"enginespec bench: impl={s['impl']} shape={s['shape']} gpu={s['gpu']} commit={s['git_commit']}",
        f"  engine: {_fmt(s['output_tok_s'], '.1f')} output tok/s, wall {_fmt(s['wall_s'])} s, "
        f"{s['num_steps']} steps",
        f"  floor: {_fmt(s['floor_s'])} s (fewest steps: {_fmt(s['floor_min_steps_s'])} s), "
        f"wall/floor {_fmt(s['wall_over_floor'])}",
        f"  transformers: {_fmt(s['hf_output_tok_s'], '.1f')} tok/s, engine/HF {_fmt(s['ratio_vs_hf'])}",
        f"  gpu busy in decode: {_fmt(s['gpu_busy_fraction'])}",
    ]
    if s.get("runs_wall_over_floor"):
        lines.insert(
            3,
            "  wall/floor of each run (median reported): "
            + ", ".join(_fmt(r) for r in s["runs_wall_over_floor"]),
        )
    for mode in ("serial", "async"):
        if s.get(f"{mode}_output_tok_s") is not None:
            lines.append(
                f"  {mode} scheduling: {_fmt(s[f'{mode}_output_tok_s'], '.1f')} output tok/s, "
                f"wall/floor {_fmt(s[f'{mode}_wall_over_floor'])}, "
                f"engine/HF {_fmt(s[f'{mode}_ratio_vs_hf'])}"
            )
    if s.get("scheduling_tokens_match") is not None:
        lines.append(f"  serial and async tokens equal: {s['scheduling_tokens_match']}")
    lat = results.get("latency") or {}
    if "default_ms_per_token" in lat:
        lines.append(
            f"  batch-1 decode: {_fmt(lat['default_ms_per_token'])} ms/token default, "
            f"{_fmt(lat.get('eager_ms_per_token'))} eager"
        )
    big = results.get("big") or {}
    if "output_tok_s" in big:
        lines.append(
            f"  {big['shape']}: {_fmt(big['output_tok_s'], '.1f')} tok/s, "
            f"wall/floor {_fmt(big.get('wall_over_floor'))}"
        )
    kinds = (results.get("engine") or {}).get("by_step_kind") or []
    if kinds:
        lines.append("  by step kind (first timed run; floor per step):")
    for row in kinds:
        lines.append(
            f"    {row['kind']:>14}: {row['steps']:5d} steps, wall {_fmt(row['wall_s'])} s, "
            f"floor {_fmt(row['floor_s'])} s, wall/floor {_fmt(row['wall_over_floor'])}, "
            f"host waited {_fmt(row.get('host_wait_s'))} s"
        )
    errors = [k for k, v in results.items() if isinstance(v, dict) and "error" in v]
    if errors:
        lines.append(f"  FAILED phases: {errors} (see the JSON)")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Entry point of `enginespec bench` and benchmarks/throughput.py. Exit 1 if a phase failed."""
    try:
        args = parse_args(argv)
    except ValueError as e:
        print(f"enginespec bench: {e}", file=sys.stderr)
        return 2
    results = run(args)
    print(report(results))
    if args.out:
        print(f"results: {args.out}")
    return 1 if any(isinstance(v, dict) and "error" in v for v in results.values()) else 0
