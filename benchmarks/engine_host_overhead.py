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
import sys
import tempfile
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cli_types import at_least_one  # noqa: E402
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import cache_root, make_checkpoint, tiny_model_dir, use_cache_root

PROMPT_LEN = 20
WARM_STEPS = 8  # admit and prefill everyone; then every step is num_requests decodes
MIN_OUTPUT_LEN = 200  # what every request asked for before output lengths followed --steps


def output_len(steps: int, spec=None) -> int:
    """max_tokens of each request: no request may finish inside the warm-up or the timed steps,
    even with every draft accepted (1 + num_speculative_tokens tokens a step), since an idle
    step costs almost nothing and averaging it in understates the figure. At least
    MIN_OUTPUT_LEN, so short runs keep the shape their recorded figures were taken with."""
    per_step = 1 + int((spec or {}).get("num_speculative_tokens", 0))
    return max(MIN_OUTPUT_LEN, (WARM_STEPS + steps) * per_step + 1)


def host_ms_per_step(impl: str, final_only: bool, num_requests: int, steps: int, spec=None) -> float:
    """Host ms of one step with num_requests running decodes: the steps' wall time less the
    model's (ModelRunner.execute). RuntimeError if a request was not decoding throughout."""
    max_tokens = output_len(steps, spec)
    max_model_len = max(256, PROMPT_LEN + max_tokens)
    llm = LLM(
        str(_model_dir(max_model_len)),
        impl=impl,
        dtype="float32",
        device="cpu",
        block_size=16,
        num_blocks=num_requests * -(-max_model_len // 16),
        max_model_len=max_model_len,
        max_num_seqs=num_requests,
        speculative_config=spec,
    )
    engine = llm.engine
    rng = random.Random(0)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(num_requests):
        engine.add_request(f"r{i}", [rng.randrange(1, 90) for _ in range(PROMPT_LEN)], params)
    in_model = 0.0
    execute = engine.runner.execute

    def timed_execute(batch):
        nonlocal in_model
        t = time.perf_counter()
        out = execute(batch)
        in_model += time.perf_counter() - t
        return out

    engine.runner.execute = timed_execute
    for _ in range(WARM_STEPS):
        engine.step(final_only)
    _check_all_decoding(engine, num_requests, "after the warm-up")
    gc.collect()  # garbage of earlier engines in this process is not this step's cost
    in_model, start = 0.0, time.perf_counter()
    for _ in range(steps):
        engine.step(final_only)
    seconds = time.perf_counter() - start - in_model
    _check_all_decoding(engine, num_requests, "after the timed steps")
    return seconds / steps * 1e3


def _model_dir(max_model_len: int):
    """The tiny Qwen3 checkpoint (256 positions), or the same family written with room for
    max_model_len positions beside it when the requests are longer."""
    if max_model_len <= 256:
        return tiny_model_dir("qwen3")
    path = cache_root() / f"qwen3-{max_model_len}-positions"
    return (
        path
        if (path / "config.json").exists()
        else make_checkpoint("qwen3", path, max_position_embeddings=max_model_len)
    )


def _check_all_decoding(engine, num_requests: int, when: str) -> None:
    """Every request is running with its whole prompt computed (none waiting, none finished)."""
    running = engine.scheduler.running
    prefilled = sum(r.num_computed_tokens >= PROMPT_LEN for r in running)
    if engine.num_unfinished != num_requests or prefilled != num_requests:
        raise RuntimeError(
            f"{when}: {prefilled} of {num_requests} requests decoding "
            f"({engine.num_unfinished} unfinished), so the steps would not time {num_requests} decodes"
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--impls", nargs="+", default=["reference", "fast"], help="impls to time, in order (default both)"
    )
    p.add_argument(
        "--num-requests",
        type=at_least_one,
        default=256,
        help="running decodes in every timed step (default 256)",
    )
    p.add_argument(
        "--steps",
        type=at_least_one,
        default=40,
        help="timed steps per case, after 8 warm-up steps (default 40)",
    )
    p.add_argument(
        "--speculative-config",
        type=json.loads,
        default=None,
        help="JSON, vLLM's names: also time each case with speculation on",
    )
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
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
