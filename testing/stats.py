"""Goodness-of-fit arithmetic for the statistical tests, without scipy (not a test dependency).

`chi2_sf(stat, dof)` is the chi-square survival function (scipy's when it is installed; else
the regularised upper incomplete gamma Q(dof / 2, stat / 2), accurate to ~1e-12).
`pearson(counts, probs)` is Pearson's test of observed counts of outcomes (any hashable keys:
token ids, tuples of ids) against their exact probabilities, with the cells pooled so that each
bin expects at least `minimum` draws (so wide supports keep their power instead of breaking the
chi-square approximation).
"""

from __future__ import annotations

import math
from typing import Hashable, Mapping, NamedTuple


def gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x): a series for P when x < a + 1, else a Lentz
    continued fraction for Q."""
    if x <= 0:
        return 1.0
    log_pre = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > 1e-15 * abs(total):
            n += 1
            term *= x / n
            total += term
        return 1.0 - total * math.exp(log_pre)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h * math.exp(log_pre)


def chi2_sf(stat: float, dof: int) -> float:
    """P(X >= stat) for X chi-square with `dof` degrees of freedom."""
    try:
        from scipy.stats import chi2
    except ImportError:
        return gamma_q(dof / 2, stat / 2)
    return float(chi2.sf(stat, dof))


class Fit(NamedTuple):
    """Pearson's test of a sample against a distribution. p: the p-value (0.0 when an outcome
    of probability 0 was drawn); outside: how many draws fell on outcomes of probability 0;
    tv: the total variation distance between the sample's frequencies and the probabilities."""

    p: float
    stat: float
    dof: int
    outside: int
    tv: float


def pearson(counts: Mapping[Hashable, int], probs: Mapping[Hashable, float], minimum: float = 5.0) -> Fit:
    """Pearson's chi-square of `counts` against `probs` (outcome -> probability, summing to 1;
    outcomes missing from it have probability 0). Cells are taken from the likeliest down and
    pooled until each bin expects >= `minimum` draws (the rest joins the last bin)."""
    n = sum(counts.values())
    outside = sum(c for key, c in counts.items() if probs.get(key, 0.0) <= 0.0)
    keys = set(probs) | set(counts)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - probs.get(k, 0.0)) for k in keys) if n else 0.0
    expected, observed, acc_e, acc_o = [], [], 0.0, 0
    for key in sorted((k for k in probs if probs[k] > 0), key=lambda k: -probs[k]):
        acc_e, acc_o = acc_e + probs[key] * n, acc_o + counts.get(key, 0)
        if acc_e >= minimum:
            expected.append(acc_e)
            observed.append(acc_o)
            acc_e, acc_o = 0.0, 0
    if expected:
        expected[-1] += acc_e
        observed[-1] += acc_o
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    dof = len(expected) - 1
    if outside:
        return Fit(0.0, math.inf, dof, outside, tv)
    return Fit(chi2_sf(stat, dof) if dof > 0 else 1.0, stat, dof, 0, tv)
