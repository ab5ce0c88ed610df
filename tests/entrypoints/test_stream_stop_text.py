"""The server's stream and stop strings: a frame holds back a tail of the text that may still
grow into a stop string only when that stop string would be cut (vLLM's rule); the frames'
texts concatenate to the full body's."""

from __future__ import annotations

import json

import pytest

from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from enginespec.entrypoints.openai.serving import _Call
from tests.entrypoints.client_helpers import stream_then_full


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize(
    "include, want", [(False, ["a", "b", "", "", "STx"]), (True, ["a", "b", "S", "T", "x"])]
)
def test_a_frame_holds_a_possible_stop_string_back_only_when_it_would_be_cut(kind, include, want):
    """Text growing a character (and a token) a step, "abSTx", with stop "STOP": "S" and "T" may
    start it, so their frames carry their tokens but not their text, which waits for the "x"
    that rules the stop string out; with include_stop_str_in_output a stop string stays in the
    text, with all before it, so nothing waits. They waited either way."""
    fields = dict(stop=["STOP"], include_stop_str_in_output=include)
    if kind == "completion":
        body = CompletionRequest(prompt="p", stream=True, **fields)
    else:
        body = ChatCompletionRequest(messages=[{"role": "user", "content": "p"}], stream=True, **fields)
    call = _Call(kind, "id-1", "m", body, [("p", [1])], ("STOP",))
    call.index_of["r"] = 0
    choices, full = stream_then_full(call, "abSTx")
    choices = [json.loads(c) if isinstance(c, str) else c for c in choices]  # the hot path's JSON
    if kind == "completion":
        texts, whole = [c["text"] for c in choices], full["text"]
    else:
        texts, whole = [c["delta"].get("content", "") for c in choices], full["message"]["content"]
    assert texts == want and "".join(texts) == whole == "abSTx"
