"""The JSON Schema keywords xgrammar compiles but does not enforce, refused before compiling.

xgrammar (measured on 0.2.9, the newest release; `enginespec[structured]` asks for >= 0.1.25,
so an older one may drop more) accepts every schema below and then generates JSON that may
break it: the keyword is dropped without a word, and the reply
finishes "stop" as if it had validated. vLLM refuses such schemas when xgrammar is its backend
(its "auto" backend falls back to another library instead; we have no other), and so do we:
a ValueError naming StructuredOutputsParams.json, the keyword and where it sits (a 400).

Refused (each measured: xgrammar accepts an instance that violates it,
tests/engine/test_schema_limits.py):
- `uniqueItems`, `contains`, `minContains`, `maxContains`;
- `not`, `if` / `then` / `else`, `dependentRequired`, `dependentSchemas`, and `dependencies`
  (draft 7's name for the last two);
- `required` naming a property its own node's `properties` does not list (xgrammar makes only
  listed properties required: one named beside `additionalProperties`, beside an `allOf`
  that lists it, or in an `anyOf` branch of its own, "one of a or b", is dropped);
- `allOf` of more than one schema;
- `multipleOf` where the value may be a non-integer number (on integers it is enforced);
- `minLength` / `maxLength` beside a `pattern` or a `format` xgrammar knows (it keeps the
  pattern and drops the bounds);
- `$ref` with assertions beside it (the siblings are dropped; annotations such as
  `description` or `default` are fine).

Accepted although not enforced, by the standard's own reading: a `format` xgrammar does not
know (`iri`, `password`, ...) is an annotation in JSON Schema 2019-09 and later, and `oneOf`
is compiled as `anyOf` (its branches overlap rarely in practice: pydantic's tagged unions do
not), as vLLM accepts both.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

#: Keywords refused wherever they appear in a schema.
ALWAYS_REFUSED = (
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
)

#: The string formats xgrammar enforces (every other one is left as an annotation).
KNOWN_FORMATS = frozenset(
    {
        "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid",
        "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
    }
)  # fmt: skip

#: Keywords that say something about a schema without constraining its instances.
ANNOTATIONS = frozenset(
    {
        "$ref", "$defs", "definitions", "$schema", "$id", "$anchor", "$comment", "title",
        "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
    }
)  # fmt: skip

_ONE_SUBSCHEMA = (
    "items", "additionalProperties", "additionalItems", "unevaluatedItems",
    "unevaluatedProperties", "propertyNames",
)  # fmt: skip
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def unenforced_keyword(schema: Any) -> Optional[str]:
    """The first keyword of `schema` (a JSON Schema as parsed JSON) that xgrammar would drop,
    as "keyword at path" (path like /properties/tags), or None when it enforces them all."""
    for node, path in _subschemas(schema, ""):
        keyword = _refused_here(node)
        if keyword is not None:
            return f"{keyword!r} at {path or '/'}"
        unlisted = _unlisted_required(node)
        if unlisted is not None:
            return f"'required' at {path or '/'} (of {unlisted!r}, which its properties do not list)"
    return None


def _unlisted_required(node: dict) -> Optional[str]:
    """The first name of the node's `required` that its own `properties` does not list."""
    required = node.get("required")
    if not isinstance(required, list):
        return None
    listed = node.get("properties")
    listed = listed if isinstance(listed, dict) else {}
    return next((name for name in required if isinstance(name, str) and name not in listed), None)


def _refused_here(node: dict) -> Optional[str]:
    """The first refused keyword of one schema object (its subschemas not looked at)."""
    for keyword in ALWAYS_REFUSED:
        if keyword in node:
            return keyword
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return "allOf"
    if "multipleOf" in node and not _integers_only(node.get("type")):
        return "multipleOf"
    generative = "pattern" in node or node.get("format") in KNOWN_FORMATS
    for bound in ("minLength", "maxLength"):
        if generative and bound in node:
            return bound
    if "$ref" in node:
        siblings = sorted(set(node) - ANNOTATIONS)
        if siblings:
            return siblings[0]
    return None


def _integers_only(types: Any) -> bool:
    """Whether a `type` value admits no number but integers (null may be admitted too)."""
    if isinstance(types, str):
        types = [types]
    return isinstance(types, list) and "integer" in types and "number" not in types


def _subschemas(node: Any, path: str) -> Iterator[tuple[dict, str]]:
    """Every schema object of `node`, itself first, with its path (depth first)."""
    if not isinstance(node, dict):
        return
    yield node, path
    for key in _ONE_SUBSCHEMA:
        if isinstance(node.get(key), dict):
            yield from _subschemas(node[key], f"{path}/{key}")
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            for i, child in enumerate(node[key]):
                yield from _subschemas(child, f"{path}/{key}/{i}")
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            for name, child in node[key].items():
                yield from _subschemas(child, f"{path}/{key}/{name}")
