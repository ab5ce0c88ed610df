"""A seeded soak of the engine through an impl: many requests, random aborts, injected faults,
preemption (recompute and swap), several tenants, async scheduling on and off.

Every greedy output is checked against an unpressured run (a big pool, no faults, serial) of
the same prompt: a request that finished normally must equal it token for token; one that was
aborted or failed must be a prefix of it. At the end of each configuration every block must be
free. `benchmarks/soak.py` runs it at full size and prints the figures; the `slow` conformance
test runs it smaller.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import VOCAB_SIZE, tiny_model_dir

TENANTS = ["tenant-a", "tenant-b", "tenant-c", "tenant-d"]


@dataclass
class SoakFigures:
    requests: int = 0
    faults_injected: int = 0
    failed_requests: int = 0
    aborts: int = 0
    preemptions: int = 0
    wall_s: float = 0.0
    blocks_leaked: int = 0
    wrong_tokens: int = 0
    configs: list = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"requests:         {self.requests}",
            f"faults injected:  {self.faults_injected} (requests failed by them: {self.failed_requests})",
            f"aborts:           {self.aborts}",
            f"preemptions:      {self.preemptions}",
            f"wall time:        {self.wall_s:.1f} s",
            f"blocks leaked:    {self.blocks_leaked}",
            f"wrong tokens:     {self.wrong_tokens}",
            "configs:          " + ", ".join(self.configs),
        ]


def _engine(impl, **kwargs):
    from enginespec.llm import LLM

    args = dict(dtype="float32", device="cpu", block_size=4, max_model_len=64, max_num_seqs=12)
    return LLM(str(tiny_model_dir("qwen3")), impl=impl, **{**args, **kwargs}).engine


def _prompts(rng: random.Random, num: int) -> list[list[int]]:
    """Prompts sharing a few system prefixes (so prefix caching and tenants matter)."""
    systems = [[rng.randrange(4, VOCAB_SIZE) for _ in range(8)] for _ in range(4)]
    return [
        rng.choice(systems) + [rng.randrange(4, VOCAB_SIZE) for _ in range(rng.randrange(1, 9))]
        for _ in range(num)
    ]


def unpressured(impl, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    engine = _engine(impl, num_blocks=512, max_num_seqs=32, async_scheduling=False)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    finals = {}
    while engine.has_unfinished:
        finals.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    return [finals[str(i)] for i in range(len(prompts))]


class _Faults:
    def __init__(self, rng: random.Random, rate: float):
        self.rng, self.rate, self.count = rng, rate, 0

    def __call__(self, phase: str) -> None:
        if self.rng.random() < self.rate:
            self.count += 1
            raise RuntimeError(f"soak fault at {phase}")


def _check(out, expected: list[int], figures: SoakFigures) -> None:
    """Count wrong tokens: positions that differ from the unpressured run, plus missing or
    extra ones for a request that finished normally (an aborted or failed one may be short)."""
    c = out.outputs[0]
    figures.wrong_tokens += sum(1 for a, b in zip(c.token_ids, expected) if a != b)
    figures.wrong_tokens += max(0, len(c.token_ids) - len(expected))
    if c.finish_reason not in ("abort", "error"):
        figures.wrong_tokens += max(0, len(expected) - len(c.token_ids))
    figures.failed_requests += c.finish_reason == "error"


def soak_config(
    impl, figures: SoakFigures, prompts, expected, *, num_requests: int, seed: int, **engine_args
):
    """One configuration: num_requests requests drawn from `prompts`, a small pool, faults and
    aborts at random. Adds its figures to `figures`."""
    rng = random.Random(seed)
    engine = _engine(impl, num_blocks=24, **engine_args)
    faults = engine.fault_hook = _Faults(rng, 0.002)
    live: dict[str, tuple[int, int]] = {}
    added = 0
    while added < num_requests or engine.has_unfinished:
        while added < num_requests and len(live) < 24:
            k, m = rng.randrange(len(prompts)), rng.randrange(2, 13)
            rid = f"{seed}-{added}"
            salt = rng.choice(TENANTS)
            engine.add_request(
                rid,
                prompts[k],
                SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True),
                cache_key=("cache_salt", salt),
            )
            live[rid] = (k, m)
            added += 1
        if live and rng.random() < 0.02:
            engine.abort(rng.choice(sorted(live)))
            figures.aborts += 1
        for out in engine.step():
            if out.finished:
                k, m = live.pop(out.request_id)
                _check(out, expected[k][:m], figures)
    state = engine.block_manager.state()
    figures.blocks_leaked += engine.runner.num_blocks - len(state.free_queue) + len(state.tables)
    figures.requests += num_requests
    figures.faults_injected += faults.count
    figures.preemptions += engine.stats.num_preemptions


def run_soak(impl, num_requests: int = 10_000, seed: int = 0) -> SoakFigures:
    """The soak over four configurations (recompute / swap when the impl can, async on / off),
    num_requests in all."""
    start = time.perf_counter()
    rng = random.Random(seed)
    prompts = _prompts(rng, 64)
    expected = unpressured(impl, prompts, 12)
    modes = ["recompute", "swap"] if "swap" in getattr(impl, "capabilities", ()) else ["recompute"]
    configs = [(mode, a) for mode in modes for a in (False, True)]
    figures = SoakFigures()
    for i, (mode, async_scheduling) in enumerate(configs):
        share = num_requests // len(configs) + (i < num_requests % len(configs))
        soak_config(
            impl,
            figures,
            prompts,
            expected,
            num_requests=share,
            seed=seed * 100 + i,
            preemption_mode=mode,
            async_scheduling=async_scheduling,
        )
        figures.configs.append(f"{mode}/{'async' if async_scheduling else 'serial'}")
    figures.wall_s = time.perf_counter() - start
    return figures
