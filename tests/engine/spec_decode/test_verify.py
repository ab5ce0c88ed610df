"""Rejection sampling of draft tokens is exact: over many independent copies of one request,
the first token drawn under speculation has the sampler's own distribution p0 (every edit,
temperature and cut applied), and the second, given the first draft was taken, has p1, the
distribution after that draft was appended (penalties and min_tokens see it). Chi-square tests
on a tiny vocabulary; the seeds are fixed, so a run is reproducible. Greedy rows take the
longest prefix of drafts equal to the argmax, then the argmax."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from enginespec.engine.spec_decode.verify import logits_rows, verify
from enginespec.sample.sampler import Sampler
from enginespec.spec import SamplingParams
from tests.sample.test_sampler import chi2_sf

VOCAB = 8
COPIES = 2000


class _Req:
    def __init__(self, params, output=(), prompt=(1, 2, 3)):
        self.request_id, self.params, self.eos_token_id = "r", params, 7
        self.prompt_token_ids, self.output_token_ids = list(prompt), list(output)
        self.num_output_tokens = len(output)


def _chi2(samples: list[int], probs: torch.Tensor) -> float:
    """p-value of the samples against probs (bins with expected count < 5 pooled into one;
    probability-0 tokens must never be drawn)."""
    counts = Counter(samples)
    expected = probs.double() * len(samples)
    big = [t for t in range(VOCAB) if expected[t] >= 5]
    small = [t for t in range(VOCAB) if 0 < expected[t] < 5]
    obs = [counts.get(t, 0) for t in big]
    exp = [float(expected[t]) for t in big]
    if small and sum(expected[t] for t in small) > 0:
        obs.append(sum(counts.get(t, 0) for t in small))
        exp.append(float(sum(expected[t] for t in small)))
    assert sum(counts.get(t, 0) for t in range(VOCAB) if probs[t] == 0) == 0, "drew a token of probability 0"
    scaled = [e * sum(obs) / sum(exp) for e in exp]
    # Pearson's statistic on len(obs) - 1 degrees of freedom, as scipy.stats.chisquare; scipy is
    # no dependency of the test extra, so the p-value comes from test_sampler's chi2_sf.
    return chi2_sf(sum((o - e) ** 2 / e for o, e in zip(obs, scaled)), len(obs) - 1)


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=4),
    SamplingParams(temperature=1.3, top_p=0.8, min_p=0.05),
    SamplingParams(temperature=1.0, repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.3),
    SamplingParams(temperature=0.9, min_tokens=2, stop_token_ids=(3,), logit_bias={5: 1.0}),
]


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: repr(p)[:40])
def test_rejection_sampling_has_the_target_distribution(params):
    torch.manual_seed(0)
    rows = torch.randn(3, VOCAB) * 1.5
    sampler = Sampler(VOCAB)
    base = _Req(params, output=(4,))
    p0 = sampler.probs(rows[:1], [base])[0]
    d0 = int(torch.argmax(p0.index_fill(0, torch.tensor([4]), 0.0)))  # likely, new to the output
    drafts = [d0, int(torch.argmax(p0))]
    p1 = sampler.probs(rows[1:2], [_Req(params, output=(4, d0))])[0]
    gen = torch.Generator().manual_seed(1)
    result = verify(sampler, rows.repeat(COPIES, 1), [base] * COPIES, [drafts] * COPIES, gen)
    first = [t[0] for t in result.token_ids]
    second = [t[1] for t in result.token_ids if t[0] == d0]
    assert all(len(t) == a + 1 for t, a in zip(result.token_ids, result.num_accepted))
    assert _chi2(first, p0) > 1e-4, (Counter(first), p0)
    assert len(second) > 100 and _chi2(second, p1) > 1e-4, (Counter(second), p1)


def test_greedy_rows_accept_the_argmax_prefix():
    rows = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])  # argmax 1, 0, 2
    sampler = Sampler(3)
    greedy = SamplingParams(temperature=0.0)
    reqs = [_Req(greedy, output=(1,)) for _ in range(3)]
    drafts = [[1, 0], [1, 2], [2, 0]]
    logits = torch.cat([rows, rows, rows])
    result = verify(sampler, logits, reqs, drafts, torch.Generator())
    assert result.token_ids == [[1, 0, 2], [1, 0], [1]]
    assert result.num_accepted == [2, 1, 0]


def test_logits_rows_cover_each_drafted_requests_last_positions():
    assert logits_rows([4, 5, 9], [2, 0, 3]) == [2, 3, 4, 5, 6, 7, 8, 9]
