"""The OpenAI handlers (entrypoints/openai/serving.py) over a step that raises inside the
EngineCore (its fault_hook; the real fault path, which EngineCore contains by finishing the
step's requests with finish_reason "error").

A failed request is answered as /dev/fail_next_step's is (and as vLLM answers a request whose
finish reason is "error"): a 500 before the stream starts, one error frame and [DONE] after; the
engine serves on. The engine runs on a thread (in_process=True: the same loop and pipes as the
spawned process)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

import enginespec.engine.core_proc as core_proc
from enginespec.engine.engine_core import load_engine_tokenizer
from enginespec.engine_args import EngineArgs
from enginespec.entrypoints.openai.engine_client import EngineClient
from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from enginespec.entrypoints.openai.serving import (
    ServerContext,
    create_chat_completion,
    create_completion,
)
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=128, max_num_seqs=8, block_size=4)
TEMPLATE = "{% for m in messages %}{{ m['content'] }};{% endfor %}"


class _Fault:
    """EngineCore.fault_hook that raises once in "execute" after arm()."""

    def __init__(self):
        self.armed = threading.Event()

    def arm(self) -> None:
        self.armed.set()

    def __call__(self, phase: str) -> None:
        if phase == "execute" and self.armed.is_set():
            self.armed.clear()
            raise RuntimeError("planted forward fault")


@pytest.fixture
def served(monkeypatch):
    """(ServerContext over an in-process engine client, the engine's _Fault), stopped after."""
    fault = _Fault()
    serve = core_proc.serve_engine

    def serve_with_fault(engine, inbox, outbox):
        engine.fault_hook = fault
        serve(engine, inbox, outbox)

    monkeypatch.setattr(core_proc, "serve_engine", serve_with_fault)
    args = EngineArgs.from_kwargs(str(tiny_model_dir("qwen3")), **ENGINE)
    tokenizer = load_engine_tokenizer(args)
    client = EngineClient(args, tokenizer, in_process=True, max_waiting=16)
    info = client.launch(timeout=120)
    try:
        yield ServerContext(client, tokenizer, ["tiny"], info.max_model_len, TEMPLATE), fault
    finally:
        client.stop()


async def _never() -> None:
    await asyncio.Event().wait()


async def _wait_idle(client: EngineClient) -> None:
    for _ in range(3000):
        if client.state.num_unfinished == 0 and client._num_pending == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never idle: {client.state}")


def _frames(lines: list[str]) -> list:
    return [line[len("data: ") :].strip() for line in lines]


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_failed_step_is_a_500_then_an_error_frame_mid_stream(served, kind):
    ctx, fault = served
    fields = dict(model="tiny", max_tokens=64, ignore_eos=True, n=2, temperature=1.0, seed=0)
    if kind == "chat":
        make = lambda **kw: create_chat_completion(  # noqa: E731
            ctx, ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields, **kw), _never
        )
    else:
        make = lambda **kw: create_completion(  # noqa: E731
            ctx, CompletionRequest(prompt="hello world", **fields, **kw), _never
        )

    async def run():
        ctx.engine.start(asyncio.get_running_loop())
        fault.arm()
        with pytest.raises(APIError) as full:
            await make()
        frames = []
        stream = await make(stream=True, stream_options={"include_usage": True})
        async for frame in stream:
            frames.append(frame)
            if len(frames) == 1:
                fault.arm()
        await _wait_idle(ctx.engine)
        after = await make()  # the engine serves on
        return full.value, _frames(frames), after

    full, frames, after = asyncio.run(run())
    assert full.status == 500 and "planted forward fault" in full.message
    assert frames[-1] == "[DONE]"
    error = json.loads(frames[-2])
    assert error["error"]["code"] == 500 and "planted forward fault" in error["error"]["message"]
    assert all('"finish_reason":"error"' not in f for f in frames)
    assert [c["finish_reason"] for c in after["choices"]] == ["length", "length"]
    assert ctx.engine.state.num_free_blocks == ctx.engine.state.num_blocks
