"""testing/stats.py: Pearson's test over pooled cells, as the statistical tests read it."""

from __future__ import annotations

import math

from enginespec.testing.stats import chi2_sf, gamma_q, pearson


def test_chi2_sf_without_scipy_is_the_regularised_gamma():
    # k = 2: exp(-x / 2) exactly
    for x in (0.5, 3.0, 40.0):
        assert math.isclose(gamma_q(1.0, x / 2), math.exp(-x / 2), rel_tol=1e-9)
        assert math.isclose(chi2_sf(x, 2), math.exp(-x / 2), rel_tol=1e-9)


def test_pearson_pools_rare_cells_into_bins_expecting_five_draws():
    probs = {"a": 0.5, "b": 0.3, "c": 0.19, "d": 0.005, "e": 0.005}
    fit = pearson({"a": 50, "b": 30, "c": 19, "d": 1}, probs)
    assert fit.dof == 2 and fit.outside == 0 and fit.p > 0.99  # c, d, e pooled: 19.99 expected
    assert math.isclose(fit.tv, 0.005, abs_tol=1e-12)


def test_pearson_fails_a_draw_of_probability_zero_and_a_skewed_sample():
    probs = {0: 0.5, 1: 0.5}
    assert pearson({0: 500, 1: 499, 2: 1}, probs).outside == 1
    assert pearson({0: 500, 1: 499, 2: 1}, probs).p == 0.0
    skewed = pearson({0: 600, 1: 400}, probs)
    assert skewed.outside == 0 and skewed.p < 1e-9 and math.isclose(skewed.stat, 40.0)


def _q_closed_form(a: float, x: float) -> float:
    """Q(a, x) where it has a closed form: a a positive integer n (e^-x times the first n terms
    of e^x's series) or n + 1/2 (erfc(sqrt x) plus the terms raised from it)."""
    if a == int(a):
        return math.exp(-x) * sum(x**k / math.factorial(k) for k in range(int(a)))
    q, term = math.erfc(math.sqrt(x)), math.exp(-x) / math.sqrt(math.pi * x)
    for k in range(int(a)):  # Q(b + 1, x) = Q(b, x) + x^b e^-x / Gamma(b + 1)
        term *= x / (k + 0.5)
        q += term
    return q


def test_gamma_q_is_the_closed_form_on_both_of_its_branches():
    """The series (x < a + 1) and the continued fraction (beyond) against Q's closed forms for
    integer and half-integer a (a = 1, the only case the test above reads, ends the fraction at
    its first term): accurate to 1e-10 relative, and 1 at x <= 0."""
    for a in (0.5, 1.5, 2.0, 2.5, 3.0, 4.5, 6.0):
        assert gamma_q(a, 0.0) == 1.0 and gamma_q(a, -1.0) == 1.0
        for x in (0.01, 0.3, 1.0, 2.0, 3.4, 5.0, 7.5, 12.0, 30.0, 80.0):
            assert math.isclose(gamma_q(a, x), _q_closed_form(a, x), rel_tol=1e-10), (a, x)


def test_chi2_sf_falls_back_to_gamma_q_without_scipy(monkeypatch):
    """Without scipy (not a test dependency) chi2_sf(stat, k) is Q(k / 2, stat / 2): the
    closed forms for k = 1 (erfc(sqrt(stat / 2))), 2, 3 and 4."""
    import sys

    monkeypatch.setitem(sys.modules, "scipy.stats", None)  # `from scipy.stats import chi2` fails
    for k in (1, 2, 3, 4):
        for stat in (0.5, 3.0, 9.0, 40.0):
            assert math.isclose(chi2_sf(stat, k), _q_closed_form(k / 2, stat / 2), rel_tol=1e-10), (k, stat)


def test_pearson_closes_a_bin_at_exactly_the_minimum_and_a_single_bin_has_p_1():
    """A cell expecting exactly `minimum` draws is a bin of its own (>=); one bin is dof 0 and
    p 1.0 (no test); the total variation counts an outcome never drawn as 0 draws."""
    fit = pearson({"a": 15, "b": 5}, {"a": 0.75, "b": 0.25})  # expects 15.0 and 5.0 exactly
    assert fit.dof == 1 and math.isclose(fit.stat, 0.0) and fit.p == 1.0
    assert pearson({"a": 19, "b": 1}, {"a": 0.75, "b": 0.25}).p < 0.05
    one = pearson({0: 10}, {0: 1.0})
    assert one.dof == 0 and one.p == 1.0 and one.tv == 0.0
    assert math.isclose(pearson({"a": 10}, {"a": 0.5, "b": 0.5}).tv, 0.5)
