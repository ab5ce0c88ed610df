"""Lesser-used request paths a client moving from vLLM's server meets, over the app and an
in-process engine, driven by the official openai client (and httpx for raw bodies): chat's echo
(vLLM's field). Each test names what the client saw before its fix."""

from __future__ import annotations

import pytest

from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.serving import ServerContext
from tests.entrypoints.client_helpers import in_process_client, run_with_clients
from tests.entrypoints.remote_server import CHAT_TEMPLATE

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4)


@pytest.fixture(scope="module")
def app():
    with in_process_client(**ENGINE) as engine:
        ctx = ServerContext(
            engine, engine.tokenizer, ["tiny"], engine.info.max_model_len, chat_template=CHAT_TEMPLATE
        )
        yield build_app(ctx, ServerMetrics("tiny")), engine


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
