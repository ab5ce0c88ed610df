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
"""

from __future__ import annotations

import collections
import contextlib
import sys
import time

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
            acc[(state["bin"], name)] += time.perf_counter() - start

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
        return prepare(output, block_manager)

    core.runner.prepare = binned_prepare
    graphs = core.runner.graphs
    if graphs is not None:
        replay = graphs.forward

        def timed_replay(batch):
            start = time.perf_counter()
            out = replay(batch)
            acc[(state["bin"], "graph_forward")] += time.perf_counter() - start
            return out

        graphs.forward = timed_replay


def main(argv=None) -> dict:
    args = parse_args(["--skip-hf", "--skip-big"] + list(sys.argv[1:] if argv is None else argv))
    model_dir = runs.checkpoint(args.shape, args)
    shape = runs.shape_of(model_dir, args.dtype)
    workload = runs.workload_for(args, args.num_requests, shape.vocab_size)
    llm = runs.make_llm(model_dir, args)
    runs.warm_up(llm, workload, args.device, args.temperature)
    acc: dict = collections.defaultdict(float)
    plain_span = core_module._span
    try:
        _instrument(runs.engine_core(llm), acc, {"bin": "none"})
        run = runs.timed_generate(llm, workload, args.device, args.temperature, use_tqdm=False)
    finally:
        core_module._span = plain_span  # the engine module is shared with whoever imported it
    print(f"wall {run['wall_s']:.3f} s, {run['num_steps']} steps, {run['output_tok_s']:.0f} output tok/s")
    table = per_step_ms(acc)
    for kind, (steps, phases) in table.items():
        cells = ", ".join(f"{k} {v:.2f}" for k, v in sorted(phases.items()))
        print(f"  {kind:>8} {steps:4d} steps, host ms/step: {cells}")
    return table


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
