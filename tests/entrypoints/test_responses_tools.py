"""Function tools in OpenAI's Responses API (POST /v1/responses), driven by the official openai
client against the app over an in-process engine: Responses' flat function tools and
tool_choice served as chat's (a forced choice goes through structured output, so the reply
parses whatever the tiny random model's weights), function_call output items, a second turn's
function_call and function_call_output input items rendered as chat's assistant tool_calls and
tool message, and the stream's function call events. Before: every request with tools was a
400 naming `tools`, and function_call items in input a 400 naming `input`."""

from __future__ import annotations

import json

import pytest

from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.protocol import ResponsesRequest
from enginespec.entrypoints.openai.reasoning import END, get_parser
from enginespec.entrypoints.openai.serving import ServerContext, _Call
from enginespec.entrypoints.openai.serving_responses import (
    _as_chat_request,
    _chat_call,
    _Events,
    _full_response,
    _MessageStream,
)
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import json_model_dir
from tests.entrypoints.client_helpers import in_process_client, run_with_clients, scripted_output

pytest.importorskip("xgrammar")
pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4, block_size=4)
# lists the tools; writes each message as its role's initial, its content, an assistant's calls
# (id, name, arguments through tojson) and a tool message's call id: what reached the template
TEMPLATE = (
    "{% if tools %}T:{% for t in tools %}{{ t.function.name }},{% endfor %};{% endif %}"
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}"
    "{% for c in m.tool_calls or [] %}C({{ c.id }}):{{ c.function.name }}{{ c.function.arguments | tojson }}"
    "{% endfor %}{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %};{% endfor %}A:"
)
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 4}, "days": {"type": "integer", "maximum": 9}},
    "required": ["city", "days"],
}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "weather",
    "parameters": SCHEMA,
    "strict": True,
}
NAMED = {"type": "function", "name": "get_weather"}
# sampled (greedy, a random model may write one token forever); seeded so that runs agree
SAMPLED = dict(model="tiny", max_output_tokens=60, temperature=1.0, extra_body={"seed": 3})


@pytest.fixture(scope="module")
def app():
    with in_process_client(json_model_dir(), **ENGINE) as engine:
        ctx = ServerContext(
            engine, engine.tokenizer, ["tiny"], 200, chat_template=TEMPLATE,
            enable_auto_tool_choice=True, tool_call_parser="hermes",
        )  # fmt: skip
        yield build_app(ctx, ServerMetrics("tiny")), engine, ctx


def serve(app, fn):
    return run_with_clients(app[0], app[1], fn)


def _valid(arguments: str) -> bool:
    """Whether arguments (JSON text) match SCHEMA."""
    value = json.loads(arguments)
    return (
        set(value) == {"city", "days"}
        and isinstance(value["city"], str)
        and len(value["city"]) <= 4
        and isinstance(value["days"], int)
        and value["days"] <= 9
    )


def test_a_named_tool_choice_answers_a_function_call_item_whose_arguments_follow_the_schema(app):
    """tool_choice {"type": "function", "name"} forces the reply (chat's named function): the
    output is one function_call item (no message: the reply has no content) whose arguments
    parse and match the tool's parameters; the Response echoes the tools and tool_choice."""

    async def fn(client, http):
        return await client.responses.create(input="weather?", tools=[TOOL], tool_choice=NAMED, **SAMPLED)

    resp = serve(app, fn)
    assert resp.status == "completed"
    (item,) = resp.output
    assert (item.type, item.name, item.status) == ("function_call", "get_weather", "completed")
    assert item.id.startswith("fc_") and item.call_id.startswith("chatcmpl-tool-")  # vLLM's, for hermes
    assert _valid(item.arguments), item.arguments
    assert resp.tools[0].name == "get_weather" and resp.tool_choice.name == "get_weather"


def test_tool_choice_required_answers_function_call_items_of_the_tools(app):
    """tool_choice "required": one function_call item per call of the forced array (this seed's
    reply makes two), each naming one of the tools, with arguments that follow its parameters;
    parallel_tool_calls false keeps the first (chat's rule)."""
    other = {"type": "function", "name": "get_time", "parameters": SCHEMA}
    base = dict(
        SAMPLED, input="weather?", tools=[TOOL, other], tool_choice="required", extra_body={"seed": 1}
    )
    base["max_output_tokens"] = 150

    async def fn(client, http):
        both = await client.responses.create(**base, parallel_tool_calls=True)
        first = await client.responses.create(**base, parallel_tool_calls=False)
        return both, first

    both, first = serve(app, fn)
    assert [item.type for item in both.output] == ["function_call"] * 2, both.output
    for item in both.output:
        assert item.name in ("get_weather", "get_time") and _valid(item.arguments), item
    assert len({item.call_id for item in both.output}) == 2
    (item,) = first.output
    assert (item.name, item.arguments) == (both.output[0].name, both.output[0].arguments)
    assert (both.parallel_tool_calls, first.parallel_tool_calls) == (True, False)


def test_a_forced_call_cut_by_max_output_tokens_is_an_incomplete_item(app):
    """A named function's reply cut by length is still its call (chat's rule), its arguments cut
    short: the item's status is the response's, "incomplete", full and streamed alike."""
    base = dict(SAMPLED, input="weather?", tools=[TOOL], tool_choice=NAMED, max_output_tokens=4)

    async def fn(client, http):
        full = await client.responses.create(**base)
        events = [e async for e in await client.responses.create(**base, stream=True)]
        return full, events

    full, events = serve(app, fn)
    (item,) = full.output
    assert (full.status, full.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert (item.type, item.status, len(item.arguments)) == ("function_call", "incomplete", 4)
    (streamed,) = events[-1].response.output
    assert (streamed.status, streamed.arguments) == ("incomplete", item.arguments)


HISTORY = [
    {"role": "user", "content": "weather?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Bern"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
]
CHAT_HISTORY = [
    {"role": "user", "content": "weather?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Bern"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]


def test_a_second_turn_renders_function_call_and_its_output_as_chats_tool_messages(app):
    """The input's function_call item is the assistant's tool call and its function_call_output
    the tool message (call_id its tool_call_id), as chat renders them; a second turn is served,
    its prompt the chat template's rendering of that conversation with the tools. The agent
    loop of OpenAI's guide works as written: the first response's output items sent back as
    they came, then the call's output."""
    body = ResponsesRequest(model="tiny", input=HISTORY, tools=[TOOL])
    call, _ = _chat_call(app[2], _as_chat_request(body), "resp_1")
    assert call.prompts[0][0] == (
        'T:get_weather,;u:weather?;a:C(call_1):get_weather{"city": "Bern"};t:sunny(call_1);A:'
    )
    again = dict(SAMPLED, tools=[TOOL], tool_choice="none", max_output_tokens=4)

    async def fn(client, http):
        resp = await client.responses.create(input=HISTORY, **again)
        count = await http.post("/tokenize", json={"messages": CHAT_HISTORY, "tools": CHAT_TOOLS})
        first = await client.responses.create(input="weather?", tools=[TOOL], tool_choice=NAMED, **SAMPLED)
        (fc,) = first.output
        output = {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}
        loop = await client.responses.create(input=[HISTORY[0], *first.output, output], **again)
        chat = [
            *CHAT_HISTORY[:1],
            {**CHAT_HISTORY[1], "tool_calls": [_chat_call_of(fc)]},
            {**CHAT_HISTORY[2], "tool_call_id": fc.call_id},
        ]
        loop_count = await http.post("/tokenize", json={"messages": chat, "tools": CHAT_TOOLS})
        return resp, count.json(), loop, loop_count.json()

    resp, count, loop, loop_count = serve(app, fn)
    assert resp.status in ("completed", "incomplete") and resp.output[-1].type == "message"
    assert resp.usage.input_tokens == count["count"]
    assert loop.output[-1].type == "message" and loop.usage.input_tokens == loop_count["count"]


def _chat_call_of(item) -> dict:
    """Chat's tool call object of a function_call output item."""
    function = {"name": item.name, "arguments": item.arguments}
    return {"id": item.call_id, "type": "function", "function": function}


def test_a_message_and_calls_in_one_turn_are_one_assistant_message():
    """An assistant message item followed by its function_call items (one turn's output, sent
    back) is one chat assistant message: its content and all the calls, in order."""
    items = [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {**HISTORY[1], "id": "fc_1", "status": "completed"},
        {**HISTORY[1], "call_id": "call_2"},
        {**HISTORY[2]},
        {**HISTORY[2], "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
    ]
    messages = _as_chat_request(ResponsesRequest(input=items)).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_1", "call_2"]
    assert messages[1]["content"] == [{"type": "output_text", "text": "ok"}]
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "call_2",
        "content": [{"type": "input_text", "text": "rain"}],
    }


def test_the_stream_sends_the_function_call_item_and_its_arguments_as_openai_does(app):
    """Streamed, a call is an output_item.added (arguments empty), its arguments' delta and
    done, and output_item.done, numbered by sequence_number, before response.completed; the
    client's responses.stream(...) helper ends with the final response holding the same item as
    the full response of the same seeded request."""
    base = dict(input="weather?", tools=[TOOL], tool_choice=NAMED, **SAMPLED)

    async def fn(client, http):
        full = await client.responses.create(**base)
        events = [e async for e in await client.responses.create(**base, stream=True)]
        async with client.responses.stream(**base) as helper:
            helper_events = [e async for e in helper]
            final = await helper.get_final_response()
        return full, events, helper_events, final

    full, events, helper_events, final = serve(app, fn)
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, delta, done_args, done = events[2:6]
    (want,) = full.output
    assert added.item.type == "function_call" and added.item.arguments == "" and added.output_index == 0
    assert delta.delta == done_args.arguments == done.item.arguments == want.arguments
    assert delta.item_id == done_args.item_id == added.item.id == done.item.id
    assert events[-1].response.output == [done.item] and done.item.status == "completed"
    assert helper_events[-1].type == "response.completed"
    (item,) = final.output
    assert (item.type, item.name, item.arguments) == ("function_call", "get_weather", want.arguments)


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bern"}}\n</tool_call>'


TWO_CALLS = CALL + "\n" + CALL.replace("Bern", "Rome")


@pytest.mark.parametrize(
    "text, kinds",
    [
        ("It is" + CALL, ["message", "function_call"]),
        (CALL, ["function_call"]),  # no content: no message item
        (TWO_CALLS, ["function_call", "function_call"]),
        ("no call", ["message"]),
        (f"hm{END}" + CALL, ["reasoning", "function_call"]),  # under --reasoning-parser
        (f"hm{END}ok" + CALL, ["reasoning", "message", "function_call"]),
    ],
)
def test_auto_calls_stream_as_the_full_response_lists_them(text, kinds):
    """tool_choice "auto" reads the reply by the server's --tool-call-parser (chat's): the full
    response lists a message item where there is content, then a function_call item per call;
    the stream, the text growing a character a step, sends the same items in the same places.
    Scripted outputs (a random model writes no calls)."""
    body = ResponsesRequest(input="hi", tools=[TOOL])
    call = _Call("chat", "resp_1", "m", _as_chat_request(body), [("p", [1])], ())
    call.tool_mode = "auto"
    if END in text:  # a reply that starts in its thinking
        call.reasoning, call.starts_in_reasoning = get_parser("qwen3"), True
    stream = _MessageStream(call, _Events())
    frames = []
    for i in range(1, len(text) + 1):
        frames += stream.feed(scripted_output(text[:i], "stop" if i == len(text) else None).outputs[0])
    events = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    final = scripted_output(text, "stop")
    final.num_cached_tokens = 0
    full = _full_response(call, body, SamplingParams(), final)["output"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == list(
        range(len(done))
    )

    def shape(items):  # ids are fresh per response
        return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]

    assert shape(done) == shape(full) and done == stream.items("completed")
    assert [item["type"] for item in full] == kinds
    assert all(
        json.loads(i["arguments"])["city"] in ("Bern", "Rome") for i in full if i["type"] == "function_call"
    )


@pytest.mark.parametrize(
    "fields, param, named",
    [
        ({"tools": [{"type": "web_search"}]}, "tools", "web_search"),
        ({"tools": [TOOL, {"type": "file_search", "vector_store_ids": ["v"]}]}, "tools", "file_search"),
        ({"tools": [{"type": "function", "parameters": SCHEMA}]}, "tools", "tools[0].name"),
        ({"tools": [{**TOOL, "parameters": 5}]}, "tools", "tools[0].parameters"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "web_search_preview"}},
            "tool_choice",
            "web_search_preview",
        ),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "'nope'"),
        ({"tool_choice": "required"}, "tool_choice", "`tools` must be set"),
        (
            {"tools": [TOOL], "tool_choice": NAMED, "include": ["message.output_text.logprobs"]},
            "include",
            "tools",
        ),
        (
            {"tools": [TOOL], "tool_choice": NAMED, "text": {"format": {"type": "json_object"}}},
            "tool_choice",
            "text.format",
        ),
        ({"input": [{**HISTORY[1], "arguments": "{x"}]}, "input", "input[0].arguments"),
        ({"input": [{**HISTORY[1], "extra": 1}]}, "input", "input[0]"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "input", "input[0].call_id"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]},
            "input",
            "input[0].output",
        ),
        ({"tools": {"type": "function", "name": "f"}}, "tools", "tools must be a list"),
    ],
)
def test_tools_this_server_does_not_do_are_400s_naming_them(app, fields, param, named):
    """Tools other than functions (hosted ones: web_search, file_search, ...) and a tool_choice
    that names one are a 400 naming the field and the type; a bad function tool or call item
    names where it is."""

    async def fn(client, http):
        body = {"model": "tiny", "input": "hi", "max_output_tokens": 2, **fields}
        return await http.post("/v1/responses", json=body)

    resp = serve(app, fn)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and named in error["message"], error
    assert "response_format" not in error["message"] and "messages" not in error["message"]


@pytest.mark.parametrize("step", [1, len(TWO_CALLS)])
def test_parallel_tool_calls_false_keeps_the_first_auto_call_streamed_and_full(step):
    """parallel_tool_calls false under tool_choice "auto" (set_tool_mode, chat's rule): of a
    reply making two calls, the full response and the stream (the text growing `step`
    characters a step: the calls settle one at a time, or both at once) keep the first only."""
    from types import SimpleNamespace

    from enginespec.entrypoints.openai.serving import set_tool_mode

    body = ResponsesRequest(input="hi", tools=[TOOL], parallel_tool_calls=False)
    call = _Call("chat", "resp_1", "m", _as_chat_request(body), [("p", [1])], ())
    set_tool_mode(SimpleNamespace(tool_call_parser=None), call, "auto", None)
    stream = _MessageStream(call, _Events())
    for end in range(step, len(TWO_CALLS) + 1, step):
        stream.feed(scripted_output(TWO_CALLS[:end], "stop" if end == len(TWO_CALLS) else None).outputs[0])
    final = scripted_output(TWO_CALLS, "stop")
    final.num_cached_tokens = 0
    full = _full_response(call, body, SamplingParams(), final)["output"]
    for items in (full, stream.items("completed")):
        (item,) = items
        assert item["type"] == "function_call" and json.loads(item["arguments"]) == {"city": "Bern"}


def test_a_calls_id_takes_the_form_of_the_servers_parser(app, monkeypatch):
    """The server's --tool-call-parser decides the form of a call's id (chat's set_tool_mode):
    under mistral, 9 letters and digits (what Mistral's templates take back), as call_id."""
    from enginespec.entrypoints.openai.serving import _tool_call_json
    from enginespec.entrypoints.openai.serving_responses import _function_call_item
    from enginespec.entrypoints.openai.tool_calls import ToolCall

    monkeypatch.setattr(app[2], "tool_call_parser", "mistral")
    body = ResponsesRequest(model="tiny", input="hi", tools=[TOOL])
    call, _ = _chat_call(app[2], _as_chat_request(body), "resp_1")
    assert call.tool_parser == "mistral"
    item = _function_call_item(_tool_call_json(ToolCall("get_weather", "{}"), call.tool_parser), "completed")
    assert len(item["call_id"]) == 9 and item["call_id"].isalnum() and item["id"].startswith("fc_")


def test_the_stream_opens_its_text_part_with_no_logprobs_as_a_list():
    """response.content_part.added's part is an output_text with logprobs [] (not null), as
    the done events' and the full response's parts."""
    body = ResponsesRequest(input="hi")
    call = _Call("chat", "resp_1", "m", _as_chat_request(body), [("p", [1])], ())
    frames = _MessageStream(call, _Events()).feed(scripted_output("ok", "stop").outputs[0])
    events = {e["type"]: e for e in (json.loads(f.split("data: ", 1)[1]) for f in frames)}
    empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    assert events["response.content_part.added"]["part"] == empty
    assert events["response.content_part.done"]["part"] == {**empty, "text": "ok"}


@pytest.mark.parametrize(
    "fields, want",
    [({}, None), ({"include": ["message.output_text.logprobs"]}, 0)]
    + [({"include": ["message.output_text.logprobs"], "top_logprobs": 3}, 3)],
)
def test_the_engine_is_asked_chats_logprobs_for_include(app, monkeypatch, fields, want):
    """The SamplingParams.logprobs a Responses request submits are chat's: None without
    include, its top_logprobs (0 where not given: the sampled token only, which an engine with
    max_logprobs 0 takes) with include's logprobs."""
    import asyncio

    from enginespec.entrypoints.openai import serving
    from enginespec.entrypoints.openai.errors import APIError
    from enginespec.entrypoints.openai.serving_responses import create_response

    submitted = []

    async def submit(ctx, call, params):
        submitted.append(params)
        raise APIError(503, "captured", None)

    monkeypatch.setattr(serving, "_submit", submit)
    body = ResponsesRequest(model="tiny", input="hi", max_output_tokens=2, **fields)
    with pytest.raises(APIError, match="captured"):
        asyncio.run(create_response(app[2], body, None))
    assert [p.logprobs for p in submitted] == [want]
