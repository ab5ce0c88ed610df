"""The engine client without HTTP: the delta protocol of engine/core_proc.py round-trips into
the same cumulative outputs LLM.generate returns (ids, text, stop strings, logprobs, n > 1,
prompt logprobs), aborts free blocks with no further step, a dead engine loop fails every
pending request and every new one, and the loop ends when the server side is gone. The engine
runs on a thread here (in_process=True: the same loop and pipes as the spawned process, without
the spawn); the process itself is covered by the server tests."""

from __future__ import annotations

import asyncio

import pytest

from enginespec.engine.core_messages import NewRequest
from enginespec.engine_args import EngineArgs
from enginespec.entrypoints.openai.engine_client import EngineClient, EngineDead, QueueFull
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import make_checkpoint
from tests.entrypoints.client_helpers import final_output

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", num_blocks=128, max_num_seqs=8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("client") / "qwen3")


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), **ENGINE)


def _client(model_dir, llm) -> EngineClient:
    args = EngineArgs.from_kwargs(str(model_dir), **ENGINE)
    client = EngineClient(args, llm.get_tokenizer(), in_process=True, max_waiting=16)
    client.launch(timeout=120)
    return client


async def _wait_state(client, predicate, timeout: float = 30.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate(client.state):
        assert asyncio.get_running_loop().time() < deadline, f"state never reached: {client.state}"
        await asyncio.sleep(0.01)
    return client.state


def _cases(llm) -> list[tuple[list[int], SamplingParams]]:
    prompt = [5, 9, 17, 33, 2, 41]
    plain = llm.generate(
        [{"prompt_token_ids": prompt}], SamplingParams(max_tokens=16, temperature=0), use_tqdm=False
    )
    text = plain[0].outputs[0].text
    stop = text[4:6] if len(text) >= 6 else text[-1:]  # a stop string the greedy text contains
    return [
        (prompt, SamplingParams(max_tokens=16, temperature=0)),
        (prompt, SamplingParams(max_tokens=16, temperature=0, stop=(stop,))),
        ([7, 8, 9], SamplingParams(max_tokens=10, temperature=1.0, seed=3, n=2, logprobs=2)),
        ([11, 12, 13, 14], SamplingParams(max_tokens=6, temperature=0, prompt_logprobs=1, logprobs=0)),
    ]


def test_deltas_rebuild_the_offline_outputs(model_dir, llm):
    cases = _cases(llm)
    client = _client(model_dir, llm)

    async def run():
        client.start(asyncio.get_running_loop())
        gens = [
            await client.submit([NewRequest(f"r{i}", None, prompt, params)])
            for i, (prompt, params) in enumerate(cases)
        ]
        return await asyncio.gather(*(final_output(g) for g in gens))

    try:
        got = asyncio.run(run())
    finally:
        client.stop()
    for (prompt, params), out in zip(cases, got):
        want = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        assert out.finished and (out.prompt_logprobs is None) == (want.prompt_logprobs is None)
        for got_lp, want_lp in zip(out.prompt_logprobs or (), want.prompt_logprobs or ()):
            assert got_lp == (None if want_lp is None else pytest.approx(want_lp, abs=1e-4))
        for g, w in zip(out.outputs, want.outputs):
            assert (g.token_ids, g.text, g.finish_reason, g.stop_reason) == (
                w.token_ids,
                w.text,
                w.finish_reason,
                w.stop_reason,
            )
            assert (g.logprobs is None, len(g.logprobs or ())) == (w.logprobs is None, len(w.logprobs or ()))
            for got_lp, want_lp in zip(g.logprobs or (), w.logprobs or ()):  # batch-dependent rounding
                assert got_lp == pytest.approx(want_lp, abs=1e-4)
            if w.cumulative_logprob is None:
                assert g.cumulative_logprob is None
            else:
                assert g.cumulative_logprob == pytest.approx(w.cumulative_logprob, abs=1e-3)
        assert out.num_cached_tokens == want.num_cached_tokens
    assert got[1].outputs[0].finish_reason == "stop" and isinstance(got[1].outputs[0].stop_reason, str)
    assert client.state.num_free_blocks == client.state.num_blocks


def test_abort_frees_the_blocks_without_another_step(model_dir, llm):
    client = _client(model_dir, llm)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)

    async def run():
        client.start(asyncio.get_running_loop())
        gen = await client.submit([NewRequest("a", None, list(range(3, 40)), params)])
        await gen.next()  # its first tokens: it holds blocks now
        await client.pause()
        before = await _wait_state(client, lambda s: s.paused)
        assert before.num_free_blocks < before.num_blocks
        gen.abort()
        after = await _wait_state(client, lambda s: s.num_unfinished == 0)
        return before, after

    try:
        before, after = asyncio.run(run())
    finally:
        client.stop()
    assert after.num_steps == before.num_steps and after.num_free_blocks == after.num_blocks
    assert client._num_pending == 0


def test_a_request_nobody_reads_queues_one_output_not_one_a_step(model_dir, llm):
    """A handler that stops taking its news (its client stopped reading and the write waits)
    while the engine runs on: the request's Inbox holds its one cumulative output, however many
    steps went by, and the finished output is handed over whole. It queued the same output
    object once a step (max_tokens items, growing for as long as the request ran)."""
    client = _client(model_dir, llm)
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)

    async def run():
        client.start(asyncio.get_running_loop())
        gen = await client.submit([NewRequest("idle", None, [4, 5, 6], params)])
        await _wait_state(client, lambda s: s.num_unfinished == 0 and not client.num_pending_requests)
        queued = len(gen.queue)
        return queued, await gen.next()

    try:
        queued, news = asyncio.run(run())
    finally:
        client.stop()
    assert queued == 1
    ((kind, out),) = news
    assert kind == "output" and out.finished and len(out.outputs[0].token_ids) == 60


def test_a_dead_engine_fails_pending_and_new_requests(model_dir, llm):
    client = _client(model_dir, llm)
    deaths = []
    client.on_death = lambda: deaths.append(True)
    params = SamplingParams(max_tokens=8, temperature=0)

    async def run():
        client.start(asyncio.get_running_loop())
        await client.pause()
        gen = await client.submit([NewRequest("p", None, [4, 5, 6], params)])
        client._send(("no-such-command",))  # a bug in the engine loop: it ends
        items = await asyncio.wait_for(gen.next(), 30)
        with pytest.raises(EngineDead):
            await client.submit([NewRequest("q", None, [4, 5, 6], params)])
        return items

    try:
        items = asyncio.run(run())
    finally:
        client.stop()
    assert items[0][0] == "error" and isinstance(items[0][1], EngineDead)
    assert deaths == [True] and not client.alive and client._num_pending == 0


def test_the_engine_loop_ends_when_the_server_side_is_gone(model_dir, llm):
    client = _client(model_dir, llm)
    try:
        client._to_engine.outbox.close()  # what the server process's death does to the pipe
        client._worker.join(30)
        assert not client._worker.is_alive()  # EOF on its input: the engine never outlives it
    finally:
        client.stop()


def test_submit_holds_logprobs_to_the_vocabulary_under_max_logprobs_minus_one(model_dir, llm):
    """--max-logprobs -1 lifts the cap to the vocabulary: submit takes logprobs = vocab_size,
    and refuses one more, naming the field and the vocabulary's size, before the queue
    (so a full queue answers it as the ValueError, not QueueFull's 503). The client checks
    this itself (EngineClient._check_params), ahead of the engine's own check on add."""
    args = EngineArgs.from_kwargs(str(model_dir), **{**ENGINE, "max_logprobs": -1})
    client = EngineClient(args, llm.get_tokenizer(), in_process=True, max_waiting=0)
    client.launch(timeout=120)
    vocab = client.vocab_size

    def params(k: int, n: int = 1) -> SamplingParams:
        return SamplingParams(max_tokens=4, temperature=0, logprobs=k, n=n)

    async def run():
        client.start(asyncio.get_running_loop())
        await client.pause()  # the first request stays pending: the queue is full
        gen = await client.submit([NewRequest("all", None, [4, 5, 6], params(vocab, n=client.capacity))])
        with pytest.raises(ValueError, match=rf"^SamplingParams\.logprobs.*\b{vocab}\b"):
            await client.submit([NewRequest("over", None, [4, 5, 6], params(vocab + 1))])
        gen.abort()

    try:
        asyncio.run(run())
    finally:
        client.stop()


def test_submit_refuses_a_sample_past_the_capacity_as_queue_full(model_dir, llm):
    """Pending samples are bounded by max_num_seqs + max_waiting: with the capacity pending
    (the engine paused), one more sample is QueueFull (the server's 503), and the queue takes
    it again once those are gone."""
    client = EngineClient(
        EngineArgs.from_kwargs(str(model_dir), **ENGINE), llm.get_tokenizer(), in_process=True, max_waiting=0
    )
    client.launch(timeout=120)
    params = SamplingParams(max_tokens=2, temperature=0)

    async def run():
        client.start(asyncio.get_running_loop())
        await client.pause()
        gen = await client.submit(
            [
                NewRequest(
                    "all", None, [4, 5, 6], SamplingParams(max_tokens=2, temperature=0, n=client.capacity)
                )
            ]
        )
        with pytest.raises(
            QueueFull, match=rf"{client.capacity} pending samples, capacity {client.capacity}"
        ):
            await client.submit([NewRequest("one", None, [4, 5, 6], params)])
        gen.abort()
        await _wait_state(client, lambda s: s.num_unfinished == 0)
        return await client.submit([NewRequest("two", None, [4, 5, 6], params)])

    try:
        gen = asyncio.run(run())
    finally:
        client.stop()
    assert gen.request_ids == ["two"]


class _Sink:
    """A RequestStream's sink that keeps what it is given."""

    def __init__(self):
        self.items = []

    def put_nowait(self, item) -> None:
        self.items.append(item)


def test_news_for_a_request_not_accepted_or_forgotten_is_dropped_and_a_bad_decode_fails_its_request(
    model_dir, llm
):
    """The reader's handling of one message of step news (EngineClient._handle), played directly.
    A delta or a failure for a request this side has not had accepted yet (an aborted request's
    news under a reused id, before the new add's reply) leaves its stream untouched; a failure
    for an id it no longer holds (aborted here meanwhile) is dropped, no crash. A request whose
    second sample's ids fail to decode, after its first sample's delta in the same message,
    ends failed: one error, no output after it, released."""
    from enginespec.engine.core_messages import EngineState, ErrorInfo
    from enginespec.entrypoints.openai.request_stream import RequestStream
    from tests.engine.test_undecodable_output import ODD_ID, RefusingTokenizer

    tokenizer = RefusingTokenizer(llm.get_tokenizer())
    client = EngineClient(EngineArgs.from_kwargs(str(model_dir), **ENGINE), tokenizer, in_process=True)
    sent = []
    client._send = sent.append  # not launched: what would go to the engine is kept here

    def stream(rid: str, n: int = 1) -> RequestStream:
        new = RequestStream(
            NewRequest(rid, None, [5, 6, 7], SamplingParams(max_tokens=4, n=n)), _Sink(), tokenizer, 0.0
        )
        client._streams[rid] = new
        client._num_pending += n
        return new

    def delta(rid: str, index: int, ids: list) -> tuple:
        return (rid, index, ids, None, None, None, None, None, None, 0)

    early = stream("early")
    failure = ErrorInfo.of(RuntimeError("planted step fault"))
    client._handle([delta("early", 0, [9])], [("early", failure), ("gone", failure)], [], EngineState(), None)
    assert early.output.outputs[0].token_ids == [] and not early.sink.items and "early" in client._streams
    odd = stream("odd", n=2)
    odd.accepted = True
    client._handle([delta("odd", 0, [9]), delta("odd", 1, [ODD_ID])], [], [], EngineState(), None)
    assert [kind for kind, _ in odd.sink.items] == ["error"]
    assert "odd" not in client._streams and sent == [("abort", ["odd"])]
