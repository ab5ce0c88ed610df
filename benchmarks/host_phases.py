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

from impls.engine import bench
from impls.engine import engine_core as core_module

BINS = bench.BATCH_BINS


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
        state["bin"] = ("prefill" if output.num_scheduled_tokens > n
                        else next((f"<={b}" for b in BINS if n <= b), f">{BINS[-1]}"))
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


def main(argv=None) -> None:
    args = bench.parse_args(["--skip-hf", "--skip-big"] + list(sys.argv[1:] if argv is None else argv))
    model_dir = bench._checkpoint(args.shape, args)
    shape = bench._shape_of(model_dir, args.dtype)
    workload = bench._workload(args, args.num_requests, shape.vocab_size)
    llm = bench.make_llm(model_dir, args)
    bench._warm_up(llm, workload, args.device, args.temperature)
    acc: dict = collections.defaultdict(float)
    _instrument(bench.engine_core(llm), acc, {"bin": "none"})
    run = bench.timed_generate(llm, workload, args.device, args.temperature, use_tqdm=False)
    print(f"wall {run['wall_s']:.3f} s, {run['num_steps']} steps, {run['output_tok_s']:.0f} output tok/s")
    rows: dict = collections.defaultdict(dict)
    for (kind, name), seconds in acc.items():
        rows[kind][name] = seconds
    for kind in ["prefill"] + [f"<={b}" for b in BINS] + [f">{BINS[-1]}"]:
        if kind in rows:
            steps = rows[kind].pop("steps")
            phases = ", ".join(f"{k} {v / steps * 1e3:.2f}" for k, v in sorted(rows[kind].items()))
            print(f"  {kind:>8} {int(steps):4d} steps, host ms/step: {phases}")


if __name__ == "__main__":
    main()
