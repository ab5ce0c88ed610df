"""A chat stream carries what the full chat body carries: with return_token_ids, the prompt's
token ids (top level, in the stream's first chunk, as vLLM sends them) beside each delta's
token_ids. The handler runs over scripted engine outputs (a token a character)."""

from __future__ import annotations

import asyncio
import json

import pytest

from enginespec.entrypoints.openai.protocol import ChatCompletionRequest
from enginespec.entrypoints.openai.serving import (
    ServerContext,
    _Call,
    _chunk,
    _chunk_head,
    _frame_choice_usage,
    _frame_choices,
    _full_body,
    _stream,
)
from enginespec.entrypoints.openai.sse import frame
from tests.entrypoints.client_helpers import ScriptedGeneration, scripted_output

MESSAGES = [{"role": "user", "content": "hi"}]
PROMPT_IDS = [5, 6, 7]


def _outputs(text: str) -> list:
    outs = []
    for i in range(1, len(text) + 1):
        out = scripted_output(text[:i], "stop" if i == len(text) else None)
        out.prompt_token_ids, out.finished = PROMPT_IDS, i == len(text)
        outs.append(out)
    return outs


def _chunks(options) -> tuple[list[dict], dict]:
    """The stream's chunks (no [DONE]) and the full body of the same call's reply."""
    body = ChatCompletionRequest(
        messages=MESSAGES, stream=True, return_token_ids=True, stream_options=options
    )
    call = _Call("chat", "chatcmpl-1", "m", body, [("p", PROMPT_IDS)], ())
    call.index_of["r"] = 0
    ctx = ServerContext(None, None, ["m"], 64)

    async def frames():
        return [f async for f in _stream(ctx, call, ScriptedGeneration(_outputs("abc")))]

    raw = asyncio.run(frames())
    assert raw[-1] == "data: [DONE]\n\n"
    return [json.loads(f[len("data: ") :]) for f in raw[:-1]], _full_body(ctx, call)


@pytest.mark.parametrize(
    "options", [None, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}]
)
def test_a_chat_stream_with_return_token_ids_sends_the_prompts_ids_once(options):
    chunks, full = _chunks(options)
    assert full["prompt_token_ids"] == PROMPT_IDS
    assert chunks[0]["prompt_token_ids"] == PROMPT_IDS  # the first chunk, as vLLM's
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    ids = [t for c in chunks for choice in c["choices"] for t in choice["token_ids"]]
    assert ids == full["choices"][0]["token_ids"]


def test_the_prompt_ids_frame_is_the_chunk_with_that_key_last():
    from enginespec.entrypoints.openai.serving import _with_prompt_ids

    body = ChatCompletionRequest(messages=MESSAGES, stream=True)
    call = _Call("chat", 'id-"1"', "m[]}", body, [("p", PROMPT_IDS)], ())
    head, choice = _chunk_head(call), {"index": 0, "delta": {"content": "}\n\n"}, "finish_reason": None}
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    with_ids = {**_chunk(call, [choice]), "prompt_token_ids": PROMPT_IDS}
    assert _with_prompt_ids(_frame_choices(head, [choice]), PROMPT_IDS) == frame(with_ids)
    with_ids = {**_chunk(call, [choice], usage), "prompt_token_ids": PROMPT_IDS}
    assert _with_prompt_ids(_frame_choice_usage(head, choice, usage), PROMPT_IDS) == frame(with_ids)
