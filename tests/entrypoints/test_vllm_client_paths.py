"""Lesser-used request paths a client moving from vLLM's server meets, over the app and an
in-process engine, driven by the official openai client (and httpx for raw bodies): chat's echo
(vLLM's field); OpenAI's Responses API, POST /v1/responses (a 404 before: no route), checked
against chat completions of the same conversation; SageMaker's POST /invocations, a load
balancer's GET /load under --enable-server-load-tracking, and a stream whose client leaves.
Each test names what the client saw before its fix."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.protocol import ResponseFormat, ResponsesRequest
from enginespec.entrypoints.openai.reasoning import END, START, get_parser
from enginespec.entrypoints.openai.serving import ServerContext, _Call
from enginespec.entrypoints.openai.serving_responses import (
    _as_chat_request,
    _Events,
    _full_response,
    _MessageStream,
)
from enginespec.spec import SamplingParams
from tests.entrypoints.client_helpers import in_process_client, run_with_clients, scripted_output
from tests.entrypoints.remote_server import CHAT_TEMPLATE

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4)


@pytest.fixture(scope="module")
def app():
    with in_process_client(**ENGINE) as engine:
        ctx = ServerContext(
            engine, engine.tokenizer, ["tiny"], engine.info.max_model_len, chat_template=CHAT_TEMPLATE
        )
        app = build_app(ctx, ServerMetrics("tiny"))
        app.state.ctx = ctx  # for the tests that build another app over the same engine
        yield app, engine


def serve(app, fn):
    """fn(openai client, httpx client) run against the app (client_helpers.run_with_clients)."""
    app, engine = app
    return run_with_clients(app, engine, fn)


# ---- chat: echo -----------------------------------------------------------------------------------

PARTIAL = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": [{"type": "text", "text": "Ab"}]},
]


def test_chat_echo_puts_the_final_assistant_message_before_each_reply(app):
    """vLLM's chat `echo`: the last message's text leads each choice's content when that message
    is the reply's role (assistant), in the full body and in the stream (in the first delta);
    a final user message is not echoed. It was a 400 ("echo: Extra inputs are not permitted")."""
    base = dict(model="tiny", max_tokens=3, temperature=0, n=2)
    opts = dict(continue_final_message=True, add_generation_prompt=False)

    async def fn(client, http):
        plain = await client.chat.completions.create(messages=PARTIAL, extra_body=opts, **base)
        echoed = await client.chat.completions.create(
            messages=PARTIAL, extra_body={**opts, "echo": True}, **base
        )
        stream = await client.chat.completions.create(
            messages=PARTIAL, stream=True, extra_body={**opts, "echo": True}, **base
        )
        chunks = [c async for c in stream]
        user_last = await client.chat.completions.create(
            messages=PARTIAL[:1], extra_body={"echo": True}, **base
        )
        alone = await client.chat.completions.create(messages=PARTIAL[:1], **base)
        return plain, echoed, chunks, user_last, alone

    plain, echoed, chunks, user_last, alone = serve(app, fn)
    replies = [c.message.content for c in plain.choices]
    assert [c.message.content for c in echoed.choices] == ["Ab" + r for r in replies]
    streamed = ["", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == ["Ab" + r for r in replies]
    assert echoed.usage == plain.usage  # the echo is no generated token
    assert [c.message.content for c in user_last.choices] == [c.message.content for c in alone.choices]


# ---- the Responses API (POST /v1/responses) -------------------------------------------------------

INSTRUCTIONS = "be brief"


async def _chat_text(client, messages, **fields) -> tuple[str, object]:
    """The greedy chat reply and its usage, the oracle of a Responses request."""
    chat = await client.chat.completions.create(model="tiny", messages=messages, temperature=0, **fields)
    return chat.choices[0].message.content, chat


def test_responses_text_is_the_chat_reply_to_the_same_conversation(app):
    """A Responses request goes the chat way: instructions as a system message, the input's
    message items after it (parts of input_text), the same greedy reply and token counts, in
    OpenAI's Response shape. It was a 404 (no route)."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]

    async def fn(client, http):
        resp = await client.responses.create(
            model="tiny", input=items, instructions=INSTRUCTIONS, max_output_tokens=6, temperature=0
        )
        messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "hi"}]
        text, chat = await _chat_text(client, messages, max_tokens=6)
        plain = await client.responses.create(model="tiny", input="hi", max_output_tokens=6, temperature=0)
        plain_text, _ = await _chat_text(client, messages[1:], max_tokens=6)
        return resp, text, chat, plain, plain_text

    resp, text, chat, plain, plain_text = serve(app, fn)
    assert resp.id.startswith("resp_") and resp.object == "response" and resp.model == "tiny"
    assert resp.output_text == text and plain.output_text == plain_text
    (item,) = resp.output
    assert (item.type, item.role, item.content[0].type, item.content[0].annotations) == (
        "message", "assistant", "output_text", []
    )  # fmt: skip
    usage = resp.usage
    assert (usage.input_tokens, usage.output_tokens) == (
        chat.usage.prompt_tokens,
        chat.usage.completion_tokens,
    )
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0 and usage.output_tokens_details.reasoning_tokens == 0
    assert (resp.instructions, resp.max_output_tokens, resp.temperature) == (INSTRUCTIONS, 6, 0.0)
    assert resp.usage.input_tokens > plain.usage.input_tokens  # the instructions reached the prompt


def test_responses_instructions_are_a_system_message_before_the_input(app):
    """The prompt is the chat template's rendering of [system: instructions, user: input]
    (CHAT_TEMPLATE writes each message as its role's initial, ':', its content, ';')."""

    async def fn(client, http):
        resp = await client.responses.create(
            model="tiny", input="hi", instructions=INSTRUCTIONS, max_output_tokens=1
        )
        want = await http.post(
            "/tokenize", json={"prompt": f"s:{INSTRUCTIONS};u:hi;A:", "add_special_tokens": False}
        )
        return resp, want.json()

    resp, want = serve(app, fn)
    assert resp.usage.input_tokens == want["count"]


def test_responses_stream_events_join_to_the_full_response(app):
    """The stream is OpenAI's event sequence, numbered from 0; its text deltas join to the
    full response's text (a stop string's tail held back, never retracted), and the openai
    client's responses.stream(...) helper builds the same final response."""
    base = dict(model="tiny", input="hi", max_output_tokens=8, temperature=0)

    async def fn(client, http):
        full = await client.responses.create(**base)
        stop = full.output_text[2:4]
        assert len(stop) == 2
        cut = await client.responses.create(**base, extra_body={"stop": [stop]})
        events = [e async for e in await client.responses.create(**base, stream=True)]
        cut_events = [
            e async for e in await client.responses.create(**base, stream=True, extra_body={"stop": [stop]})
        ]
        async with client.responses.stream(**base) as helper:
            helper_events = [e async for e in helper]
            final = await helper.get_final_response()
        return full, cut, stop, events, cut_events, helper_events, final

    full, cut, stop, events, cut_events, helper_events, final = serve(app, fn)
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert {e.output_index for e in events if hasattr(e, "output_index")} == {0}  # the one item's place
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == full.output_text
    assert events[-4].text == full.output_text
    done = events[-1].response
    assert done.output_text == full.output_text and done.usage == full.usage and done.status == full.status
    assert events[0].response.status == "in_progress" and events[0].response.id == done.id
    assert cut.output_text == full.output_text[: full.output_text.find(stop)]
    assert "".join(e.delta for e in cut_events if e.type == "response.output_text.delta") == cut.output_text
    assert [e.type for e in helper_events][-1] == "response.completed"
    assert final.output_text == full.output_text and final.id == helper_events[-1].response.id


def test_responses_cached_tokens_are_the_prompt_tokens_the_prefix_cache_served(app):
    """usage.input_tokens_details.cached_tokens: 0 for a prompt never seen, the cached blocks'
    tokens for the same prompt again (a multiple of the 16-token block, under input_tokens)."""
    base = dict(model="tiny", input="cached tokens " * 12, max_output_tokens=1, temperature=0)

    async def fn(client, http):
        return [await client.responses.create(**base) for _ in range(2)]

    first, again = serve(app, fn)
    assert first.usage.input_tokens_details.cached_tokens == 0
    assert first.usage.input_tokens_details.model_dump()["cache_write_tokens"] == 0  # not counted here
    cached = again.usage.input_tokens_details.cached_tokens
    assert 0 < cached < again.usage.input_tokens and cached % 16 == 0


def test_responses_cut_by_max_output_tokens_are_incomplete(app):
    """A reply cut by length is status "incomplete" with incomplete_details.reason
    "max_output_tokens" (its message item too), full and streamed."""
    base = dict(model="tiny", input="hi", max_output_tokens=2, temperature=0, extra_body={"ignore_eos": True})

    async def fn(client, http):
        full = await client.responses.create(**base)
        events = [e async for e in await client.responses.create(**base, stream=True)]
        return full, events

    full, events = serve(app, fn)
    assert full.status == "incomplete" and full.incomplete_details.reason == "max_output_tokens"
    assert full.output[0].status == "incomplete" and full.usage.output_tokens == 2
    done = events[-1].response
    assert (done.status, done.incomplete_details.reason, done.output[0].status) == (
        "incomplete", "max_output_tokens", "incomplete"
    )  # fmt: skip
    assert events[-2].item.status == "incomplete"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),  # function tools: test_responses_tools.py
        ({"tool_choice": "required"}, "tool_choice"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without include's logprobs
        ({"top_logprobs": 10**6, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text"),  # no schema
        ({"text": {"format": {"type": "text"}, "verbosity": "low"}}, "text"),
        ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input"),
        ({"input": [{"type": "item_reference", "id": "fc_1"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"role": "user", "content": 5}]}, "input"),
        ({"input": [{"role": "user", "content": "hi", "name": "x"}]}, "input"),
        ({"seed": 2**64}, "seed"),
        ({"priority": 1}, "priority"),  # the server's policy is fcfs
        ({"cache_salt": ""}, "cache_salt"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"temprature": 0}, "temprature"),
    ],
)
def test_responses_fields_this_server_does_not_do_are_400s_naming_them(app, fields, param):
    """Never silently ignored: a field set to what this server does not do is a 400 in OpenAI's
    error shape naming it (chat's names of the same fields, max_tokens and messages, renamed)."""

    async def fn(client, http):
        return await http.post("/v1/responses", json={"model": "tiny", "input": "hi", **fields})

    resp = serve(app, fn)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["type"], error["code"]) == (param, "BadRequestError", 400)
    assert "max_tokens" not in error["message"] and "messages" not in error["message"]


def test_responses_no_op_values_of_unsupported_fields_are_served(app):
    """What asks for nothing is served: no tools, tool_choice auto, store true (nothing is
    stored, as vLLM's default: the response says store false, and retrieving it is a 404)."""
    noop = dict(tools=[], tool_choice="auto", parallel_tool_calls=True, truncation="disabled", store=True)

    async def fn(client, http):
        resp = await client.responses.create(
            model="tiny", input="hi", max_output_tokens=2, metadata={"k": "v"}, user="u", **noop
        )
        again = await http.get(f"/v1/responses/{resp.id}")
        return resp, again

    resp, again = serve(app, fn)
    assert resp.store is False and resp.metadata == {"k": "v"} and resp.user == "u"
    assert again.status_code == 404 and again.json()["error"]["type"] == "NotFoundError"


def test_responses_json_schema_text_format_is_chats_response_format(app):
    """text.format json_schema constrains the reply as chat's response_format does."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "name": "obj", "schema": schema, "strict": True}

    async def fn(client, http):
        resp = await client.responses.create(
            model="tiny", input="hi", max_output_tokens=12, temperature=0, text={"format": fmt}
        )
        chat_format = {"type": "json_schema", "json_schema": {"name": "obj", "schema": schema}}
        text, _ = await _chat_text(
            client, [{"role": "user", "content": "hi"}], max_tokens=12, response_format=chat_format
        )
        return resp, text

    resp, text = serve(app, fn)
    assert resp.output_text == text and resp.text.format.type == "json_schema"


def test_responses_sampling_fields_and_vllms_extras_are_chats_fields_of_the_request():
    """A Responses body is served as the chat request of the same fields: OpenAI's sampling
    fields, max_output_tokens as max_tokens, and vLLM's extras (sent in extra_body) as chat's
    fields of the same name. Each is taken (no 400), so one dropped on the way would be
    ignored without a word: a top_k, a seed, a stop, a priority the engine never saw."""
    fields = dict(
        temperature=0.5, top_p=0.9, user="u", top_k=3, min_p=0.1, repetition_penalty=1.2, seed=7,
        stop=["x"], ignore_eos=True, priority=2, cache_salt="salt", request_id="rid",
    )  # fmt: skip
    chat = _as_chat_request(ResponsesRequest(input="hi", max_output_tokens=5, stream=True, **fields))
    assert {name: getattr(chat, name) for name in fields} == fields
    assert (chat.max_tokens, chat.stream, chat.messages) == (5, True, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    "fields",
    [
        dict(tools=[], tool_choice="none", parallel_tool_calls=False),
        dict(tool_choice="auto", background=False, include=[], top_logprobs=0, truncation="disabled"),
        dict(service_tier="auto", stream_options={}, prompt_cache_retention="in_memory"),
        dict(service_tier="default", text={"format": {"type": "text"}, "verbosity": "medium"}),
    ],
)
def test_responses_each_no_op_value_of_an_unsupported_field_is_taken(fields):
    """OpenAI's defaults of the fields this server does not do (what its SDK or a proxy may send
    on every request) ask for nothing and are served, not refused."""
    assert ResponsesRequest(input="hi", **fields).unsupported_field() is None


_OBJECT = {"type": "object"}


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
        ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
        ({"text": {"format": {"type": "json_object", "strict": True}}}, "text"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": _OBJECT, "bad": 1}}}, "text"),
        ({"text": {"format": {"type": "json_object", "name": "x", "schema": _OBJECT}}}, "text"),
    ],
)
def test_responses_a_value_that_asks_for_something_not_done_names_its_field(fields, name):
    """What asks for something this server does not do is refused naming the field (a 400),
    never served as though it had not been sent."""
    assert ResponsesRequest(input="hi", **fields).unsupported_field() == name


def test_responses_json_object_text_format_is_chats_json_object():
    """text.format {"type": "json_object"} is chat's response_format json_object (taken, not
    refused as an unknown text setting)."""
    body = ResponsesRequest(input="hi", text={"format": {"type": "json_object"}})
    assert body.unsupported_field() is None
    assert body.text_format() == ResponseFormat(type="json_object")


def test_responses_echo_what_was_asked_and_take_their_id_from_the_request(app):
    """The Response echoes the request's tool_choice, text, safety_identifier,
    prompt_cache_key and parallel_tool_calls (true where not sent), and says background false
    (OpenAI's shape); its id is resp_ and X-Request-Id, else the body's request_id (vLLM's
    rule, as chat's chatcmpl- ids), streamed too."""
    fields = dict(
        model="tiny", input="hi", max_output_tokens=2, tool_choice="none", safety_identifier="s1",
        prompt_cache_key="k1", text={"format": {"type": "text"}},
    )  # fmt: skip

    async def fn(client, http):
        plain = await http.post("/v1/responses", json={**fields, "request_id": "body-1"})
        headed = await http.post(
            "/v1/responses", json={**fields, "parallel_tool_calls": False}, headers={"X-Request-Id": "head-1"}
        )
        stream = await http.post(
            "/v1/responses", json={**fields, "stream": True}, headers={"X-Request-Id": "head-2"}
        )
        return plain.json(), headed.json(), stream.text

    plain, headed, stream = serve(app, fn)
    echoed = {name: plain[name] for name in ("tool_choice", "safety_identifier", "prompt_cache_key", "text")}
    assert echoed == dict(
        tool_choice="none", safety_identifier="s1", prompt_cache_key="k1", text=fields["text"]
    )
    assert (plain["parallel_tool_calls"], headed["parallel_tool_calls"], plain["background"]) == (
        True,
        False,
        False,
    )
    assert (plain["id"], headed["id"]) == ("resp_body-1", "resp_head-1")
    assert '"id":"resp_head-2"' in stream.replace(" ", "")


_PIECES = st.lists(st.sampled_from([START, END, "<", "</th", "ink>", "a", " b\n"]), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(pieces=_PIECES, in_reasoning=st.booleans())
def test_responses_stream_under_a_reasoning_parser_splits_as_the_full_response(pieces, in_reasoning):
    """Under --reasoning-parser the thinking is a reasoning item before the message, full and
    streamed (sent whole, before the message's item opens); the streamed text deltas join to the
    full response's message text, and the items the stream sends are the full response's.
    Scripted outputs, the text growing a character a step (the tags arriving in pieces)."""
    text = "".join(pieces)
    body = ResponsesRequest(input="hi")
    call = _Call("chat", "resp_1", "m", _as_chat_request(body), [("p", [1])], ())
    call.reasoning, call.starts_in_reasoning = get_parser("qwen3"), in_reasoning
    message = _MessageStream(call, _Events())
    frames = []
    for i in range(1, len(text) + 1):
        frames += message.feed(scripted_output(text[:i], "stop" if i == len(text) else None).outputs[0])
    events = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    final = scripted_output(text, "stop")
    final.num_cached_tokens = 0
    full = _full_response(call, body, SamplingParams(), final)
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in added] == [i["type"] for i in full["output"]] and done == full["output"]
    # each item's events carry its place in the response's output (the message after the reasoning)
    places = {item["id"]: i for i, item in enumerate(full["output"])}
    for event in events:
        item_id = event["item"]["id"] if "item" in event else event.get("item_id")
        if item_id is not None:
            assert event["output_index"] == places[item_id], event
    assert message.items("completed") == full["output"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == full["output"][-1]["content"][0]["text"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_responses_stream_ends_with_an_error_event_when_the_engine_fails_the_request(app):
    """A step that fails the request after the stream began: an "error" event (code 500, its
    message) after the events sent so far, and the stream ends; the server serves on."""
    base = dict(model="tiny", input="hi", max_output_tokens=4, temperature=0)

    async def fn(client, http):
        await app[1].fail_next_step()
        events = [e async for e in await client.responses.create(**base, stream=True)]
        after = await client.responses.create(**base)
        return events, after

    events, after = serve(app, fn)
    assert [e.type for e in events] == ["response.created", "response.in_progress", "error"]
    assert events[-1].code == "500" and events[-1].sequence_number == 2 and events[-1].message
    assert after.status in ("completed", "incomplete") and after.output_text


LOGPROBS = ["message.output_text.logprobs"]


def test_responses_output_text_logprobs_are_chats_logprobs_of_the_same_reply(app):
    """include ["message.output_text.logprobs"] with top_logprobs puts the reply's tokens'
    logprobs on its output_text part, chat's logprobs of the same greedy reply (token, logprob,
    bytes, top_logprobs); streamed, each text delta carries its tokens' (a stop string's tail
    held back, its tokens' logprobs with it), they add up to the full response's, and so do the
    done event's and the client's stream helper's. It was a 400 naming include."""
    base = dict(
        model="tiny", input="hi", max_output_tokens=8, temperature=0, include=LOGPROBS, top_logprobs=2
    )

    async def fn(client, http):
        full = await client.responses.create(**base)
        chat = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0,
            logprobs=True, top_logprobs=2,
        )  # fmt: skip
        stop = full.output_text[3:5]
        cut = await client.responses.create(**base, extra_body={"stop": [stop]})
        events = [
            e async for e in await client.responses.create(**base, stream=True, extra_body={"stop": [stop]})
        ]
        async with client.responses.stream(**base) as helper:
            final = await helper.get_final_response()
        return full, chat, cut, events, final

    full, chat, cut, events, final = serve(app, fn)
    (part,) = full.output[0].content
    assert [lp.model_dump() for lp in part.logprobs] == [
        c.model_dump() for c in chat.choices[0].logprobs.content
    ]
    assert len(part.logprobs) == full.usage.output_tokens and all(
        len(lp.top_logprobs) == 2 for lp in part.logprobs
    )
    (cut_part,) = cut.output[0].content
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    streamed = [lp for e in deltas for lp in e.logprobs]
    assert [lp.token for lp in streamed] == [lp.token for lp in cut_part.logprobs]
    assert "".join(e.delta for e in deltas) == cut.output_text
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [lp.token for lp in done.logprobs] == [lp.token for lp in cut_part.logprobs]
    assert len(cut_part.logprobs) == cut.usage.output_tokens > len(cut.output_text)  # the stop string's
    assert final.output[0].content[0].logprobs == part.logprobs


def test_responses_output_text_logprobs_without_top_logprobs_are_chats_without_them(app):
    """include ["message.output_text.logprobs"] alone: each token's entry has no top_logprobs
    ([]), chat's logprobs=true without top_logprobs for the same greedy reply."""

    async def fn(client, http):
        full = await client.responses.create(
            model="tiny", input="hi", max_output_tokens=6, temperature=0, include=LOGPROBS
        )
        chat = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            temperature=0,
            logprobs=True,
        )
        return full, chat

    full, chat = serve(app, fn)
    (part,) = full.output[0].content
    assert len(part.logprobs) == full.usage.output_tokens > 0
    assert all(lp.top_logprobs == [] for lp in part.logprobs)
    assert [lp.model_dump() for lp in part.logprobs] == [
        c.model_dump() for c in chat.choices[0].logprobs.content
    ]


# ---- SageMaker's /invocations -------------------------------------------------------------------

CHAT_BODY = dict(messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
COMPLETION_BODY = dict(prompt="Hello", max_tokens=4, temperature=0)


def _frames(resp) -> list:
    """The data of an SSE body's frames, [DONE] as the string."""
    lines = [line[len("data: ") :] for line in resp.text.split("\n\n") if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


def test_invocations_answers_as_the_route_its_body_names(app):
    """POST /invocations (vLLM's SageMaker entry point) was a 404. A body with "messages" is a chat
    completion, one with "prompt" a completion, answered as /v1/chat/completions and
    /v1/completions answer the same body: the same greedy reply, the id from X-Request-Id, a
    stream of the same text ending [DONE]."""

    async def fn(client, http):
        calls = [
            ("/v1/chat/completions", CHAT_BODY),
            ("/invocations", CHAT_BODY),
            ("/v1/completions", COMPLETION_BODY),
            ("/invocations", COMPLETION_BODY),
            ("/v1/chat/completions", {**CHAT_BODY, "stream": True}),
            ("/invocations", {**CHAT_BODY, "stream": True}),
        ]
        headers = {"X-Request-Id": "sm-1"}
        return [await http.post(path, json=body, headers=headers) for path, body in calls]

    chat, chat_inv, cmpl, cmpl_inv, stream, stream_inv = serve(app, fn)
    assert [r.status_code for r in (chat, chat_inv, cmpl, cmpl_inv, stream, stream_inv)] == [200] * 6
    chat, chat_inv, cmpl, cmpl_inv = (r.json() for r in (chat, chat_inv, cmpl, cmpl_inv))
    assert chat_inv["object"] == "chat.completion" and chat_inv["id"] == "chatcmpl-sm-1"
    assert (chat_inv["choices"], chat_inv["usage"]) == (chat["choices"], chat["usage"])
    assert cmpl_inv["object"] == "text_completion" and cmpl_inv["id"] == "cmpl-sm-1"
    assert (cmpl_inv["choices"], cmpl_inv["usage"]) == (cmpl["choices"], cmpl["usage"])
    assert stream_inv.headers["content-type"].startswith("text/event-stream")
    direct, invoked = _frames(stream), _frames(stream_inv)
    assert direct[-1] == invoked[-1] == "[DONE]"
    # the same stream, up to how the steps' outputs fell into frames (the loop's timing)
    (reply,) = chat["choices"]
    assert _streamed(invoked) == _streamed(direct) == (reply["message"]["content"], reply["finish_reason"])
    assert {f["id"] for f in invoked[:-1]} == {"chatcmpl-sm-1"}


def _streamed(frames: list) -> tuple:
    """(the content a chat stream's frames add up to, its finish reason)."""
    choices = [f["choices"][0] for f in frames[:-1] if f["choices"]]
    content = "".join(c["delta"].get("content") or "" for c in choices)
    return content, choices[-1]["finish_reason"]


# ---- --enable-server-load-tracking and GET /load ------------------------------------------------


class _HeldStream:
    """One raw ASGI call of a streamed POST whose client takes the first body chunk and then holds
    the response open (its send waits on `resume`), then reads the rest (`resume` set) or leaves
    (`left` set: the next receive is the disconnect, which cancels the waiting send): what
    httpx's ASGITransport, which gathers the whole body first, cannot do."""

    def __init__(self, app, path: str, body: dict):
        self.app, self.path, self.body = app, path, json.dumps(body).encode()
        self.first_chunk, self.resume, self.left = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.chunks: list = []

    async def receive(self):
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message):
        if message["type"] == "http.response.body" and message.get("body"):
            self.chunks.append(message["body"])
            self.first_chunk.set()
            await self.resume.wait()

    def run(self):
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": self.path, "raw_path": self.path.encode(),
            "root_path": "", "query_string": b"", "server": ("test", 80), "client": ("127.0.0.1", 9),
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(self.body))],
        }  # fmt: skip
        return asyncio.ensure_future(self.app(scope, self.receive, self.send))


def test_a_stream_whose_client_leaves_while_a_write_waits_aborts_its_request_at_once(app):
    """A client that leaves while its stream's write waits (uvicorn's send blocks on a client
    that stopped reading) ended the response but not the frame generator, which sat suspended
    until the garbage collector reached it: the engine went on generating (to max_tokens, its
    blocks held) for nobody, and /load said the request was gone while it still ran. The
    generator is now closed with the response, so the request is aborted when it ends."""
    body = dict(prompt="Hello", max_tokens=40, temperature=0, ignore_eos=True, stream=True)

    async def fn(client, http):
        held = _HeldStream(app[0], "/v1/completions", body)
        task = held.run()
        await held.first_chunk.wait()
        running = app[1].num_pending_requests
        held.left.set()
        await asyncio.wait_for(task, 60)  # a guard against a hang, not a timing
        return running, app[1].num_pending_requests

    assert serve(app, fn) == (1, 0)


# A streamed body a route takes, and what its last frame ends with when the stream runs to its end.
_LOAD_STREAMS = {
    "/v1/completions": (dict(prompt="Hello", max_tokens=6), b"data: [DONE]\n\n"),
    "/invocations": (dict(prompt="Hello", max_tokens=6), b"data: [DONE]\n\n"),
    "/v1/responses": (dict(input="Hello", max_output_tokens=6), b"response.completed"),
}


@pytest.mark.parametrize("path", list(_LOAD_STREAMS))
def test_server_load_counts_a_stream_until_it_ends_or_its_client_leaves(app, path):
    """--enable-server-load-tracking: GET /load is the number of generation requests in flight. A
    stream counts once (an /invocations stream too, not once more for the route it reaches) from
    its start until its last frame is sent, or until its client leaves, not until its handler
    returns the stream; then /load is 0 again. Both were 404s (flag and route); a Responses
    stream counts as vLLM's does (it did not count when the route came)."""
    tracked_app = build_app(app[0].state.ctx, ServerMetrics("tiny"), server_load_tracking=True)
    fields, end = _LOAD_STREAMS[path]
    body = dict(fields, model="tiny", temperature=0, ignore_eos=True, stream=True)

    async def load(http) -> int:
        return (await http.get("/load")).json()["server_load"]

    async def fn(client, http):
        seen = [await load(http)]
        for leave in (False, True):
            held = _HeldStream(tracked_app, path, body)
            task = held.run()
            await held.first_chunk.wait()
            seen.append(await load(http))
            (held.left if leave else held.resume).set()  # leaving cancels the held send
            await asyncio.wait_for(task, 60)  # a guard against a hang, not a timing
            seen.append(await load(http))
            assert (end in held.chunks[-1]) != leave
        return seen

    assert serve((tracked_app, app[1]), fn) == [0, 1, 0, 1, 0]


def test_responses_for_a_model_not_served_are_404s_naming_it(app):
    """A Responses request names its model as a chat request does: one not served is a 404
    naming model (OpenAI's model_not_found), not a reply from the served model."""

    async def fn(client, http):
        return await http.post("/v1/responses", json={"model": "nope", "input": "hi", "max_output_tokens": 1})

    resp = serve(app, fn)
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "model"
