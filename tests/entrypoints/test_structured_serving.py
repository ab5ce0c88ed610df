"""Structured outputs over the OpenAI API: response_format (json_object, json_schema) on chat
and completions, vLLM's structured_outputs extra body field, and their 400s. The handlers run
over an in-process engine client on the tiny model whose tokenizer can write JSON."""

from __future__ import annotations

import asyncio
import json

import pytest

from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
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


def _call(engine, kind: str, **fields) -> dict:
    ctx = ServerContext(engine, engine.tokenizer, ["tiny"], 128, chat_template=TEMPLATE)
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
