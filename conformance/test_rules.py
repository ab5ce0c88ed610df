"""Property-test failures name the spec rule and where spec/SCHEDULING.md states it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from enginespec.conformance.invariants import (
    ReqSnap,
    Snapshot,
    StepView,
    check_chunking,
    check_idle,
    check_pool,
    check_preempted,
    check_release,
    check_schedule,
)
from enginespec.conformance.rules import RULES, headings, spec_rule, where
from enginespec.spec import PoolState, SchedulerConfig, SchedulerOutput, Status, hash_request_blocks


def test_every_rule_points_to_a_section_that_exists():
    sections = set(headings())
    assert {section for _, section, _ in RULES.values()} <= sections
    assert all(1 <= point <= 8 for _, _, point in RULES.values())


def test_a_checker_failure_names_its_rule_and_section():
    leaked = PoolState(free_queue=[1], ref_counts=[0, 0], block_hashes=[None, None], cached={}, tables={})
    with pytest.raises(AssertionError) as info:
        check_pool(leaked, 2)
    text = str(info.value)
    assert (
        text.startswith('[spec rule pool-accounting: ')
        and 'spec/SCHEDULING.md, section "Block manager"' in text
    )
    assert "free queue [1] != unreferenced blocks [0, 1]" in text


def test_a_release_that_leaks_a_block_names_the_leak():
    """free() that drops the table but keeps the last block's reference: the failure is the
    pool-accounting rule (point 1) naming the leaked block, not a free-queue order mismatch."""
    before = PoolState(
        free_queue=[], ref_counts=[1, 1, 1], block_hashes=[None] * 3, cached={}, tables={"q": [0, 1, 2]}
    )
    after = PoolState(free_queue=[1, 0], ref_counts=[0, 0, 1], block_hashes=[None] * 3, cached={}, tables={})
    with pytest.raises(AssertionError, match=r"^\[spec rule pool-accounting: ") as info:
        check_release(before, after, [0, 1, 2], None, "q")
    assert "block 2: ref count 1 but held by 0 tables (leak or double free)" in str(info.value)


def test_the_innermost_rule_wins():
    @spec_rule("liveness")
    def outer():
        check_idle(
            PoolState(free_queue=[], ref_counts=[1], block_hashes=[None], cached={}, tables={"r": [0]}), 1
        )

    with pytest.raises(AssertionError, match=r"^\[spec rule idle-pool: ") as info:
        outer()
    assert str(info.value).count("[spec rule") == 1 and where("idle-pool") in str(info.value)


def test_unknown_rule_is_refused():
    with pytest.raises(KeyError):
        spec_rule("no-such-rule")


def test_a_missing_refusal_names_its_rule():
    """A rule test that expects a refusal (`pytest.raises(ValueError)`) and gets none fails with
    pytest's "DID NOT RAISE", not an AssertionError; that failure names the rule too (an outside
    backend whose trim(r, -1) clamped instead of refusing saw only "DID NOT RAISE <class
    'ValueError'>", with no pointer to the spec)."""

    @spec_rule("allocate-slots")
    def refuses():
        with pytest.raises(ValueError):
            pass

    with pytest.raises(pytest.fail.Exception) as info:
        refuses()
    text = str(info.value)
    assert text.startswith(where("allocate-slots")) and "DID NOT RAISE" in text, text
    assert str(info.value).count("[spec rule") == 1


# The checkers on hand-built steps: each must refuse the step that breaks its rule and pass the
# nearest one that keeps it (the lockstep rarely builds either, so a weakened checker passed it).

EMPTY_POOL = PoolState(free_queue=[0, 1], ref_counts=[0, 0], block_hashes=[None, None], cached={}, tables={})


def _decode(num_prompt: int, num_tokens: int, num_computed: int, drafts: int, rid: str = "a"):
    """A running request's fields as the checkers read them."""
    return SimpleNamespace(
        request_id=rid,
        num_prompt_tokens=num_prompt,
        num_tokens=num_tokens,
        num_computed_tokens=num_computed,
        spec_token_ids=[1] * drafts,
        num_tokens_with_spec=num_tokens + drafts,
    )


def _step(config, scheduled, running=("a",), preempted=(), swap_out=(), reqs=None) -> StepView:
    pre = Snapshot(list(running), [], reqs or {}, EMPTY_POOL)
    out = SchedulerOutput(scheduled=list(scheduled), preempted=list(preempted), swap_out=list(swap_out))
    return StepView(config, 1, pre, out, {}, EMPTY_POOL)


def test_check_chunking_lets_only_the_budget_cut_a_decode_at_the_prompt_s_end():
    """A running request whose chunk starts exactly at its prompt's end (its first decode, 3
    drafts) may be cut only by the budget: cut to 2 of its 4 with budget left is refused,
    naming what it holds; the same cut that spends the budget passes."""
    config = SchedulerConfig(
        max_num_batched_tokens=8, max_num_seqs=2, enable_chunked_prefill=True, long_prefill_token_threshold=1
    )
    a = _decode(num_prompt=4, num_tokens=5, num_computed=4, drafts=3)
    with pytest.raises(
        AssertionError, match=r"a: 2 of its 4 tokens .*\(1 known \+ 3 drafts\) with budget left"
    ):
        check_chunking(_step(config, [(a, 2)]))
    b = _decode(num_prompt=2, num_tokens=8, num_computed=2, drafts=0, rid="b")
    check_chunking(_step(config, [(b, 6), (a, 2)], running=("b", "a")))


def test_check_chunking_with_chunked_prefill_off_bounds_a_chunk_both_ways():
    """Chunked prefill off: every known token at once, drafts at most; fewer is refused naming
    the count, more than known + drafts refused too."""
    config = SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=2, enable_chunked_prefill=False)
    a = _decode(num_prompt=4, num_tokens=6, num_computed=2, drafts=2)
    check_chunking(_step(config, [(a, 4)]))
    check_chunking(_step(config, [(a, 6)]))
    with pytest.raises(AssertionError, match=r"only 3 of 4 scheduled"):
        check_chunking(_step(config, [(a, 3)]))
    with pytest.raises(AssertionError, match=r"only 7 of 4 scheduled"):
        check_chunking(_step(config, [(a, 7)]))


def test_check_preempted_wants_a_swap_victim_swapped_and_marked_out():
    """A swap victim is SWAPPED with swapped_out set (its blocks are on the host): either one
    alone is refused."""
    config = SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=2, preemption_mode="swap")
    reqs = {"a": ReqSnap(Status.RUNNING, 2, 3, 3, 0, ())}

    def victim(status, swapped_out):
        return SimpleNamespace(
            request_id="a", num_preemptions=1, status=status, swapped_out=swapped_out, num_computed_tokens=2
        )

    check_preempted(
        _step(config, [], preempted=[victim(Status.SWAPPED, True)], swap_out=[("a", [])], reqs=reqs)
    )
    for status, swapped_out in ((Status.SWAPPED, False), (Status.PREEMPTED, True)):
        with pytest.raises(AssertionError, match=r"a: swap victim is"):
            check_preempted(
                _step(config, [], preempted=[victim(status, swapped_out)], swap_out=[("a", [])], reqs=reqs)
            )


# The block-pool lockstep's own checks (test_block_manager.py): the first failure an outside
# block manager meets, so each names its rule, which side is which, and hashes as 8 hex digits.


def test_a_block_published_under_a_wrong_hash_names_the_rule_and_both_hashes():
    """A pool whose hash leaves out the parent publishes block 1 under its own tokens' hash: the
    failure printed 'block 1 of q became full but was not published' and raw 16-byte reprs of
    the whole pool, with no rule and not the hash it carries instead."""
    from enginespec.conformance.test_block_manager import check_published

    tokens, bs = [1, 2, 3, 4], 2
    chain, wrong = hash_request_blocks(tokens, bs), hash_request_blocks(tokens[2:], bs)[0]
    state = PoolState(
        free_queue=[],
        ref_counts=[1, 1],
        block_hashes=[chain[0], wrong],
        cached={chain[0]: 0, wrong: 1},
        tables={"q": [0, 1]},
    )
    bm = SimpleNamespace(enable_prefix_caching=True, block_size=bs, state=lambda: state)
    r = SimpleNamespace(request_id="q", token_ids=tokens, num_tokens=4, cache_key=())
    with pytest.raises(AssertionError) as info:
        check_published(bm, r, 0, 4)
    text = str(info.value)
    assert text.startswith(where("hash-chain")), text
    assert f"block 1 of q (block id 1) became full: its chain hash {chain[1].hex()[:8]}" in text, text
    assert f"it carries {wrong.hex()[:8]}" in text and "b'" not in text, text
    check_published(bm, r, 0, 2)  # block 0 is right


def test_hit_rates_that_differ_name_the_rule_and_which_side_is_which():
    """'hit_rate differs: [0.09, 0.11]' + 'assert False where False = all(<generator>)' said
    neither which number was the impl's nor what counts as a look-up."""
    from enginespec.conformance.test_block_manager import check_hit_rates

    with pytest.raises(AssertionError) as info:
        check_hit_rates(1 / 11, 1 / 9)
    text = str(info.value)
    assert text.startswith(where("find-cached-prefix")), text
    assert "hit_rate: impl 0.0909 != reference 0.1111" in text and "(num_tokens - 1) // block_size" in text
    assert "generator" not in text
    check_hit_rates(0.5, 0.5)


def test_a_pool_operation_whose_results_differ_says_which_is_the_impls():
    from enginespec.conformance.test_block_manager import agree

    with pytest.raises(
        AssertionError, match=r"^add\(q3\) returned: impl \(True, \[0\]\) != reference \(True, \[\]\)"
    ):
        agree("add(q3)", [(True, [0]), (True, [])])
    assert agree("free(q3)", [None, None]) is None


def test_a_wrong_cached_prefix_names_its_rule():
    """find_cached_prefix covering the last token's block failed with 'find_cached_prefix
    returned [0], expected []' and no pointer to the one-token-left rule."""
    from enginespec.conformance.test_block_manager import check_prefix

    tokens = [1, 2]
    state = PoolState(
        free_queue=[0], ref_counts=[0], block_hashes=[hash_request_blocks(tokens, 2)[0]], cached={}, tables={}
    )
    state.cached[state.block_hashes[0]] = 0
    r = SimpleNamespace(
        token_ids=tokens, num_tokens=2, cache_key=(), params=SimpleNamespace(prompt_logprobs=None)
    )
    with pytest.raises(AssertionError) as info:
        check_prefix(state, state, [0], r, 2, True)
    text = str(info.value)
    assert text.startswith(where("find-cached-prefix")) and "returned [0], expected []" in text, text
    check_prefix(state, state, [], r, 2, True)


def test_a_victim_taken_from_the_front_names_the_victim_rule():
    """A scheduler that preempts the FIRST running request (already scheduled this step) failed
    with 'a scheduled but Status.SWAPPED' under the step-limits rule (budget, max_num_seqs),
    which says nothing of victims; the schedule-order check names them, and the expected one."""
    config = SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=2, preemption_mode="swap")
    a = SimpleNamespace(**vars(_decode(4, 5, 4, 0, "a")), status=Status.SWAPPED)
    b = SimpleNamespace(**vars(_decode(4, 5, 4, 0, "b")), status=Status.RUNNING)
    v = _step(config, [(a, 1), (b, 1)], running=("a", "b"), preempted=[a])
    with pytest.raises(AssertionError) as info:
        check_schedule(v)
    text = str(info.value)
    assert text.startswith(where("schedule-order")), text
    assert "victims ['a'] are not the back of the running queue ['a', 'b'] (expected ['b']" in text, text
