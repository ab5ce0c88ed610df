"""EngineArgs' own checks of the settings that need no model: each bad value is a ValueError
naming the field and its bound on construction, so `LLM(...)` refuses it before any checkpoint
is read (here "/nowhere", which would otherwise be the error)."""

from __future__ import annotations

import pytest

from enginespec.engine_args import EngineArgs
from enginespec.spec import load_impl


class _NotAnImpl:
    name = "not-an-impl"


@pytest.mark.parametrize(
    "value", [3, _NotAnImpl(), None, "", "  "], ids=["int", "object", "None", "empty", "blank"]
)
def test_impl_must_name_an_implementation_or_be_one(value):
    """impl=3 (or any object that is no Implementation) failed deep in the engine's build with
    "AttributeError: 'int' object has no attribute 'attention_backend'", after the model had
    loaded; impl=None or "" was load_impl's "not given" ($ENGINESPEC_IMPL, else the reference
    oracle, many times slower) without a word, while LLM() and the CLI default to "fast" and the
    CLI refuses a blank --impl."""
    from enginespec.llm import LLM

    with pytest.raises(ValueError, match=r"^impl must name an implementation .*, got "):
        EngineArgs(impl=value)
    with pytest.raises(ValueError, match=r"^impl must name an implementation"):  # before anything loads
        LLM("/nowhere", impl=value)


def test_load_impl_checks_an_object_as_it_checks_a_named_one():
    """load_impl returned any object that was not a str as it was (impl=3 reached the engine)."""
    with pytest.raises(ValueError, match=r"is not an Implementation: missing \['new_request'"):
        load_impl(_NotAnImpl())
    fast = load_impl("fast")
    assert load_impl(fast) is fast
    assert load_impl(type(fast)).name == fast.name  # a class is made with no arguments, as by name
