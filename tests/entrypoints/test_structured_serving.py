"""Structured outputs over the OpenAI API: response_format (json_object, json_schema) on chat
and completions, vLLM's structured_outputs extra body field, and their 400s. The handlers run
over an in-process engine client on the tiny model whose tokenizer can write JSON."""

from __future__ import annotations

import asyncio
import json

import pytest

from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from enginespec.entrypoints.openai.reasoning import get_parser
from enginespec.entrypoints.openai.serving import ServerContext, create_chat_completion, create_completion
from enginespec.testing.checkpoints import JSON_CHARS, json_model_dir
from tests.entrypoints.client_helpers import in_process_client, never

pytest.importorskip("xgrammar")
pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4, block_size=4)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 4}, "age": {"type": "integer", "maximum": 99}},
    "required": ["name", "age"],
}
TEMPLATE = "{% for m in messages %}{{ m['content'] }};{% endfor %}"
# The openai client's shape of response_format (client.chat.completions.create(response_format=...)).
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
# Free-form JSON from random weights rarely closes a string: a bias towards '"' and '}'.
CLOSING = {str(4 + JSON_CHARS.index(c)): 4.0 for c in '"}'}


@pytest.fixture(scope="module")
def engine(torch_one_thread):
    with in_process_client(json_model_dir(), **ENGINE) as client:
        yield client


def _call(engine, kind: str, reasoning_parser=None, **fields) -> dict:
    ctx = ServerContext(
        engine, engine.tokenizer, ["tiny"], 128, chat_template=TEMPLATE, reasoning_parser=reasoning_parser
    )
    base = {"model": "tiny", "max_tokens": 60, "temperature": 1.0, "seed": 3, **fields}
    if kind == "chat":
        body, handler = (
            ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **base),
            create_chat_completion,
        )
    else:
        body, handler = CompletionRequest(prompt=[5, 6, 7], **base), create_completion

    async def run():
        engine.start(asyncio.get_running_loop())
        return await handler(ctx, body, never)

    return asyncio.run(run())


def _text(body: dict) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _person(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"name", "age"} and isinstance(value["age"], int) and len(value["name"]) <= 4


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_response_format_json_schema(engine, kind):
    body = _call(engine, kind, response_format=JSON_SCHEMA)
    assert _person(_text(body)), _text(body)
    assert body["choices"][0]["finish_reason"] == "stop"


def test_response_format_json_object(engine):
    body = _call(engine, "chat", response_format={"type": "json_object"}, logit_bias=CLOSING)
    assert isinstance(json.loads(_text(body)), dict), _text(body)
    assert body["choices"][0]["finish_reason"] == "stop"


def test_vllms_structured_outputs_field(engine):
    body = _call(engine, "completion", structured_outputs={"choice": ["left", "right"]}, n=2)
    assert {c["text"] for c in body["choices"]} <= {"left", "right"}
    body = _call(engine, "chat", structured_outputs={"regex": "[0-9]{4}"})
    assert len(_text(body)) == 4 and _text(body).isdigit()


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"structured_outputs": {"choice": ["a"], "regex": "b"}}, "exactly one of json, regex"),
        ({"structured_outputs": {"pattern": "b"}}, "unknown field"),
        ({"structured_outputs": {"regex": "("}}, r"StructuredOutputsParams\.regex is invalid"),
        ({"response_format": JSON_SCHEMA, "structured_outputs": {"regex": "a"}}, "not both"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "json_schema.schema"),
    ],
)
def test_bad_constraints_are_400s(engine, fields, match):
    with pytest.raises(APIError, match=match) as info:
        _call(engine, "chat", **fields)
    assert info.value.status == 400


def test_response_format_text_asks_for_nothing(engine):
    """response_format text is OpenAI's default: no constraint (the same tokens as without)."""
    plain = _call(engine, "completion", max_tokens=8, ignore_eos=True)
    text = _call(engine, "completion", max_tokens=8, ignore_eos=True, response_format={"type": "text"})
    assert _text(text) == _text(plain)


# tool_choice "required" or a named function: the reply is forced into calls (tool_calls.forced_schema)
TOOLS = [
    {"type": "function", "function": {"name": "person", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "now"}},
]
CLOSE_ARRAY = {**CLOSING, str(4 + JSON_CHARS.index("]")): 4.0}


def test_a_named_tool_choice_forces_that_functions_arguments(engine):
    named = {"type": "function", "function": {"name": "person"}}
    choice = _call(engine, "chat", tools=TOOLS, tool_choice=named)["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "person" and _person(call["function"]["arguments"])
    assert choice["message"]["content"] is None and choice["finish_reason"] == "stop"


def test_required_forces_a_list_of_listed_calls(engine):
    body = _call(engine, "chat", tools=TOOLS, tool_choice="required", max_tokens=120, logit_bias=CLOSE_ARRAY)
    choice = body["choices"][0]
    calls = [c["function"] for c in choice["message"]["tool_calls"]]
    assert calls and choice["finish_reason"] == "tool_calls"
    for call in calls:
        assert call["name"] == "now" and json.loads(call["arguments"]) == {} or _person(call["arguments"])


# the parameters openai.pydantic_function_tool writes for a model with a nested model: `$defs`
# at their top, `$ref`s to them from inside
NESTED = {
    "$defs": {"Person": SCHEMA},
    "type": "object",
    "properties": {"who": {"$ref": "#/$defs/Person"}},
    "required": ["who"],
}


def test_required_takes_tools_whose_parameters_refer_to_their_defs(engine):
    """Under "required" each tool's parameters sit inside the array schema, where `#/$defs/...`
    is read from the schema's root: the defs go there (vLLM's way). It was a 400 (`Cannot find
    field '$defs'`) for every pydantic tool with a nested model."""
    tools = [{"type": "function", "function": {"name": "greet", "parameters": NESTED}}]
    body = _call(engine, "chat", tools=tools, tool_choice="required", max_tokens=120, logit_bias=CLOSE_ARRAY)
    choice = body["choices"][0]
    calls = [c["function"] for c in choice["message"]["tool_calls"]]
    assert calls and choice["finish_reason"] == "tool_calls"
    for call in calls:
        assert call["name"] == "greet" and _person(json.dumps(json.loads(call["arguments"])["who"]))


def test_two_tools_whose_defs_clash_are_a_400_naming_tools(engine):
    """Under "required" all tools' defs share the schema's root: one name meaning two schemas is
    refused, naming `tools` (the entries at fault are in the message), not tool_choice."""
    other = {**NESTED, "$defs": {"Person": {"type": "object", "properties": {"age": {"type": "integer"}}}}}
    tools = [
        {"type": "function", "function": {"name": "greet", "parameters": NESTED}},
        {"type": "function", "function": {"name": "age", "parameters": other}},
    ]
    with pytest.raises(APIError, match=r"tools\[1\]") as info:
        _call(engine, "chat", tools=tools, tool_choice="required")
    assert (info.value.status, info.value.param) == (400, "tools")


def test_a_constrained_reply_without_thinking_is_content(engine):
    """Under --reasoning-parser a reply that starts closed (enable_thinking false) follows the
    grammar from its first token: the JSON is the content, not taken for unclosed thinking. (One
    that starts in its thinking: tests/entrypoints/test_reasoning_structured_serving.py.)"""
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    body = _call(engine, "chat", reasoning_parser=get_parser("qwen3"), response_format=JSON_SCHEMA, **off)
    message = body["choices"][0]["message"]
    assert _person(message["content"]) and message["reasoning"] is None


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "tagged"}}])
def test_a_forced_tools_schema_the_compiler_refuses_is_a_400_naming_tools(engine, choice):
    """The forced constraint is the tools' parameters, not a structured_outputs the client sent:
    its refusal names `tools` (it named StructuredOutputsParams.json with no param), and the
    engine serves the next request."""
    refused = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    tools = [{"type": "function", "function": {"name": "tagged", "parameters": refused}}]
    with pytest.raises(APIError, match="tools: .*uniqueItems") as info:
        _call(engine, "chat", tools=tools, tool_choice=choice)
    assert (info.value.status, info.value.param) == (400, "tools")
    assert _call(engine, "completion", max_tokens=4, ignore_eos=True)["choices"][0]["text"]


def test_a_refused_structured_outputs_of_the_client_keeps_its_own_name(engine):
    bad = {"type": "array", "uniqueItems": True}
    with pytest.raises(APIError, match="^StructuredOutputsParams.json") as info:
        _call(
            engine,
            "chat",
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}},
        )
    assert info.value.param == "response_format"


# a schema the engine refuses (engine/schema_limits.py: xgrammar does not enforce the keyword)
UNENFORCED = {"type": "array", "uniqueItems": True}


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize(
    "fields, param",
    [
        ({"structured_outputs": {"regex": "("}}, "structured_outputs"),
        ({"structured_outputs": {"json": UNENFORCED}}, "structured_outputs"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": UNENFORCED}}},
            "response_format",
        ),
    ],
)
def test_a_constraint_that_does_not_compile_names_the_body_field_that_carried_it(engine, kind, fields, param):
    """The engine refuses a constraint as `StructuredOutputsParams.<kind> is invalid` (a regex or
    a schema its compiler does not take); the 400's param is the body field the client set, so
    that an OpenAI client reading error.param knows what to fix (it was None: the soak's
    malformed requests found it)."""
    with pytest.raises(APIError, match="^StructuredOutputsParams") as info:
        _call(engine, kind, stream=True, **fields)
    assert (info.value.status, info.value.param) == (400, param)


class _FaultyMatcher:
    """A matcher whose fill_next_token_bitmask raises from its fourth call on (a bug inside
    xgrammar on one request's state)."""

    def __init__(self, matcher):
        self._matcher, self._fills = matcher, 0

    def __getattr__(self, name):
        return getattr(self._matcher, name)

    def fill_next_token_bitmask(self, *args, **kwargs):
        self._fills += 1
        if self._fills > 3:
            raise RuntimeError("planted matcher fault")
        return self._matcher.fill_next_token_bitmask(*args, **kwargs)


def test_a_matcher_fault_is_a_500_for_its_request_alone(engine, monkeypatch):
    """A grammar matcher that raises mid-reply fails its request as a failed step does: a 500
    naming the fault (every sample of it: n=2, one matcher broken). It failed the whole step,
    so a plain request running beside it got the same 500; it is answered as if nothing
    happened, and every block is free after."""
    from enginespec.engine.structured_output import StructuredOutputManager

    made, broken = StructuredOutputManager.new_state, []

    def new_state(self, compiled, *args):
        state = made(self, compiled, *args)
        if not broken:
            broken.append(state)
            state.matcher = _FaultyMatcher(state.matcher)
        return state

    monkeypatch.setattr(StructuredOutputManager, "new_state", new_state)
    ctx = ServerContext(engine, engine.tokenizer, ["tiny"], 128, chat_template=TEMPLATE)
    base = {"model": "tiny", "prompt": [5, 6, 7], "temperature": 1.0, "seed": 3}
    constrained = CompletionRequest(max_tokens=60, n=2, response_format=JSON_SCHEMA, **base)
    plain = CompletionRequest(max_tokens=16, ignore_eos=True, **base)

    async def run():
        engine.start(asyncio.get_running_loop())
        found = await asyncio.gather(
            create_completion(ctx, constrained, never),
            create_completion(ctx, plain, never),
            return_exceptions=True,
        )
        for _ in range(1000):  # the engine's state comes with its next message
            if engine.state.num_unfinished == 0:
                break
            await asyncio.sleep(0.01)
        return found

    failed, answered = asyncio.run(run())
    assert isinstance(answered, dict), answered
    assert answered["choices"][0]["finish_reason"] == "length"
    assert len(answered["choices"][0]["text"]) > 0
    assert isinstance(failed, APIError) and failed.status == 500, failed
    assert "grammar matcher failed" in failed.message and "planted matcher fault" in failed.message
    assert engine.state.num_free_blocks == engine.state.num_blocks
