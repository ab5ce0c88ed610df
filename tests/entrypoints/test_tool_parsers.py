"""The llama3_json and mistral tool-call formats (entrypoints/openai/tool_parsers.py): whole
replies against the module docstring's rule, and any cut of a reply into stream deltas (every
split point, a character a step, random cuts) against the whole."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginespec.entrypoints.openai.tool_calls import ToolCall
from enginespec.entrypoints.openai.tool_parsers import (
    PARSERS,
    PYTHON_TAG,
    TOOL_CALLS,
    Llama3JsonStream,
    MistralStream,
    json_end,
    new_stream,
    tool_call_id,
)

F = ToolCall("get_weather", '{"city": "Zürich", "days": 2}')
G = ToolCall("now", "{}")
_F_PARAMS = '{"name": "get_weather", "parameters": {"city": "Zürich", "days": 2}}'
_G_ARGS = '{"name": "now", "arguments": {}}'


def whole(parser: str, text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole reply: one final feed, as serving._message reads it."""
    return new_stream(parser).feed(text, final=True)


def streamed(parser: str, text: str, cuts) -> tuple[str, list[ToolCall]]:
    stream = new_stream(parser)
    bounds = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
    parts = [stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    parts.append(stream.feed("", final=True))
    return "".join(p[0] for p in parts), [call for p in parts for call in p[1]]


LLAMA_CASES = [
    # (reply, content, calls)
    (_F_PARAMS, "", [F]),
    (f"  {_F_PARAMS}\n", "", [F]),
    (f"{PYTHON_TAG}{_F_PARAMS}", "", [F]),
    (f"{_F_PARAMS}; {_G_ARGS}", "", [F, G]),
    (f"{PYTHON_TAG}{_F_PARAMS};{_G_ARGS}\n{_G_ARGS}", "", [F, G, G]),
    (f"Let me look.\n{PYTHON_TAG}{_F_PARAMS}", "Let me look.", [F]),
    (f"{_F_PARAMS}\nDone.", "Done.", [F]),
    # not calls: the reply as written
    ("It is sunny.", "It is sunny.", []),
    (f"Here: {_F_PARAMS}", f"Here: {_F_PARAMS}", []),  # not at the start, no tag
    (
        '{"name": "get_weather", "parameters": {"city": ',
        '{"name": "get_weather", "parameters": {"city": ',
        [],
    ),
    ("{bad json}", "{bad json}", []),
    ('{"answer": 42}', '{"answer": 42}', []),
    ('{"name": "f", "parameters": [1]}', '{"name": "f", "parameters": [1]}', []),
    (f" {PYTHON_TAG}brave_search.call(query='x')", f" {PYTHON_TAG}brave_search.call(query='x')", []),
    # a bad call after good ones: the good ones stay calls, the rest content as written
    (f"{_F_PARAMS}; {{bad}}", "; {bad}", [F]),
]


@pytest.mark.parametrize(("text", "content", "calls"), LLAMA_CASES)
def test_llama3_json_whole_replies(text, content, calls):
    assert whole("llama3_json", text) == (content, calls)


def test_llama3_json_prefers_arguments_and_keeps_non_ascii():
    (call,) = whole("llama3_json", '{"name": "f", "arguments": {"x": "é"}, "parameters": {"y": 1}}')[1]
    assert call == ToolCall("f", '{"x": "é"}') and json.loads(call.arguments) == {"x": "é"}


MISTRAL_CASES = [
    (f'{TOOL_CALLS} [{{"name": "get_weather", "arguments": {{"city": "Zürich", "days": 2}}}}]', "", [F]),
    (f"{TOOL_CALLS}[{_G_ARGS}, {_G_ARGS}]", "", [G, G]),
    (f"{TOOL_CALLS}{_G_ARGS}", "", [G]),  # a lone object
    (f'{TOOL_CALLS}get_weather{{"city": "Zürich", "days": 2}}{TOOL_CALLS}now{{}}', "", [F, G]),
    (f'{TOOL_CALLS}get_weather[ARGS]{{"city": "Zürich", "days": 2}}', "", [F]),
    (f"Checking.\n\n{TOOL_CALLS}[{_G_ARGS}]\n", "Checking.", [G]),
    (f"{TOOL_CALLS}[{_G_ARGS}] Done.", "Done.", [G]),
    # not calls: the reply as written
    ("It is sunny.", "It is sunny.", []),
    (_G_ARGS, _G_ARGS, []),  # no tag
    (f"a {TOOL_CALLS}[{{bad}}]", f"a {TOOL_CALLS}[{{bad}}]", []),
    (f"{TOOL_CALLS}[]", f"{TOOL_CALLS}[]", []),
    (f'{TOOL_CALLS}[{{"name": 3}}]', f'{TOOL_CALLS}[{{"name": 3}}]', []),
    (f'{TOOL_CALLS}[{_G_ARGS}, {{"name": "x"', f'{TOOL_CALLS}[{_G_ARGS}, {{"name": "x"', []),  # cut off
    (f"{TOOL_CALLS}now", f"{TOOL_CALLS}now", []),
    (f"{TOOL_CALLS}now[ARGS][1]", f"{TOOL_CALLS}now[ARGS][1]", []),
    (f"{TOOL_CALLS} now {{}}", f"{TOOL_CALLS} now {{}}", []),
    # a bad call after a good one
    (f"{TOOL_CALLS}now{{}} {TOOL_CALLS}{{bad}}", f"{TOOL_CALLS}{{bad}}", [G]),
]


@pytest.mark.parametrize(("text", "content", "calls"), MISTRAL_CASES)
def test_mistral_whole_replies(text, content, calls):
    assert whole("mistral", text) == (content, calls)


_ALL_CASES = [("llama3_json", c[0]) for c in LLAMA_CASES] + [("mistral", c[0]) for c in MISTRAL_CASES]


@pytest.mark.parametrize(("parser", "text"), _ALL_CASES)
def test_every_split_point_and_every_character_a_step_give_the_whole(parser, text):
    expected = whole(parser, text)
    for cut in range(len(text) + 1):
        assert streamed(parser, text, [cut]) == expected, cut
    assert streamed(parser, text, range(len(text))) == expected


_PIECES = {
    "llama3_json": [
        PYTHON_TAG,
        "<|python",
        "_tag|>",
        _F_PARAMS,
        _G_ARGS,
        ";",
        "; ",
        "\n",
        " ",
        "Hi",
        "{",
        "}",
        '"',
        "{bad",
        '{"name": 3}',
    ],  # fmt: skip  # noqa: E501
    "mistral": [
        TOOL_CALLS,
        "[TOOL",
        "_CALLS]",
        "[ARGS]",
        "[",
        "]",
        ", ",
        _G_ARGS,
        "now",
        "{}",
        '{"a": "]"}',
        "\n",
        " ",
        "Hi",
        "{bad",
        '"',
    ],  # fmt: skip  # noqa: E501
}
_MANY = settings(max_examples=400)  # plain string work: far more examples than the CI profile's


@_MANY
@given(data=st.data(), parser=st.sampled_from(sorted(_PIECES)))
def test_any_cut_into_deltas_gives_the_whole(data, parser):
    text = "".join(data.draw(st.lists(st.sampled_from(_PIECES[parser]), max_size=12)))
    cuts = data.draw(st.lists(st.integers(0, 300), max_size=12))
    assert streamed(parser, text, cuts) == whole(parser, text)


@_MANY
@given(data=st.data(), parser=st.sampled_from(sorted(_PIECES)))
def test_without_calls_the_content_is_the_reply(data, parser):
    text = "".join(data.draw(st.lists(st.sampled_from(_PIECES[parser]), max_size=12)))
    content, calls = whole(parser, text)
    if not calls:
        assert content == text


def test_the_stream_holds_back_only_what_may_begin_or_precede_calls():
    llama = Llama3JsonStream()
    assert llama.feed("  ") == ("", [])  # the reply may open with a call
    assert llama.feed("Hi <|python") == ("  Hi", [])
    assert llama.feed("_tag|>") == ("", [])
    assert llama.feed('{"name": "now", "parameters": {"s": "}"') == ("", [])
    assert llama.feed("}}\n") == ("", [ToolCall("now", '{"s": "}"}')])
    mistral = MistralStream()
    assert mistral.feed("Sure [TOOL") == ("Sure", [])
    assert mistral.feed("_CALLS]now") == ("", [])
    assert mistral.feed("{}[TOOL_CALLS]") == ("", [G])
    assert mistral.feed("now{}", final=True) == ("", [G])


def test_json_end_follows_strings_and_escapes():
    assert json_end('{"a": "}"}') == 10
    assert json_end('{"a": "\\"}"}') == 12
    assert json_end('[{"a": [1]}, {}] tail') == 16
    assert json_end('{"a": "}') is None  # the string is still open
    assert json_end('{"a": "\\') is None
    assert json_end('{"a": {}') is None


def test_the_registry_and_call_ids():
    assert list(PARSERS) == ["hermes", "llama3_json", "mistral"]
    ids = {tool_call_id("mistral") for _ in range(50)}
    assert len(ids) == 50 and all(len(i) == 9 and i.isalnum() and i.isascii() for i in ids)
    assert tool_call_id("llama3_json").startswith("chatcmpl-tool-")
    assert tool_call_id(None).startswith("chatcmpl-tool-")
