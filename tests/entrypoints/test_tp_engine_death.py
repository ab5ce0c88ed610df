"""A tensor-parallel engine behind the engine client (the server's and AsyncLLM's side) when a
worker dies: the request of the step that found it dead gets its error (not silence), an idle
engine notices at once (no request needed), the engine loop ends, so the client declares the
engine dead (/health fails, the server exits) and refuses new requests, and no worker process
is left. The engine runs on a thread here (in_process=True: the same loop and pipes as the
spawned engine process)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal

import pytest

from enginespec.engine.core_messages import NewRequest
from enginespec.engine.engine_core import EngineCore, load_engine_tokenizer
from enginespec.engine_args import EngineArgs
from enginespec.entrypoints.openai.engine_client import EngineClient, EngineDead
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import make_checkpoint

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(
    impl="fast", device="cpu", dtype="float32", num_blocks=32, max_num_seqs=4, tensor_parallel_size=2
)
HANG_S = 30  # liveness bound: a request of a dead engine is answered long before this


def _tp_workers() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("enginespec-tp")]


def test_a_dead_worker_fails_the_step_request_and_ends_the_engine(tmp_path, monkeypatch):
    # The idle loop's watch on the workers is blinded, so the step finds the death (as it does
    # a worker that dies the moment the step begins); the next test is the watch's own.
    monkeypatch.setattr(EngineCore, "worker_sentinels", property(lambda self: []))
    monkeypatch.setattr(EngineCore, "poll_dead", lambda self: None)
    args = EngineArgs.from_kwargs(str(make_checkpoint("qwen3", tmp_path / "qwen3")), **ENGINE)
    client = EngineClient(args, load_engine_tokenizer(args), in_process=True, max_waiting=16)
    client.launch(timeout=120)
    deaths = []
    client.on_death = lambda: deaths.append(True)
    params = SamplingParams(max_tokens=8, temperature=0)

    async def run():
        client.start(asyncio.get_running_loop())
        await client.pause()  # "a" is added but not stepped until the worker is dead
        gen = await client.submit([NewRequest("a", None, [4, 5, 6], params)])
        (worker,) = _tp_workers()
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(HANG_S)
        await client.resume()
        items = await asyncio.wait_for(gen.next(), HANG_S)
        deadline = asyncio.get_running_loop().time() + HANG_S
        while client.alive and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        with pytest.raises(EngineDead):
            await client.submit([NewRequest("b", None, [4, 5, 6], params)])
        return items

    try:
        items = asyncio.run(run())
    finally:
        client.stop()
    kind, error = items[0]
    assert kind == "error" and "worker rank 1" in str(error) and "exited with code -9" in str(error)
    assert deaths == [True] and not client.alive
    assert not _tp_workers(), "a tensor-parallel worker outlived its engine"


def test_a_worker_that_dies_while_the_engine_is_idle_ends_the_engine_at_once(tmp_path):
    """vLLM's worker monitor: a worker that dies between requests (killed, out of host memory)
    ends the engine at once. The idle engine loop slept on its input alone and noticed only at
    the next request's step, so an idle server's /health stayed 200 over a dead engine (a
    supervisor never restarted it) until a user's request failed on it."""
    args = EngineArgs.from_kwargs(str(make_checkpoint("qwen3", tmp_path / "qwen3")), **ENGINE)
    client = EngineClient(args, load_engine_tokenizer(args), in_process=True, max_waiting=16)
    client.launch(timeout=120)
    deaths = []
    client.on_death = lambda: deaths.append(True)

    async def run():
        client.start(asyncio.get_running_loop())
        (worker,) = _tp_workers()
        os.kill(worker.pid, signal.SIGKILL)  # no request in flight: the engine loop is idle
        deadline = asyncio.get_running_loop().time() + HANG_S
        while client.alive and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        with pytest.raises(EngineDead):
            await client.submit([NewRequest("b", None, [4, 5, 6], SamplingParams(max_tokens=2))])

    try:
        asyncio.run(run())
    finally:
        client.stop()
    assert deaths == [True] and not client.alive
    assert not _tp_workers(), "a tensor-parallel worker outlived its engine"
