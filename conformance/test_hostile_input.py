"""Hostile but realistic input: colliding request ids, tenants' cache keys, values that are not
numbers, token ids of every integral type. Each class is drawn by Hypothesis (strategies in
conformance/strategies.py) and checked against the impl under test."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginespec.conformance.invariants import check_idle
from enginespec.conformance.strategies import (
    bad_cache_keys,
    cache_key_values,
    integral_token_ids,
    non_token_ids,
    token_lists,
)
from enginespec.spec import MAX_N, SamplingParams, SupportsAsyncScheduling, hash_request_blocks
from enginespec.testing.checkpoints import VOCAB_SIZE, tiny_model_dir

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def make_llm(impl, **kwargs):
    from enginespec.llm import LLM

    args = dict(dtype="float32", device="cpu", block_size=4, num_blocks=40, max_model_len=64)
    return LLM(str(tiny_model_dir("qwen3")), impl=impl, **{**args, **kwargs})


def drain(engine) -> dict:
    finals = {}
    for _ in range(300):
        if not engine.has_unfinished:
            return finals
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    raise AssertionError("engine did not finish")


# ---- request ids ---------------------------------------------------------------------------


@pytest.mark.usefixtures("torch_one_thread")
def test_user_ids_never_collide_with_sibling_ids(impl):
    """Ids shaped like vLLM's sibling ids ("0_x") and like our internal ones, beside an n = 2
    request "x": every request finishes with its own outputs and no block leaks."""
    llm = make_llm(impl)
    engine = llm.engine
    engine.add_request("0_x", [5, 6, 7], GREEDY)
    engine.abort("0_x", report=False)
    users = ["0_x", "1_x", "\x1f0\x1fx", "\x1f1\x1fx", "\x1f\x1fx", "\x1fx"]
    for rid in users:
        engine.add_request(rid, [5, 6, 7], GREEDY)
    engine.add_request("x", [5, 6, 7], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, n=2))
    finals = drain(engine)
    assert sorted(finals) == sorted(users + ["x"])
    assert len(finals["x"].outputs) == 2
    solo = finals["0_x"].outputs[0].token_ids
    assert all(finals[rid].outputs[0].token_ids == solo for rid in users)
    assert all(c.token_ids == solo for c in finals["x"].outputs)
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)


# ---- tenants -------------------------------------------------------------------------------


@given(key=cache_key_values, tokens=token_lists(4, 24), block_size=st.sampled_from([1, 2, 4]))
def test_block_hashes_equal_the_spec_for_every_accepted_key(impl, key, tokens, block_size):
    bm = impl.new_block_manager(32, block_size, True)
    request = impl.new_request("r", tokens, SamplingParams(), arrival_time=0.0, cache_key=key)
    bm.find_cached_prefix(request)
    assert list(request.block_hashes) == hash_request_blocks(tokens, block_size, key)
    assert bm.allocate_slots(request, len(tokens))
    bm.cache_full_blocks(request, len(tokens))
    published = set(bm.state().cached)
    assert published == set(hash_request_blocks(tokens, block_size, key))


def test_keys_equal_in_python_but_not_in_the_spec_stay_apart(impl):
    """(1,) == (True,) in Python, but the spec's encoding tells them apart; so must every impl,
    even after it has hashed the other key."""
    tokens = [3, 4, 5, 6, 7]
    for first, second in [((1,), (True,)), ((0,), (False,)), (("a", 1), ("a", True))]:
        bm = impl.new_block_manager(16, 2, True)
        for key in (first, second):
            r = impl.new_request(f"r{key!r}", tokens, SamplingParams(), arrival_time=0.0, cache_key=key)
            bm.find_cached_prefix(r)
            assert list(r.block_hashes) == hash_request_blocks(tokens, 2, key)


@given(key=bad_cache_keys)
def test_refused_cache_keys(impl, key):
    with pytest.raises(ValueError, match="cache_key"):
        impl.new_request("r", [1, 2, 3], SamplingParams(), cache_key=key)


def test_cache_keys_nest_at_most_8_levels(impl):
    """The spec's depth bound (spec.validation: a key nesting deeper than 8 levels is refused, so
    a hostile key cannot recurse the hash encoder without end): 8 tuple levels are taken and
    hashed as the spec says, 9 are a ValueError naming cache_key and the bound."""

    def nested(levels):
        key = "salt"
        for _ in range(levels):
            key = (key,)
        return key

    tokens = [3, 4, 5, 6]
    r = impl.new_request("r", tokens, SamplingParams(), arrival_time=0.0, cache_key=nested(8))
    bm = impl.new_block_manager(8, 2, True)
    bm.find_cached_prefix(r)
    assert list(r.block_hashes) == hash_request_blocks(tokens, 2, nested(8))
    with pytest.raises(ValueError, match="cache_key nests deeper than 8 levels"):
        impl.new_request("s", tokens, SamplingParams(), arrival_time=0.0, cache_key=nested(9))


@pytest.mark.usefixtures("torch_one_thread")
def test_cache_salt_separates_tenants(impl):
    llm = make_llm(impl)
    prompt = list(range(5, 21))  # four full blocks
    bm = llm.engine.block_manager

    def hits(salt):
        before = (bm.hit_rate, llm.engine.stats.num_scheduled_tokens)
        llm.generate([{"prompt_token_ids": prompt, "cache_salt": salt}], GREEDY, use_tqdm=False)
        return llm.engine.stats.num_scheduled_tokens - before[1]

    cold = hits("tenant-a")
    assert hits("tenant-b") == cold, "tenant B adopted tenant A's blocks"
    assert hits("tenant-a") < cold, "the same tenant must hit its own prefix"
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate([{"prompt_token_ids": prompt, "cache_salt": 7}], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="prompt keys"):
        llm.generate([{"prompt_token_ids": prompt, "cache_sallt": "a"}], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished


# ---- numbers and token ids -----------------------------------------------------------------


@given(ids=st.lists(integral_token_ids(), min_size=1, max_size=6), extra=integral_token_ids())
def test_any_integral_token_id_is_accepted_as_a_plain_int(impl, ids, extra):
    r = impl.new_request("r", ids, SamplingParams(), arrival_time=0.0)
    assert r.prompt_token_ids == [int(t) for t in ids] and all(type(t) is int for t in r.token_ids)
    r.append(extra)
    if isinstance(r, SupportsAsyncScheduling):  # the optional method (async scheduling)
        r.replace_last_token(extra)
    assert type(r.token_ids[-1]) is int and r.token_ids[-1] == int(extra)


@given(bad=non_token_ids, where=st.sampled_from(["prompt", "append", "replace_last_token"]))
def test_non_token_values_are_refused_everywhere(impl, bad, where):
    if where == "prompt":
        with pytest.raises(ValueError, match="token"):
            impl.new_request("r", [1, bad], SamplingParams(), arrival_time=0.0)
        return
    r = impl.new_request("r", [1, 2], SamplingParams(), arrival_time=0.0)
    if where == "replace_last_token" and not isinstance(r, SupportsAsyncScheduling):
        return  # the impl does without the optional method: nothing to refuse
    r.append(3)
    before = list(r.token_ids)
    with pytest.raises(ValueError, match="token"):
        getattr(r, where)(bad)
    assert r.token_ids == before


@given(arrival=st.sampled_from([math.nan, math.inf, -math.inf, "0", True, None]))
def test_arrival_time_must_be_finite(impl, arrival):
    if arrival is None:
        return  # None means "now"
    with pytest.raises(ValueError, match="arrival_time"):
        impl.new_request("r", [1, 2], SamplingParams(), arrival_time=arrival)


@pytest.mark.usefixtures("torch_one_thread")
def test_engine_refuses_what_it_knows_is_out_of_range(impl):
    engine = make_llm(impl).engine
    for params, needle in [
        (SamplingParams(logprobs=VOCAB_SIZE + 1), "logprobs"),
        (SamplingParams(prompt_logprobs=VOCAB_SIZE + 1), "prompt_logprobs"),
        (SamplingParams(logit_bias={VOCAB_SIZE: 1.0}), "logit_bias"),
    ]:
        with pytest.raises(ValueError, match=needle):
            engine.add_request("x", [1, 2], params)
    with pytest.raises(ValueError, match="n"):
        SamplingParams(n=MAX_N + 1)
    over = list(range(VOCAB_SIZE, VOCAB_SIZE + 7))  # the message lists the first five, not all
    with pytest.raises(ValueError, match=re.escape(f"vocab_size ({VOCAB_SIZE}), got {over[:5]!r}")):
        engine.add_request("x", [1, *over], GREEDY)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(allowed_token_ids=[7], logit_bias={7: -math.inf})
    assert not engine.has_unfinished


def test_n_is_at_most_256_samples():
    """MAX_N is 256 (DESIGN: n in [1, 256]): a test that only reads MAX_N moves with it."""
    assert MAX_N == 256 and SamplingParams(n=256).n == 256
    with pytest.raises(ValueError, match=re.escape("SamplingParams.n must be <= 256, got 257")):
        SamplingParams(n=257)


@pytest.mark.usefixtures("torch_one_thread")
def test_engine_and_llm_take_numpy_token_ids(impl):
    """A tokenizer that returns numpy ints (or a user who passes them) gets the same outputs
    as with plain ints; bools and floats are refused with a ValueError."""
    import numpy as np

    llm = make_llm(impl)
    plain = [5, 6, 7, 8, 9]
    want = llm.generate([{"prompt_token_ids": plain}], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    for kind in (np.int32, np.int64, np.uint16):
        ids = [kind(t) for t in plain]
        assert llm.generate([ids], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want
        assert (
            llm.generate({"prompt_token_ids": np.array(plain, dtype=kind)}, GREEDY, use_tqdm=False)[0]
            .outputs[0]
            .token_ids
            == want
        )
    for bad in ([5, True], [5, 6.0]):
        with pytest.raises(ValueError, match="token"):
            llm.engine.add_request("bad", bad, GREEDY)
    assert not llm.engine.has_unfinished
