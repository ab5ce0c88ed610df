"""Property-test failures name the spec rule and where spec/SCHEDULING.md states it."""

from __future__ import annotations

import pytest

from enginespec.conformance.invariants import check_idle, check_pool, check_release
from enginespec.conformance.rules import RULES, headings, spec_rule, where
from enginespec.spec import PoolState


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
