"""AdaptiveDrafting (engine/spec_decode/adaptive.py) against its rules: drafts allowed after
full, partial and no acceptance; back-off steps on multiples of a doubling period, shared by
every request; thinned look-ups after a streak of empty proposals; reset and forget."""

from __future__ import annotations

from enginespec.engine.spec_decode.adaptive import EMPTY_PERIOD, EMPTY_STREAK, MAX_LEVEL, AdaptiveDrafting


def test_acceptance_sets_the_next_allowance():
    a = AdaptiveDrafting(5)
    assert a.allowed("r", 1) == 5 and len(a) == 0
    a.observe("r", 5, 2, step=1)  # 2 of 5 right: one more than that next
    assert a.allowed("r", 2) == 3
    a.observe("r", 3, 3, step=2)  # all right: twice as many, at most k
    assert a.allowed("r", 3) == 5 and len(a) == 0  # back to the default state
    a.observe("r", 0, 0, step=3)  # nothing verified: no change
    assert a.allowed("r", 4) == 5 and a.misses("r") == 0


def test_misses_wait_for_multiples_of_a_doubling_period_then_probe_with_one_draft():
    a = AdaptiveDrafting(4)
    step, probes = 5, []
    for _ in range(MAX_LEVEL + 2):
        a.miss("r", step)
        step = next(s for s in range(step + 1, step + 1000) if a.allowed("r", s))
        assert a.allowed("r", step) == 1
        probes.append(step)
    assert probes == [6, 8, 16, 32, 64, 128, 192, 256]  # the period stops doubling at 64
    a.observe("r", 1, 1, step)
    assert (a.misses("r"), a.allowed("r", step + 1)) == (0, 2)


def test_requests_missing_at_different_steps_probe_on_the_same_steps():
    a = AdaptiveDrafting(4)
    for rid, step in (("x", 1), ("y", 2), ("z", 3)):
        for _ in range(3):  # three misses in a row: period 8
            a.miss(rid, step)
    assert [s for s in range(1, 17) if a.allowed("x", s)] == [8, 9, 10, 11, 12, 13, 14, 15, 16]
    assert all(a.allowed(r, s) == a.allowed("x", s) for r in "yz" for s in range(1, 17))


def test_an_empty_streak_thins_look_ups_until_a_verification():
    a = AdaptiveDrafting(4)
    for step in range(1, EMPTY_STREAK + 1):
        assert a.allowed("r", step) == 4
        a.empty("r", step)
    looked = []
    for step in range(EMPTY_STREAK + 1, EMPTY_STREAK + 13):
        if a.allowed("r", step):  # looked up, nothing found again
            looked.append(step)
            a.empty("r", step)
    assert looked and all(s % EMPTY_PERIOD == 0 for s in looked) and len(looked) == 12 // EMPTY_PERIOD
    a.observe("r", 4, 1, step=looked[0])  # drafts again: the streak is over
    assert a.allowed("r", looked[0] + 1) == 2
    a.forget("r")
    assert len(a) == 0 and a.allowed("r", 1) == 4
