"""Structured outputs (vLLM's StructuredOutputsParams, with xgrammar) through LLM.generate on
the impl under test: the output follows its constraint, finishes "stop" once the constraint is
complete, and a constrained request changes nothing for its batch mates; async scheduling on
and off give the same tokens. Tiny float32 model on CPU whose tokenizer can write JSON
(testing.checkpoints.json_model_dir); engines are built once per module."""

from __future__ import annotations

import json
import re
import sys

import pytest

from enginespec.spec import SamplingParams, StructuredOutputsParams
from enginespec.testing.checkpoints import JSON_CHARS, json_model_dir

pytest.importorskip("xgrammar")
pytestmark = pytest.mark.usefixtures("torch_one_thread")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "color": {"enum": ["red", "blue"]},
    },
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}
CHOICES = ["yes", "no", "maybe"]
REGEX = r"[a-c]{2}\d{3}"
PROMPT = [5, 6, 7]
#: Free-form JSON from random weights rarely closes its strings: a bias towards '"' and '}'
#: (applied after the grammar's mask, so it can only choose among allowed tokens) ends it.
CLOSING = {"logit_bias": {4 + JSON_CHARS.index(c): 4.0 for c in '"}'}}


def _valid(value: object) -> bool:
    """SCHEMA checked by hand (jsonschema is not a test dependency)."""
    return (
        isinstance(value, dict)
        and list(value) == ["name", "age", "color"]
        and isinstance(value["name"], str)
        and len(value["name"]) <= 4
        and isinstance(value["age"], int)
        and 0 <= value["age"] <= 99
        and value["color"] in ("red", "blue")
    )


@pytest.fixture(scope="module")
def llms(impl):
    """One engine per async_scheduling setting, built on first use."""
    from enginespec.llm import LLM

    built: dict = {}

    def get(async_scheduling: bool):
        if async_scheduling not in built:
            built[async_scheduling] = LLM(
                str(json_model_dir()),
                impl=impl,
                dtype="float32",
                device="cpu",
                block_size=4,
                num_blocks=64,
                max_model_len=128,
                async_scheduling=async_scheduling,
            )
        return built[async_scheduling]

    return get


def _generate(llm, params, prompts=(PROMPT,)):
    return llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)


def _params(so, **kwargs):
    return SamplingParams(
        **{"max_tokens": 80, "temperature": 1.0, "seed": 11, **kwargs}, structured_outputs=so
    )


def test_a_json_schema_s_output_validates_with_async_on_and_off(llms):
    """n=2 seeded samples, each with its own matcher: both parse and validate, end "stop" on
    EOS once the object is closed, and async scheduling gives exactly the serial engine's
    tokens, with its steps still async (the draw left on the device: the masks only wait for
    the step before)."""
    params = _params(StructuredOutputsParams(json=SCHEMA), n=2)
    stats = llms(True).engine.stats
    steps, async_steps = stats.num_steps, stats.num_async_steps
    got = {flag: _generate(llms(flag), params)[0].outputs for flag in (False, True)}
    assert [o.token_ids for o in got[True]] == [o.token_ids for o in got[False]]
    num_steps, num_async = stats.num_steps - steps, stats.num_async_steps - async_steps
    assert num_async >= max(len(o.token_ids) for o in got[True]) - 1 and num_async <= num_steps
    for out in got[False]:
        assert _valid(json.loads(out.text)), out.text
        assert out.finish_reason == "stop" and out.stop_reason is None
    assert got[False][0].token_ids != got[False][1].token_ids  # two samples, two matchers


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize(
    "so, check, extra",
    [
        (StructuredOutputsParams(choice=CHOICES), lambda text: text in CHOICES, {}),
        (StructuredOutputsParams(regex=REGEX), lambda text: re.fullmatch(REGEX, text) is not None, {}),
        (StructuredOutputsParams(json_object=True), lambda text: isinstance(json.loads(text), dict), CLOSING),
        (StructuredOutputsParams(json=json.dumps(SCHEMA)), lambda text: _valid(json.loads(text)), {}),
        (
            StructuredOutputsParams(grammar='root ::= "(" [0-9]+ ")" | "none"'),
            lambda text: re.fullmatch(r"\(\d+\)|none", text) is not None,
            {},
        ),
    ],
    ids=["choice", "regex", "json_object", "json_text", "grammar"],
)
def test_each_constraint_is_followed(llms, so, check, extra, async_scheduling):
    params = [_params(so, seed=s, **extra) for s in (1, 2)]
    outs = _generate(llms(async_scheduling), params, [PROMPT, PROMPT])
    for out in (o.outputs[0] for o in outs):
        assert check(out.text), out.text
        assert out.finish_reason == "stop"


def test_a_short_max_tokens_ends_for_length_on_a_valid_prefix(llms):
    params = _params(StructuredOutputsParams(regex=r"[a-c]{2}\d{20}"), max_tokens=5)
    out = _generate(llms(False), params)[0].outputs[0]
    assert out.finish_reason == "length"
    assert re.fullmatch(r"[a-c]{2}\d{3}", out.text), out.text


def test_the_grammar_s_end_finishes_even_with_ignore_eos(llms):
    """Once the matcher has taken its stop token the grammar is complete: the request ends
    "stop" there rather than running on to max_tokens with nothing left to allow."""
    out = _generate(llms(False), _params(StructuredOutputsParams(choice=CHOICES), ignore_eos=True))[0]
    assert out.outputs[0].text in CHOICES
    assert out.outputs[0].finish_reason == "stop"


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_stop_token_id_that_is_text_stays_text_to_the_grammar(llms, async_scheduling):
    """A stop_token_ids entry the grammar can write as text ("5" here) is text to the
    grammar, as in vLLM: the mask is the one without it, so the draws up to the first "5"
    are those of the request without the stop id, and that "5" stops it ("stop", stop_reason
    the id). Made a grammar end instead, xgrammar took it out of the text: a choice of "55a"
    had no first token left (finish "error") and a regex drew other digits."""
    llm, five = llms(async_scheduling), 4 + JSON_CHARS.index("5")
    regex = StructuredOutputsParams(regex=r"[0-9]{6}")
    free = _generate(llm, _params(regex, temperature=0.0))[0].outputs[0].token_ids
    assert five in free  # the premise: greedy writes a "5"
    cut = free[: free.index(five) + 1]
    outs = _generate(
        llm,
        [
            _params(so, temperature=0.0, stop_token_ids=[five])
            for so in (regex, StructuredOutputsParams(choice=["55a"]))
        ],
        [PROMPT, PROMPT],
    )
    got, choice = outs[0].outputs[0], outs[1].outputs[0]
    assert (got.token_ids, got.finish_reason, got.stop_reason) == (cut, "stop", five)
    assert (choice.token_ids, choice.finish_reason, choice.stop_reason) == ([five], "stop", five)


def test_a_special_stop_token_id_still_ends_the_grammar(llms):
    """A stop id the tokenizer counts as special (<unk> here) may end the grammar, with
    ignore_eos too: the regex is written, then that id ends it."""
    unk = llms(False).engine.tokenizer.unk_token_id
    so = StructuredOutputsParams(regex=r"[0-9]{3}")
    out = _generate(llms(False), _params(so, ignore_eos=True, stop_token_ids=[unk]))[0].outputs[0]
    assert re.fullmatch(r"[0-9]{3}", out.text) and out.token_ids[-1] == unk, out.token_ids
    assert (out.finish_reason, out.stop_reason) == ("stop", unk)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_constrained_request_leaves_its_batch_mates_alone(llms, async_scheduling):
    """A free request next to a constrained one draws the tokens it draws alone (seeded)."""
    llm = llms(async_scheduling)
    free = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
    alone = _generate(llm, free, [[9, 10, 11]])[0].outputs[0].token_ids
    both = _generate(llm, [free, _params(StructuredOutputsParams(json=SCHEMA))], [[9, 10, 11], PROMPT])
    assert both[0].outputs[0].token_ids == alone
    assert _valid(json.loads(both[1].outputs[0].text))


def test_masked_tokens_have_minus_infinite_logprobs(llms):
    """The mask is applied to the raw logits before the sampler (vLLM's model runner), so
    the logprobs see it: at the first position only the choices' first letters are finite."""
    params = _params(StructuredOutputsParams(choice=CHOICES), logprobs=5, temperature=0.0)
    first = _generate(llms(False), params)[0].outputs[0].logprobs[0]
    finite = {lp.decoded_token for lp in first.values() if lp != float("-inf")}
    assert finite == {"y", "n", "m"}


def test_preemption_keeps_the_matcher_valid(impl):
    """A pool too small for every request at once preempts (recompute keeps output tokens),
    and every preempted request's output still validates."""
    from enginespec.llm import LLM

    llm = LLM(
        str(json_model_dir()), impl=impl, dtype="float32", device="cpu", block_size=4,
        num_blocks=24, max_model_len=96, max_num_seqs=8,
    )  # fmt: skip
    params = [_params(StructuredOutputsParams(json=SCHEMA), seed=s) for s in range(6)]
    outs = _generate(llm, params, [PROMPT] * 6)
    assert llm.engine.stats.num_preemptions > 0
    for out in (o.outputs[0] for o in outs):
        assert _valid(json.loads(out.text)), out.text


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_min_tokens_yields_to_a_complete_grammar(llms, async_scheduling):
    """Once a choice is written the grammar allows only EOS, which min_tokens masks: the
    grammar wins (vLLM's rule) and the request ends "stop" on EOS below min_tokens, instead of
    drawing from an all -inf row a token the grammar refuses. Its batch mate is untouched."""
    llm = llms(async_scheduling)
    free = SamplingParams(max_tokens=8, temperature=1.0, seed=5, ignore_eos=True)
    alone = _generate(llm, free, [[9, 10, 11]])[0].outputs[0].token_ids
    tight = _params(StructuredOutputsParams(choice=CHOICES), min_tokens=20, max_tokens=30)
    outs = _generate(llm, [free, tight, _params(StructuredOutputsParams(regex=REGEX), min_tokens=9)],
                     [[9, 10, 11], PROMPT, PROMPT])  # fmt: skip
    assert outs[0].outputs[0].token_ids == alone
    eos = llm.engine.tokenizer.eos_token_id
    for out, check in (
        (outs[1].outputs[0], CHOICES.__contains__),
        (outs[2].outputs[0], re.compile(REGEX).fullmatch),
    ):
        assert check(out.text) and out.finish_reason == "stop", (out.text, out.token_ids)
        assert out.token_ids == [*llm.engine.tokenizer.encode(out.text, add_special_tokens=False), eos]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_row_left_no_token_the_grammar_allows_ends_as_an_error(llms, async_scheduling):
    """allowed_token_ids or bad_words that exclude every token the grammar allows, or a choice
    the vocabulary cannot write (no "é" in it), leave an all -inf row: the grammar refuses
    what is drawn there and the request ends at once with finish_reason "error" (vLLM finishes
    it as an error) rather than running to max_tokens on refused tokens; also when the refused
    token is the last max_tokens allows (it was "length", as if the output were a valid
    prefix). Batch mates finish."""
    llm = llms(async_scheduling)
    z = 4 + JSON_CHARS.index("z")
    bad = [
        _params(StructuredOutputsParams(choice=CHOICES), allowed_token_ids=[z]),
        _params(StructuredOutputsParams(choice=CHOICES), bad_words=["y", "n", "m"]),
        _params(StructuredOutputsParams(choice=["héllo"])),
        _params(StructuredOutputsParams(choice=["yes"]), bad_words=["e"], max_tokens=2),
    ]
    outs = _generate(llm, [*bad, _params(StructuredOutputsParams(choice=CHOICES))], [PROMPT] * 5)
    for out in (o.outputs[0] for o in outs[:4]):
        assert out.finish_reason == "error" and "no token the grammar allows" in out.error
        assert len(out.token_ids) <= 2, out.token_ids  # "h" of "héllo", then the refused token
    assert outs[4].outputs[0].text in CHOICES
    assert not llm.engine.has_unfinished and not llm.engine._constrained


# ---------------------------------------------------------------- a start marker (reasoning)

#: A two-token start marker, "<" then "/" (a reasoning model's `</think>` in miniature: it
#: arrives over two steps), made likely by a bias; the grammars below cannot write it, so the
#: bias, applied after the mask, changes nothing once the grammar governs.
MARKER = tuple(4 + JSON_CHARS.index(c) for c in "</")
THINKING = {"logit_bias": {t: 5.0 for t in MARKER}}


def _after_marker(text: str) -> tuple[str, str]:
    """(the free text before the marker's first appearance, the text after it)."""
    at = text.index("</")
    return text[:at], text[at + 2 :]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_grammar_starts_after_its_start_marker(llms, async_scheduling):
    """With start_after_token_ids the output is free until the marker has appeared (a
    reasoning model thinks first; vLLM's structured outputs with reasoning) and follows the
    grammar after it: n=2 samples, each with its own watch, write free text (that the regex
    refuses), the marker, then a full match, and end "stop". Async scheduling draws the serial
    engine's tokens. On an engine without the marker the grammar governed from the first token."""
    so = StructuredOutputsParams(regex=REGEX, start_after_token_ids=MARKER)
    params = _params(so, n=2, **THINKING)
    outs = _generate(llms(async_scheduling), params)[0].outputs
    serial = _generate(llms(False), params)[0].outputs
    assert [o.token_ids for o in outs] == [o.token_ids for o in serial]
    thoughts = []
    for out in outs:
        thought, answer = _after_marker(out.text)
        assert re.fullmatch(REGEX, answer) and out.finish_reason == "stop", out.text
        thoughts.append(thought)
    assert any(thoughts) and outs[0].token_ids != outs[1].token_ids, thoughts


def test_without_its_start_marker_the_output_stays_free(llms):
    """A marker that never appears (biased away) leaves every token free: the request runs to
    max_tokens ("length") with text the choice grammar would have refused, and no grammar
    ever finishes it."""
    so = StructuredOutputsParams(choice=CHOICES, start_after_token_ids=MARKER[:1])
    params = _params(so, max_tokens=8, ignore_eos=True, logit_bias={MARKER[0]: -100.0})
    out = _generate(llms(False), params)[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 8
    assert not any(c.startswith(out.text[:2]) for c in CHOICES), out.text
    assert set(out.text) - {"y", "n", "m"}, out.text  # not a fresh grammar's first letters either


def test_a_start_marker_decides_alike_on_the_reference(impl, reference_impl, llms):
    """The marker's watch and the mask after it are the engine's, over any impl: the impl
    under test draws the reference impl's tokens, marker, thinking and answer alike."""
    from enginespec.llm import LLM

    so = StructuredOutputsParams(json=SCHEMA, start_after_token_ids=MARKER)
    params = [_params(so, seed=s, **THINKING) for s in (1, 2)]
    reference = LLM(
        str(json_model_dir()), impl=reference_impl, dtype="float32", device="cpu", block_size=4,
        num_blocks=64, max_model_len=128,
    )  # fmt: skip
    got = [o.outputs[0] for o in _generate(llms(False), params, [PROMPT, PROMPT])]
    want = [o.outputs[0] for o in _generate(reference, params, [PROMPT, PROMPT])]
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for out in got:
        assert _valid(json.loads(_after_marker(out.text)[1])), out.text


def test_before_its_start_marker_min_tokens_is_checked_as_for_a_free_request(llms):
    """allowed_token_ids of stop ids only with min_tokens leave a free row nothing to draw: a
    ValueError on add, as for a request without a grammar, since no grammar governs the
    thinking (without a marker the grammar wins over min_tokens and the request is taken)."""
    llm = llms(False)
    eos = llm.engine.tokenizer.eos_token_id
    tight = {"allowed_token_ids": [eos], "min_tokens": 2}
    with pytest.raises(ValueError, match=r"allowed_token_ids \[\d+\] are all stop ids"):
        _generate(
            llm, _params(StructuredOutputsParams(choice=CHOICES, start_after_token_ids=MARKER), **tight)
        )
    assert not llm.engine.has_unfinished
    out = _generate(llm, _params(StructuredOutputsParams(regex="a*"), **tight))[0].outputs[0]
    assert (out.text, out.finish_reason) == ("", "stop")


def test_a_start_marker_past_the_vocabulary_is_refused_on_add(llms):
    llm = llms(False)
    so = StructuredOutputsParams(choice=CHOICES, start_after_token_ids=[5, llm.engine.vocab_size])
    with pytest.raises(ValueError, match=r"structured_outputs\.start_after_token_ids must be token ids <"):
        _generate(llm, _params(so))
    assert not llm.engine.has_unfinished


class _FaultyMatcher:
    """An xgrammar GrammarMatcher whose `method` raises from its call number `calls` + 1 on
    (a bug inside xgrammar on one request's state); everything else is the matcher's own."""

    def __init__(self, matcher, method: str, calls: int):
        self._matcher, self._method, self._left = matcher, method, calls

    def __getattr__(self, name):
        found = getattr(self._matcher, name)
        if name != self._method:
            return found

        def call(*args, **kwargs):
            if self._left == 0:
                raise RuntimeError("planted matcher fault")
            self._left -= 1
            return found(*args, **kwargs)

        return call


def _run(engine, requests: dict, plant=None) -> dict:
    """Add `requests` ({id: (prompt, params)}) to the engine, have `plant(engine)` break one
    matcher, step to the end: {id: its final RequestOutput}."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, list(prompt), params)
    if plant is not None:
        plant(engine)
    finals = {}
    while engine.has_unfinished:
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
    return finals


def _breaker(request_id: str, method: str, calls: int):
    def plant(engine):
        state = engine._samples[request_id][1].grammar
        state.matcher = _FaultyMatcher(state.matcher, method, calls)

    return plant


def _outcome(out) -> list:
    return [(c.token_ids, c.text, c.finish_reason, c.error) for c in out.outputs]


@pytest.mark.parametrize("method", ["fill_next_token_bitmask", "accept_token"], ids=["fill", "accept"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_matcher_fault_fails_only_its_request(llms, async_scheduling, method):
    """A matcher that raises filling its bitmask or accepting a token (a bug inside xgrammar
    on one request's state) failed the whole step: every request of the batch ended "error".
    Only its request fails (finish_reason "error" naming the fault, the tokens it had), its
    blocks are freed, no step counts as failed, every other request (constrained or not) gets
    the fault-free run's output, and the engine serves on."""
    engine = llms(async_scheduling).engine
    requests = {
        "bad": (PROMPT, _params(StructuredOutputsParams(choice=CHOICES), seed=3)),
        "good": (PROMPT, _params(StructuredOutputsParams(json=SCHEMA), seed=4)),
        "free": ([9, 10, 11], SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)),
    }
    expected = _run(engine, requests)
    failed_steps = engine.stats.num_failed_steps
    got = _run(engine, requests, _breaker("bad", method, 1))
    others = ("good", "free")
    assert {k: _outcome(got[k]) for k in others} == {k: _outcome(expected[k]) for k in others}
    assert engine.stats.num_failed_steps == failed_steps, "one matcher's fault failed the whole step"
    ((tokens, _, finish, error),) = _outcome(got["bad"])
    assert finish == "error" and "grammar matcher failed" in error and "planted matcher fault" in error
    assert 1 <= len(tokens) < len(expected["bad"].outputs[0].token_ids)
    assert tokens == expected["bad"].outputs[0].token_ids[: len(tokens)]
    assert not engine._constrained and engine.block_manager.num_free == engine.runner.num_blocks
    again = _run(engine, requests)  # served on
    assert {k: _outcome(o) for k, o in again.items()} == {k: _outcome(o) for k, o in expected.items()}


@pytest.mark.parametrize("method", ["fill_next_token_bitmask", "accept_token"], ids=["fill", "accept"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_matcher_fault_fails_every_sample_of_its_request(llms, async_scheduling, method):
    """n=2: sample 0's matcher raises mid-output while sample 1 runs. The user's request has
    failed, so sample 1 ends "error" too, at once (naming sample 0's fault), with the tokens
    it had: a prefix of the fault-free run's, the same with async scheduling on and off (none
    drawn after the fault). Its batch mate is untouched and the pool is idle."""
    from enginespec.engine.request_ids import internal_id

    engine = llms(async_scheduling).engine
    requests = {
        "pair": (PROMPT, _params(StructuredOutputsParams(json=SCHEMA), n=2)),
        "free": ([9, 10, 11], SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)),
    }
    expected = _run(engine, requests)
    got = _run(engine, requests, _breaker(internal_id("pair", 0, 2), method, 3))
    assert _outcome(got["free"]) == _outcome(expected["free"])
    first, second = got["pair"].outputs
    assert first.finish_reason == second.finish_reason == "error"
    assert "planted matcher fault" in first.error
    assert second.error == f"sample 0 of this request failed: {first.error}"
    for out, full in zip(got["pair"].outputs, expected["pair"].outputs):
        assert out.token_ids == full.token_ids[: len(out.token_ids)] and len(out.token_ids) < len(
            full.token_ids
        )
    assert len(second.token_ids) == (3 if method == "fill_next_token_bitmask" else 4)
    assert not engine.has_unfinished and not engine._constrained
    assert engine.block_manager.num_free == engine.runner.num_blocks


# ---------------------------------------------------------------- bad input


def test_exactly_one_constraint_is_required():
    with pytest.raises(
        ValueError, match=r"exactly one of json, regex, choice, grammar, json_object.*got json, regex"
    ):
        StructuredOutputsParams(json=SCHEMA, regex="a")
    with pytest.raises(ValueError, match="got none"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="choice must be a non-empty list"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="structured_outputs must be None or a StructuredOutputsParams"):
        SamplingParams(structured_outputs="json")
    assert SamplingParams(structured_outputs={"choice": ["a"]}).structured_outputs.choice == ("a",)


@pytest.mark.parametrize(
    "so, field",
    [
        (StructuredOutputsParams(json='{"type": "object"'), "json"),
        (StructuredOutputsParams(json={"type": "nosuch"}), "json"),
        (StructuredOutputsParams(regex="[a-z]+("), "regex"),
        (StructuredOutputsParams(grammar="rule ::= 'x'"), "grammar"),
        # not JSON text: a brace too many closes the schema early (xgrammar's parser would read
        # the first object and drop "required" unseen); text after the schema
        (StructuredOutputsParams(json='{"type": "object", "properties": {}}, "required": ["a"]}'), "json"),
        (StructuredOutputsParams(json='{"type": "object"} {"type": "string"}'), "json"),
    ],
)
def test_a_constraint_that_does_not_compile_is_refused_on_add(llms, so, field):
    """A schema, regex or grammar that does not compile, or a schema given as text that is not
    JSON text (vLLM parses it as JSON first), is a ValueError on add naming the field."""
    llm = llms(False)
    with pytest.raises(ValueError, match=rf"StructuredOutputsParams\.{field} is invalid: (?!\[)") as info:
        _generate(llm, _params(so))
    assert ".cc:" not in str(info.value)  # xgrammar's reason without its log prefix
    assert not llm.engine.has_unfinished


@pytest.mark.parametrize(
    "so", [StructuredOutputsParams(regex="é+"), StructuredOutputsParams(choice=["élan", "été"])]
)
def test_a_constraint_no_token_can_begin_is_refused_on_add(llms, so):
    """The vocabulary (ASCII) cannot write its first character: a ValueError on add (a 400 over
    HTTP), not a request that fails on its first step."""
    llm = llms(False)
    with pytest.raises(
        ValueError, match=rf"StructuredOutputsParams\.{so.kind}: no token of this model's vocabulary"
    ):
        _generate(llm, _params(so))
    assert not llm.engine.has_unfinished
    assert (
        llm.generate(["ab"], _params(StructuredOutputsParams(regex="é*")), use_tqdm=False)[0].outputs[0].text
        == ""
    )


def test_without_xgrammar_the_error_says_what_to_install(llms, monkeypatch):
    llm = llms(False)
    monkeypatch.setattr(llm.engine, "_structured", None)  # as if no request had compiled yet
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar raises ImportError
    with pytest.raises(ValueError, match=r"structured_outputs: .*pip install xgrammar"):
        _generate(llm, _params(StructuredOutputsParams(choice=CHOICES)))
    assert not llm.engine.has_unfinished


def test_constrained_requests_are_not_drafted_for(impl):
    """Speculative decoding (n-gram) drafts for the free request only: a grammar masks one
    position at a time, so a constrained request is never given drafts (and its output is
    valid); vLLM V1 drafts for it with rollback, which is not needed here yet."""
    from enginespec.llm import LLM

    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    llm = LLM(
        str(json_model_dir()), impl=impl, dtype="float32", device="cpu", block_size=4,
        num_blocks=64, max_model_len=128, speculative_config=ngram,
    )  # fmt: skip
    loop = [5, 6, 7, 8] * 4
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    constrained = _params(StructuredOutputsParams(json=SCHEMA), temperature=0.0)
    outs = _generate(llm, [free, constrained], [loop, loop])
    assert outs[0].outputs[0].spec_decode.num_draft_tokens > 0
    assert outs[1].outputs[0].spec_decode.num_draft_tokens == 0
    assert _valid(json.loads(outs[1].outputs[0].text))
