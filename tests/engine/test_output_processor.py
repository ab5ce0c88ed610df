"""OutputProcessor's own rules, checked without an engine: the per-tokenizer cache of token
texts, and the text of a step that ends on a stop token."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from enginespec.engine.detokenizer import IncrementalDetokenizer
from enginespec.engine.output_processor import OutputProcessor, Parent, Sample
from enginespec.outputs import Logprob
from enginespec.spec import SamplingParams, Status, UpdateOutput
from tests.engine.test_detokenizer import byte_bpe


class CountingTokenizer:
    """decode([id]) is `prefix` + the id; each call is recorded."""

    def __init__(self, prefix: str):
        self.prefix, self.calls = prefix, []

    def decode(self, ids):
        self.calls.append(list(ids))
        return "".join(f"{self.prefix}{i}" for i in ids)


def test_token_texts_are_decoded_once_per_id_and_per_tokenizer():
    """name_tokens caches a token's text for the tokenizer that decoded it: the same id named
    again under that tokenizer is not decoded again, and under another tokenizer it takes that
    tokenizer's text (never the first one's cached text)."""
    processor = OutputProcessor(lambda *a: None, placeholder_id=96)
    first, second = CountingTokenizer("a"), CountingTokenizer("b")
    entries = [{5: Logprob(-0.5, 1), 7: Logprob(-1.5, 2)} for _ in range(3)]
    processor.name_tokens(entries[0], first)
    processor.name_tokens(entries[1], first)
    assert [lp.decoded_token for lp in entries[1].values()] == ["a5", "a7"]
    assert first.calls == [[5], [7]]  # once per id
    processor.name_tokens(entries[2], second)
    assert [lp.decoded_token for lp in entries[2].values()] == ["b5", "b7"]
    assert second.calls == [[5], [7]]


def ids_ending_in_a_stop_token():
    """The byte BPE tokenizer, 'hello world, stop' as several ids then the id of '.', and that id
    (the stop token of the tests below)."""
    tok = byte_bpe()
    (period,) = tok.encode(".")
    return tok, tok.encode("hello world, stop") + [period], period


#: include_stop_str_in_output -> the text of the ids above
STOP_TOKEN_TEXTS = [(False, "hello world, stop"), (True, "hello world, stop.")]


@pytest.mark.parametrize("include, want", STOP_TOKEN_TEXTS)
def test_a_stop_token_in_a_step_of_several_ids_hides_only_its_own_text(include, want):
    """A step that appends several ids at once (speculative decoding accepts a run of drafts)
    and ends on a stop token: the output's text is that of every id but the stop token, and of
    all of them with include_stop_str_in_output (vLLM's rule); its ids are all shown. One id
    more or less cut would drop a word the model produced, or show the stop token's text."""
    tok, ids, period = ids_ending_in_a_stop_token()
    params = SamplingParams(max_tokens=16, stop_token_ids=[period], include_stop_str_in_output=include)
    request = SimpleNamespace(
        request_id="r",
        params=params,
        output_token_ids=ids,
        status=Status.FINISHED_STOPPED,
        stop_reason=period,
    )
    sample = Sample(0, request, detokenizer=IncrementalDetokenizer(tok, [1], params))
    parent = Parent("r", None, [1], [sample])
    processor = OutputProcessor(lambda *a: None, placeholder_id=-1)
    processor.apply_update(UpdateOutput({"r": list(ids)}, [request]), {"r": (parent, sample)}.get, {}, {})
    out = processor.make_output(parent).outputs[0]
    assert (out.text, out.token_ids, out.finish_reason, out.stop_reason) == (want, ids, "stop", period)
