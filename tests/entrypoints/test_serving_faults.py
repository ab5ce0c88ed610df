"""The OpenAI handlers (entrypoints/openai/serving.py) over a step that raises inside the
EngineCore (its fault_hook; the real fault path, which EngineCore contains by finishing the
step's requests with finish_reason "error"), and the engine client's own request bookkeeping.

A failed request is answered as /dev/fail_next_step's is (and as vLLM answers a request whose
finish reason is "error"): a 500 before the stream starts, one error frame and [DONE] after; the
engine serves on. The engine runs on a thread (in_process=True: the same loop and pipes as the
spawned process)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

import pytest

import enginespec.engine.core_proc as core_proc
from enginespec.engine.core_messages import NewRequest
from enginespec.engine.engine_core import load_engine_tokenizer
from enginespec.engine_args import EngineArgs
from enginespec.entrypoints.openai.engine_client import EngineClient, EngineDead, EngineRequestError
from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from enginespec.entrypoints.openai.serving import (
    ServerContext,
    create_chat_completion,
    create_completion,
)
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir
from tests.engine.test_undecodable_output import RefusingTokenizer
from tests.entrypoints.client_helpers import final_output

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=128, max_num_seqs=8, block_size=4)
TEMPLATE = "{% for m in messages %}{{ m['content'] }};{% endfor %}"


class _Fault:
    """EngineCore.fault_hook that raises once in "execute" after arm(), and calls `also` (when
    set) with every phase first."""

    def __init__(self):
        self.armed = threading.Event()
        self.also = None

    def arm(self) -> None:
        self.armed.set()

    def __call__(self, phase: str) -> None:
        if self.also is not None:
            self.also(phase)
        if phase == "execute" and self.armed.is_set():
            self.armed.clear()
            raise RuntimeError("planted forward fault")


@contextlib.contextmanager
def _serve(monkeypatch, **engine):
    """(ServerContext over an in-process engine client with ENGINE's arguments and `engine`'s,
    the engine's _Fault), stopped after."""
    fault = _Fault()
    serve = core_proc.serve_engine

    def serve_with_fault(engine, inbox, outbox):
        engine.fault_hook = fault
        serve(engine, inbox, outbox)

    monkeypatch.setattr(core_proc, "serve_engine", serve_with_fault)
    args = EngineArgs.from_kwargs(str(tiny_model_dir("qwen3")), **{**ENGINE, **engine})
    tokenizer = load_engine_tokenizer(args)
    client = EngineClient(args, tokenizer, ServerMetrics("tiny"), in_process=True, max_waiting=16)
    info = client.launch(timeout=120)
    try:
        yield ServerContext(client, tokenizer, ["tiny"], info.max_model_len, TEMPLATE), fault
    finally:
        client.stop()


@pytest.fixture
def served(monkeypatch):
    """(ServerContext over an in-process engine client, the engine's _Fault), stopped after."""
    with _serve(monkeypatch) as found:
        yield found


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


def _successes(client: EngineClient) -> dict:
    """vllm:request_success_total by finished_reason."""
    labels = {"model_name": "tiny", "engine": "0"}
    get = client.metrics.registry.get_sample_value
    return {
        r: get("vllm:request_success_total", {**labels, "finished_reason": r}) for r in ("error", "abort")
    }


@pytest.mark.parametrize("stream", [False, True], ids=["full", "stream"])
def test_a_failed_sample_fails_its_siblings_as_errors(monkeypatch, stream):
    """n=2 on an engine that runs one sequence at a time: the step that fails sample 0 (a
    forward fault) cannot touch sample 1, still waiting. The server answered the 500 and aborted
    the request, so /metrics counted sample 1 under "abort", as if the client had cancelled. The
    whole request failed: both samples count under "error" (the engine fails the siblings with
    it), the answer is the 500 naming the fault, every block is free and the engine serves on."""
    fields = dict(
        model="tiny", prompt="hello world", max_tokens=8, ignore_eos=True, n=2, temperature=1.0, seed=0
    )

    async def run(ctx, fault):
        ctx.engine.start(asyncio.get_running_loop())
        fault.arm()
        request = CompletionRequest(stream=stream, **fields)
        if stream:
            frames = _frames([f async for f in await create_completion(ctx, request, _never)])
            failure = json.loads(frames[-2])["error"]
        else:
            with pytest.raises(APIError) as info:
                await create_completion(ctx, request, _never)
            failure = {"code": info.value.status, "message": info.value.message}
        await _wait_idle(ctx.engine)
        return failure, await create_completion(ctx, CompletionRequest(**fields), _never)

    with _serve(monkeypatch, max_num_seqs=1) as (ctx, fault):
        failure, after = asyncio.run(run(ctx, fault))
        assert failure["code"] == 500 and "planted forward fault" in failure["message"]
        assert _successes(ctx.engine) == {"error": 2, "abort": 0}
        assert [c["finish_reason"] for c in after["choices"]] == ["length", "length"]
        assert ctx.engine.state.num_free_blocks == ctx.engine.state.num_blocks


# ---- the engine client's bookkeeping ---------------------------------------------------------------

LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)


def test_a_request_id_in_use_is_refused_and_the_first_request_runs_on(served):
    ctx, _ = served
    client = ctx.engine
    short = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    async def run():
        client.start(asyncio.get_running_loop())
        await client.pause()  # the first request cannot finish before the second arrives
        first = await client.submit([NewRequest("same", None, [5, 6, 7], short)])
        with pytest.raises(ValueError, match="request_id 'same'"):
            await client.submit([NewRequest("same", None, [8, 9, 10], short)])
        with pytest.raises(ValueError, match="request_id 'twice'"):
            await client.submit(
                [NewRequest("twice", None, [8], short), NewRequest("twice", None, [9], short)]
            )
        await client.resume()
        return await asyncio.wait_for(final_output(first), 60)

    out = asyncio.run(run())
    assert out.finished and out.prompt_token_ids == [5, 6, 7] and len(out.outputs[0].token_ids) == 6
    assert client._num_pending == 0 and not client._streams


def test_stop_ends_every_pending_request_with_an_error(served):
    ctx, _ = served
    client = ctx.engine

    async def run():
        client.start(asyncio.get_running_loop())
        gen = await client.submit([NewRequest("long", None, [5, 6, 7], LONG)])
        await gen.next()  # running
        waiter = asyncio.ensure_future(final_output(gen))
        await asyncio.sleep(0)  # the consumer waits on its inbox
        client.stop()
        with pytest.raises(EngineDead):
            await asyncio.wait_for(waiter, 30)

    asyncio.run(run())
    assert client._num_pending == 0 and not client._streams


def test_a_failed_request_counts_each_sample_under_error_either_way(served):
    """request_success counts the samples of a request the engine loop dropped (a step that
    raised out of EngineCore.step: `failed`) under "error", as it counts those EngineCore
    finished with finish_reason "error": /metrics tells a fault from an abort both ways."""
    ctx, fault = served
    client = ctx.engine
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=0, n=2, ignore_eos=True)

    async def run():
        client.start(asyncio.get_running_loop())
        fault.arm()  # inside EngineCore.step: contained, the samples finish with "error"
        contained = await final_output(
            await client.submit([NewRequest("contained", None, [5, 6, 7], params)])
        )
        await client.fail_next_step()  # out of EngineCore.step: the engine loop drops the request
        with pytest.raises(EngineRequestError):
            await final_output(await client.submit([NewRequest("dropped", None, [5, 6, 7], params)]))
        return contained

    contained = asyncio.run(run())
    assert [c.finish_reason for c in contained.outputs] == ["error", "error"]
    labels = {"model_name": "tiny", "engine": "0", "finished_reason": "error"}
    assert client.metrics.registry.get_sample_value("vllm:request_success_total", labels) == 4


def test_an_id_reused_after_a_cancelled_submit_gets_only_its_own_replies(served):
    """A submit cancelled before the engine answered its add frees the id at once; a submit that
    reuses it gets its own "added" reply, never the cancelled one's (a client retrying under
    its own request id)."""
    ctx, fault = served
    client = ctx.engine
    holding, busy, release = threading.Event(), threading.Event(), threading.Event()

    def hold(phase: str) -> None:  # the engine loop sits in a step: commands wait
        if phase == "execute" and holding.is_set() and not release.is_set():
            busy.set()
            release.wait(60)

    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)

    async def run():
        client.start(asyncio.get_running_loop())
        blocker = await client.submit([NewRequest("blocker", None, [4, 5], LONG)])
        holding.set()
        assert await asyncio.get_running_loop().run_in_executor(None, busy.wait, 60)
        first = asyncio.ensure_future(client.submit([NewRequest("x", None, [5, 6, 7], params)]))
        await asyncio.sleep(0)  # its add is on the way
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.ensure_future(client.submit([NewRequest("x", None, [8, 9, 10], params)]))
        await asyncio.sleep(0)
        release.set()
        gen = await asyncio.wait_for(second, 60)
        blocker.abort()
        return await asyncio.wait_for(final_output(gen), 60)

    fault.also = hold
    out = asyncio.run(run())
    assert out.finished and out.prompt_token_ids == [8, 9, 10] and len(out.outputs[0].token_ids) == 5
    assert client._num_pending == 0 and not client._streams


# ---- faults on the server's side ------------------------------------------------------------------


def test_a_frame_builder_that_raises_ends_the_stream_with_an_error_frame(served, monkeypatch):
    """A bug while building a frame (a tool or reasoning parser, say) mid-stream: the client gets
    one 500 error frame and [DONE] (not a connection cut without its end), the request is freed,
    and the next request is served."""
    import enginespec.entrypoints.openai.serving as serving

    ctx, _ = served
    build = serving._output_frames
    calls = []

    def flaky(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("planted frame fault")
        return build(*args)

    monkeypatch.setattr(serving, "_output_frames", flaky)
    fields = dict(model="tiny", prompt="hello world", max_tokens=64, ignore_eos=True, temperature=0)

    async def run():
        ctx.engine.start(asyncio.get_running_loop())
        stream = await create_completion(ctx, CompletionRequest(stream=True, **fields), _never)
        frames = [f async for f in stream]
        await _wait_idle(ctx.engine)
        return frames, await create_completion(ctx, CompletionRequest(**fields), _never)

    frames, after = asyncio.run(run())
    frames = _frames(frames)
    assert frames[-1] == "[DONE]"
    error = json.loads(frames[-2])["error"]
    assert error["code"] == 500 and "planted frame fault" in error["message"]
    assert after["choices"][0]["finish_reason"] == "length"
    assert ctx.engine.state.num_free_blocks == ctx.engine.state.num_blocks


def test_a_fault_reading_the_engine_fails_pending_requests_instead_of_hanging(served, monkeypatch):
    """An exception while the client folds a message of the engine (a bug) would lose that
    message's outputs, leaving their requests waiting forever: it ends the client as the
    engine's death does (every pending request gets EngineDead naming the fault, new ones are
    refused, on_death runs), and the engine is asked to stop."""
    import enginespec.entrypoints.openai.engine_client as engine_client

    ctx, _ = served
    client = ctx.engine
    deaths = []
    client.on_death = lambda: deaths.append(True)

    def broken(self, delta):
        raise RuntimeError("planted reader fault")

    monkeypatch.setattr(engine_client.RequestStream, "apply", broken)

    async def run():
        client.start(asyncio.get_running_loop())
        gen = await client.submit([NewRequest("r", None, [5, 6, 7], LONG)])
        with pytest.raises(EngineDead, match="planted reader fault"):
            await asyncio.wait_for(final_output(gen), 30)
        with pytest.raises(EngineDead):
            await client.submit([NewRequest("s", None, [5, 6, 7], LONG)])

    asyncio.run(run())
    assert deaths == [True] and not client.alive and client._num_pending == 0


# ---- logits that are not finite ---------------------------------------------------------------------


@pytest.fixture
def overflowing(monkeypatch):
    """Every forward's logits get +inf in one column (an fp16 model that overflowed), so the
    raw logprobs of every row are NaN. Patched before `served` builds its engine."""
    from enginespec.worker.runner import ModelRunner

    execute = ModelRunner.execute

    def overflow(self, batch):
        result = execute(self, batch)
        result.logits = result.logits.clone()
        result.logits[:, 3] = float("inf")
        return result

    monkeypatch.setattr(ModelRunner, "execute", overflow)


def _strict_json(text: str):
    """json.loads refusing NaN and Infinity, as a browser's JSON.parse or a typed client does."""

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_nan_logprobs_still_make_valid_json(overflowing, served):
    """Logits that overflowed give NaN logprobs. JSON has no NaN: the full body went through
    starlette's renderer (allow_nan=False) as a 500 "Out of range float values are not JSON
    compliant" after the whole generation, and stream frames carried a bare NaN that strict
    parsers refuse. Every logprob field goes out as a number, as a masked token's -inf does."""
    ctx, _ = served
    common = dict(model="tiny", max_tokens=3, ignore_eos=True, temperature=0)
    completion = dict(prompt="hello world", logprobs=2, **common)
    chat = dict(messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=2, **common)

    async def run():
        ctx.engine.start(asyncio.get_running_loop())
        bodies = [
            await create_completion(
                ctx, CompletionRequest(prompt_logprobs=1, echo=True, **completion), _never
            ),
            await create_chat_completion(ctx, ChatCompletionRequest(**chat), _never),
        ]
        frames = []
        for make, request in (
            (create_completion, CompletionRequest(stream=True, **completion)),
            (create_chat_completion, ChatCompletionRequest(stream=True, **chat)),
        ):
            frames += [f async for f in await make(ctx, request, _never)]
        return bodies, _frames(frames)

    bodies, frames = asyncio.run(run())
    for body in bodies:
        _strict_json(json.dumps(body))  # what starlette's JSONResponse renders, and a client parses
    assert bodies[0]["choices"][0]["logprobs"]["token_logprobs"][-1] == -9999.0
    assert bodies[1]["choices"][0]["logprobs"]["content"][0]["logprob"] == -9999.0
    for frame in frames:
        if frame != "[DONE]":
            _strict_json(frame)


# ---- a tokenizer that cannot decode an id --------------------------------------------------------

ODD_ID = 50  # the id RefusingTokenizer refuses to decode here


def test_a_token_the_tokenizer_cannot_decode_fails_only_its_request(monkeypatch):
    """Decoding a request's ids on the server's side raised out of the client's reader, which
    took it for a bug of its own: every pending request ended with EngineDead, the engine was
    stopped and the server with it. Only that request fails (EngineRequestError naming the
    tokenizer's error, a 500), its engine request is aborted, and the others run on."""
    args = EngineArgs.from_kwargs(str(tiny_model_dir("qwen3")), **ENGINE)
    tokenizer = RefusingTokenizer(load_engine_tokenizer(args), ODD_ID)
    client = EngineClient(args, tokenizer, ServerMetrics("tiny"), in_process=True, max_waiting=16)
    client.launch(timeout=120)
    odd = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, allowed_token_ids=[ODD_ID])
    fine = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)

    async def run():
        client.start(asyncio.get_running_loop())
        other = await client.submit([NewRequest("fine", None, [5, 6, 7], fine)])
        bad = await client.submit([NewRequest("odd", None, [5, 6, 7], odd)])
        with pytest.raises(EngineRequestError, match=f"no token for id {ODD_ID}"):
            await asyncio.wait_for(final_output(bad), 60)
        out = await asyncio.wait_for(final_output(other), 60)
        await _wait_idle(client)
        again = await client.submit([NewRequest("again", None, [8, 9], fine)])
        return out, await asyncio.wait_for(final_output(again), 60)

    try:
        out, again = asyncio.run(run())
        assert client.alive
        assert out.outputs[0].finish_reason == again.outputs[0].finish_reason == "length"
        assert len(out.outputs[0].token_ids) == 40
        assert client.state.num_free_blocks == client.state.num_blocks
        labels = {"model_name": "tiny", "engine": "0", "finished_reason": "error"}
        assert client.metrics.registry.get_sample_value("vllm:request_success_total", labels) == 1
    finally:
        client.stop()


def test_a_prompt_ending_in_an_id_the_tokenizer_cannot_decode_is_served():
    """The front end decodes a request's prompt tail as its output's left context (RequestStream's
    detokenizer); a tokenizer that raised there made submit() raise its KeyError, a 500 with the
    server's traceback for a request the engine can serve. It is served without the context."""
    args = EngineArgs.from_kwargs(str(tiny_model_dir("qwen3")), **ENGINE)
    tokenizer = RefusingTokenizer(load_engine_tokenizer(args), ODD_ID)
    client = EngineClient(args, tokenizer, ServerMetrics("tiny"), in_process=True, max_waiting=16)
    client.launch(timeout=120)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, allowed_token_ids=[20, 21])

    async def run():
        client.start(asyncio.get_running_loop())
        gen = await client.submit([NewRequest("tail", None, [5, 6, ODD_ID], params)])
        return await asyncio.wait_for(final_output(gen), 60)

    try:
        out = asyncio.run(run())
        assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 6
        assert out.outputs[0].text == tokenizer.decode(out.outputs[0].token_ids)
    finally:
        client.stop()
