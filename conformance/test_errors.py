"""Bad input is refused with a ValueError that names the field (and nothing changes).

Covers requests (empty prompt, bad token ids), SamplingParams and SchedulerConfig (spec-owned,
checked here because every impl relies on them), the block manager's own arguments, and
Scheduler.add's refusals: a duplicate id and requests that can never fit (pool, max_model_len,
budget with chunked prefill off). After a refusal the pool state and the queues are identical.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginespec.conformance.invariants import Harness, check_idle, snapshot
from enginespec.conformance.rules import spec_rule
from enginespec.conformance.strategies import (
    RequestSpec,
    invalid_config_kwargs,
    invalid_sampling_kwargs,
    scenarios,
    token_lists,
)
from enginespec.spec import SamplingParams, SchedulerConfig, Status


def unchanged(h: Harness):
    """A comparable view of everything a refused call must leave alone."""
    snap = snapshot(h.sched, h.live)
    return snap.state, snap.running, snap.waiting, snap.reqs


@given(case=invalid_sampling_kwargs())
def test_sampling_params_name_the_field(case):
    field, kwargs = case
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


#: (field, value just past its bound, the bound as the message states it). The Hypothesis test
#: above draws 12 cases over ~25 fields, so a bound can go unchecked for a whole run (mutation:
#: top_p 0 taken, every real field's lower bound dropped, a "None" bound in the message).
_JUST_PAST = [
    ("temperature", -0.01, ">= 0.0"),
    ("top_k", -2, ">= -1"),
    ("top_p", 0.0, "in (0, 1]"),
    ("top_p", 1.01, "in (0, 1]"),
    ("min_p", -0.01, ">= 0.0"),
    ("min_p", 1.01, "<= 1.0"),
    ("presence_penalty", -2.01, ">= -2.0"),
    ("presence_penalty", 2.01, "<= 2.0"),
    ("frequency_penalty", -2.01, ">= -2.0"),
    ("frequency_penalty", 2.01, "<= 2.0"),
    ("repetition_penalty", 0.0, "> 0"),
    ("max_tokens", 0, ">= 1"),
    ("min_tokens", -1, ">= 0"),
    ("n", 0, ">= 1"),
    ("n", 257, "<= 256"),
    ("truncate_prompt_tokens", 0, "None, -1 (up to max_model_len) or >= 1"),
]


@pytest.mark.parametrize(("field", "value", "bound"), _JUST_PAST, ids=lambda v: str(v))
def test_sampling_params_refuse_a_value_just_past_each_bound(field, value, bound):
    """Each bound of SamplingParams' docstring, one step past it: a ValueError whose message
    states the field, the bound and the value."""
    with pytest.raises(ValueError, match=re.escape(f"SamplingParams.{field} must be {bound}, got {value!r}")):
        SamplingParams(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [("logit_bias", {3: -100.5}), ("logit_bias", {3: 100.5})],
    ids=["low", "high"],
)
def test_logit_bias_values_are_bounded_at_100(field, value):
    bound = ">= -100.0" if value[3] < 0 else "<= 100.0"
    with pytest.raises(ValueError, match=re.escape(f"SamplingParams.logit_bias must be {bound}")):
        SamplingParams(**{field: value})


def test_sampling_params_take_each_bound_itself():
    """The closed ends are taken as given (the open ones, top_p 0 and repetition_penalty 0, are
    refused above)."""
    p = SamplingParams(
        temperature=0.0,
        top_k=-1,
        top_p=1.0,
        min_p=1.0,
        presence_penalty=-2.0,
        frequency_penalty=2.0,
        max_tokens=1,
        min_tokens=1,
        n=256,
        truncate_prompt_tokens=1,
        logit_bias={3: -100.0, 4: 100.0},
    )
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.n, p.truncate_prompt_tokens) == (
        0.0,
        -1,
        1.0,
        1.0,
        256,
        1,
    )
    assert (p.presence_penalty, p.frequency_penalty, p.logit_bias) == (-2.0, 2.0, {3: -100.0, 4: 100.0})
    assert SamplingParams(min_p=0.0, presence_penalty=2.0, frequency_penalty=-2.0, top_p=1e-9).top_p == 1e-9
    assert SamplingParams(truncate_prompt_tokens=-1).truncate_prompt_tokens == -1


@pytest.mark.parametrize("stop", [("ok", ""), ("ok", 5), ("ok", None)], ids=["empty", "int", "none"])
def test_stop_strings_must_be_non_empty_strings(stop):
    with pytest.raises(ValueError, match=re.escape("SamplingParams.stop must be non-empty strings")):
        SamplingParams(stop=stop)


@given(case=invalid_config_kwargs())
def test_scheduler_config_names_the_field(case):
    field, kwargs = case
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**kwargs)


def test_empty_prompt(impl):
    with pytest.raises(ValueError, match="prompt"):
        impl.new_request("r", [], SamplingParams())


@given(tokens=token_lists(0, 4), bad=st.sampled_from([-1, -7, 1.5, "a"]), at=st.integers(0, 4))
def test_bad_prompt_token(impl, tokens, bad, at):
    tokens = list(tokens)
    tokens.insert(min(at, len(tokens)), bad)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        impl.new_request("r", tokens, SamplingParams())


@pytest.mark.parametrize(
    "field,kwargs",
    [
        ("num_blocks", dict(num_blocks=0, block_size=4)),
        ("num_blocks", dict(num_blocks=-3, block_size=4)),
        ("block_size", dict(num_blocks=4, block_size=0)),
    ],
)
def test_block_manager_arguments(impl, field, kwargs):
    with pytest.raises(ValueError, match=field):
        impl.new_block_manager(**kwargs)


def test_cached_blocks_only_into_an_empty_table(impl):
    bm = impl.new_block_manager(8, 2)
    first = impl.new_request("a", [1, 2, 3, 4, 5], SamplingParams(), arrival_time=0.0)
    assert bm.allocate_slots(first, 5)
    bm.cache_full_blocks(first, 5)
    second = impl.new_request("b", [1, 2, 3, 4, 5], SamplingParams(), arrival_time=0.0)
    cached = bm.find_cached_prefix(second)
    assert cached and bm.allocate_slots(second, 1)
    before = bm.state()
    with pytest.raises(ValueError):
        bm.allocate_slots(second, 1, cached)
    assert bm.state() == before


def add_refused(h: Harness, spec: RequestSpec, match: str) -> None:
    before = unchanged(h)
    with pytest.raises(ValueError, match=match):
        h.add(spec)
    assert unchanged(h) == before, "a refused add changed the scheduler"
    h.check()


def warm(h: Harness, scn, steps: int) -> None:
    for spec in scn.requests:
        h.add(spec)
    for _ in range(steps):
        if h.sched.has_unfinished:
            h.step()


@given(scn=scenarios(), steps=st.integers(0, 3), data=st.data())
@spec_rule("add-refusals")
def test_duplicate_id_refused(impl, scn, steps, data):
    h = Harness.for_scenario(impl, scn)
    warm(h, scn, steps)
    if not h.live:
        return
    dup = data.draw(st.sampled_from(sorted(h.live)))
    add_refused(h, dataclasses.replace(scn.requests[0], request_id=dup), dup)


@given(scn=scenarios(), steps=st.integers(0, 3), over=st.integers(1, 3), data=st.data())
@spec_rule("add-refusals")
def test_request_that_can_never_fit(impl, scn, steps, over, data):
    """prompt + max_tokens over the pool, over max_model_len, or (chunked prefill off) minus one
    over the budget: refused on add, naming the bound."""
    h = Harness.for_scenario(impl, scn)
    warm(h, scn, steps)
    cfg, limits = scn.config, scn.limits
    bounds = {"num_blocks": scn.num_blocks * scn.block_size}
    if cfg.max_model_len is not None:
        bounds["max_model_len"] = cfg.max_model_len
    if not cfg.enable_chunked_prefill:
        bounds["max_num_batched_tokens"] = cfg.max_num_batched_tokens + 1
    name = data.draw(st.sampled_from(sorted(bounds)))
    total = bounds[name] + over
    # a prompt of exactly max_model_len with max_tokens 1 is add's one exception (it may fit)
    full = cfg.max_model_len is not None and total - 1 == cfg.max_model_len
    max_tokens = data.draw(st.integers(2 if full else 1, total - 1))
    spec = RequestSpec(
        "never",
        tuple(data.draw(token_lists(total - max_tokens, total - max_tokens))),
        SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )
    assert not limits.fits(len(spec.prompt_token_ids), max_tokens)
    binding = [n for n, b in bounds.items() if total > b]
    add_refused(h, spec, "|".join(binding))


@pytest.mark.parametrize(
    "bound, value, config, num_blocks",
    [
        ("max_model_len", 10, dict(max_model_len=10), 8),
        ("num_blocks", 2, dict(), 2),
        ("max_num_batched_tokens", 9, dict(enable_chunked_prefill=False, max_num_batched_tokens=9), 8),
    ],
)
@spec_rule("add-refusals")
def test_refusal_states_the_count_and_the_bound(impl, bound, value, config, num_blocks):
    """A refusal's message names the bound and states both numbers: the bound's value and the
    request's count (num_prompt + max_tokens; minus one for the budget). Here 6 + 5 = 11 tokens
    with block_size 4, and exactly one bound broken per case."""
    sched = impl.new_scheduler(
        SchedulerConfig(max_num_seqs=4, **config), impl.new_block_manager(num_blocks, 4)
    )
    count = 10 if bound == "max_num_batched_tokens" else 11
    with pytest.raises(ValueError, match=bound) as refused:
        sched.add(impl.new_request("r", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=5)))
    numbers = re.findall(r"\d+", str(refused.value))
    assert str(count) in numbers and str(value) in numbers, str(refused.value)


@pytest.mark.parametrize("block_size", [1, 4])
@pytest.mark.parametrize("chunked", [True, False])
@spec_rule("add-refusals")
def test_a_prompt_of_max_model_len_takes_one_token_in_a_pool_of_max_model_len(impl, block_size, chunked):
    """add's one exception to prompt + max_tokens <= max_model_len (vLLM's): a prompt of exactly
    max_model_len with max_tokens 1. Its token is sampled at the last prompt position and needs
    no KV slot, so a pool of exactly max_model_len tokens holds it (and, chunked prefill off, a
    budget of max_model_len); the max_model_len stop ends it after that token, and the pool is
    idle again."""
    cfg = SchedulerConfig(
        max_num_batched_tokens=8, max_num_seqs=2, enable_chunked_prefill=chunked, max_model_len=8
    )
    h = Harness(impl, cfg, 8 // block_size, block_size)
    params = SamplingParams(max_tokens=1, min_tokens=1, temperature=0.0, ignore_eos=True)
    h.add(RequestSpec("full", tuple(range(1, 9)), params))
    h.run_to_completion(max_steps=16)
    r = h.all["full"]
    assert r.status == Status.FINISHED_LENGTH and len(r.output_token_ids) == 1
    check_idle(h.bm.state(), h.num_blocks)


@pytest.mark.parametrize(
    "num_prompt, max_tokens, num_blocks, bound",
    [
        (8, 2, 8, "max_model_len"),  # the exception is max_tokens 1 only (the engine fits it)
        (9, 1, 16, "max_model_len"),  # a prompt over max_model_len
        (8, 1, 7, "num_blocks"),  # the exception's prompt still needs all its slots
    ],
)
@spec_rule("add-refusals")
def test_around_a_prompt_of_max_model_len_add_refuses(impl, num_prompt, max_tokens, num_blocks, bound):
    """The exception stays narrow: at the Scheduler a prompt of max_model_len with max_tokens 2
    is refused (the engine fits it to 1 before add), so is a prompt of max_model_len + 1, and a
    pool one slot short of the prompt; each naming its bound, nothing changed."""
    cfg = SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=2, max_model_len=8)
    h = Harness(impl, cfg, num_blocks, 1)
    spec = RequestSpec("r", (1,) * num_prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    add_refused(h, spec, bound)


@pytest.mark.parametrize("field", ["max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold"])
def test_scheduler_config_refuses_a_bool_for_a_count(field):
    """True is an int to isinstance: max_num_batched_tokens=True was a budget of one token, and
    LLM(..., long_prefill_token_threshold=True) a threshold of one (EngineArgs refuses bools for
    its own counts, SchedulerConfig let these through)."""
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**{"max_num_seqs": 1, field: True})
