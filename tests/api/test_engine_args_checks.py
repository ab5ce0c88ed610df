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


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_model_len": "1k"}, r"max_model_len must be None, -1 .* or an int >= 2, got '1k'"),
        ({"max_model_len": 0}, r"max_model_len must be None, -1 .* or an int >= 2, got 0"),
        ({"max_model_len": 64.0}, r"max_model_len must be None, -1 .* or an int >= 2, got 64.0"),
        ({"max_model_len": True}, r"max_model_len must be None, -1 .* or an int >= 2, got True"),
        ({"num_blocks": 0}, r"num_blocks must be an int >= 1, got 0"),
        ({"num_blocks": "64"}, r"num_blocks must be an int >= 1, got '64'"),
        ({"kv_cache_bytes": -1}, r"kv_cache_bytes must be an int >= 1, got -1"),
        (
            {"max_model_len": 64, "max_num_batched_tokens": 32, "enable_chunked_prefill": False},
            r"max_num_batched_tokens \(32\) is smaller than max_model_len \(64\) - 1 with enable_chunked_prefill=False",
        ),
    ],
    ids=["len-str", "len-0", "len-float", "len-bool", "blocks-0", "blocks-str", "bytes-neg", "budget"],
)
def test_settings_that_need_no_model_are_refused_before_it_loads(kwargs, message):
    """A max_model_len of the wrong type or below 2, a num_blocks or kv_cache_bytes that is no
    positive int, and (chunked prefill off) a budget that a chosen max_model_len cannot prefill
    in were refused only after the checkpoint and tokenizer had loaded (minutes for a large
    model), though none needs the model to decide; a typo in a script then cost a whole load."""
    from enginespec.llm import LLM

    with pytest.raises(ValueError, match=message):
        EngineArgs(**kwargs)
    with pytest.raises(ValueError, match=message):  # not "checkpoint directory /nowhere does not exist"
        LLM("/nowhere", **kwargs)


def test_the_model_dependent_bounds_still_pass_construction():
    """What needs the model stays where the model is: a max_model_len past its positions, -1
    and None (the model's, fitted), and a budget beside a max_model_len the engine fits."""
    for kwargs in (
        {"max_model_len": 10**9},
        {"max_model_len": -1, "max_num_batched_tokens": 8, "enable_chunked_prefill": False},
        {"max_model_len": None, "max_num_batched_tokens": 8, "enable_chunked_prefill": False},
        {"max_model_len": 9, "max_num_batched_tokens": 8, "enable_chunked_prefill": False},
        {"max_model_len": 64, "max_num_batched_tokens": 8},
    ):
        EngineArgs(**kwargs)


@pytest.mark.parametrize("value", ["nope", "", 3, None], ids=["unknown", "empty", "int", "None"])
def test_compile_backend_must_be_one_torch_compile_knows(value):
    """compile_backend went to torch.compile as it was: on CUDA (or with compile_model=True) an
    unknown name was torch's InvalidBackend, a RuntimeError naming no engine argument, raised
    after the model had loaded; on the CPU, where nothing compiles, it passed unseen."""
    from enginespec.llm import LLM

    with pytest.raises(ValueError, match=r"^compile_backend must be .*'aot_eager'.*'inductor'.*, got "):
        EngineArgs(compile_backend=value)
    with pytest.raises(ValueError, match=r"^compile_backend must be"):
        LLM("/nowhere", compile_backend=value)


def test_compile_backend_takes_torch_compiles_names_and_callables():
    for value in ("inductor", "aot_eager", "eager", lambda gm, inputs: gm.forward):
        assert EngineArgs(compile_backend=value).compile_backend is value


def test_max_model_len_and_the_budget_are_refused_just_past_their_bounds():
    """Each construction-time bound at its value and one past it: max_model_len 2 (a prompt
    token and a generated one) is taken and 1 refused; with chunked prefill off a budget of
    max_model_len - 1 tokens is taken (add() admits prompt + max_tokens - 1 <= budget) and one
    token fewer refused. The other tests stood far from both bounds, so moving either by one
    went unseen."""
    assert EngineArgs(max_model_len=2).max_model_len == 2
    with pytest.raises(ValueError, match=r"max_model_len must be None, -1 .* or an int >= 2, got 1"):
        EngineArgs(max_model_len=1)
    EngineArgs(max_model_len=9, max_num_batched_tokens=8, enable_chunked_prefill=False)
    with pytest.raises(
        ValueError, match=r"max_num_batched_tokens \(8\) is smaller than max_model_len \(10\) - 1"
    ):
        EngineArgs(max_model_len=10, max_num_batched_tokens=8, enable_chunked_prefill=False)
