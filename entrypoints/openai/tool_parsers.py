"""The --tool-call-parser registry (PARSERS, new_stream, tool_call_id), and the two formats that
are not hermes' `<tool_call>` blocks (tool_calls.py): Llama 3.1/3.2's JSON calls (llama3_json)
and Mistral's `[TOOL_CALLS]` (mistral), named as vLLM names its parsers.

llama3_json: a call is a JSON object {"name": ..., "parameters": {...}} ("arguments" also read,
and preferred where both are given), written at the very start of the reply (whitespace aside)
or after `<|python_tag|>`; more calls follow it, each after a `;` or whitespace.
mistral: after `[TOOL_CALLS]` either a JSON array of {"name": ..., "arguments": {...}} objects
(Mistral 7B Instruct v0.3's form; a lone object is read too), or `name{...arguments}` or
`name[ARGS]{...arguments}` (the forms of the v11+ and v13 tokenizers); each call of the latter
has its own `[TOOL_CALLS]`. Mistral's call ids are 9 letters and digits (tool_call_id), the form
its chat templates and mistral_common check when the calls come back, as vLLM's parser sends them.

The rule (one for the whole reply and for its stream, so streamed parts add up to the whole):

- Content runs up to the tag (llama3_json: also up to a `{` that opens the reply). What follows
  is read as calls; a call's arguments go out as JSON text (json.dumps, non-ASCII kept). A
  missing arguments object is {}, as hermes reads it.
- Where the calls do not parse (bad JSON, no string "name", arguments no object, an empty
  array, a call cut off), the tag (or separator) and all after it stay content as written, the
  whitespace before the tag included; content may then hold another tag, read the same way.
- Whitespace right before a tag that opens calls, or right after calls, is dropped.

Differences from vLLM's parsers, mostly where vLLM's full-body and stream readers disagree or
where a stream cannot take back what it sent: vLLM answers a whole reply with any bad call as
content, here calls before the bad one stay calls; vLLM's llama3_json full-body reader takes a
JSON object anywhere in the reply (its stream only one that opens it: the rule here) and drops
the text around the calls; vLLM's mistral keeps the whitespace before `[TOOL_CALLS]`, reads
`name{...}` only with mistral_common's tokenizer (here: with any), and, like its llama3_json,
takes a call without arguments for no call. Not read: Mistral's `[CALL_ID]` form, Llama's
built-in tools (`<|python_tag|>brave_search.call(...)`, content here), Llama 4's pythonic calls.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from typing import Optional, Union

from enginespec.entrypoints.openai.tool_calls import ToolCall, ToolCallStream, _held_tail, _loads

PYTHON_TAG, TOOL_CALLS, ARGS = "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]"

_BAD = object()  # a reader's answer: these are no calls
# a reader's answer: None (the calls may still complete), _BAD, or (the calls, the text after them)
_Read = Union[None, object, tuple[list[ToolCall], str]]


def call_of(value, keys: tuple[str, ...]) -> Optional[ToolCall]:
    """The call a decoded JSON value names: an object with a string "name" whose arguments (the
    first of keys present; absent: {}) are an object; else None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = next((value[k] for k in keys if k in value), {})
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


# a whole string, a string still open (its quote alone), or a bracket
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|"|[{}\[\]]', re.S)


def json_end(text: str) -> Optional[int]:
    """Where the JSON object or array that opens text ends (the index after its closing
    bracket), by its brackets outside strings; None while it is still open (a string in it
    too). Whether it parses is json's to say."""
    depth = 0
    for token in _TOKENS.finditer(text):
        if token.group() == '"':
            return None
        if len(token.group()) == 1:
            depth += 1 if token.group() in "{[" else -1
            if depth == 0:
                return token.end()
    return None


class _TaggedCallStream:
    """ToolCallStream's contract (feed() returns the content and the calls a delta settles;
    any cut of a text into deltas, final=True on the last, adds up to one final feed of it)
    for formats whose calls follow a tag: subclasses give TAG, _read (calls at the start of a
    text) and, optionally, _opens (calls that begin the reply untagged) and _separator (what
    starts more calls right after calls). Held back until a later delta settles them: text
    that may begin the tag and the whitespace before it, and calls not yet complete."""

    TAG = ""

    def __init__(self) -> None:
        self._pending = ""  # text not yet settled
        self._at_start = True  # nothing but whitespace read yet
        self._in_calls = False  # _pending is calls being read
        self._after_calls = False  # the outside text so far follows calls: its whitespace goes
        self._opening = ""  # what opened the calls being read: content if they are no calls

    def feed(self, delta: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        text: Optional[str] = self._pending + delta
        self._pending = ""
        content: list[str] = []
        calls: list[ToolCall] = []
        while text is not None:  # each step settles a part of text and returns what follows it
            step = self._calls if self._in_calls else self._outside
            text = step(text, final, content, calls)
        return "".join(content), calls

    def _open(self, opening: str, rest: str) -> str:
        self._opening, self._in_calls = opening, True
        return rest

    def _outside(self, text: str, final: bool, content: list[str], calls: list[ToolCall]) -> Optional[str]:
        """Content up to the next calls (returning the text they begin with), or all of it but
        what may begin the tag or precede it (held; returns None)."""
        if self._after_calls:
            text = text.lstrip()
            if not text:
                return None
            self._after_calls = False
            sep = self._separator(text)
            if sep is not None:
                return self._open(text[:sep], text[sep:])
        elif self._at_start:
            body = text.lstrip()
            if not body and not final:
                self._pending = text
                return None
            self._at_start = False
            if body and self._opens(body):
                return self._open(text[: len(text) - len(body)], body)
        at = text.find(self.TAG)
        if at >= 0:
            before = text[:at].rstrip()
            content.append(before)
            return self._open(text[len(before) : at + len(self.TAG)], text[at + len(self.TAG) :])
        keep = 0 if final else _held_tail(text, self.TAG)
        content.append(text[: len(text) - keep])
        self._pending = text[len(text) - keep :]
        return None

    def _calls(self, text: str, final: bool, content: list[str], calls: list[ToolCall]) -> Optional[str]:
        """The calls that text begins with (returning the text after them); held while they may
        still complete; when they are none, the opening as content (returning text, content)."""
        read = self._read(text)
        if read is None and not final:
            self._pending = text
            return None
        self._in_calls = False
        if read is None or read is _BAD:
            content.append(self._opening)
            return text
        found, rest = read
        calls.extend(found)
        self._after_calls = True
        return rest

    def _read(self, text: str) -> _Read:
        raise NotImplementedError

    def _opens(self, text: str) -> bool:
        """Whether a reply that begins (whitespace aside) with text begins with calls, untagged."""
        return False

    def _separator(self, text: str) -> Optional[int]:
        """How long the separator is with which text, right after calls (whitespace aside),
        begins more calls; None where it begins none."""
        return None


def _read_json(text: str, keys: tuple[str, ...], lists: bool) -> _Read:
    """The calls of the JSON value that text begins with (whitespace aside): an object, or
    (lists) an array of them, all calls by call_of."""
    body = text.lstrip()
    if not body:
        return None
    if body[0] != "{" and not (lists and body[0] == "["):
        return _BAD
    end = json_end(body)
    if end is None:
        return None
    value = _loads(body[:end])
    found = [call_of(v, keys) for v in (value if isinstance(value, list) else [value])]
    return _BAD if not found or None in found else (found, body[end:])


class Llama3JsonStream(_TaggedCallStream):
    """llama3_json (the module docstring's rule)."""

    TAG = PYTHON_TAG

    def _read(self, text: str) -> _Read:
        return _read_json(text, ("arguments", "parameters"), lists=False)

    def _opens(self, text: str) -> bool:
        return text.startswith("{")

    def _separator(self, text: str) -> Optional[int]:
        return 1 if text.startswith(";") else 0 if text.startswith("{") else None


_NAME = re.compile(r"[A-Za-z0-9_-]+")  # an OpenAI function name


class MistralStream(_TaggedCallStream):
    """mistral (the module docstring's rule)."""

    TAG = TOOL_CALLS

    def _read(self, text: str) -> _Read:
        body = text.lstrip()
        if body[:1] in ("[", "{", ""):
            return _read_json(text, ("arguments",), lists=True)
        name = _NAME.match(body)
        if name is None:
            return _BAD
        rest = body[name.end() :]
        if ARGS.startswith(rest):  # the name, or [ARGS], may go on
            return None
        if rest.startswith(ARGS):
            rest = rest[len(ARGS) :]
        if not rest.startswith("{"):
            return _BAD if rest else None
        end = json_end(rest)
        if end is None:
            return None
        arguments = _loads(rest[:end])
        if not isinstance(arguments, dict):
            return _BAD
        return [ToolCall(name.group(), json.dumps(arguments, ensure_ascii=False))], rest[end:]


PARSERS = {"hermes": ToolCallStream, "llama3_json": Llama3JsonStream, "mistral": MistralStream}
ToolStream = Union[ToolCallStream, Llama3JsonStream, MistralStream]

_ALNUM = string.ascii_letters + string.digits


def new_stream(parser: str) -> ToolStream:
    """A reader of one reply's calls in the format --tool-call-parser names."""
    return PARSERS[parser]()


def tool_call_id(parser: Optional[str]) -> str:
    """A fresh tool call id in vLLM's form for the server's parser: 9 letters and digits for
    mistral (what Mistral's templates accept back), else `chatcmpl-tool-` and 32 hex digits."""
    if parser == "mistral":
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return f"chatcmpl-tool-{uuid.uuid4().hex}"
