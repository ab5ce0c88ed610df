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


def test_a_frame_costs_the_same_whatever_the_stop_strings_length():
    """The held-back tail of a choice's text is followed as the text grows: it was searched
    again for every frame, one str.endswith per length it could have, so the front end spent
    the stop strings' length times the text's on each frame of each stream (64 stop strings of
    4,000 chars: about 60 ms a frame, every client's event loop waiting). A frame now takes as
    many builtin calls with stop strings of 4,000 chars as with stop strings of 4, and holds
    back the same text."""
    from enginespec.entrypoints.openai.serving import _delta_choice
    from tests.engine.test_detokenizer import builtin_calls
    from tests.entrypoints.client_helpers import scripted_output

    text = "hello world, abc. " * 120 + "a"
    costs = {}
    for length in (4, 4000):
        stops = tuple("a" * (length - 1) + end for end in "ST")
        call = _Call(
            "completion", "id-1", "m", CompletionRequest(prompt="p", stream=True), [("p", [1])], stops
        )
        call.index_of["r"] = 0
        sent = ""
        for end in (len(text) - 1, len(text)):
            out = scripted_output(text[:end])
            calls = builtin_calls(_delta_choice, None, call, out, out.outputs[0])
            sent = call.choices[0].num_chars
        costs[length] = (calls, sent)
    assert costs[4000] == costs[4] and costs[4][1] == len(text) - 1, costs
