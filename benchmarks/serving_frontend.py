"""CPU microbenchmark of the server's front end: host cost per streamed token, no GPU, no engine.

Drives the same code the server runs per engine step: the engine client's pipe reader
(EngineClient._on_readable: unpickle one message of deltas, route them, fold them into each
RequestStream, detokenize, record the Prometheus metrics, wake the queues), then each request's
SSE generator (serving._stream: delta choice, chunk dict, JSON, SSE framing) and the UTF-8
encoding starlette does before its write. With --http each stream is instead a real HTTP request
to the server's app (build_app) through uvicorn's h11 protocol, over transports that only count
bytes: starlette's StreamingResponse, the middlewares, uvicorn's send and h11's chunked framing
are then included; only the socket syscall is not.

N streaming completions (token-id prompts, ignore_eos) are submitted through EngineClient.submit
against a fake engine that accepts them; then, per step, one pre-pickled message carrying one new
token for each of the N samples goes down a real multiprocessing Pipe (the engine's pickling is
the engine's cost, not timed here), and the step ends when every stream has yielded its frame.
Reported: process CPU microseconds per token and the tokens/s one front-end core could sustain.

Tokenizer: by default the one the H200 serving benchmark uses (testing.checkpoints.write_tokenizer
for the qwen3-0.6b vocabulary, 151,936 word-level entries); --tokenizer DIR takes any HF tokenizer.

    python -m benchmarks.serving_frontend --num-streams 256 --num-steps 200 --repeats 3
    python -m benchmarks.serving_frontend --profile 30   # cProfile, top 30 by cumulative time
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import multiprocessing
import pickle
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cli_types import at_least_one  # noqa: E402
from enginespec.engine.core_messages import EngineState
from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.engine_client import EngineClient
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.protocol import CompletionRequest
from enginespec.entrypoints.openai.serving import ServerContext, create_completion

_QWEN3_VOCAB, _QWEN3_EOS = 151936, 151645


class _AcceptAll:
    """Stands in for the engine's command pipe: every "add" is accepted at once, its request
    ids recorded (the step messages address them)."""

    def __init__(self, client: EngineClient):
        self.client = client
        self.request_ids: list[str] = []

    def send(self, command: tuple) -> None:
        if command[0] == "add":
            self.request_ids.extend(r.request_id for r in command[2])
            asyncio.get_running_loop().call_soon(self.client._on_reply, "added", command[1], None)

    def close(self, timeout=None) -> None:
        pass


class _Counter:
    """Frames seen so far; wakes the driver once `target` frames have gone out."""

    def __init__(self) -> None:
        self.num_frames = self.num_bytes = self.target = 0
        self.wake = asyncio.Event()

    def add(self, num_frames: int, num_bytes: int) -> None:
        self.num_frames += num_frames
        self.num_bytes += num_bytes
        if self.num_frames >= self.target:
            self.wake.set()


class _Transport(asyncio.Transport):
    """A socket that only counts: what uvicorn's protocol writes (status line, chunked frames)."""

    def __init__(self, counter: _Counter, port: int):
        super().__init__()
        self.counter, self.port, self.closing = counter, port, False

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", self.port)}.get(name, default)

    def write(self, data) -> None:
        self.counter.add(bytes(data).count(b"data: "), len(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def load_tokenizer(path):
    from transformers import AutoTokenizer

    if path is None:
        from enginespec.testing.checkpoints import write_tokenizer

        path = tempfile.mkdtemp(prefix="fe-tok-")
        write_tokenizer(path, _QWEN3_VOCAB, _QWEN3_EOS)
    return AutoTokenizer.from_pretrained(path)


def _messages(request_ids: list[str], num_steps: int, vocab: int, seed: int) -> list[bytes]:
    """Pre-pickled ("step", deltas, failed, replies, state, step_start) messages, one per step;
    the last step finishes every stream ("length"). A delta is core_proc's SampleDelta tuple:
    (request id, sample index, new ids, new logprobs, new text, finish, stop, error, prompt
    logprobs, num cached tokens)."""
    rng = random.Random(seed)
    state = EngineState()
    out = []
    for step in range(num_steps):
        finish = "length" if step == num_steps - 1 else None
        deltas = [
            (rid, 0, [rng.randrange(vocab)], None, None, finish, None, None, None, None)
            for rid in request_ids
        ]
        out.append(
            pickle.dumps(("step", deltas, [], [], state, time.monotonic()), protocol=pickle.HIGHEST_PROTOCOL)
        )
    return out


async def _consume(stream, counter: _Counter) -> None:
    async for frame in stream:
        counter.add(1, len(frame.encode("utf-8")))  # starlette encodes each str chunk


def _body(i: int, num_steps: int) -> dict:
    return dict(model="bench", prompt=[5 + i % 100] * 64, max_tokens=num_steps, stream=True, ignore_eos=True)


async def _open_generators(ctx, counter: _Counter, num_streams: int, num_steps: int) -> list:
    """The streams as serving.create_completion returns them, each drained by a task."""
    streams = [
        await create_completion(ctx, CompletionRequest(**_body(i, num_steps)), None)
        for i in range(num_streams)
    ]
    return [asyncio.ensure_future(_consume(s, counter)) for s in streams]


async def _open_http(ctx, counter: _Counter, num_streams: int, num_steps: int) -> list:
    """The streams as HTTP requests to the server's app, through uvicorn's h11 protocol (the one
    the server runs without httptools) over transports that only count the bytes."""
    from uvicorn.config import Config
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.server import ServerState

    config = Config(build_app(ctx, ServerMetrics("bench")), http="h11", lifespan="off", access_log=False)
    config.load()
    state, transports = ServerState(), []
    for i in range(num_streams):
        proto = H11Protocol(config, state, {}, _loop=asyncio.get_running_loop())
        transports.append(_Transport(counter, 40000 + i))
        proto.connection_made(transports[-1])
        payload = json.dumps(_body(i, num_steps)).encode()
        head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        proto.data_received(f"{head}content-length: {len(payload)}\r\n\r\n".encode() + payload)
    while len(ctx.engine._to_engine.request_ids) < num_streams:
        if not state.tasks:  # every request ended before all were submitted: a failed request
            got = len(ctx.engine._to_engine.request_ids)
            raise RuntimeError(
                f"{num_streams - got} of {num_streams} requests ended before submitting (a 4xx/5xx)"
            )
        await asyncio.sleep(0.001)
    return [asyncio.ensure_future(_drained(state)) for _ in range(1)]


async def _drained(state) -> None:
    while state.tasks:
        await asyncio.sleep(0.001)


async def run_once(
    tokenizer, num_streams: int, num_steps: int, *, http: bool, seed: int = 0, profiler=None
) -> dict:
    loop = asyncio.get_running_loop()
    args = SimpleNamespace(
        max_num_seqs=num_streams, max_logprobs=20
    )  # what submit reads (vLLM's default cap)
    client = EngineClient(args, tokenizer, ServerMetrics("bench"))
    client.info = SimpleNamespace(vocab_size=len(tokenizer))  # what submit's prompt check reads
    recv, send = multiprocessing.Pipe(duplex=False)
    client._to_engine, client._from_engine = _AcceptAll(client), recv
    client.start(loop)
    ctx = ServerContext(client, tokenizer, ["bench"], 1 << 20)
    counter = _Counter()
    tasks = await (_open_http if http else _open_generators)(ctx, counter, num_streams, num_steps)
    await asyncio.sleep(0.01)
    msgs = _messages(client._to_engine.request_ids, num_steps, tokenizer.vocab_size, seed)
    base = counter.num_frames
    if profiler is not None:
        profiler.enable()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for step, msg in enumerate(msgs):
        counter.target = base + num_streams * (step + 1) + (num_streams if step == num_steps - 1 else 0)
        counter.wake.clear()
        send.send_bytes(msg)
        await counter.wake.wait()
    await asyncio.gather(*tasks)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if profiler is not None:
        profiler.disable()
    client.stop(0.1)
    send.close()
    recv.close()
    num_tokens = num_streams * num_steps
    return {
        "num_tokens": num_tokens,
        "num_frames": counter.num_frames - base,
        "num_bytes": counter.num_bytes,
        "cpu_s": cpu,
        "wall_s": wall,
        "us_per_token": 1e6 * cpu / num_tokens,
        "max_tokens_per_s": num_tokens / cpu,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-streams", type=at_least_one, default=256, help="concurrent streaming requests")
    ap.add_argument(
        "--num-steps", type=at_least_one, default=200, help="engine steps, one token per stream each"
    )
    ap.add_argument("--repeats", type=at_least_one, default=3, help="runs; the best is reported")
    ap.add_argument("--tokenizer", default=None, help="an HF tokenizer dir (default: the benchmark's)")
    ap.add_argument("--http", action="store_true", help="through the app and uvicorn's h11 protocol too")
    ap.add_argument("--profile", type=int, default=0, help="print the top N cProfile entries")
    return ap


def main(argv=None) -> None:
    ns = build_parser().parse_args(argv)
    tokenizer = load_tokenizer(ns.tokenizer)
    runs = []
    for r in range(ns.repeats):
        prof = cProfile.Profile() if ns.profile and r == ns.repeats - 1 else None
        runs.append(
            asyncio.run(
                run_once(tokenizer, ns.num_streams, ns.num_steps, http=ns.http, seed=r, profiler=prof)
            )
        )
        if prof is not None:
            pstats.Stats(prof).sort_stats("tottime").print_stats(ns.profile)
    best = min(runs, key=lambda x: x["us_per_token"])
    print(
        json.dumps(
            {
                "runs": runs,
                "best_us_per_token": best["us_per_token"],
                "best_max_tokens_per_s": best["max_tokens_per_s"],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
