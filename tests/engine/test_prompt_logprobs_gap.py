"""OutputProcessor's prompt_logprobs list: entry i for prompt token i, never shifted by a gap."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from enginespec.engine.output_processor import (
    OutputProcessor,
    Parent,
    PromptLogprobsError,
    Sample,
    store_prompt_logprobs,
)
from enginespec.outputs import Logprob
from enginespec.spec import SamplingParams, UpdateOutput


def _parent(found: dict) -> Parent:
    request = SimpleNamespace(output_token_ids=[], params=SamplingParams(prompt_logprobs=0))
    return Parent("req-7", None, [10, 11, 12, 13, 14], [Sample(0, request)], found)


def _entry(token: int) -> dict:
    return {token: Logprob(-1.0, 1)}


def test_make_output_refuses_a_gap_instead_of_shifting_the_list():
    """Positions 0, 1 and 3 but not 2 (prompt token 3's entry lost): the list used to skip the
    gap, so token 4's entry showed at index 3, against token 3, and the list was one short."""
    parent = _parent({0: _entry(11), 1: _entry(12), 3: _entry(14)})
    with pytest.raises(PromptLogprobsError, match=r"request 'req-7'.* no entry for prompt token 3 "):
        OutputProcessor(lambda *a: None, placeholder_id=96).make_output(parent)


def test_make_output_lists_a_contiguous_prefix_in_prompt_order():
    """A prompt still in prefill shows the entries it has, each at its token's index."""
    parent = _parent({1: _entry(12), 0: _entry(11)})
    out = OutputProcessor(lambda *a: None, placeholder_id=96).make_output(parent)
    assert out.prompt_logprobs == [None, _entry(11), _entry(12)]
    assert [list(e) for e in out.prompt_logprobs[1:]] == [[11], [12]]


def test_store_refuses_an_entry_past_a_gap_and_accepts_a_recompute_from_zero():
    parent = _parent({})
    store_prompt_logprobs(parent, [0, 1], [_entry(11), _entry(12)])
    store_prompt_logprobs(parent, [0, 1, 2], [_entry(11), _entry(12), _entry(13)])  # recompute
    with pytest.raises(PromptLogprobsError, match="no entry for prompt token 4 .*token 5 came first"):
        store_prompt_logprobs(parent, [4], [_entry(15)])
    assert sorted(parent.prompt_logprobs) == [0, 1, 2]


def test_a_first_output_token_with_prompt_entries_missing_states_both_counts():
    """The first sample's first token means the whole prompt was computed: a prompt of 5 tokens
    owes 4 entries. With 2 stored, the error names the first missing token (3), the count
    stored (2) and the count owed (4), never another count."""
    parent = _parent({0: _entry(11), 1: _entry(12)})
    processor = OutputProcessor(lambda *a: None, placeholder_id=96)
    update = UpdateOutput(new_token_ids={"internal-7": [42]})
    expected = (
        "request 'req-7': prompt_logprobs has no entry for prompt token 3 (prompt_logprobs[3]); "
        "its first sample has output tokens, but only 2 of the prompt's 4 entries were stored"
    )
    with pytest.raises(PromptLogprobsError) as raised:
        processor.apply_update(update, lambda rid: (parent, parent.samples[0]), {}, {})
    assert str(raised.value) == expected
