"""engine/schema_limits.py: the schemas it refuses are exactly ones xgrammar would not enforce.

Each refused case carries an instance that violates it: xgrammar's own grammar of the schema
accepts that instance (so the refusal is needed; the day an xgrammar release enforces the
keyword, that test fails and the keyword can leave the list). Each accepted case carries a
violating instance xgrammar refuses (so accepting it is safe). Then the engine's path: a
refused schema is a ValueError on add naming StructuredOutputsParams.json and the keyword.
"""

from __future__ import annotations

import json

import pytest

from enginespec.engine.schema_limits import unenforced_keyword

xgr = pytest.importorskip("xgrammar")
INT_ARRAY = {"type": "array", "items": {"type": "integer"}}
PAIR = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}

# (schema, the keyword the refusal names, an instance that breaks the schema)
REFUSED = [
    ({**INT_ARRAY, "uniqueItems": True}, "uniqueItems", "[1, 1]"),
    ({**INT_ARRAY, "contains": {"const": 5}}, "contains", "[1]"),
    ({**INT_ARRAY, "contains": {"type": "integer"}, "maxContains": 1}, "contains", "[1, 2]"),
    ({"not": {"type": "integer"}}, "not", "4"),
    ({**PAIR, "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, "if", '{"a": 1}'),
    ({**PAIR, "dependentRequired": {"a": ["b"]}}, "dependentRequired", '{"a": 1}'),
    ({**PAIR, "dependentSchemas": {"a": {"required": ["b"]}}}, "dependentSchemas", '{"a": 1}'),
    ({"allOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 5}]}, "allOf", "9"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf", "0.3"),
    ({"multipleOf": 2}, "multipleOf", "3"),
    ({"type": "string", "pattern": "a+", "maxLength": 2}, "maxLength", '"aaaa"'),
    ({"type": "string", "pattern": "a+", "minLength": 3}, "minLength", '"a"'),
    ({"type": "string", "format": "email", "maxLength": 3}, "maxLength", '"ab@cd.ef"'),
    ({"$defs": {"A": {"type": "integer"}}, "$ref": "#/$defs/A", "maximum": 3}, "maximum", "9"),
    ({"type": "object", "properties": {"tags": {**INT_ARRAY, "uniqueItems": True}}}, "uniqueItems", '{"tags": [1, 1]}'),
    # draft 7's name for dependentRequired and dependentSchemas
    ({**PAIR, "dependencies": {"a": ["b"]}}, "dependencies", '{"a": 1}'),
    ({**PAIR, "dependencies": {"a": {"required": ["b"]}}}, "dependencies", '{"a": 1}'),
    # required is enforced only for the names its own node's properties list
    ({"type": "object", "required": ["a"], "additionalProperties": True}, "required", "{}"),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "required": ["a"]}, "required", '{"b": 1}'),
    ({**PAIR, "required": ["a", "c"]}, "required", '{"a": 1}'),
    ({"allOf": [PAIR], "required": ["a"]}, "required", "{}"),
    ({**PAIR, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, "required", "{}"),
]  # fmt: skip

# (schema, an instance that breaks it): xgrammar enforces these
ACCEPTED = [
    ({**INT_ARRAY, "minItems": 2}, "[1]"),
    ({"type": "integer", "multipleOf": 3}, "4"),
    ({"type": ["integer", "null"], "multipleOf": 2}, "3"),
    ({"allOf": [{"type": "integer", "maximum": 5}]}, "9"),
    ({"type": "string", "format": "iri", "maxLength": 3}, '"abcdef"'),
    ({"type": "string", "format": "email"}, '"nope"'),
    ({"type": "string", "pattern": "^a+$"}, '"b"'),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/A", "description": "x"}}, "$defs": {"A": {"type": "integer"}}}, '{"a": "s"}'),
    ({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, '"s"'),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False}, '{"y": 1}'),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1}, '{"y": 1, "z": 2}'),
    ({**PAIR, "required": ["a"]}, "{}"),
    ({**PAIR, "required": ["a", "b"], "additionalProperties": True}, '{"a": 1, "c": 2}'),
]  # fmt: skip


def _xgrammar_accepts(schema: dict, instance: str) -> bool:
    from xgrammar.testing import _is_grammar_accept_string

    return _is_grammar_accept_string(xgr.Grammar.from_json_schema(json.dumps(schema)), instance)


@pytest.mark.parametrize("schema, keyword, instance", REFUSED)
def test_a_refused_keyword_is_one_xgrammar_drops(schema, keyword, instance):
    assert json.loads(instance) is not None  # the instance is JSON; the schema forbids it
    assert _xgrammar_accepts(schema, instance)
    where = unenforced_keyword(schema)
    assert where is not None and where.startswith(repr(keyword))


@pytest.mark.parametrize("schema, instance", ACCEPTED)
def test_an_accepted_schema_is_one_xgrammar_enforces(schema, instance):
    assert not _xgrammar_accepts(schema, instance)
    assert unenforced_keyword(schema) is None


def test_the_refusal_names_where_the_keyword_sits():
    schema = {
        "type": "object",
        "properties": {"rows": {"type": "array", "items": {**INT_ARRAY, "uniqueItems": True}}},
    }
    assert unenforced_keyword(schema) == "'uniqueItems' at /properties/rows/items"
    assert unenforced_keyword({"$defs": {"T": {"not": {}}}, "type": "integer"}) == "'not' at /$defs/T"
    either = {**PAIR, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert unenforced_keyword(either) == "'required' at /anyOf/0 (of 'a', which its properties do not list)"


def test_a_refused_schema_is_a_valueerror_on_add():
    from enginespec.llm import LLM
    from enginespec.spec import SamplingParams
    from enginespec.spec.structured_outputs import StructuredOutputsParams
    from enginespec.testing.checkpoints import json_model_dir

    llm = LLM(str(json_model_dir()), impl="reference", device="cpu")
    for given in ({**INT_ARRAY, "uniqueItems": True}, json.dumps({**INT_ARRAY, "uniqueItems": True})):
        params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(json=given))
        with pytest.raises(
            ValueError, match=r"StructuredOutputsParams\.json is invalid: .*'uniqueItems' at /"
        ):
            llm.generate([[5, 6]], params, use_tqdm=False)
    ok = SamplingParams(
        max_tokens=4, structured_outputs=StructuredOutputsParams(json={**INT_ARRAY, "minItems": 1})
    )
    assert llm.generate([[5, 6]], ok, use_tqdm=False)[0].outputs[0].token_ids
