"""The one workload generator: random prompts of token ids and the output length each asks for.

The benchmark, the demo and the simulator all draw their requests here, so "the workload" means
one thing. The default is nano-vllm's bench shape (the benchmark's, DESIGN.md "Performance
targets"): 256 requests, prompt and output lengths randint(100, 1024), prompt ids below 10000,
seed 0.

Draw order, with Python's `random.Random(seed)` (fixed: benchmark figures stay comparable
across commits only while this order does):
1. only when shared_prefix_len > 0: `num_prefixes` prefixes of shared_prefix_len ids each;
2. for each request: its prompt length randint(min_input_len, max_input_len), then its ids,
   each randint(0, id_bound - 1);
3. for each request: its output length randint(min_output_len, max_output_len).
Request i's prompt is prefix[i % num_prefixes] + its own ids (no extra draw), so with no shared
prefix the draws are exactly the benchmark's. A min above its max is lowered to the max, so a
small smoke run needs only the max flags.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from enginespec.spec import SamplingParams

NANO_VLLM = dict(
    num_requests=256,
    min_input_len=100,
    max_input_len=1024,
    min_output_len=100,
    max_output_len=1024,
    id_bound=10000,
    seed=0,
)


@dataclass(frozen=True)
class Workload:
    """Prompts (token ids) and the output length each request asks for."""

    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def prompt_lens(self) -> list[int]:
        return [len(p) for p in self.prompts]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    def head(self, n: int) -> Workload:
        """The first n requests."""
        return Workload(self.prompts[:n], self.output_lens[:n])

    def prompt_inputs(self) -> list[dict]:
        """The prompts as `LLM.generate` inputs ({"prompt_token_ids": ids})."""
        return [{"prompt_token_ids": list(p)} for p in self.prompts]

    def sampling_params(self, temperature: float = 0.0, ignore_eos: bool = True) -> list[SamplingParams]:
        """One SamplingParams per request, max_tokens = its output length. With ignore_eos (the
        default) every request produces exactly its output length."""
        return [
            SamplingParams(max_tokens=n, temperature=temperature, ignore_eos=ignore_eos)
            for n in self.output_lens
        ]


def _check(num_requests: int, lengths: dict, id_bound: int, num_prefixes: int, shared_prefix_len: int):
    for name, value in (("num_requests", num_requests), *lengths.items(), ("id_bound", id_bound)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(num_prefixes, int) or num_prefixes < 1:
        raise ValueError(f"num_prefixes must be an int >= 1, got {num_prefixes!r}")
    if not isinstance(shared_prefix_len, int) or shared_prefix_len < 0:
        raise ValueError(f"shared_prefix_len must be an int >= 0, got {shared_prefix_len!r}")


def make_workload(
    num_requests: int = 256,
    *,
    min_input_len: int = 100,
    max_input_len: int = 1024,
    min_output_len: int = 100,
    max_output_len: int = 1024,
    id_bound: int = 10000,
    seed: int = 0,
    shared_prefix_len: int = 0,
    num_prefixes: int = 1,
) -> Workload:
    """The workload drawn in the module docstring's order (defaults: nano-vllm's bench shape).
    ValueError naming the argument when a count or length is below its bound."""
    lengths = dict(
        min_input_len=min_input_len,
        max_input_len=max_input_len,
        min_output_len=min_output_len,
        max_output_len=max_output_len,
    )
    _check(num_requests, lengths, id_bound, num_prefixes, shared_prefix_len)
    rng = random.Random(seed)
    prefixes = [[rng.randint(0, id_bound - 1) for _ in range(shared_prefix_len)] for _ in range(num_prefixes)]
    lo_in, lo_out = min(min_input_len, max_input_len), min(min_output_len, max_output_len)
    prompts = []
    for i in range(num_requests):
        length = rng.randint(lo_in, max_input_len)
        own = [rng.randint(0, id_bound - 1) for _ in range(length)]
        prompts.append((prefixes[i % num_prefixes] if shared_prefix_len else []) + own)
    output_lens = [rng.randint(lo_out, max_output_len) for _ in range(num_requests)]
    return Workload(prompts, output_lens)
