"""The demo: a scaled-down throughput workload on a tiny random model, runnable on any CPU.

The workload is the benchmark's (testing/workload.py, nano-vllm's bench shape, scaled down):
`num_requests` prompts of random ids with lengths uniform in [min_input_len, max_input_len],
outputs of lengths uniform in [1, max_output_len] with ignore_eos, seed fixed. Optionally every
prompt starts with the same `shared_prefix_len` ids so the prefix cache has something to hit. A pool smaller than
the workload's peak (num_blocks) makes preemptions visible.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from enginespec.spec import SamplingParams
from enginespec.testing.workload import make_workload


@dataclass
class DemoResult:
    """What one demo run measured."""

    num_requests: int
    num_prompt_tokens: int
    num_output_tokens: int
    seconds: float
    num_steps: int
    prefix_hit_rate: float
    num_preemptions: int
    num_blocks: int
    sample: Optional[tuple[str, str]] = None  # (prompt text, greedy completion text)

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        text = f"generate: {self.sample[0]!r} -> {self.sample[1]!r}\n" if self.sample else ""
        return text + (
            f"requests {self.num_requests}, prompt tokens {self.num_prompt_tokens}, "
            f"output tokens {self.num_output_tokens}\n"
            f"time {self.seconds:.2f} s, output {self.output_tokens_per_s:.1f} tok/s, "
            f"steps {self.num_steps}\n"
            f"prefix hit rate {self.prefix_hit_rate:.1%}, preemptions {self.num_preemptions}, "
            f"KV blocks {self.num_blocks}"
        )


def _tiny_checkpoint(family: str, path: Path, seed: int, max_len: int) -> str:
    """A tiny random checkpoint written without transformers' progress bars."""
    from transformers.utils import logging as hf_logging

    from enginespec.testing.checkpoints import make_checkpoint

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return str(make_checkpoint(family, path, seed=seed, max_position_embeddings=max_len))
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def run_demo(
    *,
    family: str = "qwen3",
    impl: str = "fast",
    num_requests: int = 16,
    min_input_len: int = 8,
    max_input_len: int = 64,
    max_output_len: int = 32,
    shared_prefix_len: int = 16,
    seed: int = 0,
    model_dir: Optional[str] = None,
    use_tqdm: bool = True,
    **engine_args,
) -> DemoResult:
    """Build a tiny random `family` checkpoint (unless model_dir is given), run the workload
    through LLM.generate and report throughput and engine counters."""
    from enginespec.llm import LLM

    with tempfile.TemporaryDirectory(prefix="enginespec-demo-") as tmp:
        max_len = shared_prefix_len + max_input_len + max_output_len
        if model_dir is None:
            model_dir = _tiny_checkpoint(family, Path(tmp) / family, seed, max(256, max_len))
        engine_args.setdefault("max_model_len", max_len)
        llm = LLM(model_dir, impl=impl, seed=seed, **engine_args)
        workload = make_workload(
            num_requests,
            min_input_len=min_input_len,
            max_input_len=max_input_len,
            min_output_len=1,
            max_output_len=max_output_len,
            id_bound=llm.engine.vocab_size,
            seed=seed,
            shared_prefix_len=shared_prefix_len,
        )
        prompts, params = workload.prompt_inputs(), workload.sampling_params()
        sample = _text_sample(llm, workload.prompts[0])
        steps_before = llm.engine.stats.num_steps
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=use_tqdm)
        seconds = time.perf_counter() - start
    engine = llm.engine
    num_prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return DemoResult(
        num_requests=len(outputs),
        num_prompt_tokens=num_prompt_tokens,
        num_output_tokens=sum(o.num_output_tokens for o in outputs),
        seconds=seconds,
        num_steps=engine.stats.num_steps - steps_before,
        prefix_hit_rate=_prefix_hit_rate(outputs, num_prompt_tokens),
        num_preemptions=engine.stats.num_preemptions,
        num_blocks=engine.runner.num_blocks,
        sample=sample,
    )


def _prefix_hit_rate(outputs, num_prompt_tokens: int) -> float:
    """vLLM's prefix-cache hit rate of the run: prompt tokens the cache served (each output's
    num_cached_tokens, recorded once, at the request's first admission) over prompt tokens, in
    [0, 1). Not the pool's block counters: those count every lookup, a waiting request's retries
    and a preempted request's re-admission (its own blocks) included."""
    served = sum(o.num_cached_tokens or 0 for o in outputs)
    return served / num_prompt_tokens if num_prompt_tokens else 0.0


def _text_sample(llm, ids: list[int]) -> Optional[tuple[str, str]]:
    """Text in, text out through the checkpoint's tokenizer (random weights: random words)."""
    tokenizer = llm.engine.tokenizer
    if tokenizer is None:
        return None
    prompt = tokenizer.decode(ids[:12], skip_special_tokens=True)
    max_tokens = min(12, llm.engine.max_model_len - len(tokenizer.encode(prompt)))
    if not prompt or max_tokens < 1:
        return None
    out = llm.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0.0), use_tqdm=False)[0]
    return prompt, out.outputs[0].text
