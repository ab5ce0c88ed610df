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

from enginespec.conformance.invariants import Harness, snapshot
from enginespec.conformance.rules import spec_rule
from enginespec.conformance.strategies import (
    RequestSpec,
    invalid_config_kwargs,
    invalid_sampling_kwargs,
    scenarios,
    token_lists,
)
from enginespec.spec import SamplingParams, SchedulerConfig


def unchanged(h: Harness):
    """A comparable view of everything a refused call must leave alone."""
    snap = snapshot(h.sched, h.live)
    return snap.state, snap.running, snap.waiting, snap.reqs


@given(case=invalid_sampling_kwargs())
def test_sampling_params_name_the_field(case):
    field, kwargs = case
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


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
    max_tokens = data.draw(st.integers(1, total - 1))
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


@pytest.mark.parametrize("field", ["max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold"])
def test_scheduler_config_refuses_a_bool_for_a_count(field):
    """True is an int to isinstance: max_num_batched_tokens=True was a budget of one token, and
    LLM(..., long_prefill_token_threshold=True) a threshold of one (EngineArgs refuses bools for
    its own counts, SchedulerConfig let these through)."""
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**{"max_num_seqs": 1, field: True})
