"""conformance/soak.py's features mix, small: one pressured configuration (swap, async
scheduling, n-gram speculation) over two prompts, every FEATURE_VARIANT drawn; the checks pass
on the engine as it is, and each variant's promise is checked (a broken one is counted)."""

from __future__ import annotations

import random

import pytest

from enginespec.conformance import soak
from enginespec.spec import load_impl

pytest.importorskip("xgrammar")
pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_the_features_mix_under_pressure_matches_its_reference_and_leaks_nothing():
    impl = load_impl("reference")
    prompts = soak._prompts(random.Random(5), 2)
    expected = soak.unpressured_features(impl, prompts, 12)
    figures = soak.SoakFigures()
    soak.soak_config(
        impl, figures, prompts, expected, num_requests=48, seed=5, mix="features",
        preemption_mode="swap", async_scheduling=True, speculative_config=soak.NGRAM,
    )  # fmt: skip
    assert figures.preemptions > 0
    assert (figures.blocks_leaked, figures.state_leaked) == (0, 0)
    assert (figures.wrong_tokens, figures.feature_violations) == (0, 0)


def test_a_broken_promise_is_counted():
    """The checks are not vacuous: a banned word, a constrained output its grammar refuses, a
    whole-vocabulary logprob entry cut short."""
    from enginespec.outputs import CompletionOutput

    banned = CompletionOutput(0, text="x!y", token_ids=[5, 6, 7], finish_reason="length")
    assert soak._feature_violations(banned, soak.FEATURE_VARIANTS[1], None) == 1
    cut = CompletionOutput(0, token_ids=[5], finish_reason="length", logprobs=[{5: -1.0}])
    assert soak._feature_violations(cut, {"logprobs": -1}, None) == 1
    assert not soak._matches(soak._so(regex=soak._REGEX), "ab12")
