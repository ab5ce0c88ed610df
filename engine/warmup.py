"""Warm-up at construction: the engine a user gets back from LLM(...) is already warm.

Without it the first generate() pays what later calls do not: dynamo's compile of prefill
shapes the profile run did not meet (or all of them when num_gpu_blocks_override skips the
profile run), the Triton JIT of the attention kernels' prefill variants and of the sampler's
kernels (the draw, penalties, the top-p bisection), cuBLAS/cuDNN heuristics, pinned-memory
pools. CUDA-graph capture of every decode bucket already happens in ModelRunner's
construction. `warm_up` then drives throwaway requests through the engine's own step(), so
every path the real traffic takes runs once: prefill chunks of several sizes (the dynamic
token dimension settles), mixed prefill + decode steps, graph-replayed decodes, and one row
of each sampler setting (greedy, temperature, top-k/top-p, top-p alone, min-p, penalties,
bias, allowed ids, min_tokens, logprobs), through the async path as real steps take it, and
last batches with no edited row (the fused draw's model-dtype variant) and with a loose top-p
(the wide cut), edited and not (`LATER_BATCHES`). Before the first request, every sampler
kernel variant those batches meet is compiled side by side (compile-only launches on a thread
pool, sample/precompile.py), not one after another as the batches meet them.

Invariant: nothing of the warm-up remains visible: its requests finish, the prefix cache is
reset (their blocks are free and unhashed), EngineStats start from zero (startup figures
aside), and the sampler's generator is re-seeded as constructed, as is speculative decoding
(SpecDecoder.reset: its verifier's generator and its adaptive drafting's step clock), so seeded
and unseeded outputs are those of an engine that never warmed up. On the CPU it is off by
default (EngineArgs.warmup None = on for CUDA); forced on, it is tiny (short prompts, two tokens
each), so tests stay fast.

Compile caches persist across processes by default: inductor's FX-graph and autotune caches
(TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_<user>) and Triton's kernel cache
(TRITON_CACHE_DIR, default ~/.triton/cache). A second start in a new process loads compiled
artefacts instead of compiling; what it still pays is dynamo tracing and the graph capture.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import torch

from enginespec.spec import SamplingParams

log = logging.getLogger(__name__)


def sampler_settings(vocab: int, max_logprobs: int = 5) -> tuple:
    """One SamplingParams setting per sampler path (ids kept below the vocabulary, logprobs
    within the engine's max_logprobs)."""
    return (
        dict(temperature=0.0),
        dict(temperature=0.6),
        dict(temperature=0.7, top_p=0.8, top_k=20),
        dict(temperature=0.8, min_p=0.05, seed=0),
        dict(temperature=0.7, repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1),
        dict(
            temperature=0.0,
            logit_bias={0: -1.0},
            allowed_token_ids=tuple(range(1, min(64, vocab))),
            min_tokens=2,
        ),
        dict(temperature=0.7, logprobs=min(5, vocab, max_logprobs)),
    )


# The warm-up batches after the first: random rows with and without cuts and no edits (the
# fused draw reads the model-dtype logits, another compiled variant), then a loose top-p (no
# top-k, no min-p: the draw's wide cut, or with SPREAD_CUT its spread cut's launches) with and
# without an edited row.
# A batch's kernels depend on all its rows, so each variant needs a batch of its own.
LATER_BATCHES = (
    (dict(temperature=0.6, ignore_eos=True), dict(temperature=0.7, top_p=0.8, top_k=20, ignore_eos=True)),
    (
        dict(temperature=1.0, top_p=0.9, ignore_eos=True),
        dict(temperature=0.7, presence_penalty=0.1, ignore_eos=True),
    ),
    (dict(temperature=1.0, top_p=0.9, ignore_eos=True),),
)


@dataclass
class WarmupReport:
    """What warm_up did: requests and steps run, prefill sizes met, seconds taken (all of it,
    and of those the sampler's compile-only launches before the first request)."""

    num_requests: int
    num_steps: int
    prefill_lengths: list
    seconds: float
    precompile_seconds: float = 0.0

    def line(self) -> str:
        return (
            f"warm-up: {self.num_requests} requests, {self.num_steps} steps (prefill lengths "
            f"{self.prefill_lengths}, decode graphs, every sampler setting) "
            f"in {self.seconds:.1f} s, of which {self.precompile_seconds:.1f} s compiling the sampler"
        )


def _prompt_lengths(engine, tiny: bool) -> list[int]:
    """Prompt lengths that make prefill chunks of several sizes: the largest chunk the budget
    allows, a middle one and small ones, each fitting the pool and max_model_len."""
    if tiny:
        return [3]
    budget = engine.scheduler_config.max_num_batched_tokens
    room = min(engine.max_model_len - 8, engine.runner.num_blocks * engine.args.block_size // 4)
    sizes = [budget, budget // 2 + 1, 1000, 129, 17]
    return sorted({max(2, min(n, room)) for n in sizes}, reverse=True)


def logits_like(engine) -> torch.Tensor:
    """A [1, W] tensor laid out as the logits the sampler will get (their dtype, row stride and
    alignment: what its kernels' variants depend on): a row of the decode graphs' logits buffer
    where graphs were captured, else a fresh row in the model's dtype, vocab_size wide."""
    graphs = getattr(getattr(engine, "runner", None), "graphs", None)  # no runner yet: a fresh row
    for buffer in getattr(graphs, "logits", {}).values():
        return buffer[:1]
    model = engine.model
    return torch.empty((1, model.vocab_size), dtype=model.dtype, device=engine.sampler.device)


def _precompile_sampler(engine) -> None:
    """sample/precompile.py's compile-only launches for this engine's sampler and logits (CUDA
    only). Never raises: what is not compiled here compiles when the warm-up meets it."""
    from enginespec.sample.precompile import precompile_sampler

    try:
        logits = logits_like(engine)
    except Exception as e:  # noqa: BLE001 - an optimisation of startup, never a requirement
        log.info("sampler precompile skipped: %s: %s", type(e).__name__, e)
        return
    precompile_sampler(engine.sampler, logits)


def warm_up(engine, *, tiny: bool = False, progress: bool = True) -> WarmupReport:
    """Run the warm-up requests to completion through engine.step(), then reset what they left
    (see the module docstring). `tiny`: short prompts, two output tokens (the CPU). First, on
    CUDA, every sampler kernel variant compiles side by side (sample/precompile.py) rather than
    one after another as the requests meet them."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    _precompile_sampler(engine)
    precompiled = time.perf_counter() - start
    rng = random.Random(0)
    lengths = _prompt_lengths(engine, tiny)
    vocab = min(engine.vocab_size, 10_000)
    settings, num = sampler_settings(engine.vocab_size, engine.max_logprobs), 0
    max_tokens = 2 if tiny else 4
    # Every request must fit alone: a tiny pool (a test's num_gpu_blocks_override), a short
    # max_model_len or, with chunked prefill off, a small budget shrinks its prompt, and one with
    # no room left is not sent at all.
    room = min(engine.max_model_len, engine.runner.num_blocks * engine.args.block_size) - max_tokens
    config = engine.scheduler_config
    if not config.enable_chunked_prefill:  # the scheduler's add() rule: it must run in one step
        room = min(room, config.max_num_batched_tokens + 1 - max_tokens)
    for i, n in enumerate(lengths):  # one prefill size each, then decodes over every setting
        for j, setting in enumerate(settings if i == 0 else settings[:1]):
            num_prompt = min(n if j == 0 else 3 + j, room)
            if num_prompt < 1:
                continue
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **setting)
            prompt = [rng.randrange(1, vocab) for _ in range(num_prompt)]
            engine.add_request(f"__warmup-{num}", prompt, params)
            num += 1
    steps = 0
    total = num + sum(map(len, LATER_BATCHES))
    with tqdm(total=total, desc="Warming up", disable=not progress, leave=False) as bar:
        while engine.has_unfinished:
            bar.update(sum(1 for out in engine.step(final_only=True) if out.finished))
            steps += 1
        # then the later batches (LATER_BATCHES), one at a time
        for batch in LATER_BATCHES if num and room >= 1 else ():
            for setting in batch:
                prompt = [rng.randrange(1, vocab) for _ in range(min(3, room))]
                engine.add_request(
                    f"__warmup-{num}", prompt, SamplingParams(max_tokens=max_tokens, **setting)
                )
                num += 1
            while engine.has_unfinished:
                bar.update(sum(1 for out in engine.step(final_only=True) if out.finished))
                steps += 1
    _reset(engine)
    report = WarmupReport(num, steps, lengths, time.perf_counter() - start, precompiled)
    log.info(report.line())
    return report


def _reset(engine) -> None:
    """Leave no trace of the warm-up (see the module docstring)."""
    from enginespec.engine.engine_core import EngineStats

    trace = engine.stats.step_trace
    engine.stats = EngineStats(step_trace=None if trace is None else [])
    if engine.spec is not None:  # speculation restarts too (counters, generator, clock), its
        engine.spec.reset()  # counters still shared with the engine's stats
        engine.stats.spec_decode = engine.spec.stats
    engine.block_manager.reset_prefix_cache()
    engine.sampler.generator.seed(engine.sampler.seed)
