"""The n-gram drafter against its definition (engine/spec_decode/ngram.py), recomputed by a
plain scan after every append; and the config's validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginespec.engine.spec_decode import Drafter, NgramDrafter, SpeculativeConfig
from enginespec.engine.spec_decode import config as sd_config


class _Req:
    def __init__(self, rid, tokens):
        self.request_id, self.token_ids = rid, list(tokens)


def scan(tokens: list[int], k: int, lo: int, hi: int, limit: int) -> list[int]:
    """The proposal rule by brute force: longest n first, earliest earlier start."""
    num = len(tokens)
    limit = min(k, limit)
    if limit < 1:
        return []
    for n in range(hi, lo - 1, -1):
        if n >= num:
            continue
        suffix = tokens[num - n :]
        for p in range(0, num - n):
            if tokens[p : p + n] == suffix:
                return tokens[p + n : min(p + n + limit, num)]
    return []


@given(
    prompt=st.lists(st.integers(0, 4), min_size=1, max_size=30),
    appended=st.lists(st.integers(0, 4), max_size=20),
    sizes=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    k=st.integers(1, 5),
    limit=st.integers(0, 6),
)
def test_incremental_index_proposes_what_a_scan_finds(prompt, appended, sizes, k, limit):
    lo, hi = sizes[0], sizes[0] + sizes[1]
    drafter = NgramDrafter(k, lo, hi)
    r = _Req("a", prompt)
    assert drafter.propose(r, len(r.token_ids), limit) == scan(r.token_ids, k, lo, hi, limit)
    for t in appended:
        r.token_ids.append(t)
        got = drafter.propose(r, len(r.token_ids), limit)
        assert got == scan(r.token_ids, k, lo, hi, limit), f"after {r.token_ids}"


def test_a_lagged_lookup_ignores_the_newest_token_and_a_reused_id_starts_afresh():
    drafter = NgramDrafter(3, 1, 2)
    r = _Req("a", [1, 2, 3, 1, 2, 99])  # 99: a placeholder, not yet real
    assert drafter.propose(r, 5, 3) == [3, 1, 2]  # suffix [1, 2] of the 5 real tokens
    other = _Req("a", [7, 8, 9])
    assert drafter.propose(other, 3, 3) == []  # a new request under the same id
    drafter.forget("a")
    assert len(drafter) == 0


def test_config_takes_vllms_names_and_refuses_bad_values():
    """vLLM V1's n-gram lengths: 5 and 5 when neither is given, and one given bound stands for
    both (vLLM 0.8 had made the min 1 when only the max was given; its later releases do not)."""
    cfg = SpeculativeConfig.of({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4})
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max, cfg.num_speculative_tokens) == (4, 4, 4)
    assert SpeculativeConfig.of({"prompt_lookup_min": 2}).prompt_lookup_max == 2
    neither = SpeculativeConfig.of({"method": "ngram", "num_speculative_tokens": 2})
    assert (
        (neither.prompt_lookup_min, neither.prompt_lookup_max)
        == (5, 5)
        == (sd_config.NGRAM_DEFAULT_LOOKUP,) * 2
    )
    one = SpeculativeConfig.of({"prompt_lookup_max": 1})  # one-token lookups: the smallest n-gram
    assert (one.prompt_lookup_min, one.prompt_lookup_max) == (1, 1)
    assert SpeculativeConfig.of(None) is None
    for bad, field in (
        ({"method": "eagle"}, "method"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ({"prompt_lookup_max": True}, "prompt_lookup_max"),
        ({"lookahead": 2}, "unknown"),
    ):
        with pytest.raises(ValueError, match=field):
            SpeculativeConfig.of(bad)


@pytest.mark.parametrize(
    "config",
    [
        {"model": "[ngram]", "num_speculative_tokens": 4, "prompt_lookup_max": 3},  # vLLM 0.8's docs
        {"model": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
        {"method": "[ngram]", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
        {"method": "ngram", "model": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
    ],
)
def test_vllms_ngram_spellings_are_the_ngram_method(config):
    """vLLM takes "ngram" or "[ngram]" (the old speculative_model value) as `model` or `method`
    for the n-gram drafter; they were read as a draft checkpoint directory named "ngram" (a
    CheckpointNotFound) or as an unknown method."""
    cfg = SpeculativeConfig.of(config)
    assert (cfg.method, cfg.model) == ("ngram", None)
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max, cfg.num_speculative_tokens) == (3, 3, 4)
    with pytest.raises(ValueError, match="model"):  # a real draft path is still no ngram field
        SpeculativeConfig.of({"method": "[ngram]", "model": "/ckpt/draft"})


def test_first_to_propose_stops_at_the_first_request_with_a_draft():
    drafter = NgramDrafter(3, 1, 2)
    reqs = [_Req("none", [5, 6, 7]), _Req("loop", [1, 2, 1, 2]), _Req("later", [3, 4, 3, 4])]
    assert drafter.first_to_propose(reqs, [3, 4, 4]) == 1
    assert len(drafter) == 2, "the request after the first hit was never looked up"
    assert drafter.first_to_propose(reqs[:1], [3]) is None
    assert Drafter.first_to_propose(drafter, reqs, [3, 4, 4]) == 1  # the base class's loop
