"""Tool-call parsers: a chat reply's `<tool_call>{json}</tool_call>` blocks as OpenAI tool calls;
and, at the end, the calls of a reply that tool_choice "required" or a named function forced
(forced_schema, ForcedCallStream). The other formats --tool-call-parser names (llama3_json,
mistral) and the registry of them: tool_parsers.py.

`enginespec serve --enable-auto-tool-choice --tool-call-parser hermes` reads the calls that
Qwen2.5, Qwen3 and other Hermes-format models write (vLLM's parser of that name): each block's
body is a JSON object {"name": ..., "arguments": {...}}, and goes out as a tool call whose
`arguments` is that object as a JSON string (json.dumps, non-ASCII kept), as vLLM sends it.
The replies it reads are decoded with their special tokens (skip_special_tokens off, as vLLM's
parser sets it), since some checkpoints mark the tags special (serving._tool_params).

The rule (one for the whole reply and for its stream, so the streamed parts add up to the whole
reply's; under --reasoning-parser it applies to the content part):

- A block runs from `<tool_call>` to the next `</tool_call>`, or to the end of the reply (a model
  that stopped after the JSON). Its body, whitespace aside, is a call when it is a JSON object
  with a string "name" and an object "arguments" (absent: "parameters", Llama's key, which some
  Hermes-format fine-tunes write; neither: {}).
- Any other block (bad JSON, JSON escaping a lone surrogate, no name) stays in the content as written, tags and the whitespace
  around it included: vLLM answers all of such a reply as content; a stream cannot take back
  calls it has sent, so here only the bad block is.
- Text outside blocks is content, except whitespace right before a call's `<tool_call>` or
  right after its end (the newlines a model puts between calls), which is dropped. vLLM keeps
  only the text before the first block; here text between and after blocks is kept.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

START, END = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function's name and its arguments as a JSON string."""

    name: str
    arguments: str


def _loads(text: str):
    """json.loads of text; _NOT_JSON where it is no JSON, nests deeper than the decoder recurses
    (its RecursionError), or escapes half a surrogate pair such as "\\ud83d" (I-JSON's rule, RFC
    7493: a lone surrogate cannot be written as UTF-8, so a call holding one failed its response
    body). A reply is the model's, and no reply fails the request."""
    try:
        value = json.loads(text)
        if _SURROGATE_ESCAPE.search(text):  # UnicodeEncodeError (a ValueError) where one is alone
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        return value
    except (ValueError, RecursionError):
        return _NOT_JSON


_NOT_JSON = object()
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_block(body: str) -> Optional[ToolCall]:
    """The call a block's body names (the module docstring's rule), or None."""
    value = _loads(body)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


class ToolCallStream:
    """Splits a reply's text into content and calls as it grows: feed() returns the content text
    and the calls this delta settles. Held back until the next delta settles them: text that may
    begin `<tool_call>`, whitespace that may precede one, and an open block's body.

    Invariant: for any cut of a text into deltas (final=True on the last), the concatenated
    content and the calls in order equal one final feed of the whole text."""

    def __init__(self) -> None:
        self._pending = ""  # text not yet settled
        self._in_block = False  # _pending is an open block's body
        self._after_block = False  # the outside text so far follows a call: its leading whitespace goes
        self._gap = ""  # the whitespace before the open block's tag: dropped if it is a call

    def feed(self, delta: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        text: Optional[str] = self._pending + delta
        self._pending = ""
        content: list[str] = []
        calls: list[ToolCall] = []
        while text is not None:  # each step takes text up to a tag and returns what follows it
            step = self._block if self._in_block else self._outside
            text = step(text, final, content, calls)
        return "".join(content), calls

    def _outside(self, text: str, final: bool, content: list[str], calls: list[ToolCall]) -> Optional[str]:
        """Content up to the next block's start (returning the text after the tag), or all of it
        but what may begin a tag or precede one (held; returns None)."""
        if self._after_block:
            text = text.lstrip()
            self._after_block = not text  # only whitespace so far: the next delta strips on
        at = text.find(START)
        if at >= 0:
            before = text[:at].rstrip()
            content.append(before)
            self._gap, self._in_block = text[len(before) : at], True
            return text[at + len(START) :]
        keep = 0 if final else _held_tail(text)
        content.append(text[: len(text) - keep])
        self._pending = text[len(text) - keep :]
        return None

    def _block(self, text: str, final: bool, content: list[str], calls: list[ToolCall]) -> Optional[str]:
        """A block's body up to its end tag (returning the text after it), or all of it when the
        reply ended; held (returning None) while the end tag may still come."""
        at = text.find(END)
        if at < 0 and not final:
            self._pending = text
            return None
        body = text if at < 0 else text[:at]
        call = parse_block(body)
        if call is not None:
            calls.append(call)
        else:  # as written, with the whitespace before it
            content.append(self._gap + START + body + ("" if at < 0 else END))
        self._in_block, self._after_block = False, call is not None
        return None if at < 0 else text[at + len(END) :]


def _held_tail(text: str, tag: str = START) -> int:
    """How much of text's end to hold: a proper prefix of tag it ends with, and the whitespace
    before that (either may turn out to precede a block)."""
    keep = 0
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            keep = n
            break
    body = text[: len(text) - keep]
    return keep + len(body) - len(body.rstrip())


# ---- forced calls: tool_choice "required" or a named function ---------------------------------


def forced_schema(tools: list, name: Optional[str]) -> dict:
    """The JSON schema a reply must follow when tool_choice forces calls (vLLM's): for a named
    function, its parameters (an empty object where it gives none): the reply is the arguments;
    for "required", a non-empty array of {"name": one of the tools, "parameters": its
    parameters}, with the tools' defs at its root (_root_defs). ValueError when the named
    function is not among the tools, or two tools define one def name differently."""
    params = {t["function"]["name"]: t["function"].get("parameters") or _EMPTY_OBJECT for t in tools}
    if name is not None:
        if name not in params:
            raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools")
        return params[name]
    options = [
        {
            "properties": {"name": {"type": "string", "enum": [n]}, "parameters": p},
            "required": ["name", "parameters"],
        }
        for n, p in params.items()
    ]
    return {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": options},
        **_root_defs(tools),
    }


_EMPTY_OBJECT = {"type": "object", "properties": {}}
# where a schema keeps the subschemas its `$ref`s name: `#/$defs/X` (pydantic's, 2019-09 on) or
# `#/definitions/X` (draft-07's)
_DEFS_KEYS = ("$defs", "definitions")


def _root_defs(tools: list) -> dict:
    """The defs of all tools' parameters, for the root of the "required" schema: a `$ref` such as
    `#/$defs/X` is read from the root of the whole schema, and there each tool's parameters are
    nested under the array's items, so refs into their own defs find nothing (vLLM lifts them
    the same way). The parameters keep their own copy. ValueError where two tools give one name
    under one key different schemas (the root can hold one)."""
    lifted: dict = {}
    origin: dict = {}  # (key, name) -> the index of the tool that defined it first
    for i, tool in enumerate(tools):
        params = tool["function"].get("parameters") or {}
        for key in _DEFS_KEYS:
            defs = params.get(key)
            if not isinstance(defs, dict):
                continue
            for name, schema in defs.items():
                first = origin.setdefault((key, name), i)
                if lifted.setdefault(key, {}).setdefault(name, schema) != schema:
                    raise ValueError(
                        f"tools[{i}].function.parameters.{key}.{name} differs from tools[{first}]'s: "
                        'tool_choice "required" puts all tools\' defs in one schema, so a def name '
                        "must mean one schema across the tools"
                    )
    return lifted


class ForcedCallStream:
    """ToolCallStream's counterpart for a reply forced by forced_schema: nothing settles until
    the reply ends; then its calls (forced_calls), or, when it is no such JSON (cut off), its
    whole text as content. Same feed() contract, so the whole reply is one final feed."""

    def __init__(self, name: Optional[str]) -> None:
        self.name = name
        self._text: list[str] = []

    def feed(self, delta: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        self._text.append(delta)
        if not final:
            return "", []
        text = "".join(self._text)
        calls = forced_calls(text, self.name)
        return (text, []) if calls is None else ("", calls)


def forced_calls(text: str, name: Optional[str]) -> Optional[list[ToolCall]]:
    """The calls of a reply written under forced_schema: for a named function, one call whose
    arguments are the reply as written; for "required", the array's items (arguments as JSON
    text, non-ASCII kept). None when the reply is not such an array (cut off by max_tokens)."""
    if name is not None:
        return [ToolCall(name, text)]
    items = _loads(text)
    if not isinstance(items, list) or not all(
        isinstance(i, dict) and isinstance(i.get("name"), str) and isinstance(i.get("parameters"), dict)
        for i in items
    ):
        return None
    return [ToolCall(i["name"], json.dumps(i["parameters"], ensure_ascii=False)) for i in items]
