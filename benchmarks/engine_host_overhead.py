"""Host time of one engine step outside the model, with 256 running decodes, on any machine.

On the GPU the engine is host-bound (benchmarks/RESULTS.md, "End-to-end throughput"): what
counts is the Python around the forward (schedule, batch building, sampling, update, outputs).
This times `EngineCore.step()` minus `ModelRunner.execute()` on a tiny random Qwen3 checkpoint
(conformance/models.py), for each impl and for generate()'s final-only outputs vs streaming's
per-step outputs.

    python benchmarks/engine_host_overhead.py [--impls reference fast] [--steps 40]
    python benchmarks/engine_host_overhead.py --impls fast --speculative-config \
        '{"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'

With --speculative-config, each case also runs with speculation on (the drafter, verification on
the host and the trims count as host time; the wider forward does not).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time

import torch

from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir, use_cache_root


def host_ms_per_step(impl: str, final_only: bool, num_requests: int, steps: int, spec=None) -> float:
    llm = LLM(
        str(tiny_model_dir("qwen3")),
        impl=impl,
        dtype="float32",
        device="cpu",
        block_size=16,
        num_blocks=num_requests * 16,
        max_model_len=256,
        max_num_seqs=num_requests,
        speculative_config=spec,
    )
    engine = llm.engine
    rng = random.Random(0)
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    for i in range(num_requests):
        engine.add_request(f"r{i}", [rng.randrange(1, 90) for _ in range(20)], params)
    in_model = 0.0
    execute = engine.runner.execute

    def timed_execute(batch):
        nonlocal in_model
        t = time.perf_counter()
        out = execute(batch)
        in_model += time.perf_counter() - t
        return out

    engine.runner.execute = timed_execute
    for _ in range(8):  # admit and prefill everyone; then every step is num_requests decodes
        engine.step(final_only)
    gc.collect()  # garbage of earlier engines in this process is not this step's cost
    in_model, start = 0.0, time.perf_counter()
    for _ in range(steps):
        engine.step(final_only)
    return (time.perf_counter() - start - in_model) / steps * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impls", nargs="+", default=["reference", "fast"])
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--speculative-config", type=json.loads, default=None, help="JSON, vLLM's names")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="enginespec-host-") as tmp:
        use_cache_root(tmp)  # the tiny checkpoint goes away with the run
        _report(args)
    return 0


def _report(args) -> None:
    host_ms_per_step(args.impls[0], False, 8, 4)  # first-engine costs (imports, caches) land here
    specs = [None] if args.speculative_config is None else [None, args.speculative_config]
    print(f"{'impl':<10} {'outputs':<10} {'spec':<5} host ms/step ({args.num_requests} decodes)")
    for impl in args.impls:
        for final_only in (False, True):
            for spec in specs:
                ms = host_ms_per_step(impl, final_only, args.num_requests, args.steps, spec)
                on = "off" if spec is None else "on"
                print(f"{impl:<10} {'final' if final_only else 'per-step':<10} {on:<5} {ms:8.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
