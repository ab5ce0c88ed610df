"""RequestStream: the server's front end decodes a sample without stop strings with the
request's own text settings, as the engine would."""

from __future__ import annotations

import pytest

from enginespec.engine.core_messages import NewRequest
from enginespec.entrypoints.openai.request_stream import RequestStream
from enginespec.spec import SamplingParams
from tests.engine.test_detokenizer import byte_bpe
from tests.engine.test_output_processor import STOP_TOKEN_TEXTS, ids_ending_in_a_stop_token


@pytest.mark.parametrize(
    "params, want",
    [
        (SamplingParams(), "ab"),
        (SamplingParams(skip_special_tokens=False), "ab<eos>"),
        (SamplingParams(detokenize=False), ""),
    ],
    ids=["defaults", "special-tokens-kept", "no-detokenize"],
)
def test_front_end_text_follows_the_requests_settings(params, want):
    tok = byte_bpe()
    ids = tok.encode("ab") + [tok.eos_token_id]
    stream = RequestStream(NewRequest("r", None, [1], params), sink=None, tokenizer=tok, arrival=0.0)
    stream.apply(("r", 0, ids, None, None, "length", None, None, None, None))
    out = stream.output.outputs[0]
    assert (out.token_ids, out.text, out.finish_reason) == (ids, want, "length")


@pytest.mark.parametrize("include, want", STOP_TOKEN_TEXTS)
def test_front_end_hides_only_the_stop_token_of_a_delta_of_several_ids(include, want):
    """A delta of several ids (a speculative step) ending in the stop token that finished the
    sample: the front end's text is that of every id but that token (of all of them with
    include_stop_str_in_output), the same text the engine gives a sample it decodes."""
    tok, ids, period = ids_ending_in_a_stop_token()
    params = SamplingParams(stop_token_ids=[period], include_stop_str_in_output=include)
    stream = RequestStream(NewRequest("r", None, [1], params), sink=None, tokenizer=tok, arrival=0.0)
    stream.apply(("r", 0, ids, None, None, "stop", period, None, None, None))
    out = stream.output.outputs[0]
    assert (out.token_ids, out.text, out.finish_reason) == (ids, want, "stop")
