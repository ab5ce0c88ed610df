"""Helpers shared by the tests that drive the engine client (entrypoints/openai/engine_client.py)
without HTTP, and by those that drive the chat choice builders over scripted outputs."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from types import SimpleNamespace

from enginespec.engine.engine_core import load_engine_tokenizer
from enginespec.engine_args import EngineArgs
from enginespec.entrypoints.openai.engine_client import EngineClient
from enginespec.entrypoints.openai.serving import _Call, _delta_choice, _full_choice
from enginespec.testing.checkpoints import tiny_model_dir


@contextmanager
def in_process_client(model=None, **engine):
    """A launched EngineClient on a thread of this process over `model` (default: the tiny
    qwen3 checkpoint) with these engine arguments (the same loop and pipes as the spawned
    engine process); stopped on exit."""
    args = EngineArgs.from_kwargs(str(model or tiny_model_dir("qwen3")), **engine)
    client = EngineClient(args, load_engine_tokenizer(args), in_process=True, max_waiting=16)
    client.launch(timeout=120)
    try:
        yield client
    finally:
        client.stop()


def run_with_clients(app, engine, fn):
    """fn(openai client, httpx client), an async function, run against the ASGI `app` whose
    engine client `engine` reads on this loop (the lifespan's job: ASGITransport runs none);
    every request is finished or aborted at the end. Returns fn's result."""
    import httpx
    import openai

    async def run():
        engine.start(asyncio.get_running_loop())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as http:
            client = openai.AsyncOpenAI(
                base_url="http://test/v1", api_key="k", http_client=http, max_retries=0
            )
            result = await fn(client, http)
        assert engine.num_pending_requests == 0  # every step's requests finished or aborted
        return result

    return asyncio.run(run())


async def never() -> None:
    """A handler's wait_disconnect for a client that never leaves."""
    await asyncio.Event().wait()


async def final_output(gen):
    """The last output of a Generation (raising the error it ends with, if any)."""
    last = None
    while not gen.done:
        for kind, payload in await gen.next():
            if kind == "error":
                raise payload
            last = payload
    return last


class ScriptedGeneration:
    """A Generation that yields these outputs, one a step (the engine's steps, or outputs
    coalesced while the event loop was busy): the stream builders' input without an engine."""

    def __init__(self, outputs):
        self.outputs, self.done = list(outputs), False

    async def next(self):
        out = self.outputs.pop(0)
        self.done = out.finished
        return [("output", out)]

    def abort(self) -> None:
        pass


def scripted_output(text: str, finish_reason=None):
    """A one-choice RequestOutput (request id "r") whose text is `text`, a token a character,
    as the tiny character tokenizer would stream it."""
    completion = SimpleNamespace(
        index=0, text=text, token_ids=list(range(len(text))), logprobs=None,
        finish_reason=finish_reason, stop_reason=None,
    )  # fmt: skip
    return SimpleNamespace(request_id="r", outputs=[completion], prompt_token_ids=[1])


def stream_then_full(call: _Call, text: str) -> tuple[list[dict], dict]:
    """The streamed choices of `text` growing a character a step (the last step finishes it with
    "stop"), and the full body's choice of the finished text."""
    choices = []
    for i in range(1, len(text) + 1):
        out = scripted_output(text[:i], "stop" if i == len(text) else None)
        choice = _delta_choice(None, call, out, out.outputs[0])
        if choice is not None:
            choices.append(choice)
    final = scripted_output(text, "stop")
    return choices, _full_choice(None, call, final, final.outputs[0])
