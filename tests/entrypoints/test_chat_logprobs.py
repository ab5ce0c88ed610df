"""A chat choice's logprobs list the k best entries of each position, or with top_logprobs=-1
(SamplingParams.logprobs=-1, the whole vocabulary) every entry the engine returned."""

from __future__ import annotations

import pytest

from enginespec.entrypoints.openai.serving import _chat_logprobs
from enginespec.outputs import Logprob

ENTRY = {t: Logprob(-0.5 * t, t + 1, f"t{t}") for t in range(6)}  # best first: t0, t1, ...


@pytest.mark.parametrize("k, want", [(0, 0), (2, 2), (-1, 6)])
def test_top_logprobs_keeps_k_entries_and_minus_one_keeps_all(k, want):
    (choice,) = _chat_logprobs(None, [3], [ENTRY], k)["content"]
    assert choice["token"] == "t3" and choice["logprob"] == -1.5
    assert [t["token"] for t in choice["top_logprobs"]] == [f"t{t}" for t in range(want)]
