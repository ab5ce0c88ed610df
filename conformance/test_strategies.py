"""Tests of the strategies themselves (as array-api-tests tests its hypothesis helpers): they
draw only valid, fitting inputs, and they do reach the situations the suite relies on (shared
prefixes, prompt_logprobs, cache keys, chunked prefill off, preemption pressure, every invalid
field). A strategy that silently stopped reaching one of those would make a property vacuous.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from enginespec.conformance.invariants import Harness, cdiv
from enginespec.conformance.strategies import (
    _BAD_CONFIG,
    _BAD_PARAMS,
    EOS_TOKEN_ID,
    VOCAB_SIZE,
    Limits,
    RequestSpec,
    invalid_config_kwargs,
    invalid_sampling_kwargs,
    pool_shapes,
    pressure_scenarios,
    sampling_params,
    scenarios,
)
from enginespec.spec import SamplingParams, SchedulerConfig
from enginespec.testing.fake_model import FakeModel

FIND = settings(
    max_examples=2000, database=None, deadline=None, phases=[Phase.generate]
)  # found is enough: no shrinking


@given(scn=scenarios())
def test_scenarios_fit(scn):
    ids = [spec.request_id for spec in scn.requests]
    assert len(set(ids)) == len(ids) and ids
    for spec in scn.requests:
        assert scn.limits.fits(len(spec.prompt_token_ids), spec.params.max_tokens), spec
        assert all(0 < t < VOCAB_SIZE for t in spec.prompt_token_ids)
        assert spec.params.min_tokens <= spec.params.max_tokens


@given(params=sampling_params(), shape=pool_shapes())
def test_small_draws_are_valid(params, shape):
    assert params.greedy and 0 <= params.min_tokens <= params.max_tokens
    assert set(params.stop_token_ids) <= set(range(1, VOCAB_SIZE))
    num_blocks, block_size = shape
    assert num_blocks >= 1 and block_size >= 1


@given(scn=pressure_scenarios())
def test_pressure_scenarios_force_preemption(scn):
    """Arithmetic behind the pressure: all prompts are admitted in step 1, each request fits
    alone, but the pool cannot hold every request's last step at once."""
    bs, reqs = scn.block_size, scn.requests
    prompts = [len(s.prompt_token_ids) for s in reqs]
    assert sum(prompts) <= scn.config.max_num_batched_tokens and len(reqs) <= scn.config.max_num_seqs
    assert sum(cdiv(p, bs) for p in prompts) <= scn.num_blocks
    assert all(scn.limits.fits(p, s.params.max_tokens) for p, s in zip(prompts, reqs))
    assert sum(cdiv(p + s.params.max_tokens - 1, bs) for p, s in zip(prompts, reqs)) > scn.num_blocks
    assert len({s.params.max_tokens for s in reqs}) == 1 and all(s.params.ignore_eos for s in reqs)


def shares_a_block(scn) -> bool:
    bs = scn.block_size
    heads = [(s.prompt_token_ids[:bs], s.cache_key) for s in scn.requests if len(s.prompt_token_ids) > bs]
    return len(heads) != len(set(heads))


@pytest.mark.parametrize(
    "name,predicate",
    [
        ("shared full first block", shares_a_block),
        ("prompt_logprobs", lambda scn: any(s.params.prompt_logprobs is not None for s in scn.requests)),
        ("cache_key", lambda scn: any(s.cache_key for s in scn.requests)),
        ("chunked prefill off", lambda scn: not scn.config.enable_chunked_prefill and len(scn.requests) > 1),
        (
            "threshold binds",
            lambda scn: (
                scn.config.enable_chunked_prefill
                and any(
                    len(s.prompt_token_ids) > scn.config.long_prefill_token_threshold > 0
                    for s in scn.requests
                )
            ),
        ),
        (
            "priority policy with ties",
            lambda scn: (
                scn.config.policy == "priority"
                and len({s.priority for s in scn.requests}) < len(scn.requests)
            ),
        ),
        ("swap mode", lambda scn: scn.config.preemption_mode == "swap"),
        ("max_model_len", lambda scn: scn.config.max_model_len is not None),
        (
            "min_tokens and stop ids",
            lambda scn: any(s.params.min_tokens and s.params.stop_token_ids for s in scn.requests),
        ),
    ],
)
def test_scenarios_reach(name, predicate):
    find(scenarios(), predicate, settings=FIND)


@pytest.mark.parametrize("field", sorted({k.strip() for k in _BAD_PARAMS}))
def test_every_invalid_sampling_field_is_drawn(field):
    find(invalid_sampling_kwargs(), lambda case: case[0] == field, settings=FIND)


@pytest.mark.parametrize("field", sorted({k.strip() for k in _BAD_CONFIG}))
def test_every_invalid_config_field_is_drawn(field):
    find(invalid_config_kwargs(), lambda case: case[0] == field, settings=FIND)


@given(case=invalid_config_kwargs())
def test_invalid_config_kwargs_blame_the_named_field(case):
    """Putting the named field back to its default makes the config valid: the field named is
    really the culprit (so test_errors checks the right message)."""
    field, kwargs = case
    SchedulerConfig(**{**kwargs, field: getattr(SchedulerConfig(), field)})


@given(case=invalid_sampling_kwargs())
def test_invalid_sampling_kwargs_blame_the_named_field(case):
    field, kwargs = case
    SamplingParams(**{**kwargs, field: getattr(SamplingParams(), field)})


def test_limits_match_add(impl):
    """Limits.fits (what the strategies draw) is exactly Scheduler.add's acceptance, both sides of
    each bound: pool, max_model_len, budget with chunked prefill off."""
    for chunked in (False, True):
        cfg = SchedulerConfig(
            max_num_batched_tokens=8, max_num_seqs=2, enable_chunked_prefill=chunked, max_model_len=12
        )
        for num_blocks, block_size in [(2, 4), (5, 2), (20, 1)]:
            limits = Limits.of(cfg, num_blocks, block_size)
            for total in range(2, 16):
                h = Harness(impl, cfg, num_blocks, block_size)
                spec = RequestSpec("x", (1,) * (total - 1), SamplingParams(max_tokens=1, temperature=0.0))
                if limits.fits(total - 1, 1):
                    h.add(spec)
                else:
                    with pytest.raises(ValueError):
                        h.add(spec)


@given(tokens=st.lists(st.integers(0, 99), max_size=20), seed=st.integers(0, 3))
def test_fake_model_is_deterministic_and_in_range(tokens, seed):
    model = FakeModel(seed=seed)
    first = model.next_token(tokens)
    assert first == model.next_token(list(tokens)) and 0 <= first < model.vocab_size
    assert dataclasses.replace(model).next_token(tokens) == first


def test_fake_model_emits_eos_and_others():
    model = FakeModel()
    find(
        st.lists(st.integers(1, 9), max_size=6), lambda t: model.next_token(t) == EOS_TOKEN_ID, settings=FIND
    )
    find(
        st.lists(st.integers(1, 9), max_size=6), lambda t: model.next_token(t) != EOS_TOKEN_ID, settings=FIND
    )
