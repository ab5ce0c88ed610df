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
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import time
import traceback
import warnings

from benchmarks import engine_runs as runs
from benchmarks.step_bins import BATCH_BINS
from benchmarks.throughput import parse_args
from enginespec.engine import engine_core as core_module

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


def main(argv=None) -> dict:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--tail", type=int, default=0, help="print the run's last N steps one by one")
    own.add_argument("--sync-debug", action="store_true", help="count host waits on the device")
    mine, rest = own.parse_known_args(sys.argv[1:] if argv is None else argv)
    tail, sync_debug = mine.tail, mine.sync_debug
    if sync_debug and not _cuda_available():
        own.error("--sync-debug needs a CUDA device (torch's sync debug mode watches CUDA calls)")
    args = parse_args(["--skip-hf", "--skip-big"] + rest)
    model_dir = runs.checkpoint(args.shape, args)
    shape = runs.shape_of(model_dir, args.dtype)
    workload = runs.workload_for(args, args.num_requests, shape.vocab_size)
    llm = runs.make_llm(model_dir, args)
    runs.warm_up(llm, workload, args.device, args.temperature)
    acc: dict = collections.defaultdict(float)
    state: dict = {"bin": "none", "step": {}, "steps": []}
    plain_span = core_module._span
    try:
        _instrument(runs.engine_core(llm), acc, state)
        with _host_waits(sync_debug) as waits:
            run = runs.timed_generate(llm, workload, args.device, args.temperature, use_tqdm=False)
    finally:
        core_module._span = plain_span  # the engine module is shared with whoever imported it
    print(f"wall {run['wall_s']:.3f} s, {run['num_steps']} steps, {run['output_tok_s']:.0f} output tok/s")
    table = per_step_ms(acc)
    for kind, (steps, phases) in table.items():
        cells = ", ".join(f"{k} {v:.2f}" for k, v in sorted(phases.items()))
        print(f"  {kind:>8} {steps:4d} steps, host ms/step: {cells}")
    for step in state["steps"][-tail:] if tail > 0 else []:
        cells = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in sorted(step.items()) if k != "rows")
        print(f"  step of {step['rows']:3d} rows, host ms: {cells}")
    if sync_debug:
        print(f"  host waits on the device in generate(): {sum(waits.values())}")
        for where, count in waits.most_common(12):
            print(f"    {count:6d} x {where}")
    return table


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


def per_step_ms(acc: dict) -> dict:
    """{kind: (steps, {phase: ms per step})} in bin order, from the accumulated seconds."""
    rows: dict = collections.defaultdict(dict)
    for (kind, name), seconds in acc.items():
        rows[kind][name] = seconds
    table = {}
    for kind in ["prefill"] + [f"<={b}" for b in BINS] + [f">{BINS[-1]}"]:
        if kind in rows:
            steps = int(rows[kind].pop("steps"))
            table[kind] = (steps, {k: v / steps * 1e3 for k, v in rows[kind].items()})
    return table


if __name__ == "__main__":
    main()
