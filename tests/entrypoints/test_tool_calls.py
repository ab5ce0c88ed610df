"""The hermes tool-call split (entrypoints/openai/tool_calls.py): the whole reply against a
regex reference of the rule, and any cut of it into stream deltas against the whole."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginespec.entrypoints.openai.tool_calls import (
    END,
    START,
    ForcedCallStream,
    ToolCall,
    ToolCallStream,
    forced_calls,
    forced_schema,
    parse_block,
)

_CALL = '{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}'
_PIECES = st.sampled_from(
    [
        START,
        END,
        "\n",
        "  ",
        "<tool",
        "_call>",
        "</tool_",
        "Hi",
        _CALL,
        '{"name": "f"}',
        "{bad",
        '{"name": 3}',
    ]
)
_TEXTS = st.lists(_PIECES, max_size=12).map("".join)
_MANY = settings(max_examples=500)  # plain string work: far more examples than the CI profile's

_BLOCK = re.compile(r"(\s*)<tool_call>(.*?)(</tool_call>|\Z)", re.S)


def _reference(text: str) -> tuple[str, list[ToolCall]]:
    """The module docstring's rule by regex: blocks, calls, and whitespace dropped around calls."""
    content, calls, pos, after_call = [], [], 0, False
    for match in _BLOCK.finditer(text):
        outside = text[pos : match.start()]
        content.append(outside.lstrip() if after_call else outside)
        gap = "" if after_call else match.group(1)
        call = parse_block(match.group(2))
        if call is not None:
            calls.append(call)
        else:
            content.append(gap + match.group(0)[len(match.group(1)) :])
        after_call, pos = call is not None, match.end()
    tail = text[pos:]
    content.append(tail.lstrip() if after_call else tail)
    return "".join(content), calls


def split_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole reply: one final feed, as serving._message reads it."""
    return ToolCallStream().feed(text, final=True)


def _streamed(text: str, cuts: list[int]) -> tuple[str, list[ToolCall]]:
    stream = ToolCallStream()
    bounds = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
    parts = [stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    parts.append(stream.feed("", final=True))
    return "".join(p[0] for p in parts), [call for p in parts for call in p[1]]


@_MANY
@given(text=_TEXTS)
def test_whole_split_follows_the_rule(text):
    assert split_calls(text) == _reference(text)


@_MANY
@given(text=_TEXTS, cuts=st.lists(st.integers(0, 200), max_size=12))
def test_any_cut_into_deltas_gives_the_whole_split(text, cuts):
    assert _streamed(text, cuts) == split_calls(text)


def test_qwen3_style_calls_after_a_sentence():
    text = f"Let me check.\n\n{START}\n{_CALL}\n{END}\n{START}\n" + '{"name": "now"}\n' + f"{END}\n"
    content, calls = split_calls(text)
    assert content == "Let me check."
    assert calls == [ToolCall("get_weather", '{"city": "Zürich", "days": 2}'), ToolCall("now", "{}")]
    assert json.loads(calls[0].arguments) == {"city": "Zürich", "days": 2}


def test_a_bad_block_stays_in_the_content_as_written():
    assert split_calls(f"a {START}{{bad{END} b") == (f"a {START}{{bad{END} b", [])
    assert split_calls(f'{START}{{"name": "f", "arguments": [1]}}{END}') == (
        f'{START}{{"name": "f", "arguments": [1]}}{END}',
        [],
    )  # arguments must be an object


def test_a_call_cut_off_after_its_json_is_still_a_call():
    assert split_calls(f"{START}\n{_CALL}\n") == (
        "",
        [ToolCall("get_weather", '{"city": "Zürich", "days": 2}')],
    )
    assert split_calls(f'{START}\n{{"name": "get_wea') == (f'{START}\n{{"name": "get_wea', [])


def test_the_stream_holds_back_only_what_may_begin_or_precede_a_block():
    stream = ToolCallStream()
    assert stream.feed("Hello <tool") == ("Hello", [])
    assert stream.feed("box> x\n") == (" <toolbox> x", [])
    assert stream.feed(START + '{"name": "f"') == ("", [])
    assert stream.feed("}" + END + "\n\nDone") == ("Done", [ToolCall("f", "{}")])


def test_forced_schemas_are_vllms():
    tools = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {}}}},
        },
        {"type": "function", "function": {"name": "g"}},
    ]
    assert forced_schema(tools, "f") == {"type": "object", "properties": {"x": {}}}
    assert forced_schema(tools, "g") == {"type": "object", "properties": {}}
    required = forced_schema(tools, None)
    assert required["type"] == "array" and required["minItems"] == 1
    assert [o["properties"]["name"]["enum"] for o in required["items"]["anyOf"]] == [["f"], ["g"]]
    with pytest.raises(ValueError, match="'h', which is not among the tools"):
        forced_schema(tools, "h")


def test_required_lifts_the_tools_defs_to_the_schemas_root():
    """`#/$defs/X` (and draft-07's `#/definitions/X`) in a tool's parameters means the root of
    the schema: under "required" that is the array's, so the defs go there; two tools that
    define one name differently cannot share it (a ValueError naming both)."""
    inner = {"type": "object", "properties": {"c": {"type": "string"}}}
    params = {"$defs": {"In": inner}, "type": "object", "properties": {"i": {"$ref": "#/$defs/In"}}}
    old = {
        "definitions": {"Old": inner},
        "type": "object",
        "properties": {"o": {"$ref": "#/definitions/Old"}},
    }
    tools = [
        {"type": "function", "function": {"name": n, "parameters": p}}
        for n, p in (("f", params), ("g", params), ("h", old))
    ]
    required = forced_schema(tools, None)
    assert required["$defs"] == {"In": inner} and required["definitions"] == {"Old": inner}
    assert [o["properties"]["parameters"] for o in required["items"]["anyOf"]] == [params, params, old]
    assert forced_schema(tools, "f") == params  # the parameters are the root: nothing to lift
    clash = {"$defs": {"In": {"type": "integer"}}, "type": "object"}
    tools.append({"type": "function", "function": {"name": "k", "parameters": clash}})
    with pytest.raises(
        ValueError, match=r"tools\[3\].function.parameters.\$defs.In differs from tools\[0\]'s"
    ):
        forced_schema(tools, None)


def test_forced_calls_read_the_reply_whole():
    assert forced_calls('{"x": 1}', "f") == [ToolCall("f", '{"x": 1}')]
    assert forced_calls('[{"name": "g", "parameters": {"é": 2}}]', None) == [ToolCall("g", '{"é": 2}')]
    assert forced_calls('[{"name": "g"}]', None) is None  # no parameters
    assert forced_calls("[{", None) is None
    stream = ForcedCallStream(None)
    assert stream.feed('[{"name": "g", ') == ("", [])
    assert stream.feed('"parameters": {}}]', final=True) == ("", [ToolCall("g", "{}")])


# Deeper than json.loads recurses on every Python we run: about 1,000 levels on 3.11, several
# thousand on 3.12 (its C recursion limit; 5,000 levels parsed there).
DEEP = 100_000


def test_json_nested_past_the_decoders_depth_is_no_call():
    """A reply nesting deeper than json.loads recurses (a model repeating `[`, or `{"a": ` in
    arguments that any JSON schema admits) is read as not a call: json's RecursionError escaped
    the parser (a 500, and a stream cut off without an error frame or [DONE])."""
    deep = "[" * DEEP + "]" * DEEP
    block = f'{START}{{"name": "f", "arguments": {{"a": {deep}}}}}{END}'
    assert parse_block(deep) is None
    assert split_calls(f"x {block}") == (f"x {block}", [])
    assert ToolCallStream().feed(START + "[" * DEEP, final=True) == (START + "[" * DEEP, [])
    assert forced_calls(deep, None) is None
    assert forced_calls(f'[{{"name": "g", "parameters": {{"a": {deep}}}}}]', None) is None


def test_a_surrogate_pair_escape_is_read_and_half_of_one_is_no_json():
    """`"\\ud83d\\ude00"` is one character (😀), kept as written in the arguments; `"\\ud83d"`
    alone is a lone surrogate, which no UTF-8 body carries: no call (serving's full body failed)."""
    pair = f'{START}{{"name": "f", "arguments": {{"x": "\\ud83d\\ude00"}}}}{END}'
    assert split_calls(pair) == ("", [ToolCall("f", '{"x": "😀"}')])
    for lone in ("\\ud83d", "\\uDE00", "a\\ud83d\\u0041"):
        block = f'{START}{{"name": "f", "arguments": {{"x": "{lone}"}}}}{END}'
        assert split_calls(block) == (block, [])
    assert forced_calls('[{"name": "g", "parameters": {"\\udc00": 1}}]', None) is None
    escaped = '{"x": "\\\\ud83d"}'  # a backslash, then the letters: no escape of a surrogate
    assert parse_block(f'{{"name": "f", "arguments": {escaped}}}') == ToolCall("f", escaped)


def test_a_block_naming_its_arguments_parameters_keeps_them():
    """`{"name": ..., "parameters": {...}}` (Llama's key, which some Hermes-format fine-tunes
    write) was a call with arguments `{}`: the tool ran without the arguments the model gave.
    "arguments" is read first, then "parameters", as llama3_json reads them."""
    block = f'{START}{{"name": "f", "parameters": {{"city": "Bern"}}}}{END}'
    assert split_calls(block) == ("", [ToolCall("f", '{"city": "Bern"}')])
    both = '{"name": "f", "arguments": {"a": 1}, "parameters": {"p": 2}}'
    assert parse_block(both) == ToolCall("f", '{"a": 1}')
    assert parse_block('{"name": "f", "parameters": [1]}') is None  # not an object: no call
