"""engine/structured_output.py without an engine: what each constraint compiles to, checked
by walking a matcher over text (the tiny JSON tokenizer: one token per character)."""

from __future__ import annotations

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
