"""engine/structured_output.py without an engine: what each constraint compiles to, checked
by walking a matcher over text (the tiny JSON tokenizer: one token per character)."""

from __future__ import annotations

import json
import sys

import pytest

from enginespec.engine import structured_output as so_mod
from enginespec.spec import StructuredOutputsParams
from enginespec.testing.checkpoints import json_model_dir

pytest.importorskip("xgrammar")
EOS = 3


@pytest.fixture(scope="module")
def manager():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(json_model_dir()))
    return so_mod.StructuredOutputManager(tokenizer, 96, [EOS]), tokenizer


def _takes(manager, params: StructuredOutputsParams, text: str) -> bool:
    """Whether the constraint accepts `text` and then ends (its stop token accepted)."""
    mgr, tokenizer = manager
    state = mgr.new_state(mgr.compile(params), [EOS])
    state.accept(tokenizer.encode(text, add_special_tokens=False) + [EOS])
    return state.num_rejected == 0 and state.terminated


def test_the_compiled_grammar_cache_is_bounded():
    """A new schema per request (tool calls, response_format) must not grow the compiler's
    cache without bound: it is capped (vLLM's 512 MiB by default) and evicts past the cap."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(json_model_dir()))
    assert so_mod.StructuredOutputManager(tokenizer, 96, [EOS]).compiler.cache_limit_bytes == 512 << 20
    small = so_mod.StructuredOutputManager(tokenizer, 96, [EOS], cache_limit_bytes=50_000)
    for i in range(200):
        small.compile(
            StructuredOutputsParams(json={"type": "object", "properties": {f"k{i}": {"type": "integer"}}})
        )
    # xgrammar's size is approximate: within twice the cap (unbounded, 200 schemas take ~1 MB)
    assert 0 < small.compiler.get_cache_size_bytes() <= 100_000


def test_choices_are_matched_literally_quotes_and_backslashes_included(manager):
    params = StructuredOutputsParams(choice=['say"hi"', "a\\b", "x|y"])
    for text in params.choice:
        assert _takes(manager, params, text), text
    for text in ("say", "a", "x", "a\\bb", "y"):
        assert not _takes(manager, params, text), text


def test_choices_with_control_characters_compile_and_match_literally(manager):
    """A newline, tab or carriage return in a choice is a character of that choice (a
    multi-line answer): it compiles (the grammar's string literal cannot hold it raw, which
    was a 400 "EBNF lexer error" for a valid choice) and matches only itself."""
    mgr, _ = manager
    choices = ["a\nb", "tab\there", "cr\r\n", "esc\x1b", "bell\x07"]
    compiled = mgr.compile(StructuredOutputsParams(choice=choices))

    def takes(text: str) -> bool:
        state = mgr.new_state(compiled, [EOS])
        return state.matcher.accept_string(text) and state.accept([EOS]) is None and state.terminated

    for text in choices:
        assert takes(text), repr(text)
    for text in ("a", "ab", "a\\nb", "tab", "cr\r", "esc"):
        assert not takes(text), repr(text)


def test_a_schema_is_strict_unlisted_properties_are_refused(manager):
    """xgrammar's strict mode, as vLLM compiles schemas: an object schema without
    additionalProperties takes only its listed properties."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert _takes(manager, StructuredOutputsParams(json=schema), '{"a":1}')
    assert not _takes(manager, StructuredOutputsParams(json=schema), '{"a":1,"c":2}')


@pytest.mark.parametrize(
    "schema, fits, too_long",
    [
        ({"type": "string", "maxLength": 4}, "abcd", "abcde"),
        ({"type": "string", "minLength": 2}, "ab", None),
        ({"type": "string", "minLength": 1, "maxLength": 3}, "abc", "abcd"),
        ({"type": "array", "items": {"type": "string", "maxLength": 2}}, "ab", "abc"),
    ],
)
def test_a_length_bounded_string_takes_no_raw_control_character(manager, schema, fits, too_long):
    """JSON forbids U+0000-U+001F raw in a string. xgrammar's bounded strings let them through
    but CR and LF (its issue #800), and a byte-level model wrote a tab or U+001C inside a
    name of maxLength 4: a reply no json.loads took, finished "stop" (the server soak, on a
    byte-level BPE checkpoint). The bound still holds, and what fits it is still taken."""
    mgr, _ = manager
    compiled = mgr.compile(StructuredOutputsParams(json=schema))
    wrap = (lambda s: f'["{s}"]') if schema["type"] == "array" else (lambda s: f'"{s}"')

    def takes(text: str) -> bool:
        state = mgr.new_state(compiled, [EOS])
        return state.matcher.accept_string(text) and state.accept([EOS]) is None and state.terminated

    assert takes(wrap(fits)) and json.loads(wrap(fits))
    for control in ("\t", "\x1c", "\x01", "\x0b"):
        assert not takes(wrap(fits[:-1] + control)), repr(control)
    if too_long is not None:
        assert not takes(wrap(too_long))


@pytest.mark.parametrize("bound", [{}, {"maxLength": 4}])
def test_a_bounded_string_schema_is_as_strict_as_any_other(manager, bound):
    """The bounded-string path compiles the schema's EBNF itself, in xgrammar's strict mode as
    compile_json_schema does (vLLM's default): an object without additionalProperties takes
    no property it does not name, whether or not one of its strings is bounded."""
    mgr, _ = manager
    schema = {"type": "object", "properties": {"n": {"type": "string", **bound}}, "required": ["n"]}
    compiled = mgr.compile(StructuredOutputsParams(json=schema))

    def takes(text: str) -> bool:
        state = mgr.new_state(compiled, [EOS])
        return state.matcher.accept_string(text) and state.accept([EOS]) is None and state.terminated

    assert takes('{"n": "ab"}')
    assert not takes('{"n": "ab", "x": 1}')


def test_a_bounded_string_schema_whose_ebnf_does_not_compile_is_served_as_before(manager, monkeypatch):
    """The narrowed EBNF is xgrammar's printed form read back; where a version does not read
    it back, the schema compiles as xgrammar writes it (served, not refused as invalid)."""
    mgr, _ = manager

    def refuse(*args, **kwargs):
        raise RuntimeError("EBNF parser error")

    monkeypatch.setattr(mgr.compiler, "compile_grammar", refuse)
    schema = {"type": "object", "properties": {"n": {"type": "string", "maxLength": 2}}, "required": ["n"]}
    compiled = mgr.compile(StructuredOutputsParams(json=schema))
    state = mgr.new_state(compiled, [EOS])
    assert state.matcher.accept_string('{"n":"ab"}') and state.accept([EOS]) is None and state.terminated


def test_json_object_means_an_object(manager):
    params = StructuredOutputsParams(json_object=True)
    assert _takes(manager, params, '{"k":[1,2]}')
    assert not _takes(manager, params, "[1,2]")


def test_the_install_hint_when_xgrammar_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(ValueError, match=r"pip install xgrammar.*enginespec\[structured\]"):
        so_mod.import_xgrammar()


def test_nothing_else_imports_xgrammar():
    """xgrammar is optional: one module imports it (lazily), so an install without it runs
    everything else."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    users = [
        str(p.relative_to(root))
        for folder in (
            "api",
            "spec",
            "engine",
            "sample",
            "worker",
            "entrypoints",
            "impls",
            "kernels",
            "testing",
        )
        for p in (root / folder).rglob("*.py")
        if "import xgrammar" in p.read_text() or "from xgrammar" in p.read_text()
    ]
    assert users == ["engine/structured_output.py"]


# ---- a start marker (start_after_token_ids: a reasoning model's end tag) ---------------------


def _ids(manager, text: str) -> list[int]:
    return manager[1].encode(text, add_special_tokens=False)


def test_before_its_start_marker_the_grammar_takes_nothing_and_masks_nothing(manager):
    """Free text before the marker (text the grammar refuses, the marker's own first token
    alone, a false start "<" "<") leaves the matcher untouched and the state inactive; the
    marker split over accepts is found; the tokens after it in that same accept feed the
    matcher, and a later "</" is the grammar's own text."""
    mgr, _ = manager
    marker = _ids(manager, "</")
    state = mgr.new_state(mgr.compile(StructuredOutputsParams(regex=r"ab</\d")), [EOS], marker)
    assert state.accept(_ids(manager, "{no<<")) is None
    assert not state.active and state.num_rejected == 0
    assert state.accept(_ids(manager, "/ab")) is None  # the marker's end, then the grammar's text
    assert state.active
    assert state.accept(_ids(manager, "</7") + [EOS]) is None
    assert state.terminated and state.num_rejected == 0


def test_after_its_start_marker_the_grammar_refuses_what_it_refuses(manager):
    mgr, _ = manager
    state = mgr.new_state(mgr.compile(StructuredOutputsParams(regex=r"\d+")), [EOS], _ids(manager, "##"))
    assert state.accept(_ids(manager, "x#y")) is None and not state.active  # not adjacent
    assert state.accept(_ids(manager, "##x")) == _ids(manager, "x")[0]
    assert state.num_rejected == 1


def test_an_overlapping_marker_is_found_at_its_first_appearance(manager):
    """The marker "aab" inside "aaab": the newest tokens are compared, so the extra "a" in
    front does not hide it (a matcher of the marker that restarts on a mismatch would)."""
    mgr, _ = manager
    state = mgr.new_state(mgr.compile(StructuredOutputsParams(regex=r"\d")), [EOS], _ids(manager, "aab"))
    for token in _ids(manager, "aaab"):
        assert not state.active
        state.accept([token])
    assert state.active
    assert state.accept(_ids(manager, "5") + [EOS]) is None and state.terminated


@pytest.mark.parametrize("value", [[], "ab", [1, -1], [True], [1.0], 7, list(range(65)), {"a": 1}])
def test_a_bad_start_marker_is_a_value_error_naming_the_field(value):
    with pytest.raises(ValueError, match=r"StructuredOutputsParams\.start_after_token_ids must "):
        StructuredOutputsParams(regex="a", start_after_token_ids=value)


def test_a_start_marker_is_stored_as_a_tuple_and_checked_against_the_vocabulary():
    import numpy as np

    from enginespec.spec import SamplingParams

    so = StructuredOutputsParams.of({"regex": "a", "start_after_token_ids": [np.int64(5), 6]})
    assert so.start_after_token_ids == (5, 6) and all(type(t) is int for t in so.start_after_token_ids)
    params = SamplingParams(structured_outputs=so)
    params.validate_vocab(7)
    with pytest.raises(
        ValueError, match=r"structured_outputs\.start_after_token_ids must be token ids < vocab_size \(6\)"
    ):
        params.validate_vocab(6)
