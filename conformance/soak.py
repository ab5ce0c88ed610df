"""A seeded soak of the engine through an impl: many requests, random aborts, injected faults,
preemption (recompute and swap), several tenants, async scheduling on and off.

Every greedy output is checked against an unpressured run (a big pool, no faults, serial) of
the same prompt: a request that finished normally must equal it token for token; one that was
aborted or failed must be a prefix of it. At the end of each configuration every block must be
free. `benchmarks/soak.py` runs it at full size and prints the figures; the `slow` conformance
test runs it smaller.

mix="features" (default "plain", the figures of benchmarks/RESULTS.md before 2026-12-05, drawn
exactly as before) gives each request one of FEATURE_VARIANTS: bad_words, truncate_prompt_tokens,
structured outputs of every kind (xgrammar; the tiny model with json_model_dir's tokenizer),
logprobs=-1, seed=-1, n=2, alone and combined. Greedy variants are compared with the unpressured
run of the same prompt and params; an unseeded sample (seed=-1, temperature 1) only for its
length. Every variant also checks what it promises (`_feature_violations`, a fresh grammar
matcher over each constrained output), half the aborts are silent (report=False), and each
configuration ends with no request, sample or grammar matcher left in the engine.
speculative="ngram" turns n-gram speculation on in every pressured configuration.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Optional

from enginespec.spec import SamplingParams, StructuredOutputsParams
from enginespec.testing.checkpoints import EOS_ID, VOCAB_SIZE, json_model_dir, tiny_model_dir

TENANTS = ["tenant-a", "tenant-b", "tenant-c", "tenant-d"]
MIXES = ("plain", "features")
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}

_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 4}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
_CHOICES = ("yes", "no", "maybe")
_REGEX = r"[a-c]{2}\d{3}"
_GRAMMAR = 'root ::= "(" [0-9]+ ")" | "none"'
_BANNED = ("!", "#$")  # json_model_dir's tokenizer: one token a character


def _so(**kwargs) -> StructuredOutputsParams:
    return StructuredOutputsParams(**kwargs)


#: The features mix: SamplingParams fields on top of the plain request's (greedy, ignore_eos),
#: one variant drawn per request. Variant 0 is the plain request.
FEATURE_VARIANTS: tuple[dict, ...] = (
    {},
    {"bad_words": _BANNED, "bad_words_token_ids": ((40,),)},
    {"truncate_prompt_tokens": 5},
    {"truncate_prompt_tokens": -1},
    {"structured_outputs": _so(choice=_CHOICES)},
    {"structured_outputs": _so(regex=_REGEX)},
    {"structured_outputs": _so(json=_SCHEMA)},
    {"structured_outputs": _so(grammar=_GRAMMAR)},
    {"structured_outputs": _so(json_object=True), "ignore_eos": False},
    {"logprobs": -1},
    {"logprobs": -1, "structured_outputs": _so(choice=_CHOICES)},
    {"bad_words": ("a",), "structured_outputs": _so(regex=_REGEX), "truncate_prompt_tokens": 3},
    {"n": 2, "structured_outputs": _so(grammar=_GRAMMAR)},
    {"seed": -1, "temperature": 1.0},
    {"seed": -1, "temperature": 1.0, "structured_outputs": _so(regex=_REGEX), "logprobs": -1},
    {"prompt_logprobs": -1, "truncate_prompt_tokens": 6},
    {"per_prompt_regex": True, "n": 2},
)


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
    # mix="features" only (0 otherwise): outputs that break their variant's promise (a banned
    # word, a finished constrained output that does not match, logprobs that are not the whole
    # vocabulary or differ from the unpressured run's), and requests, samples or grammar
    # matchers still held by the engine at the end of a configuration
    feature_violations: int = 0
    state_leaked: int = 0
    draft_tokens: int = 0  # speculative="ngram": tokens drafted, and accepted
    accepted_tokens: int = 0
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
            f"feature violations: {self.feature_violations}",
            f"state leaked:     {self.state_leaked}",
            f"drafts:           {self.draft_tokens} tokens, {self.accepted_tokens} accepted",
            "configs:          " + ", ".join(self.configs),
        ]


def _engine(impl, mix: str = "plain", **kwargs):
    from enginespec.llm import LLM

    args = dict(dtype="float32", device="cpu", block_size=4, max_model_len=64, max_num_seqs=12)
    model = tiny_model_dir("qwen3")
    if mix == "features":  # a tokenizer that writes JSON; logprobs=-1 allowed
        model, args["max_logprobs"] = json_model_dir("qwen3"), -1
    return LLM(str(model), impl=impl, **{**args, **kwargs}).engine


def _extra(variant: int, k: int) -> dict:
    """FEATURE_VARIANTS[variant] for prompt k: "per_prompt_regex" becomes a regex of that
    prompt's own (32 grammars over 64 prompts: compiled on add, under load)."""
    extra = dict(FEATURE_VARIANTS[variant])
    if extra.pop("per_prompt_regex", False):
        extra["structured_outputs"] = _so(regex=f"[a-c]{{{1 + k % 4}}}\\d{{{1 + k // 4 % 8}}}")
    return extra


def _params(variant: int, max_tokens: int, k: int = 0) -> SamplingParams:
    extra = _extra(variant, k)
    return SamplingParams(**{"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, **extra})


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


def unpressured_features(impl, prompts: list[list[int]], max_tokens: int) -> dict:
    """(prompt index, variant) -> the unpressured run's RequestOutput (None for an unseeded
    variant, whose tokens are not reproducible)."""
    engine = _engine(impl, "features", num_blocks=512, max_num_seqs=32, async_scheduling=False)
    keys = [(k, v) for k in range(len(prompts)) for v in range(len(FEATURE_VARIANTS))]
    for i, (k, v) in enumerate(keys):
        engine.add_request(str(i), prompts[k], _params(v, max_tokens, k))
    finals = {}
    while engine.has_unfinished:
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    return {key: None if _unseeded(key[1]) else finals[str(i)] for i, key in enumerate(keys)}


def _unseeded(variant: int) -> bool:
    return FEATURE_VARIANTS[variant].get("seed") == -1


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


def _check_features(engine, out, extra: dict, m: int, expected, figures: SoakFigures) -> None:
    """A features-mix request (`extra`: its _extra): every sample against the unpressured run
    (a greedy variant; an unseeded one: its length) and against its variant's promises."""
    reference = None if expected is None else expected.outputs[0]
    for c in out.outputs:
        if reference is not None:
            _check_sample(c, reference, m, figures)
        elif c.finish_reason == "length" and len(c.token_ids) != m:
            figures.wrong_tokens += abs(len(c.token_ids) - m)
        figures.failed_requests += c.finish_reason == "error"
        figures.feature_violations += _feature_violations(c, extra, reference)
        so = extra.get("structured_outputs")
        if so is not None:
            figures.feature_violations += _grammar_violation(engine, c, so)
    if extra.get("prompt_logprobs") == -1 and out.outputs[0].finish_reason == "length":
        figures.feature_violations += _prompt_logprob_violations(out, expected)


def _check_sample(c, reference, m: int, figures: SoakFigures) -> None:
    """_check's token comparison for one sample against a CompletionOutput cut to m tokens."""
    expected = reference.token_ids[:m]
    figures.wrong_tokens += sum(1 for a, b in zip(c.token_ids, expected) if a != b)
    figures.wrong_tokens += max(0, len(c.token_ids) - len(expected))
    if c.finish_reason not in ("abort", "error"):
        figures.wrong_tokens += max(0, len(expected) - len(c.token_ids))


def _feature_violations(c, extra: dict, reference) -> int:
    """How many of the variant's promises sample `c` breaks."""
    bad = 0
    ids = c.token_ids
    for word in extra.get("bad_words", ()):
        bad += word in c.text
    for seq in extra.get("bad_words_token_ids", ()):
        bad += any(tuple(ids[i : i + len(seq)]) == seq for i in range(len(ids)))
    so = extra.get("structured_outputs")
    if so is not None and c.finish_reason == "stop" and not _matches(so, c.text):
        bad += 1
    if extra.get("logprobs") == -1 and c.finish_reason != "error":
        bad += _logprob_violations(c, reference)
    return bad


def _grammar_violation(engine, c, so: StructuredOutputsParams) -> bool:
    """A fresh matcher of the constraint refuses one of the sample's tokens, or has not ended
    where the sample finished "stop"."""
    manager = engine._structured
    state = manager.new_state(manager.compile(so), [EOS_ID])
    state.accept(c.token_ids)
    return state.num_rejected > 0 or (c.finish_reason == "stop" and not state.terminated)


def _matches(so: StructuredOutputsParams, text: str) -> bool:
    """Whether a finished constrained output is a sentence of its constraint."""
    if so.choice is not None:
        return text in so.choice
    if so.regex is not None:
        return re.fullmatch(so.regex, text) is not None
    if so.grammar is not None:
        return re.fullmatch(r"\(\d+\)|none", text) is not None
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if so.json_object:
        return isinstance(value, dict)
    return isinstance(value, dict) and list(value) == ["name", "age"]


def _logprob_violations(c, reference) -> int:
    """logprobs=-1: one entry per token, each the whole vocabulary with the sampled token in
    it; its logprob that of the unpressured run (a greedy reference) within 1e-3."""
    if c.logprobs is None or len(c.logprobs) != len(c.token_ids):
        return 1
    bad = 0
    for i, (tok, entry) in enumerate(zip(c.token_ids, c.logprobs)):
        bad += len(entry) != VOCAB_SIZE or tok not in entry
        if reference is not None and i < len(reference.token_ids) and tok == reference.token_ids[i]:
            want = reference.logprobs[i][tok]
            bad += tok in entry and not math.isclose(entry[tok], want, abs_tol=1e-3)
    return bad


def _prompt_logprob_violations(out, reference) -> int:
    """prompt_logprobs=-1: None, then the whole vocabulary with the actual token in it, at each
    position of the (truncated) prompt; values those of the unpressured run within 1e-3."""
    got, want = out.prompt_logprobs, reference.prompt_logprobs
    if got is None or len(got) != len(out.prompt_token_ids) or got[0] is not None:
        return 1
    bad = 0
    for tok, entry, ref in zip(out.prompt_token_ids[1:], got[1:], want[1:]):
        bad += entry is None or len(entry) != VOCAB_SIZE or tok not in entry
        bad += entry is not None and tok in entry and not math.isclose(entry[tok], ref[tok], abs_tol=1e-3)
    return bad


def _leftovers(engine) -> int:
    """Per-request state the engine still holds once every request finished (0 expected):
    requests, samples, grammar matchers, high-water marks, swapped-out KV copies, and the
    speculative decoder's indexes and counters."""
    held = [engine.parents, engine._samples, engine._constrained, engine._pending, engine._high_water]
    if engine.spec is not None:
        held += [engine.spec.request_stats, engine.spec.adaptive, engine.spec.drafter]
    return sum(map(len, held)) + engine.runner.num_swapped


def soak_config(
    impl,
    figures: SoakFigures,
    prompts,
    expected,
    *,
    num_requests: int,
    seed: int,
    mix: str = "plain",
    **engine_args,
):
    """One configuration: num_requests requests drawn from `prompts`, a small pool, faults and
    aborts at random. Adds its figures to `figures`. `expected`: unpressured()'s list (plain)
    or unpressured_features()'s dict (features)."""
    rng = random.Random(seed)
    engine = _engine(impl, mix, num_blocks=24, **engine_args)
    faults = engine.fault_hook = _Faults(rng, 0.002)
    live: dict[str, tuple[int, int, int]] = {}
    added = 0
    while added < num_requests or engine.has_unfinished:
        while added < num_requests and len(live) < 24:
            k, m = rng.randrange(len(prompts)), rng.randrange(2, 13)
            rid = f"{seed}-{added}"
            salt = rng.choice(TENANTS)
            v = rng.randrange(len(FEATURE_VARIANTS)) if mix == "features" else 0
            engine.add_request(rid, prompts[k], _params(v, m, k), cache_key=("cache_salt", salt))
            live[rid] = (k, m, v)
            added += 1
        if live and rng.random() < 0.02:
            victim = rng.choice(sorted(live))
            report = mix == "plain" or rng.random() < 0.5  # features: half never report
            engine.abort(victim, report=report)
            figures.aborts += 1
            if not report:
                live.pop(victim)
        for out in engine.step():
            if out.finished:
                k, m, v = live.pop(out.request_id)
                if mix == "features":
                    _check_features(engine, out, _extra(v, k), m, expected[k, v], figures)
                else:
                    _check(out, expected[k][:m], figures)
    state = engine.block_manager.state()
    figures.blocks_leaked += engine.runner.num_blocks - len(state.free_queue) + len(state.tables)
    figures.state_leaked += _leftovers(engine)
    figures.requests += num_requests
    figures.faults_injected += faults.count
    figures.preemptions += engine.stats.num_preemptions
    if engine.stats.spec_decode is not None:
        figures.draft_tokens += engine.stats.spec_decode.num_draft_tokens
        figures.accepted_tokens += engine.stats.spec_decode.num_accepted_tokens


def run_soak(
    impl,
    num_requests: int = 10_000,
    seed: int = 0,
    mix: str = "plain",
    speculative: Optional[str] = None,
) -> SoakFigures:
    """The soak over four configurations (recompute / swap when the impl can, async on / off),
    num_requests in all; `mix` one of MIXES, `speculative` None or "ngram"."""
    if mix not in MIXES:
        raise ValueError(f"mix must be one of {MIXES}, got {mix!r}")
    if speculative not in (None, "ngram"):
        raise ValueError(f"speculative must be None or 'ngram', got {speculative!r}")
    start = time.perf_counter()
    rng = random.Random(seed)
    prompts = _prompts(rng, 64)
    if mix == "features":
        expected: object = unpressured_features(impl, prompts, 12)
    else:
        expected = unpressured(impl, prompts, 12)
    spec_args = {"speculative_config": NGRAM} if speculative == "ngram" else {}
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
            mix=mix,
            preemption_mode=mode,
            async_scheduling=async_scheduling,
            **spec_args,
        )
        figures.configs.append(f"{mode}/{'async' if async_scheduling else 'serial'}")
    figures.wall_s = time.perf_counter() - start
    return figures
