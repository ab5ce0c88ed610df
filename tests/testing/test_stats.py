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
