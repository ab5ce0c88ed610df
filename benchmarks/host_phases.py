"""Unprofiled host time per engine phase, by kind of step, over the throughput workload.

The torch profiler inflates host time (every aten op is recorded) and hides where a step
waits; this times EngineCore's phases (schedule, prepare, execute, sample, update, resolve,
outputs, plus a CUDA graph's replay inside execute) with perf_counter around the engine's own
spans, bins them like the harness (prefill steps, then decode steps by batch size) and prints
milliseconds per step. `resolve` includes the wait for the previous step's ids: where it is
large the step was bound by the GPU, where it is small by the host.

    python3 benchmarks/host_phases.py [throughput.py flags: --shape, --num-requests, ...]

On the H200 (02c85ed, default workload) it showed the prefill steps bound by the host at
8,192-token chunks and decode steps waiting on the GPU (benchmarks/RESULTS.md, issue 6).

--tail N also prints the run's last N steps one by one (rows; each phase's ms from its prepare to
the next step's schedule), where requests finish. --sync-debug runs the timed generate() under torch's CUDA sync debug mode ("warn") and
prints each place in our code that made the host wait on the device (a D2H copy, .item(), a copy
from pageable memory), with its count: the async engine should make none but its one wait a step
for the previous step's ids (an event wait, which the mode does not report).

--gc counts the cyclic garbage collector's pauses inside the timed generate() (per generation,
and by kind of step), --gc-freeze runs gc.collect() and gc.freeze() before it (vLLM freezes its
startup heap; on the H200 the timed run's pauses were 14.6 ms in all with or without it, thirty-
second session), --profile-finishes PATH writes a cProfile of the `_resolve` calls that settle a
finished request (the tail's slow steps). --alloc-stats prints the CUDA caching allocator's event
counters over the timed run (a retry frees cached blocks through cudaFree, which waits for the
device and which the sync debug mode does not see).

Prefill steps in the workload take about twice the host time of the same step run synced
(twenty-first session: `execute` 35 ms against 18.5-23.5). --prefill-sync waits for the device
before each prefill step's execute (timed apart, as `presync`) and after it (`postsync`: the
device's work still queued once the host has launched the step), so `execute` is timed from an
idle device: a large postsync means the host ran ahead of the device; none, that the host's
launches waited for the device (or that the device was faster).
--profile-prefill PATH writes a cProfile of the prefill steps' executes (which calls hold the
time: the launches, the allocator, the compiled body's Python).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import gc
import io
import pstats
import sys
import time
import traceback
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import engine_runs as runs  # noqa: E402
from benchmarks.step_bins import BATCH_BINS  # noqa: E402
from benchmarks.throughput import parse_args  # noqa: E402
from enginespec.engine import engine_core as core_module  # noqa: E402

BINS = BATCH_BINS


def _instrument(core, acc: dict, state: dict) -> None:
    @contextlib.contextmanager
    def span(name):
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            acc[(state["bin"], name)] += seconds
            state["step"][name] = state["step"].get(name, 0.0) + seconds

    core_module._span = span
    prepare = core.runner.prepare

    def binned_prepare(output, block_manager):
        n = len(output.scheduled)
        state["bin"] = (
            "prefill"
            if output.num_scheduled_tokens > n
            else next((f"<={b}" for b in BINS if n <= b), f">{BINS[-1]}")
        )
        acc[(state["bin"], "steps")] += 1
        state["step"] = {"rows": n}  # its phases from prepare to the next step's schedule
        state["steps"].append(state["step"])
        return prepare(output, block_manager)

    core.runner.prepare = binned_prepare
    graphs = core.runner.graphs
    if graphs is not None:
        replay = graphs.forward

        def timed_replay(batch):
            start = time.perf_counter()
            out = replay(batch)
            seconds = time.perf_counter() - start
            acc[(state["bin"], "graph_forward")] += seconds
            state["step"]["graph_forward"] = seconds
            return out

        graphs.forward = timed_replay


def _own_parser() -> argparse.ArgumentParser:
    """This probe's options; everything else goes to throughput.py's parser."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--tail", type=int, default=0, help="print the run's last N steps one by one")
    own.add_argument("--sync-debug", action="store_true", help="count host waits on the device")
    own.add_argument("--gc", action="store_true", help="count the cyclic GC's pauses by kind of step")
    own.add_argument(
        "--gc-freeze", action="store_true", help="gc.collect() then gc.freeze() before the timed run"
    )
    own.add_argument(
        "--profile-finishes", metavar="PATH", help="cProfile of the resolves that finish a request"
    )
    own.add_argument("--alloc-stats", action="store_true", help="the CUDA caching allocator's counters")
    own.add_argument(
        "--prefill-sync", action="store_true", help="wait for the device before each prefill execute"
    )
    own.add_argument("--profile-prefill", metavar="PATH", help="cProfile of the prefill steps' executes")
    own.add_argument(
        "--torch-profile-prefill",
        metavar="PATH",
        help="torch.profiler table (self CPU) over the run's prefill steps, their first to the first decode's execute",
    )
    return own


def main(argv=None) -> dict:
    own = _own_parser()
    mine, rest = runs.own_args(own, argv)
    if mine.sync_debug and not _cuda_available():
        own.error("--sync-debug needs a CUDA device (torch's sync debug mode watches CUDA calls)")
    args = parse_args(["--skip-hf", "--skip-big"] + rest)
    model_dir = runs.checkpoint(args.shape, args)
    shape = runs.shape_of(model_dir, args)
    workload = runs.workload_for(args, args.num_requests, shape.vocab_size)
    llm = runs.make_llm(model_dir, args)
    runs.warm_up(llm, workload, args.device, args.temperature)
    if mine.gc_freeze:
        gc.collect()
        gc.freeze()
    acc: dict = collections.defaultdict(float)
    state: dict = {"bin": "none", "step": {}, "steps": []}
    run, extras = _timed_run(llm, workload, args, mine, acc, state)
    print(f"wall {run['wall_s']:.3f} s, {run['num_steps']} steps, {run['output_tok_s']:.0f} output tok/s")
    table = per_step_ms(acc)
    for kind, (steps, phases) in table.items():
        cells = ", ".join(f"{k} {v:.2f}" for k, v in sorted(phases.items()))
        print(f"  {kind:>8} {steps:4d} steps, host ms/step: {cells}")
    for step in state["steps"][-mine.tail :] if mine.tail > 0 else []:
        cells = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in sorted(step.items()) if k != "rows")
        print(f"  step of {step['rows']:3d} rows, host ms: {cells}")
    _print_extras(mine, extras)
    return table


def _timed_run(llm, workload, args, mine, acc: dict, state: dict) -> tuple[dict, dict]:
    """The timed generate() with the engine's spans binned into `acc`/`state` and what the
    options ask for watched around it: (the run, {"waits", "pauses", "allocs", "finishes"})."""
    plain_span = core_module._span
    try:
        _instrument(runs.engine_core(llm), acc, state)
        finishes = _profile_finishes(runs.engine_core(llm), mine.profile_finishes)
        prefills = _watch_prefill(runs.engine_core(llm), mine, acc, state)
        _torch_profile_prefill(runs.engine_core(llm), mine.torch_profile_prefill, state)
        before = _alloc_counters() if mine.alloc_stats else {}
        with _host_waits(mine.sync_debug) as waits, _gc_pauses(mine.gc, state) as pauses:
            run = runs.timed_generate(llm, workload, args.device, args.temperature, use_tqdm=False)
        after = _alloc_counters() if mine.alloc_stats else {}
    finally:
        core_module._span = plain_span  # the engine module is shared with whoever imported it
    allocs = {k: after[k] - before.get(k, 0) for k in after}
    return run, {
        "waits": waits,
        "pauses": pauses,
        "allocs": allocs,
        "finishes": finishes,
        "prefills": prefills,
    }


def _print_extras(mine, extras: dict) -> None:
    """What --alloc-stats, --profile-finishes, --gc and --sync-debug found, each if asked."""
    if mine.alloc_stats:
        counts = ", ".join(f"{k} {v}" for k, v in extras["allocs"].items())
        print("  CUDA allocator in generate(): " + (counts or "no CUDA"))
    if extras["finishes"] is not None:
        extras["finishes"].dump(mine.profile_finishes)
    if extras["prefills"] is not None:
        extras["prefills"].dump(mine.profile_prefill, "prefill executes")
    if mine.gc:
        frozen = gc.get_freeze_count()
        print(f"  cyclic GC in generate(), {frozen} objects frozen: " + gc_summary(extras["pauses"]))
    if mine.sync_debug:
        waits = extras["waits"]
        print(f"  host waits on the device in generate(): {sum(waits.values())}")
        for where, count in waits.most_common(12):
            print(f"    {count:6d} x {where}")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def _host_waits(on: bool):
    """With `on`: torch's CUDA sync debug mode set to warn, and each warning counted by the
    innermost frame of ours (enginespec or benchmarks) that made it. Yields the Counter."""
    counts: collections.Counter = collections.Counter()
    if not on:
        yield counts
        return
    import torch

    def record(message, category, filename, lineno, file=None, line=None):
        stack = traceback.extract_stack()[:-1]  # without this function's own frame
        ours = [f for f in stack if "enginespec" in f.filename or "/benchmarks/" in f.filename]
        where = f"{ours[-1].filename}:{ours[-1].lineno}" if ours else f"{filename}:{lineno}"
        counts[f"{where}: {str(message)[:60]}"] += 1

    previous_mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counts
        finally:
            torch.cuda.set_sync_debug_mode(previous_mode)


ALLOC_COUNTERS = (
    "num_alloc_retries",
    "num_device_alloc",
    "num_device_free",
    "num_sync_all_streams",
    "num_ooms",
)


def _alloc_counters() -> dict:
    """The caching allocator's event counters (torch.cuda.memory_stats), {} without CUDA. A
    retry frees cached blocks and calls cudaMalloc again; cudaFree synchronizes the device,
    which torch's sync debug mode does not report."""
    import torch

    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {name: int(stats.get(name, 0)) for name in ALLOC_COUNTERS}


class _Profiled:
    """cProfile over chosen calls (the `_resolve` calls that settle a finished request, the
    tail's outliers; the prefill steps' executes), with their count and wall time."""

    def __init__(self):
        self.profile = cProfile.Profile()
        self.calls, self.seconds = 0, 0.0

    def dump(self, path: str, what: str = "resolves with a finish") -> None:
        text = io.StringIO()
        text.write(f"{self.calls} {what}, {self.seconds * 1e3:.1f} ms in all (profiled)\n")
        pstats.Stats(self.profile, stream=text).sort_stats("cumulative").print_stats(50)
        pstats.Stats(self.profile, stream=text).sort_stats("tottime").print_stats(30)
        with open(path, "w") as f:
            f.write(text.getvalue())
        print(f"  {self.calls} {what} profiled into {path}")


def _profile_finishes(core, path):
    """Wrap core._resolve (an instance attribute shadows the method) when `path` is given."""
    if not path:
        return None
    finishes, resolve = _Profiled(), core._resolve

    def profiled(inflight, changed):
        if inflight is None or inflight.resolved or not inflight.finished:
            return resolve(inflight, changed)
        start = time.perf_counter()
        try:
            return finishes.profile.runcall(resolve, inflight, changed)
        finally:
            finishes.calls += 1
            finishes.seconds += time.perf_counter() - start

    core._resolve = profiled
    return finishes


def _watch_prefill(core, mine, acc: dict, state: dict):
    """Wrap core.runner.execute (an instance attribute shadows the method) for prefill steps
    when --prefill-sync or --profile-prefill asks: the device synced first (its wait timed as
    `presync`, outside `execute`), the call profiled. Returns the profile holder or None."""
    if not (mine.prefill_sync or mine.profile_prefill):
        return None
    sync = _device_sync() if mine.prefill_sync else None
    held, execute = _Profiled(), core.runner.execute

    def watched(batch):
        if state["bin"] != "prefill":
            return execute(batch)
        if sync is not None:
            start = time.perf_counter()
            sync()
            seconds = time.perf_counter() - start
            acc[("prefill", "presync")] += seconds
            state["step"]["presync"] = seconds
        start = time.perf_counter()
        try:
            return held.profile.runcall(execute, batch) if mine.profile_prefill else execute(batch)
        finally:
            held.calls += 1
            held.seconds += time.perf_counter() - start
            if sync is not None:  # the device's work left once the host has launched it all
                start = time.perf_counter()
                sync()
                seconds = time.perf_counter() - start
                acc[("prefill", "postsync")] += seconds
                state["step"]["postsync"] = seconds

    core.runner.execute = watched
    return held if mine.profile_prefill else None


def _torch_profile_prefill(core, path, state: dict) -> None:
    """With `path`: torch.profiler (CPU, and CUDA where there is) from the first prefill step's
    execute to the first decode step's execute, so every phase of the prefill steps in the
    workload's own context is in it (an isolated step is prefill_profile.py's); its ops by self
    CPU time are written to `path` when it stops."""
    if not path:
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof, execute = profile(activities=activities), core.runner.execute
    phase = {"on": False, "done": False}

    def watched(batch):
        if state["bin"] == "prefill" and not phase["done"] and not phase["on"]:
            prof.start()
            phase["on"] = True
        elif state["bin"] != "prefill" and phase["on"]:
            prof.stop()
            phase["on"], phase["done"] = False, True
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=45)
            with open(path, "w") as f:
                f.write(table)
            print(f"  prefill steps torch-profiled into {path}")
        return execute(batch)

    core.runner.execute = watched


def _device_sync():
    """torch.cuda.synchronize where there is CUDA, else None (nothing runs ahead on the CPU)."""
    import torch

    return torch.cuda.synchronize if torch.cuda.is_available() else None


@contextlib.contextmanager
def _gc_pauses(on: bool, state: dict):
    """With `on`: every cyclic-GC collection while the block runs, as (generation, seconds, the
    kind of step it fell in) through gc.callbacks. Yields the list."""
    pauses: list = []
    if not on:
        yield pauses
        return
    started: list = []

    def record(phase, info):
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append((info["generation"], time.perf_counter() - started.pop(), state["bin"]))

    gc.callbacks.append(record)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(record)


def gc_summary(pauses: list) -> str:
    """'gen0 N x, T ms (max M); ...' per generation, then the bins that held pauses."""
    by_gen: dict = collections.defaultdict(list)
    by_bin: dict = collections.defaultdict(float)
    for generation, seconds, kind in pauses:
        by_gen[generation].append(seconds)
        by_bin[kind] += seconds
    gens = "; ".join(
        f"gen{g} {len(v)} x, {sum(v) * 1e3:.1f} ms (max {max(v) * 1e3:.2f})"
        for g, v in sorted(by_gen.items())
    )
    bins = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(by_bin.items(), key=lambda kv: -kv[1]))
    return f"{gens or 'none'}; ms by kind of step: {bins or '-'}"


def per_step_ms(acc: dict) -> dict:
    """{kind: (steps, {phase: ms per step})} in bin order, from the accumulated seconds."""
    rows: dict = collections.defaultdict(dict)
    for (kind, name), seconds in acc.items():
        rows[kind][name] = seconds
    table = {}
    for kind in ["prefill"] + [f"<={b}" for b in BINS] + [f">{BINS[-1]}"]:
        if kind in rows:
            for wait in ("presync", "postsync"):  # --prefill-sync's waits ran inside execute's span
                rows[kind]["execute"] -= rows[kind].get(wait, 0.0)
            steps = int(rows[kind].pop("steps"))
            table[kind] = (steps, {k: v / steps * 1e3 for k, v in rows[kind].items()})
    return table


if __name__ == "__main__":
    main()
