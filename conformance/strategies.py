"""Every Hypothesis strategy of the conformance suite, in one module (as array-api-tests keeps
its hypothesis_helpers): tests import from here and never build ad-hoc strategies, so what the
suite explores is visible in one place and `test_strategies.py` can check the strategies
themselves (a strategy that only draws trivial or invalid cases would hide bugs).

Sections: tokens and pools; sampling params (valid and invalid); scheduler configs (valid and
invalid); requests and workloads that fit a pool; scenarios (config + pool + workload).
Engine and parity strategies are appended at the end by their owners.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np
from hypothesis import strategies as st

from enginespec.spec import MAX_N, SamplingParams, SchedulerConfig

# --------------------------------------------------------------------------- tokens and pools

#: Small vocabulary so random prompts share prefixes and stop ids get hit.
VOCAB_SIZE = 16
EOS_TOKEN_ID = 0

block_sizes = st.sampled_from([1, 2, 3, 4, 8])
cache_keys = st.sampled_from([(), ("tenant-a",), ("tenant-b", 7), ("lora", b"\x01")])


def token_lists(min_size: int = 1, max_size: int = 24, vocab: int = VOCAB_SIZE):
    """Lists of token ids in [1, vocab) (0 is the EOS id of the fake model)."""
    return st.lists(st.integers(1, vocab - 1), min_size=min_size, max_size=max_size)


@st.composite
def pool_shapes(draw, min_blocks: int = 1, max_blocks: int = 24):
    """(num_blocks, block_size)."""
    return draw(st.integers(min_blocks, max_blocks)), draw(block_sizes)


# --------------------------------------------------------------------------- sampling params


@st.composite
def sampling_params(draw, max_tokens: int = 8, prompt_logprobs: bool = True):
    """Valid SamplingParams exercising the stop rules the scheduler applies (greedy: the fake
    model ignores temperature)."""
    num_max = draw(st.integers(1, max(1, max_tokens)))
    return SamplingParams(
        max_tokens=num_max,
        temperature=0.0,
        min_tokens=draw(st.integers(0, num_max)),
        stop_token_ids=tuple(draw(st.lists(st.integers(1, VOCAB_SIZE - 1), max_size=2, unique=True))),
        ignore_eos=draw(st.booleans()),
        prompt_logprobs=draw(st.one_of(st.none(), st.integers(0, 2))) if prompt_logprobs else None,
    )


#: Values no real-valued field accepts, whatever its range: NaN, +-inf, and things that are not
#: real numbers (bool included: True is an int to Python, never a temperature).
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
not_numbers = st.sampled_from([True, False, "1", None, [1.0], b"1", 1j])
not_reals = st.one_of(non_finite, not_numbers)
#: Values no integral field accepts: floats (even whole ones), bools, strings, None.
not_ints = st.one_of(st.floats(allow_nan=True), st.sampled_from([True, "3", None, 2.0, [1]]))


def _bad(name: str, *values):
    return st.one_of(*values).map(lambda v: {name: v})


#: (field, kwargs) that SamplingParams must refuse with a ValueError naming the field: for each
#: field the out-of-range values, the non-finite ones, and the wrong types.
_BAD_PARAMS = {
    "max_tokens": _bad("max_tokens", st.integers(-5, 0), not_ints.filter(lambda v: v is not None)),
    "temperature": _bad("temperature", st.floats(-10, -0.01), not_reals),
    "top_k": _bad("top_k", st.integers(-9, -2), not_ints),
    "top_p": _bad("top_p", st.floats(-1, 0), st.floats(1.01, 5), not_reals),
    "min_p": _bad("min_p", st.floats(-1, -0.01), st.floats(1.01, 5), not_reals),
    "seed": _bad(
        "seed",
        st.integers(2**64, 2**80),
        st.integers(-(2**80), -(2**63) - 1),
        st.floats(-5, 5),
        st.sampled_from([True, "1"]),
    ),
    "min_tokens": st.one_of(
        _bad("min_tokens", st.integers(-5, -1), not_ints),
        st.integers(1, 5).map(lambda v: {"max_tokens": v, "min_tokens": v + 1}),
    ),
    "n": _bad("n", st.integers(-3, 0), st.integers(MAX_N + 1, 10 * MAX_N), not_ints),
    "logprobs": _bad("logprobs", st.integers(-5, -2), not_ints.filter(lambda v: v is not None)),
    "prompt_logprobs": _bad("prompt_logprobs", st.integers(-5, -2), not_ints.filter(lambda v: v is not None)),
    "presence_penalty": _bad("presence_penalty", st.sampled_from([-2.5, 2.5, 9.0]), not_reals),
    "frequency_penalty": _bad("frequency_penalty", st.sampled_from([-2.5, 2.5, -9.0]), not_reals),
    "repetition_penalty": _bad("repetition_penalty", st.floats(-2, 0), not_reals),
    "stop_token_ids": st.one_of(
        st.integers(-9, -1).map(lambda v: {"stop_token_ids": (1, v)}),
        st.sampled_from([True, 1.0, "1", None]).map(lambda v: {"stop_token_ids": (1, v)}),
    ),
    "stop": st.sampled_from([{"stop": ("ok", "")}, {"stop": ("ok",), "detokenize": False}]),
    **{
        name: _bad(name, st.sampled_from([1, 0, "yes", None, 1.0]))
        for name in ("skip_special_tokens", "spaces_between_special_tokens", "detokenize")
    },
    "allowed_token_ids": st.one_of(
        st.just({"allowed_token_ids": ()}),
        st.sampled_from([-1, True, 2.5]).map(lambda v: {"allowed_token_ids": (v,)}),
    ),
    "logit_bias": st.one_of(
        st.integers(-9, -1).map(lambda v: {"logit_bias": {v: 1.0}}),
        st.one_of(not_reals, st.floats(100.5, 1e9), st.floats(-1e9, -100.5)).map(
            lambda v: {"logit_bias": {3: v}}
        ),
    ),
}


@st.composite
def invalid_sampling_kwargs(draw):
    """(field name, kwargs) with exactly one invalid SamplingParams field."""
    name = draw(st.sampled_from(sorted(_BAD_PARAMS)))
    return name, draw(_BAD_PARAMS[name])


# --------------------------------------------------------------------------- scheduler configs


@st.composite
def scheduler_configs(draw, max_seqs: int = 6, max_budget: int = 48, max_model_len: Optional[int] = None):
    """Valid SchedulerConfigs with small limits, so budgets, seq caps and chunk thresholds bind."""
    num_seqs = draw(st.integers(1, max_seqs))
    return SchedulerConfig(
        max_num_batched_tokens=draw(st.integers(num_seqs, max(num_seqs, max_budget))),
        max_num_seqs=num_seqs,
        enable_chunked_prefill=draw(st.booleans()),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 3, 8])),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
        max_model_len=max_model_len,
    )


_BAD_CONFIG = {
    "max_num_batched_tokens": st.integers(-4, 0).map(lambda v: {"max_num_batched_tokens": v}),
    "max_num_seqs": st.integers(-4, 0).map(lambda v: {"max_num_seqs": v}),
    "max_num_batched_tokens ": st.integers(2, 9).map(
        lambda v: {"max_num_seqs": v, "max_num_batched_tokens": v - 1}
    ),
    "long_prefill_token_threshold": st.integers(-5, -1).map(lambda v: {"long_prefill_token_threshold": v}),
    "policy": st.sampled_from(["lifo", "FCFS", ""]).map(lambda v: {"policy": v}),
    "preemption_mode": st.sampled_from(["drop", "", "Swap"]).map(lambda v: {"preemption_mode": v}),
    "max_model_len": st.integers(-3, 1).map(lambda v: {"max_model_len": v}),
}


@st.composite
def invalid_config_kwargs(draw):
    """(field name, kwargs) that SchedulerConfig must refuse with a ValueError naming the field."""
    key = draw(st.sampled_from(sorted(_BAD_CONFIG)))
    return key.strip(), draw(_BAD_CONFIG[key])


# --------------------------------------------------------------------------- requests and workloads


@dataclass(frozen=True)
class Limits:
    """What a request must satisfy to be accepted by Scheduler.add (SCHEDULING.md)."""

    num_blocks: int
    block_size: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    max_model_len: Optional[int] = None

    @property
    def max_total_tokens(self) -> int:
        """Most prompt + max_tokens a request may have."""
        bound = self.num_blocks * self.block_size
        if self.max_model_len is not None:
            bound = min(bound, self.max_model_len)
        if not self.enable_chunked_prefill:
            bound = min(bound, self.max_num_batched_tokens + 1)
        return bound

    def fits(self, num_prompt: int, max_tokens: int) -> bool:
        if num_prompt < 1 or max_tokens < 1:
            return False
        if self.fills_max_model_len(num_prompt, max_tokens):
            return self.fits_full_prompt
        return num_prompt + max_tokens <= self.max_total_tokens

    def fills_max_model_len(self, num_prompt: int, max_tokens: int) -> bool:
        """Add's one exception to `num_prompt + max_tokens <= max_model_len` (vLLM's rule): a
        prompt of exactly max_model_len with max_tokens 1."""
        return self.max_model_len is not None and (num_prompt, max_tokens) == (self.max_model_len, 1)

    @property
    def fits_full_prompt(self) -> bool:
        """Whether a prompt of exactly max_model_len with max_tokens 1 is accepted: its one
        token takes no KV slot, so the pool need hold the prompt only; with chunked prefill off
        the budget must hold the prompt (num_prompt + max_tokens - 1)."""
        mml = self.max_model_len
        if mml is None or mml > self.num_blocks * self.block_size:
            return False
        return self.enable_chunked_prefill or mml <= self.max_num_batched_tokens

    @classmethod
    def of(cls, config: SchedulerConfig, num_blocks: int, block_size: int) -> "Limits":
        return cls(
            num_blocks,
            block_size,
            config.max_num_batched_tokens,
            config.enable_chunked_prefill,
            config.max_model_len,
        )


@dataclass(frozen=True)
class RequestSpec:
    """Everything to build one request with `impl.new_request` (impl-independent)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    priority: int = 0
    arrival_time: float = 0.0
    cache_key: tuple = ()

    def build(self, impl):
        return impl.new_request(
            self.request_id,
            list(self.prompt_token_ids),
            self.params,
            eos_token_id=EOS_TOKEN_ID,
            priority=self.priority,
            arrival_time=self.arrival_time,
            cache_key=self.cache_key,
        )


@st.composite
def request_specs(
    draw,
    limits: Limits,
    request_id: str,
    stems: tuple = (),
    max_tokens: int = 8,
    arrival_time: Optional[float] = None,
):
    """A RequestSpec that Scheduler.add accepts under `limits` (requires max_total_tokens >= 2),
    now and then (where it fits) add's one exception: a prompt of exactly max_model_len with
    max_tokens 1.

    The prompt starts, most of the time, with one of `stems` (cut to fit), so workloads share
    prefixes and prefix-cache hits, misses and evictions all happen."""
    total = limits.max_total_tokens
    assert total >= 2, "limits too small for any request"
    full = limits.fits_full_prompt and draw(st.integers(0, 7)) == 0
    if full:  # add's one exception: a prompt of exactly max_model_len, max_tokens 1
        num_max, room = 1, limits.max_model_len
    else:
        num_max = draw(st.integers(1, min(max_tokens, total - 1)))
        room = total - num_max
    stem: tuple = draw(st.sampled_from(stems)) if stems and draw(st.integers(0, 3)) else ()
    stem = stem[:room]
    least = room - len(stem) if full else 0 if stem else 1
    suffix = draw(token_lists(min_size=least, max_size=room - len(stem)))
    min_tokens = draw(st.integers(0, num_max))
    params = SamplingParams(
        max_tokens=num_max,
        temperature=0.0,
        min_tokens=min_tokens,
        stop_token_ids=tuple(draw(st.lists(st.integers(1, VOCAB_SIZE - 1), max_size=2, unique=True))),
        ignore_eos=draw(st.booleans()),
        prompt_logprobs=1 if draw(st.integers(0, 5)) == 0 else None,
    )
    return RequestSpec(
        request_id=request_id,
        prompt_token_ids=tuple(stem) + tuple(suffix),
        params=params,
        priority=draw(st.integers(0, 3)),
        arrival_time=float(draw(st.integers(0, 20))) if arrival_time is None else arrival_time,
        cache_key=draw(cache_keys) if draw(st.integers(0, 3)) == 0 else (),
    )


def draft_token_lists(max_drafts: int = 3):
    """Draft tokens (Request.spec_token_ids) a drafter proposes for a decoding request: 1 to
    max_drafts token ids in the vocabulary."""
    return token_lists(min_size=1, max_size=max_drafts)


@st.composite
def drafts_for(draw, request, model, max_drafts: int = 3):
    """Drafts for a decoding request: half the time the fake model's own continuation (so the
    verifier accepts some: all of them, or a prefix when a drawn position is corrupted), else
    arbitrary ids (mostly rejected)."""
    if draw(st.booleans()):
        return draw(draft_token_lists(max_drafts))
    history, drafts = list(request.token_ids), []
    for _ in range(draw(st.integers(1, max_drafts))):
        drafts.append(model.next_token(history))
        history.append(drafts[-1])
    if draw(st.booleans()):
        drafts[draw(st.integers(0, len(drafts) - 1))] = draw(st.integers(0, VOCAB_SIZE - 1))
    return drafts


def drafting(request) -> bool:
    """Whether a drafter may propose for this request now: it is running and decoding (only
    its newest token is uncomputed) and has no drafts yet."""
    from enginespec.spec import Status

    return (
        request.status == Status.RUNNING
        and request.num_computed_tokens == request.num_tokens - 1
        and not request.spec_token_ids
    )


@st.composite
def stems_for(draw, block_size: int, num: int = 3):
    """Shared prompt prefixes, mostly whole blocks long so they can be cached."""
    return tuple(
        tuple(draw(token_lists(min_size=block_size, max_size=3 * block_size)))
        for _ in range(draw(st.integers(1, num)))
    )


@st.composite
def workloads(draw, limits: Limits, min_requests: int = 1, max_requests: int = 6, max_tokens: int = 8):
    """Requests with distinct ids that all fit `limits`, sharing prefixes."""
    stems = draw(stems_for(limits.block_size))
    count = draw(st.integers(min_requests, max_requests))
    return [draw(request_specs(limits, f"r{i}", stems, max_tokens)) for i in range(count)]


# --------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    """A scheduler config, a pool and a workload that fits it (every request fits alone)."""

    config: SchedulerConfig
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool
    requests: list = field(default_factory=list)

    @property
    def limits(self) -> Limits:
        return Limits.of(self.config, self.num_blocks, self.block_size)


@st.composite
def scenarios(
    draw,
    max_requests: int = 6,
    max_tokens: int = 8,
    max_blocks: int = 16,
    preemption_mode: Optional[str] = None,
    policy: Optional[str] = None,
):
    """Small pools (so preemption happens) with a workload that fits each request alone."""
    block_size = draw(block_sizes)
    max_model_len = draw(st.one_of(st.none(), st.integers(4, 40)))
    config = draw(scheduler_configs(max_model_len=max_model_len))
    overrides = {}
    if preemption_mode is not None:
        overrides["preemption_mode"] = preemption_mode
    if policy is not None:
        overrides["policy"] = policy
    if overrides:
        config = SchedulerConfig(**{**config.__dict__, **overrides})
    min_blocks = -(-2 // block_size)
    num_blocks = draw(st.integers(min_blocks, max(min_blocks, max_blocks)))
    limits = Limits.of(config, num_blocks, block_size)  # >= 2 tokens: min_blocks, max_model_len >= 4
    requests = draw(workloads(limits, max_requests=max_requests, max_tokens=max_tokens))
    return Scenario(config, num_blocks, block_size, draw(st.booleans()), requests)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@st.composite
def pressure_scenarios(draw, preemption_mode: Optional[str] = None):
    """All requests are admitted in step 1 (budget and seats suffice, prompts fit together) but
    cannot all grow to their end together, so running requests must be preempted. Outputs run
    to max_tokens (ignore_eos, no stop ids) so the pressure is certain."""
    block_size = draw(st.sampled_from([1, 2, 4]))
    count = draw(st.integers(2, 4))
    prompt_blocks = [draw(st.integers(1, 2)) for _ in range(count)]
    max_tokens = [draw(st.integers(2, 3)) * block_size + 1] * count  # equal: all peak in the same step
    need_end = max(_cdiv(b * block_size + m, block_size) for b, m in zip(prompt_blocks, max_tokens))
    need_all = sum(_cdiv(b * block_size + m - 1, block_size) for b, m in zip(prompt_blocks, max_tokens))
    num_blocks = draw(
        st.integers(max(sum(prompt_blocks), need_end), max(sum(prompt_blocks), need_end, need_all - 1))
    )
    budget = sum(prompt_blocks) * block_size
    config = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=count,
        enable_chunked_prefill=True,
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        preemption_mode=preemption_mode or draw(st.sampled_from(["recompute", "swap"])),
    )
    requests = []
    for i, (b, m) in enumerate(zip(prompt_blocks, max_tokens)):
        prompt = tuple(draw(token_lists(b * block_size, b * block_size)))
        requests.append(
            RequestSpec(
                f"p{i}",
                prompt,
                SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True),
                priority=draw(st.integers(0, 2)),
                arrival_time=float(i),
                cache_key=(f"p{i}",),
            )
        )
    return Scenario(config, num_blocks, block_size, draw(st.booleans()), requests)


# --------------------------------------------------------------------------- (engine sections below)

# --------------------------------------------------------------------------- attention batches
# (owner: model) Flat-batch attention cases for the AttentionBackend conformance tests.


@dataclass(frozen=True)
class AttentionCase:
    """One flat batch for an attention backend: per request a context of seq_lens[r] positions
    whose last query_lens[r] are this step's rows (the rest were written by earlier steps),
    then num_pad_rows padding rows. `seed` draws the tensors and shuffles the block tables."""

    block_size: int
    num_kv_heads: int
    num_q_heads: int
    head_dim: int
    window: int
    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    num_pad_rows: int
    seed: int
    float64: bool = False


@st.composite
def attention_cases(draw, max_requests: int = 4, max_seq_len: int = 40):
    """Ragged batches mixing prefills, chunks and decodes: odd block sizes, GQA groups 1/2/4,
    sliding windows shorter and longer than the context, padding rows."""
    num_reqs = draw(st.integers(1, max_requests))
    seq_lens, query_lens = [], []
    for _ in range(num_reqs):
        seq_len = draw(st.integers(1, max_seq_len))
        kind = draw(st.sampled_from(["prefill", "decode", "chunk"]))
        q_len = {"prefill": seq_len, "decode": 1}.get(kind) or draw(st.integers(1, seq_len))
        seq_lens.append(seq_len)
        query_lens.append(q_len)
    num_kv_heads = draw(st.sampled_from([1, 2]))
    return AttentionCase(
        block_size=draw(st.sampled_from([1, 3, 4, 5, 16])),
        num_kv_heads=num_kv_heads,
        num_q_heads=num_kv_heads * draw(st.sampled_from([1, 2, 4])),
        head_dim=draw(st.sampled_from([4, 8, 16])),
        window=draw(st.sampled_from([0, 0, 1, 3, 7, 64])),
        seq_lens=tuple(seq_lens),
        query_lens=tuple(query_lens),
        num_pad_rows=draw(st.sampled_from([0, 0, 1, 3])),
        seed=draw(st.integers(0, 2**16)),
        float64=draw(st.booleans()),
    )


# --------------------------------------------------------------------------- engine workloads
# (owner: engine) Whole-engine workloads for the greedy parity tests: prompts sharing prefixes,
# staggered arrivals, aborts mid-flight, n > 1, and configs (small pools, budgets, chunk
# thresholds, priority, recompute or swap) that force every scheduling path.


@dataclass(frozen=True)
class EngineRequestSpec:
    """One user request of an engine workload: added before step `arrive_step`, aborted before
    step `abort_step` (None = never)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    n: int = 1
    priority: int = 0
    arrive_step: int = 0
    abort_step: Optional[int] = None


@dataclass(frozen=True)
class EngineWorkload:
    """Engine arguments (vLLM names) plus the requests; every request fits the pool alone."""

    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int
    scheduling_policy: str
    preemption_mode: str
    requests: tuple = ()

    def engine_kwargs(self) -> dict:
        return {
            name: getattr(self, name)
            for name in (
                "block_size",
                "num_blocks",
                "max_num_batched_tokens",
                "max_num_seqs",
                "enable_prefix_caching",
                "enable_chunked_prefill",
                "long_prefill_token_threshold",
                "scheduling_policy",
                "preemption_mode",
            )
        }


@st.composite
def engine_request_specs(draw, request_id: str, vocab: int, stem: tuple, max_tokens: int):
    prompt = tuple(stem) if stem and draw(st.integers(0, 3)) else ()
    prompt += tuple(draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=10)))
    arrive = draw(st.sampled_from([0, 0, 0, 1, 3]))
    abort = draw(st.one_of(st.none(), st.none(), st.none(), st.none(), st.integers(arrive + 1, arrive + 8)))
    return EngineRequestSpec(
        request_id,
        prompt,
        max_tokens=draw(st.integers(1, max_tokens)),
        n=draw(st.sampled_from([1, 1, 1, 2])),
        priority=draw(st.integers(0, 2)),
        arrive_step=arrive,
        abort_step=abort,
    )


def _lockstep_peak(requests, block_size: int) -> int:
    """Most blocks held at once if every request started together and decoded in lockstep:
    after step t a request holds its prompt + t tokens, until its last output (never computed)."""
    longest = max(r.max_tokens for r in requests)
    return max(
        sum(r.n * -(-(len(r.prompt_token_ids) + t) // block_size) for r in requests if t < r.max_tokens)
        for t in range(longest)
    )


@st.composite
def engine_workloads(draw, vocab: int, max_requests: int = 4, max_tokens: int = 6, swap: bool = True):
    """A config and a workload for the whole engine over a model of `vocab` tokens. Pools are
    mostly just enough for the largest request, or for every prompt at once (so all are admitted
    and their growth must preempt), sometimes two or three times that, so preemption (by
    recompute, or by swap when `swap`) is common."""
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    stem = tuple(draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=min(16, 3 * block_size))))
    requests = tuple(
        draw(engine_request_specs(f"r{i}", vocab, stem, max_tokens))
        for i in range(draw(st.integers(min(2, max_requests), max_requests)))
    )
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.integers(1, 4)) if draw(st.integers(0, 3)) == 0 else 4
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in requests)
    low_budget = max_num_seqs if chunked else max(max_num_seqs, longest - 1)
    need = max(-(-(len(r.prompt_token_ids) + r.max_tokens) // block_size) for r in requests)
    # Room for every prompt (and its first output) at once: all are admitted, then growth preempts;
    # or one block short of the peak of all requests running in lockstep from the first step.
    prompts = max(need, sum(r.n * -(-(len(r.prompt_token_ids) + 1) // block_size) for r in requests))
    tight = max(need, _lockstep_peak(requests, block_size) - 1)
    policy = draw(st.sampled_from(["fcfs", "priority"]))  # fcfs: priorities 0 (others are refused)
    return EngineWorkload(
        block_size=block_size,
        num_blocks=draw(st.sampled_from([tight, tight, tight, prompts, need, 2 * need + 2])),
        max_num_batched_tokens=draw(st.integers(low_budget, low_budget + 24)),
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=draw(st.booleans()),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 3, 8])),
        scheduling_policy=policy,
        preemption_mode=draw(st.sampled_from(["recompute", "swap"] if swap else ["recompute"])),
        requests=requests if policy == "priority" else tuple(replace(r, priority=0) for r in requests),
    )


# --------------------------------------------------------------------------- input validation
# The classes of spec/validation.py, drawn: what every impl and the engine must accept (and
# normalise) or refuse with a ValueError.

_NUMPY_INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@st.composite
def integral_token_ids(draw, vocab: int = VOCAB_SIZE):
    """A valid token id in [0, vocab) as a plain int or any numpy integer type."""
    value = draw(st.integers(0, min(vocab - 1, 127)))
    kind = draw(st.sampled_from([int, *_NUMPY_INTS]))
    return kind(value)


#: Values that are never a token id: bools, floats (whole ones and numpy ones included),
#: strings, None, negatives (plain and numpy), containers.
non_token_ids = st.one_of(
    st.booleans(),
    st.floats(allow_nan=True),
    st.integers(-(2**40), -1),
    st.integers(-128, -1).map(np.int64),
    st.sampled_from([np.float32(1.0), np.float64(2.0), np.bool_(True), "1", None, b"\x01", [1], (2,)]),
)

_key_atoms = st.one_of(
    st.text(max_size=6), st.binary(max_size=6), st.integers(-(2**70), 2**70), st.booleans(), st.none()
)
#: Cache keys the spec accepts: tuples or lists of str, bytes, int, bool, None, nested.
cache_key_values = st.recursive(
    _key_atoms, lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner)), max_leaves=6
).map(lambda v: tuple(v) if isinstance(v, (list, tuple)) else (v,))
#: Cache keys the spec refuses: a bare str/bytes/int (never split into characters), or tuples
#: holding floats, numpy values, sets, dicts or other objects.
bad_cache_keys = st.one_of(
    st.text(min_size=1, max_size=4),
    st.binary(min_size=1, max_size=4),
    st.integers(),
    st.floats().map(lambda v: (v,)),
    st.sampled_from([(np.int64(1),), ({1},), ({"a": 1},), (object(),), ("a", 1.5), None]),
)
