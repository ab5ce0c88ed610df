"""Where one steady decode step's time goes, host and GPU side by side, without the profiler.

decode_sweep.py gives a step's wall time; this says who sets it. For `--batch` requests in
decode it times, per step, with perf_counter: the whole EngineCore.step(), each engine phase
(schedule, prepare, execute, sample, update, resolve, detokenize), and inside them the CUDA
graph's load + replay, the logits GEMM, and the wait for the previous step's ids. (The fast
impl's staging buffer also waits for its last copy, in prepare: 6-12 us a step in every H200 run
of 2026-12-01; benchmarks may not import an impl, so that timer is gone.) On the GPU, CUDA events on the stream around
execute and sample give the device time from the step's first launch to its sampler's end.
If the host's own time (step minus the waits) is above the GPU's, the host sets the pace.

    python3 benchmarks/step_anatomy.py --batch 1 --out $OUT/anatomy.json [--trace $OUT/trace.json.gz]

--trace also writes a torch.profiler Chrome trace of a few steps (gzip), for the timeline;
--cprofile the host's top functions (cProfile, which slows the host: use its ranking, not its times).
CPU smoke: --shape tiny --device cpu --steps 5
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gzip
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import roofline as rl  # noqa: E402
from benchmarks.decode_profile import step_until_steady  # noqa: E402
from benchmarks.engine_runs import add_model_args, checkpoint, engine_core, make_llm, shape_of, sync  # noqa: E402
from enginespec.engine import async_scheduling  # noqa: E402
from enginespec.engine import engine_core as core_module  # noqa: E402
from enginespec.spec import SamplingParams  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/step_anatomy.py", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE", help="JSON values")
    p.add_argument(
        "--trace", help="also write a profiler Chrome trace of 8 steps here (.json.gz; taken last)"
    )
    p.add_argument("--cprofile", help="also write cProfile's top host functions over the steps here (text)")
    p.add_argument(
        "--generate-tokens",
        type=int,
        default=0,
        help="also batch-1 ms/token through LLM.generate on the same LLM (decode_sweep's measure)",
    )
    p.add_argument("--git-commit")
    p.add_argument("--out")
    return p


class Timers:
    """Seconds per step by name; `step` starts a new step's row."""

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, name: str, seconds: float) -> None:
        if self.rows:
            row = self.rows[-1]
            row[name] = row.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def time(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)


def _wrap(obj, attr: str, timers: Timers, name: str, undo: list) -> None:
    inner = getattr(obj, attr)
    undo.append((obj, attr, obj.__dict__.get(attr)))

    def timed(*a, **k):
        with timers.time(name):
            return inner(*a, **k)

    setattr(obj, attr, timed)


@contextlib.contextmanager
def instrument(core, timers: Timers, cuda: bool):
    """Within the block, the engine's spans and a few inner calls time into `timers` (module
    doc); yields the list that collects (start, end) CUDA events per step. Everything patched
    (the engine module's span, a class method, this engine's objects) is put back after."""
    undo: list = [(core_module, "_span", core_module._span)]
    core_module._span = timers.time
    runner = core.runner
    if getattr(runner, "graphs", None) is not None:
        _wrap(runner.graphs, "forward", timers, "graph_load_replay", undo)
    _wrap(runner.model, "compute_logits", timers, "logits_gemm", undo)
    _wrap(async_scheduling.InFlight, "_read", timers, "ids_wait_read", undo)
    try:
        yield mark_gpu_steps(core) if cuda else []
    finally:
        if cuda:
            unmark_gpu_steps(core)
        for obj, attr, old in reversed(undo):
            if old is None:
                delattr(obj, attr)  # an instance attribute set over its class's method
            else:
                setattr(obj, attr, old)


def mark_gpu_steps(core) -> list:
    """Record a CUDA event on the stream as each step's execute starts and another after its
    sampler's launches (patching this engine's runner.execute and sampler.sample_deferred);
    returns the list of [start, end] pairs it fills. unmark_gpu_steps(core) undoes it."""
    runner, sampler = core.runner, core.sampler
    execute, sample_deferred = runner.execute, sampler.sample_deferred
    events: list = []

    def marked_execute(batch):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        events.append([start, None])
        return execute(batch)

    def marked_sample(*a, **k):
        out = sample_deferred(*a, **k)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        if events:
            events[-1][1] = end
        return out

    runner.execute, sampler.sample_deferred = marked_execute, marked_sample
    return events


def unmark_gpu_steps(core) -> None:
    for obj, name in ((core.runner, "execute"), (core.sampler, "sample_deferred")):
        obj.__dict__.pop(name, None)  # the instance attribute mark_gpu_steps set: the method again


def graph_replay_ms(core, num_rows: int, reps: int = 20) -> Optional[float]:
    """Device milliseconds of the decode CUDA graph that `num_rows` rows replay, replayed `reps`
    times back to back on an idle GPU (its static inputs as the last step left them: the same
    K/V rewritten to the same slots). The decoder's own GPU time, free of the host's pace,
    which the event marks above are not: a GPU that waits for the host's launches waits
    between and inside those marks too. The graph the last step replayed when it was this
    bucket's (a bucket's balanced twin for spread contexts), else the bucket's plain one. None
    without CUDA graphs."""
    graphs = getattr(core.runner, "graphs", None)
    bucket = graphs.bucket_for(num_rows) if graphs is not None else None
    if bucket is None or bucket not in graphs.graphs:
        return None
    twins = (graphs.graphs[bucket], graphs.balanced_graphs.get(bucket))
    last = getattr(graphs, "last_graph", None)
    graph = last if last is not None and any(last is g for g in twins) else graphs.graphs[bucket]
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def gpu_ms(events: list) -> dict:
    """Median GPU milliseconds per step from mark_gpu_steps' events (call after a sync):
    from execute's start to the sampler's end, and between consecutive steps' starts. Both
    include the GPU's waits for the host's launches; only the host's wait for the previous
    step's ids (ids_wait_read near zero) says that the host set the pace."""
    done = [(s, e) for s, e in events if e is not None]
    if len(done) < 2:
        return {}
    starts = [s for s, _ in done]
    return {
        "gpu_execute_to_sampled": statistics.median(s.elapsed_time(e) for s, e in done),
        "gpu_step_period": statistics.median(a.elapsed_time(b) for a, b in zip(starts, starts[1:])),
    }


def summarize(timers: Timers, events: list) -> dict:
    """Median milliseconds per step of every timed name, and the GPU's per-step times."""
    names = sorted({k for r in timers.rows for k in r})
    out = {n: statistics.median(r.get(n, 0.0) for r in timers.rows) * 1e3 for n in names}
    out.update(gpu_ms(events))
    waits = ("ids_wait_read",)
    out["host_own"] = out["step"] - sum(out.get(w, 0.0) for w in waits)
    return out


def run(args) -> dict:
    from benchmarks.report import environment

    cuda = torch.device(args.device).type == "cuda"
    model_dir = checkpoint(args.shape, args)
    args.engine_args.setdefault("max_num_seqs", args.batch)  # --engine-arg max_num_seqs=256: the LLM default
    llm = make_llm(model_dir, args)
    core = engine_core(llm)
    params = SamplingParams(
        max_tokens=2 * args.steps + 160, temperature=args.temperature, ignore_eos=True, seed=args.seed
    )
    for i in range(args.batch):
        ids = [(7 * i + j) % (core.vocab_size - 1) + 1 for j in range(args.prompt_len)]
        core.add_request(f"anatomy{i}", ids, params)
    step_until_steady(core, args.batch, 64)
    for _ in range(5):
        core.step(final_only=True)
    timers = Timers()
    with instrument(core, timers, cuda) as events:
        sync(args.device)
        for _ in range(args.steps):
            timers.rows.append({})
            with timers.time("step"):
                core.step(final_only=True)
        sync(args.device)
    if args.cprofile:  # a second pass: cProfile slows the host, so the timed pass runs without it
        write_cprofile(core, args.steps, args.cprofile)
    result = {
        "config": vars(args),
        "env": environment(args),
        "startup_phases": getattr(core.stats, "startup_phases", None),
        "ms_per_step": summarize(timers, events),
    }
    if cuda:
        result["graph_replay_ms"] = graph_replay_ms(core, args.batch)
    if cuda:  # one read of the weights at the copy bandwidth measured now (decode_sweep's floor)
        rate = rl.measure_copy_bandwidth(args.device, 1 << 30, iters=10)
        result["weight_floor_ms"] = shape_of(model_dir, args).weight_bytes_per_step / rate * 1e3
    if args.generate_tokens:
        from benchmarks.phases import decode_latency

        core.abort([f"anatomy{i}" for i in range(args.batch)])
        while core.has_unfinished:
            core.step()
        vocab = core.vocab_size
        prompt = [(3 * j) % (vocab - 1) + 1 for j in range(args.prompt_len)]
        result["generate_batch1_ms_per_token"] = decode_latency(
            llm, prompt, args.generate_tokens, args.device
        )
    if args.trace:  # last: a profiler leaves instrumentation behind that slows what follows it
        result["trace"] = write_trace(core, args.trace, args.prompt_len, params)
    return result


def write_cprofile(core, steps: int, path: str) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        core.step(final_only=True)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
    text.write("\n\n")
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
    Path(path).write_text(text.getvalue())


def write_trace(core, path: str, prompt_len: int, params: SamplingParams) -> str:
    """A Chrome trace (torch.profiler, CPU and, where there is one, CUDA) of 8 steady decode
    steps of one fresh request, which is then aborted: call it last, since the profiler's
    instrumentation outlives it and inflates what is timed after."""
    from torch.profiler import ProfilerActivity, profile

    ids = [(5 * j) % (core.vocab_size - 1) + 1 for j in range(prompt_len)]
    core.add_request("anatomy-trace", ids, params)
    step_until_steady(core, 1, 64)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(8):
            core.step(final_only=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    core.abort(["anatomy-trace"])
    while core.has_unfinished:
        core.step()
    raw = Path(path).with_suffix("").with_suffix(".json") if path.endswith(".gz") else Path(path)
    prof.export_chrome_trace(str(raw))
    if path.endswith(".gz"):
        with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
            dst.write(src.read())
        raw.unlink()
    return path


def main(argv=None) -> int:
    from enginespec.engine_args import resolve_device

    args = build_parser().parse_args(argv)
    args.device = str(resolve_device(args.device))
    if args.dtype == "auto":
        args.dtype = "bfloat16" if torch.device(args.device).type == "cuda" else "float32"
    args.engine_args = {k: json.loads(v) for k, v in (a.split("=", 1) for a in args.engine_arg)}
    result = run(args)
    cells = ", ".join(f"{k} {v:.3f}" for k, v in sorted(result["ms_per_step"].items()))
    print(f"batch {args.batch}: ms/step (medians): {cells}")
    if result.get("graph_replay_ms") is not None:
        print(f"decode graph alone, replayed back to back: {result['graph_replay_ms']:.3f} ms")
    if "weight_floor_ms" in result:
        print(f"weight floor {result['weight_floor_ms']:.3f} ms")
    if "generate_batch1_ms_per_token" in result:
        print(f"batch 1 via LLM.generate: {result['generate_batch1_ms_per_token']:.3f} ms/token")
    print(f"startup phases: {result['startup_phases']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
