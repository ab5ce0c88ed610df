"""The streaming hot path's shortcuts change no byte and lose no item: a steady-state choice
written as JSON text equals the JSON encoder's rendering of the same dict (any text: quotes,
control characters, non-ASCII, astral characters), pre-encoded and dict choices frame alike, and
the per-request Inbox keeps order across waits and cancellations."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from enginespec.entrypoints.openai.engine_client import Inbox
from enginespec.entrypoints.openai.serving import (
    _chunk,
    _chunk_head,
    _frame_choice_usage,
    _frame_choices,
    _plain_choice_json,
)
from enginespec.entrypoints.openai.sse import encode_json, frame

TEXTS = [
    "",
    " w123",
    'quote " back \\ slash',
    "tab\tnew\nline\x00\x1f",
    "é ü 中文",
    "emoji 🙂 \U0001f600",
    "\ud800",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("index", [0, 7, 12345])
def test_plain_choice_json_equals_encoder(text, index):
    tail = {"logprobs": None, "finish_reason": None, "stop_reason": None}
    completion = {"index": index, "text": text, **tail}
    chat = {"index": index, "delta": {"content": text}, **tail}
    assert _plain_choice_json("completion", index, text) == encode_json(completion)
    assert _plain_choice_json("chat", index, text) == encode_json(chat)


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_frame_choices_equals_frame_of_chunk(kind):
    call = SimpleNamespace(response_id='id-"1"', kind=kind, created=1700000000, model="m[]}", choices={})
    dicts = [
        {"index": i, "text": t, "logprobs": None, "finish_reason": None, "stop_reason": None}
        for i, t in enumerate(TEXTS)
    ]
    mixed = [encode_json(d) if i % 2 else d for i, d in enumerate(dicts)]
    head = _chunk_head(call)
    assert _frame_choices(head, mixed) == frame(_chunk(call, dicts))
    assert _frame_choices(head, dicts[:1]) == frame(_chunk(call, dicts[:1]))
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    for choice in (dicts[1], encode_json(dicts[1])):  # continuous usage: one choice, then the usage
        assert _frame_choice_usage(head, choice, usage) == frame(_chunk(call, [dicts[1]], usage))


def test_inbox_order_waits_and_cancellation():
    async def scenario():
        inbox = Inbox()
        waiter = asyncio.ensure_future(inbox.take_all())
        await asyncio.sleep(0)
        waiter.cancel()  # a handler cancelled while waiting loses nothing queued later
        await asyncio.sleep(0)
        inbox.put_nowait(("accepted", None))
        inbox.put_nowait(("output", 1))
        assert await inbox.get() == ("accepted", None)
        getter = asyncio.ensure_future(inbox.take_all())
        inbox.put_nowait(("output", 2))
        assert await getter == [("output", 1), ("output", 2)]
        later = asyncio.ensure_future(inbox.take_all())
        await asyncio.sleep(0)
        assert not later.done()
        inbox.put_nowait(("error", None))
        assert await later == [("error", None)]

    asyncio.run(scenario())


def test_inbox_queues_an_output_object_once_until_it_is_taken():
    """An ("output", out) already queued is not queued again (the taker reads the one
    cumulative object as it is when taken); once taken, by get or take_all, the same object
    queues again, and put_back counts it as queued. Other kinds queue every time, the same
    payload too. Were a taken output still counted as queued, the request's next news (its
    finish) would be dropped and its handler would wait for ever."""

    async def scenario():
        inbox, out, other = Inbox(), object(), object()
        inbox.put_nowait(("output", out))
        inbox.put_nowait(("output", out))
        inbox.put_nowait(("output", other))
        assert len(inbox) == 2
        assert await inbox.get() == ("output", out)
        inbox.put_nowait(("output", out))  # taken by get: it queues again
        assert await inbox.take_all() == [("output", other), ("output", out)]
        inbox.put_nowait(("output", out))  # taken by take_all: it queues again
        assert len(inbox) == 1
        item = await inbox.get()
        inbox.put_back(item)
        inbox.put_nowait(("output", out))  # put back: queued, not queued twice
        assert await inbox.take_all() == [("output", out)]
        inbox.put_nowait(("error", out))
        inbox.put_nowait(("error", out))
        assert len(inbox) == 2
        await inbox.take_all()
        inbox.put_nowait(("accepted", None))
        inbox.put_nowait(("output", other))
        first = await inbox.get()
        inbox.put_back(first)  # back in front of what came after it
        assert await inbox.take_all() == [("accepted", None), ("output", other)]

    asyncio.run(scenario())


def _two_sample_output(texts: list, finished: bool) -> SimpleNamespace:
    """One engine output (request "r") of n = len(texts) samples, a token a character."""
    samples = [
        SimpleNamespace(
            index=i, text=t, token_ids=list(range(len(t))), logprobs=None,
            finish_reason="length" if finished else None, stop_reason=None,
        )
        for i, t in enumerate(texts)
    ]  # fmt: skip
    return SimpleNamespace(request_id="r", outputs=samples, prompt_token_ids=[1], finished=finished)


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_stream_of_n_samples_sends_one_choice_a_chunk(kind):
    """n > 1: each chunk carries one choice, as vLLM and OpenAI stream them. Two samples' news
    of one engine step went out in one chunk of two choices, and a client ported from vLLM that
    reads `chunk.choices[0]` (vLLM's own tests do) lost every other sample's text."""
    from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from enginespec.entrypoints.openai.serving import ServerContext, _Call, _full_body, _stream
    from tests.entrypoints.client_helpers import ScriptedGeneration

    if kind == "completion":
        body = CompletionRequest(prompt="p", n=2, stream=True)
    else:
        body = ChatCompletionRequest(messages=[{"role": "user", "content": "p"}], n=2, stream=True)
    call = _Call(kind, "id-1", "m", body, [("p", [1])], ())
    call.index_of["r"] = 0
    steps = [_two_sample_output(["a", "x"], False), _two_sample_output(["ab", "xy"], True)]
    ctx = ServerContext(None, None, ["m"], 64)

    async def frames():
        return [f async for f in _stream(ctx, call, ScriptedGeneration(steps))]

    raw = asyncio.run(frames())
    assert raw[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(f[len("data: ") :]) for f in raw[:-1]]
    assert [len(c["choices"]) for c in chunks] == [1] * 4
    texts: dict = {}
    for chunk in chunks:  # the vLLM client's way of reading a stream of n samples
        choice = chunk["choices"][0]
        piece = choice["text"] if kind == "completion" else choice["delta"].get("content", "")
        texts[choice["index"]] = texts.get(choice["index"], "") + piece
    full = _full_body(ctx, call)["choices"]
    want = [c["text"] if kind == "completion" else c["message"]["content"] for c in full]
    assert [texts[0], texts[1]] == want == ["ab", "xy"]
