"""CPU microbenchmark of the server's front end: host cost per streamed token, no GPU, no engine.

Drives the same code the server runs per engine step: the engine client's pipe reader
(EngineClient._on_readable: unpickle one message of deltas, route them, fold them into each
RequestStream, detokenize, record the Prometheus metrics, wake the queues), then each request's
SSE generator (serving._stream: delta choice, chunk dict, JSON, SSE framing) and the UTF-8
encoding starlette does before its write. Not included: uvicorn's socket write and HTTP framing.

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
import tempfile
import time
import uuid
from types import SimpleNamespace

import enginespec.entrypoints.openai.serving as serving
from enginespec.engine.core_messages import EngineState
from enginespec.entrypoints.openai.engine_client import EngineClient
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.protocol import CompletionRequest
from enginespec.entrypoints.openai.serving import ServerContext, create_completion

_QWEN3_VOCAB, _QWEN3_EOS = 151936, 151645


class _AcceptAll:
    """Stands in for the engine's command pipe: every "add" is accepted at once."""

    def __init__(self, client: EngineClient):
        self.client = client

    def send(self, command: tuple) -> None:
        if command[0] == "add":
            loop = asyncio.get_running_loop()
            loop.call_soon(self.client._on_reply, "added", command[1], None)

    def close(self, timeout=None) -> None:
        pass


def load_tokenizer(path):
    from transformers import AutoTokenizer

    if path is None:
        from enginespec.testing.checkpoints import write_tokenizer

        path = tempfile.mkdtemp(prefix="fe-tok-")
        write_tokenizer(path, _QWEN3_VOCAB, _QWEN3_EOS)
    return AutoTokenizer.from_pretrained(path)


def _messages(num_streams: int, num_steps: int, vocab: int, seed: int) -> list[bytes]:
    """Pre-pickled ("step", deltas, failed, replies, state, step_start) messages, one per step;
    the last step finishes every stream ("length")."""
    rng = random.Random(seed)
    state = EngineState()
    out = []
    for step in range(num_steps):
        finish = "length" if step == num_steps - 1 else None
        deltas = [
            (f"cmpl-{i}", 0, [rng.randrange(vocab)], None, None, finish, None, None, None)
            for i in range(num_streams)
        ]
        out.append(
            pickle.dumps(("step", deltas, [], [], state, time.monotonic()), protocol=pickle.HIGHEST_PROTOCOL)
        )
    return out


async def _consume(stream, counter: dict, wake: asyncio.Event) -> None:
    async for frame in stream:
        counter["bytes"] += len(frame.encode("utf-8"))  # starlette encodes each str chunk
        counter["frames"] += 1
        if counter["frames"] >= counter["target"]:
            wake.set()


async def run_once(tokenizer, num_streams: int, num_steps: int, seed: int = 0, profiler=None) -> dict:
    loop = asyncio.get_running_loop()
    args = SimpleNamespace(max_num_seqs=num_streams)
    client = EngineClient(args, tokenizer, ServerMetrics("bench"), max_waiting=num_streams)
    recv, send = multiprocessing.Pipe(duplex=False)
    client._to_engine, client._from_engine = _AcceptAll(client), recv
    client.start(loop)
    ctx = ServerContext(client, tokenizer, ["bench"], 1 << 20)
    streams = []
    ids = iter(range(num_streams))
    serving.uuid = SimpleNamespace(uuid4=lambda: SimpleNamespace(hex=str(next(ids))))  # ids cmpl-{i}
    try:
        for i in range(num_streams):
            body = CompletionRequest(
                prompt=[5 + i % 100] * 64, max_tokens=num_steps, stream=True, ignore_eos=True
            )
            streams.append(await create_completion(ctx, body, None))
    finally:
        serving.uuid = uuid
    msgs = _messages(num_streams, num_steps, tokenizer.vocab_size, seed)
    counter = {"bytes": 0, "frames": 0, "target": 0}
    wake = asyncio.Event()
    tasks = [asyncio.ensure_future(_consume(s, counter, wake)) for s in streams]
    await asyncio.sleep(0)
    if profiler is not None:
        profiler.enable()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for step, msg in enumerate(msgs):
        counter["target"] = num_streams * (step + 1) + (num_streams if step == num_steps - 1 else 0)
        wake.clear()
        send.send_bytes(msg)
        await wake.wait()
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
        "num_frames": counter["frames"],
        "num_bytes": counter["bytes"],
        "cpu_s": cpu,
        "wall_s": wall,
        "us_per_token": 1e6 * cpu / num_tokens,
        "max_tokens_per_s": num_tokens / cpu,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-streams", type=int, default=256)
    ap.add_argument("--num-steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokenizer", default=None, help="an HF tokenizer dir (default: the benchmark's)")
    ap.add_argument("--profile", type=int, default=0, help="print the top N cProfile entries")
    ns = ap.parse_args(argv)
    tokenizer = load_tokenizer(ns.tokenizer)
    runs = []
    for r in range(ns.repeats):
        prof = cProfile.Profile() if ns.profile and r == ns.repeats - 1 else None
        runs.append(asyncio.run(run_once(tokenizer, ns.num_streams, ns.num_steps, seed=r, profiler=prof)))
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
