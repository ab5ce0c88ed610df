"""StructuredOutputsParams: the constraint a request's output must follow (vLLM's structured
outputs, also called guided decoding), under vLLM's names.

Only the shape is checked here (types, exactly one constraint): whether a schema, a regex or a
grammar compiles is decided by the engine on add (engine/structured_output.py), which needs
the tokenizer and the optional xgrammar package; a constraint that does not compile is a
ValueError naming its field there.
"""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Union, cast

from enginespec.spec.validation import check_token_id

#: The constraint fields, in vLLM's order: exactly one of them is set.
KINDS = ("json", "regex", "choice", "grammar", "json_object")
#: The longest start_after_token_ids: the engine compares the newest output tokens with it after
#: every token, so its length is a cost per token (a reasoning end tag is a token or a few).
MAX_START_AFTER = 64


def _fail(name: str, bound: str, value: object) -> None:
    raise ValueError(f"StructuredOutputsParams.{name} must be {bound}, got {value!r}")


def _marker(value: object) -> tuple[int, ...]:
    """start_after_token_ids as a tuple of plain ints, or a ValueError naming the field."""
    bound = f"None or a list of 1 to {MAX_START_AFTER} token ids (ints >= 0)"
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        _fail("start_after_token_ids", bound, value)
    ids = tuple(cast(Iterable[object], value))
    if not 1 <= len(ids) <= MAX_START_AFTER:
        _fail("start_after_token_ids", bound, value)
    return tuple(check_token_id("StructuredOutputsParams.start_after_token_ids", t) for t in ids)


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one constraint (vLLM's fields; anything else is a ValueError naming them):

    - `json`: a JSON schema, as a dict or its JSON text: the output is JSON that validates;
    - `regex`: the output matches it in full (xgrammar's regex dialect);
    - `choice`: a non-empty list of strings: the output is exactly one of them;
    - `grammar`: an EBNF grammar in xgrammar's dialect (GBNF, a `root ::= ...` rule);
    - `json_object`: True: the output is any JSON object (the server's
      response_format {"type": "json_object"}).

    Options (vLLM's): `disable_any_whitespace` takes away JSON's free whitespace (no runs of
    spaces or newlines between its tokens); the separators keep one space each (", " and ": ",
    as xgrammar writes them and vLLM with it), so a vocabulary must be able to write a space. `disable_additional_properties` and
    `disable_fallback` are accepted and change nothing: xgrammar (the one backend, so no
    fallback to disable) compiles schemas strictly, an object without additionalProperties
    taking no property it does not list, as in vLLM with xgrammar.

    Stored normalised: `choice` as a tuple of str, `json` as given (a dict stays a dict, so
    two requests with equal schemas compare equal; `json_text` gives the text the compiler
    reads). json_object=False counts as not set.

    `start_after_token_ids` (ours; vLLM decides the same from its server's reasoning parser):
    None, or the token ids (1 to MAX_START_AFTER of them, each >= 0; < vocab_size is checked by
    the engine on add) after whose first appearance in the output the constraint applies. Until
    they have all appeared, in order and adjacent, the output is free (no mask, the matcher
    untouched: a reasoning model's thinking, up to its end tag); the tokens after them follow
    the constraint. The server sets it to its reasoning parser's end tag (`</think>`) when a
    constrained chat reply starts in its thinking. Stored as a tuple of int."""

    json: Union[str, Mapping[str, Any], None] = None
    regex: Optional[str] = None
    choice: Optional[tuple[str, ...]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    disable_fallback: bool = False
    start_after_token_ids: Optional[tuple[int, ...]] = None

    def __post_init__(self) -> None:
        for name in ("disable_any_whitespace", "disable_additional_properties", "disable_fallback"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, "a bool", getattr(self, name))
        self._check_fields()
        given = [name for name in KINDS if self._is_set(name)]
        if len(given) != 1:
            raise ValueError(
                f"StructuredOutputsParams: exactly one of {', '.join(KINDS)} must be set, "
                f"got {', '.join(given) if given else 'none'}"
            )

    def _is_set(self, name: str) -> bool:
        value = getattr(self, name)
        return bool(value) if name == "json_object" else value is not None

    def _check_fields(self) -> None:
        """Each given field's type; choice becomes a tuple."""
        if self.json is not None and not isinstance(self.json, (str, Mapping)):
            _fail("json", "a JSON schema (a dict or its JSON text)", self.json)
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                _fail(name, "a non-empty str", value)
        if self.json_object is not None and not isinstance(self.json_object, bool):
            _fail("json_object", "a bool", self.json_object)
        if self.choice is not None:
            if isinstance(self.choice, (str, bytes, Mapping)) or not hasattr(self.choice, "__iter__"):
                _fail("choice", "a non-empty list of strings", self.choice)
            choices = tuple(self.choice)
            if not choices or not all(isinstance(c, str) for c in choices):
                _fail("choice", "a non-empty list of strings", self.choice)
            object.__setattr__(self, "choice", choices)
        if self.start_after_token_ids is not None:
            object.__setattr__(self, "start_after_token_ids", _marker(self.start_after_token_ids))

    @property
    def kind(self) -> str:
        """The name of the one constraint that is set (one of KINDS)."""
        return next(name for name in KINDS if self._is_set(name))

    def json_text(self) -> str:
        """The schema as JSON text (a dict dumped with its keys in their order: the order of
        `properties` is the order the output writes them in). Only for kind "json"."""
        if isinstance(self.json, str):
            return self.json
        return _json.dumps(self.json)

    @classmethod
    def of(cls, value: object) -> "StructuredOutputsParams":
        """`value` itself, or one built from a dict of its fields (the server's
        structured_outputs body field); anything else is a ValueError naming the field."""
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValueError(f"structured_outputs: unknown field(s) {', '.join(map(str, unknown))}")
            return cls(**value)
        raise ValueError(
            f"SamplingParams.structured_outputs must be None or a StructuredOutputsParams, got {value!r}"
        )
