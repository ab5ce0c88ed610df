"""Speculation on vs off through `LLM.generate`, with the sampling constraints a request may carry
(allowed_token_ids, bad words, logit_bias, min_tokens, stop ids and strings, max_tokens, EOS,
penalties, logprobs, prompt_logprobs, n > 1, seeded rows beside greedy ones): a greedy or
seeded request's output (ids, text, finish and stop reasons, logprobs) is exactly the plain
engine's, with async scheduling on and off, under preemption and chunked prefill, and both
pools end idle. Sampled rows under speculation never draw a token a constraint forbids.

Three drafters: a replay of the plain run's own output under the same params (every draft is
accepted, so stops, min_tokens edges and max_tokens land inside accepted runs), the n-gram
lookup, and a draft model (the target itself, unconstrained: its drafts are rejected wherever a
constraint bites).
"""

from __future__ import annotations

import collections
import dataclasses

import pytest

from enginespec.conformance.invariants import check_idle
from enginespec.conformance.test_spec_decode import ReplayDrafter

pytestmark = pytest.mark.usefixtures("torch_one_thread")

EOS = 3  # the tiny qwen3's
PROMPTS = [[(7 * i + 3 * j) % 90 + 4 for j in range(6 + 3 * i)] for i in range(4)]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
POOLS = {
    "roomy": {"num_blocks": 64},
    "preempting": {"num_blocks": 12},
    "chunked": {
        "num_blocks": 64,
        "max_num_batched_tokens": 8,
        "enable_chunked_prefill": True,
        "max_num_seqs": 3,
    },
}


def _llm(impl, speculative_config=None, **engine_args):
    from enginespec.llm import LLM
    from enginespec.testing.checkpoints import tiny_model_dir

    args = {"impl": impl, "dtype": "float32", "device": "cpu", "block_size": 4, **engine_args}
    return LLM(str(tiny_model_dir("qwen3")), speculative_config=speculative_config, **args)


def _seen(outs) -> list:
    return [[(c.text, list(c.token_ids), c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs]


def _combos(free: list):
    """(name, params or a list of params per prompt), built around the plain greedy run `free`
    (its ids and texts), so that stops and bans fall inside the outputs."""
    from enginespec.spec import SamplingParams

    base = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ids = [o[0][1] for o in free]
    texts = [o[0][0] for o in free]
    some = sorted({t for out in ids for t in out[:3]})
    common = [c for c, _ in collections.Counter("".join(texts)).most_common(4)]
    edit = dataclasses.replace
    yield "allowed", edit(base, allowed_token_ids=(*some, 5, 6, 7))
    yield "bias", edit(base, logit_bias={some[0]: 5.0, some[1]: -100.0})
    yield "bad_words", edit(base, bad_words_token_ids=((ids[0][2],), (ids[1][1], ids[1][2])))
    yield "stop_ids", edit(base, stop_token_ids=(ids[0][4], ids[1][3]))
    yield "max_tokens", edit(base, max_tokens=5)
    yield "to_max_model_len", edit(base, max_tokens=None)
    yield "eos_min_n2", edit(base, ignore_eos=False, logit_bias={EOS: 30.0}, min_tokens=3, n=2)
    for m in (2, 4, 5):
        yield f"stop_ids_min{m}", edit(base, stop_token_ids=tuple(range(10, 60)), min_tokens=m)
        yield f"stop_str_min{m}", edit(base, stop=tuple(common[:2]), min_tokens=m)
        yield (
            f"stop_str_incl_min{m}",
            edit(base, stop=(common[2], common[3]), min_tokens=m, include_stop_str_in_output=True),
        )
    yield "stop_str_n2", edit(base, stop=(texts[0][4:9], texts[2][6:10]), n=2)
    yield "presence", edit(base, presence_penalty=1.5)
    yield "frequency", edit(base, frequency_penalty=1.0)
    # after an x, bad words ban every allowed id but the stop id s (min_tokens yields to it: "stop"
    # at the second token), or every allowed id (no stop id allowed: "error" there, x shown alone)
    x, y, s = some[0], some[1], some[2]
    empties = edit(base, bad_words_token_ids=((x, y), (x, x)), logit_bias={x: 100.0})
    yield (
        "emptied_yields_to_a_stop_id",
        edit(empties, allowed_token_ids=(x, y, s), stop_token_ids=(s,), min_tokens=3),
    )
    yield "emptied_ends_in_error", edit(empties, allowed_token_ids=(x, y))
    yield "repetition", edit(base, repetition_penalty=1.5)
    yield "logprobs", edit(base, logprobs=2)
    yield "prompt_logprobs", edit(base, prompt_logprobs=2)
    seeded = edit(base, temperature=0.9, seed=3, n=2)
    yield "seeded_beside_greedy", [seeded if i % 2 == 0 else base for i in range(len(PROMPTS))]


def _same_logprobs(want, got, name: str) -> None:
    for a, b in zip(want, got):
        for x, y in zip(a.outputs[0].logprobs or (), b.outputs[0].logprobs or ()):
            assert x.keys() == y.keys() and all(abs(x[k].logprob - y[k].logprob) < 1e-4 for k in x), name
        if a.prompt_logprobs is not None:
            assert len(a.prompt_logprobs) == len(b.prompt_logprobs), name
            for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
                assert x.keys() == y.keys() and all(abs(x[k].logprob - y[k].logprob) < 1e-4 for k in x), name


def _check_idle(llm, drafter: str) -> None:
    engine = llm.engine
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    if drafter == "draft_model":
        d = engine.spec.drafter
        check_idle(d.block_manager.state(), d.block_manager.num_blocks)
        assert len(d) == 0, "a draft mirror outlived its request"


@pytest.mark.parametrize(
    "drafter, async_scheduling, pool",
    [
        ("replay", False, "roomy"),
        ("replay", True, "preempting"),
        ("ngram", False, "preempting"),
        ("ngram", True, "chunked"),
        ("draft_model", False, "chunked"),
        ("draft_model", True, "preempting"),
    ],
)
def test_speculation_changes_no_constrained_greedy_or_seeded_output(impl, drafter, async_scheduling, pool):
    """Each combo (_combos) through a plain engine and a speculating one of the same pool:
    identical outputs and logprobs, drafts accepted, both pools idle after every call."""
    from enginespec.spec import SamplingParams
    from enginespec.testing.checkpoints import tiny_model_dir

    inputs = [{"prompt_token_ids": p} for p in PROMPTS]
    plain = _llm(impl, **POOLS[pool])
    free = _seen(
        plain.generate(
            inputs, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True), use_tqdm=False
        )
    )
    config = NGRAM
    if drafter == "draft_model":
        config = {"method": "draft_model", "model": str(tiny_model_dir("qwen3")), "num_speculative_tokens": 3}
    spec = _llm(impl, config, async_scheduling=async_scheduling, **POOLS[pool])
    differ = {}
    for name, params in _combos(free):
        want = plain.generate(inputs, params, use_tqdm=False)
        if drafter == "replay":
            spec.engine.spec.drafter = ReplayDrafter(
                {tuple(p): o.outputs[0].token_ids for p, o in zip(PROMPTS, want)}
            )
        got = spec.generate(inputs, params, use_tqdm=False)
        if _seen(got) != _seen(want):
            differ[name] = [(w, g) for w, g in zip(_seen(want), _seen(got)) if w != g]
        _same_logprobs(want, got, name)
        _check_idle(spec, drafter)
    assert not differ, differ
    stats = spec.engine.stats.spec_decode
    assert stats.num_accepted_tokens > 0, stats
    if pool == "preempting":
        assert spec.engine.stats.num_preemptions > 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_sampled_rows_under_speculation_never_draw_a_forbidden_token(impl, async_scheduling):
    """temperature 1 with allowed ids, bad words (one and two tokens) and min_tokens over stop
    ids, and bad words that empty the allowed ids, n-gram drafts on a looping prompt (drafts
    are verified): no output breaks its rule."""
    from enginespec.spec import SamplingParams

    allowed = (10, 11, 12, 13)
    inputs = [{"prompt_token_ids": [*allowed, *allowed, 10 + i % 4]} for i in range(16)]
    base = SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)
    emptying = {"bad_words_token_ids": tuple((a, b) for a in (10, 11) for b in (10, 11))}
    rules = {
        "allowed": (
            dataclasses.replace(base, allowed_token_ids=allowed),
            lambda ids: set(ids) <= set(allowed),
        ),
        "bad_words": (
            dataclasses.replace(base, bad_words_token_ids=((10,), (11, 12))),
            lambda ids: 10 not in ids and all(ids[i : i + 2] != [11, 12] for i in range(len(ids))),
        ),
        "min_tokens": (
            dataclasses.replace(base, stop_token_ids=(10, 11), min_tokens=5),
            lambda ids: not set(ids[:-1]) & {10, 11} and (len(ids) == 8 or ids[-1] in (10, 11)),
        ),
        # after a 10 or an 11 bad words ban both: min_tokens yields to the stop id 12, or, with no
        # stop id allowed, the request ends "error" showing its one allowed token
        "emptied_yields": (
            dataclasses.replace(
                base, stop_token_ids=(12,), min_tokens=5, **emptying, allowed_token_ids=(10, 11, 12)
            ),
            lambda ids: len(ids) == 2 and ids[0] in (10, 11) and ids[1] == 12,
        ),
        "emptied_fails": (
            dataclasses.replace(base, **emptying, allowed_token_ids=(10, 11)),
            lambda ids: len(ids) == 1 and ids[0] in (10, 11),
        ),
    }
    spec = _llm(impl, NGRAM, num_blocks=14, async_scheduling=async_scheduling)
    for name, (params, ok) in rules.items():
        for out in spec.generate(inputs, params, use_tqdm=False):
            assert ok(out.outputs[0].token_ids), (name, out.outputs[0].token_ids)
        check_idle(spec.engine.block_manager.state(), spec.engine.runner.num_blocks)
    assert spec.engine.stats.spec_decode.num_accepted_tokens > 0
