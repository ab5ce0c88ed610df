"""Every numeric argument of the BlockManager protocol, tried with negative, zero and
non-integral values (DESIGN: bad input is a ValueError naming the field; nothing changes).

Counts are token or block counts: a real int (numpy integers included, via `operator.index`),
never a bool, a float or a string. Zero is valid where a count of nothing makes sense
(allocate 0 new tokens, trim to 0 tokens, publish the first 0 tokens) and must then behave as
the spec says; negative and non-integral counts are refused and leave `state()` identical.
"""

from __future__ import annotations

import numpy as np
import pytest

from enginespec.conformance.invariants import check_pool
from enginespec.conformance.rules import spec_rule
from enginespec.spec import SamplingParams

BAD_COUNTS = [-1, -5, 1.5, 2.0, True, "2", None]
BAD_IDS = ["neg1", "neg5", "float", "integral-float", "bool", "str", "none"]
BS = 4

#: Cases the in-repo impls do not refuse yet (found when this test was written). They are
#: xfail (not strict) for those impls only, so fixing an impl turns them into passes; any
#: other impl must pass them. Owners: impls/ (see docs/writing-a-backend.md, "Numeric arguments").
# (method, case) pairs an in-repo impl still accepts; empty since both impls go through
# spec.check_count. Kept as the place to list a known gap of an impl while it is being fixed.
PENDING: set[tuple[str, str]] = set()
PENDING_FOR: dict[str, set[tuple[str, str]]] = {"reference": PENDING, "fast": PENDING}


def pool_with_one_request(impl):
    """A pool holding one request of 6 tokens, 4 of them computed and published."""
    bm = impl.new_block_manager(8, BS)
    r = impl.new_request("a", [1, 2, 3, 4, 5, 6], SamplingParams(), arrival_time=0.0)
    assert bm.allocate_slots(r, 6)
    r.num_computed_tokens = 4
    return bm, r


CALLS = {
    "allocate_slots": lambda bm, r, n: bm.allocate_slots(r, n),
    "trim": lambda bm, r, n: bm.trim(r, n),
    "cache_full_blocks": lambda bm, r, n: bm.cache_full_blocks(r, n),
}


def pending(request, impl, method: str, case: str) -> None:
    if (method, case) in PENDING_FOR.get(impl.name, ()):
        request.applymarker(pytest.mark.xfail(reason=f"{impl.name} accepts {method}({case})", strict=False))


@pytest.mark.parametrize("method", sorted(CALLS))
@pytest.mark.parametrize("bad", BAD_COUNTS, ids=BAD_IDS)
@spec_rule("allocate-slots")
def test_bad_counts_are_refused_and_change_nothing(request, impl, method, bad):
    if method == "cache_full_blocks" and bad is None:
        pytest.skip("None is cache_full_blocks' default (num_computed_tokens)")
    pending(request, impl, method, BAD_IDS[BAD_COUNTS.index(bad)] if bad is not True else "bool")
    bm, r = pool_with_one_request(impl)
    before = bm.state()
    with pytest.raises(ValueError):
        CALLS[method](bm, r, bad)
    assert bm.state() == before, f"{method}({bad!r}) was refused but changed the pool"


@spec_rule("allocate-slots")
def test_zero_counts_do_what_the_spec_says(impl):
    bm, r = pool_with_one_request(impl)
    before = bm.state()
    assert bm.allocate_slots(r, 0) is True and bm.state() == before, "allocating 0 tokens changes nothing"
    bm.cache_full_blocks(r, 0)
    assert bm.state() == before, "publishing the first 0 tokens publishes nothing"
    bm.trim(r, 0)
    state = bm.state()
    assert "a" not in state.tables and sorted(state.free_queue) == list(range(8)), "trim(0) frees every block"
    check_pool(state, 8)
    empty = impl.new_request("e", [1], SamplingParams(), arrival_time=0.0)
    assert bm.allocate_slots(empty, 0) is True and "e" not in bm.state().tables, "no table for 0 tokens"


@spec_rule("allocate-slots")
def test_numpy_integers_count_like_ints(impl):
    bm, r = pool_with_one_request(impl)
    other, s = pool_with_one_request(impl)
    assert bm.allocate_slots(r, np.int64(5)) == other.allocate_slots(s, 5)
    bm.trim(r, np.int32(4))
    other.trim(s, 4)
    assert bm.state() == other.state()


@pytest.mark.parametrize("field", ["num_blocks", "block_size"])
@pytest.mark.parametrize("bad", [-1, 0, 2.5, True, "4"], ids=["neg", "zero", "float", "bool", "str"])
def test_pool_shape_arguments(request, impl, field, bad):
    pending(request, impl, "new_block_manager", "bool" if bad is True else "")
    kwargs = {"num_blocks": 8, "block_size": BS, field: bad}
    with pytest.raises(ValueError, match=field):
        impl.new_block_manager(**kwargs)


# --------------------------------------------------------------------------- tokens into a request

BAD_TOKENS = [-1, 1.5, 2.0, True, "3", None]
BAD_TOKEN_IDS = ["neg", "float", "integral-float", "bool", "str", "none"]


def _with_output(impl):
    r = impl.new_request("t", [1, 2, 3], SamplingParams(max_tokens=8), arrival_time=0.0)
    r.append(0)  # token id 0 is a valid token
    return r


@pytest.mark.parametrize("bad", BAD_TOKENS, ids=BAD_TOKEN_IDS)
@pytest.mark.parametrize("method", ["append", "replace_last_token"])
@spec_rule("request-invariants")
def test_bad_tokens_are_refused_and_change_nothing(impl, method, bad):
    r = _with_output(impl)
    if not hasattr(r, method):
        pytest.skip(f"{impl.name} requests have no {method} (optional: async scheduling)")
    before = list(r.token_ids), list(r.output_token_ids)
    with pytest.raises(ValueError, match="token"):
        getattr(r, method)(bad)
    assert (list(r.token_ids), list(r.output_token_ids)) == before, (
        f"{method}({bad!r}) refused but changed the request"
    )


@spec_rule("request-invariants")
def test_tokens_zero_and_numpy_are_stored_as_ints(impl):
    r = _with_output(impl)
    r.append(np.int64(5))
    assert list(r.token_ids) == [1, 2, 3, 0, 5] and list(r.output_token_ids) == [0, 5]
    assert all(type(t) is int for t in r.token_ids), "tokens must be stored as Python ints"
    assert r.num_tokens == 5 and r.num_output_tokens == 2


@spec_rule("request-invariants")
def test_replace_last_token_overwrites_only_the_newest_output(impl):
    r = _with_output(impl)
    if not hasattr(r, "replace_last_token"):
        pytest.skip(f"{impl.name} requests have no replace_last_token (optional: async scheduling)")
    r.append(7)
    r.replace_last_token(np.int32(9))
    assert list(r.token_ids) == [1, 2, 3, 0, 9] and list(r.output_token_ids) == [0, 9]
    assert type(r.token_ids[-1]) is int
    fresh = impl.new_request("f", [1, 2], SamplingParams(), arrival_time=0.0)
    with pytest.raises(ValueError):
        fresh.replace_last_token(4)  # no output token to replace: the prompt is never touched
    assert list(fresh.token_ids) == [1, 2]


def test_new_request_defaults(impl):
    """DESIGN: new_request(..., eos_token_id=None, priority=0, arrival_time=None, cache_key=())."""
    r = impl.new_request("d", [4, 5])
    assert r.priority == 0 and tuple(r.cache_key) == () and r.eos_token_id is None
    assert r.num_computed_tokens == 0 and r.num_cached_tokens == 0 and list(r.spec_token_ids) == []
    assert r.num_preemptions == 0 and not r.swapped_out and r.stop_reason is None
    assert isinstance(r.arrival_time, float) and r.params == SamplingParams()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"], ids=["neg", "float", "bool", "str"])
@spec_rule("update-and-stops")
def test_sampled_tokens_are_validated(impl, bad):
    """update_from_output puts sampled tokens into requests: a bad one is a ValueError (never a
    stored float or string); a numpy integer is stored as an int."""
    from enginespec.spec import SchedulerConfig

    def one_step(sample):
        bm = impl.new_block_manager(8, BS)
        sched = impl.new_scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=2), bm)
        r = impl.new_request("a", [1, 2, 3], SamplingParams(max_tokens=4, temperature=0.0), arrival_time=0.0)
        sched.add(r)
        return r, lambda: sched.update_from_output(sched.schedule(), {"a": [sample]}).new_token_ids

    r, update = one_step(bad)
    with pytest.raises(ValueError, match="token"):
        update()
    assert all(type(t) is int for t in r.token_ids)
    r, update = one_step(np.int64(6))
    assert update() == {"a": [6]}, "UpdateOutput.new_token_ids reports the token as stored"
    assert list(r.token_ids) == [1, 2, 3, 6] and type(r.token_ids[-1]) is int
