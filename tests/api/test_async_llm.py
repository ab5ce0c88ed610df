"""AsyncLLM, the asyncio API: its outputs equal LLM.generate's (ids, text, logprobs,
cumulative_logprob, num_cached_tokens, finish reasons) alone and under concurrency; leaving a
generate early or abort() frees the request in the engine; bad input is a ValueError before
anything is queued; shutdown ends live requests with EngineDead; the engine core runs in a
process of its own by default. The engine runs on a thread (in_process=True) except in the last
test; each test drives its own event loop (asyncio.run), so the reader moves between loops."""

from __future__ import annotations

import asyncio
import os
import threading
import traceback

import pytest

from enginespec import AsyncLLM
from enginespec.async_llm import EngineDead
from enginespec.beam_search import BeamSearchParams
from enginespec.llm import LLM
from enginespec.spec import RequestOutputKind, SamplingParams
from enginespec.testing.checkpoints import make_checkpoint

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=128, max_num_seqs=8, block_size=16)
PROMPT = list(range(5, 45))  # 40 ids: two full blocks the prefix cache serves the second time


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("async_llm") / "qwen3")


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), **ENGINE)


@pytest.fixture(scope="module")
def async_llm(model_dir):
    engine = AsyncLLM(str(model_dir), in_process=True, start_timeout=120, **ENGINE)
    yield engine
    engine.shutdown()


async def _collect(engine, prompt, params, request_id) -> list:
    return [out async for out in engine.generate(prompt, params, request_id)]


def _named(logprobs):
    """Per position [(token id, rank, decoded_token)]: what Logprob equality (the float's)
    leaves out."""
    if logprobs is None:
        return None
    return [None if d is None else [(t, lp.rank, lp.decoded_token) for t, lp in d.items()] for d in logprobs]


def _summary(out) -> tuple:
    return (
        out.prompt_token_ids,
        out.num_cached_tokens,
        _named(out.prompt_logprobs),
        [
            (c.token_ids, c.text, c.finish_reason, c.stop_reason, c.cumulative_logprob, c.logprobs)
            + (_named(c.logprobs),)
            for c in out.outputs
        ],
    )


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=12, temperature=0, logprobs=2),
        SamplingParams(max_tokens=10, temperature=0.8, n=2, seed=7, logprobs=0),
        SamplingParams(max_tokens=30, temperature=0, stop=["a"]),
    ],
    ids=["greedy-logprobs", "seeded-n2", "stop-string"],
)
def test_outputs_equal_llm_generate(async_llm, llm, params):
    """Twice each (the second finds the prompt's two blocks cached): the last output equals
    LLM.generate's field for field, and only the last one is finished."""
    for attempt in range(2):
        want = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
        outs = asyncio.run(_collect(async_llm, {"prompt_token_ids": PROMPT}, params, f"eq-{attempt}"))
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert _summary(outs[-1]) == _summary(want)
    assert outs[-1].num_cached_tokens == 32


def test_truncated_prompt_is_reported_as_llm_generate_reports_it(async_llm, llm):
    """truncate_prompt_tokens=k: the output's prompt_token_ids are the k ids the engine ran, as
    LLM.generate's (they were the whole prompt given: the engine truncated, the client did not)."""
    params = SamplingParams(max_tokens=6, temperature=0, truncate_prompt_tokens=20, prompt_logprobs=1)
    want = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    out = asyncio.run(_collect(async_llm, {"prompt_token_ids": PROMPT}, params, "trunc"))[-1]
    assert want.prompt_token_ids == PROMPT[-20:]
    assert _summary(out) == _summary(want)


def test_prompt_logprobs_equal_llm_generate(async_llm, llm):
    """Prompt and sample logprobs, decoded_token and rank included: the samples without stop
    strings are decoded on the client's side, which left every decoded_token None."""
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=2, prompt_logprobs=2)
    want = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    out = asyncio.run(_collect(async_llm, {"prompt_token_ids": PROMPT}, params, "plp"))[-1]
    assert out.prompt_logprobs == want.prompt_logprobs
    assert _summary(out) == _summary(want)
    assert out.outputs[0].logprobs[0][out.outputs[0].token_ids[0]].decoded_token is not None


@pytest.mark.parametrize(
    "kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA], ids=["cumulative", "delta"]
)
def test_prompt_logprobs_come_with_the_first_output(async_llm, llm, kind):
    """vLLM hands a request's prompt logprobs with its first output after the prefill (every
    CUMULATIVE output has them from then on; under DELTA that first one only). They came with
    the last output only: every earlier one read None (a consumer that stopped reading early
    never had them)."""
    params = SamplingParams(
        max_tokens=40, temperature=0, ignore_eos=True, prompt_logprobs=2, output_kind=kind
    )
    want = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].prompt_logprobs
    outs = asyncio.run(_collect(async_llm, {"prompt_token_ids": PROMPT}, params, f"first-{kind.name}"))
    assert len(want) == len(PROMPT) and len(outs) > 1
    assert outs[0].prompt_logprobs == want and _named(outs[0].prompt_logprobs) == _named(want)
    later = [out.prompt_logprobs for out in outs[1:]]
    assert later == ([None] * len(later) if kind == RequestOutputKind.DELTA else [want] * len(later))


def test_concurrent_generates_each_equal_their_own_run(async_llm, llm):
    prompts = [list(range(3 + i, 20 + 3 * i)) for i in range(6)]
    params = SamplingParams(max_tokens=9, temperature=0)
    want = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    async def run_all():
        runs = [_collect(async_llm, p, params, f"c-{i}") for i, p in enumerate(prompts)]
        return await asyncio.gather(*runs)

    got = asyncio.run(run_all())
    assert [_summary(outs[-1]) for outs in got] == [_summary(w) for w in want]
    assert async_llm.num_unfinished_requests == 0


def test_text_prompts_are_tokenized_here(async_llm, llm):
    params = SamplingParams(max_tokens=6, temperature=0)
    want = llm.generate(["Hello there"], params, use_tqdm=False)[0]
    outs = asyncio.run(_collect(async_llm, "Hello there", params, "text"))
    assert outs[-1].prompt == "Hello there" and _summary(outs[-1]) == _summary(want)


async def _wait(predicate, what: str, timeout: float = 60.0) -> None:
    """Wait (bounded, not timed) until predicate() holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


async def _live_request(engine, request_id: str, consume) -> asyncio.Task:
    """A task running consume(generate(...)) over a request that is pending in the engine and
    cannot finish: the engine is paused (it takes commands, runs no step) until resumed. On a
    tiny model the request would otherwise finish before the test could act on it."""
    await _collect(engine, [1, 2, 3], SamplingParams(max_tokens=1), f"{request_id}-bind")  # bind the loop
    await engine._client.pause()
    gen = engine.generate(PROMPT, SamplingParams(max_tokens=50, temperature=0), request_id)
    task = asyncio.ensure_future(consume(gen))
    await _wait(lambda: engine.num_unfinished_requests == 1, "the request never became pending")
    return task


async def _resume_and_wait_idle(engine) -> None:
    """Resume, then wait for the engine's own count of unfinished requests (sent with every
    message) to reach 0, with a second request keeping messages coming."""
    await engine._client.resume()
    await _collect(engine, [1, 2, 3], SamplingParams(max_tokens=2, temperature=0), "after")
    await _wait(lambda: engine._client.state.num_unfinished == 0, "the engine kept a request")


def test_a_cancelled_generate_aborts_its_request(async_llm):
    async def cancel_midway():
        task = await _live_request(async_llm, "cancelled", lambda gen: gen.__anext__())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert async_llm.num_unfinished_requests == 0
        await _resume_and_wait_idle(async_llm)

    asyncio.run(cancel_midway())


def test_leaving_generate_after_an_output_aborts_its_request(async_llm):
    async def leave_after_first():
        gen = async_llm.generate(PROMPT, SamplingParams(max_tokens=50, temperature=0), "early")
        first = await gen.__anext__()
        await gen.aclose()  # whether the request had finished by then or not
        assert async_llm.num_unfinished_requests == 0
        await _resume_and_wait_idle(async_llm)
        return first

    assert asyncio.run(leave_after_first()).request_id == "early"


def test_a_generate_dropped_after_an_output_without_closing_it_aborts_its_request(async_llm):
    """A consumer that lets go of a half-read generate (no break inside `async for`, no
    aclose: the generator is only garbage collected) still frees the request: the event loop's
    async-generator finalizer closes it, and closing it aborts (vLLM's GeneratorExit path)."""
    import gc

    async def drop_after_first():
        gen = async_llm.generate(PROMPT, SamplingParams(max_tokens=200, ignore_eos=True), "dropped")
        await gen.__anext__()
        del gen
        gc.collect()
        await _wait(lambda: async_llm.num_unfinished_requests == 0, "the dropped request stayed pending")
        await _collect(async_llm, [1, 2, 3], SamplingParams(max_tokens=2), "after-drop")
        await _wait(lambda: async_llm._client.state.num_unfinished == 0, "the engine kept the request")

    asyncio.run(drop_after_first())


def test_abort_ends_generate_with_an_abort_output(async_llm):
    async def abort_midway():
        task = await _live_request(async_llm, "ab", lambda gen: _outputs(gen))
        await async_llm.abort("ab")
        await async_llm.abort(["ab", "never-seen"])  # finished and unknown ids: ignored
        outs = await task
        await _resume_and_wait_idle(async_llm)
        return outs

    outs = asyncio.run(abort_midway())
    assert len(outs) == 1 and outs[0].finished
    assert outs[0].outputs[0].finish_reason == "abort" and outs[0].outputs[0].token_ids == []


async def _outputs(gen) -> list:
    return [out async for out in gen]


@pytest.mark.parametrize(
    "kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA], ids=["cumulative", "delta"]
)
def test_abort_shows_the_text_the_engine_held_back_for_a_stop_string(async_llm, kind):
    """A sample with stop strings is detokenized in the engine, which holds back a tail of its
    text that may still grow into a stop string (one char here: every char the output has
    begins a stop). abort() ends the sample here, before the engine hears of it: its last
    output showed every token id but not that tail (its text was no longer the decode of its
    ids, and DELTA texts did not add up to it), where vLLM's abort output, as this engine's
    own, shows a finished sample's whole text."""
    seeded = dict(max_tokens=60, temperature=1.0, seed=5, ignore_eos=True)
    whole = asyncio.run(_collect(async_llm, [1, 2, 3], SamplingParams(**seeded), "unstopped"))[-1]
    stops = sorted({ch + "\x00\x00" for ch in whole.outputs[0].text})  # never completed
    params = SamplingParams(stop=stops, output_kind=kind, **seeded)

    async def abort_after_first():
        gen = async_llm.generate([1, 2, 3], params, "held")
        outs = [await gen.__anext__()]
        await async_llm.abort("held")
        return outs + await _outputs(gen)

    outs = asyncio.run(abort_after_first())
    samples = [out.outputs[0] for out in outs if out.outputs]
    ids = (
        [t for s in samples for t in s.token_ids]
        if kind == RequestOutputKind.DELTA
        else samples[-1].token_ids
    )
    text = "".join(s.text for s in samples) if kind == RequestOutputKind.DELTA else samples[-1].text
    assert outs[-1].finished and samples[-1].finish_reason == "abort" and ids
    assert ids == whole.outputs[0].token_ids[: len(ids)]
    assert text == async_llm.tokenizer.decode(ids) == whole.outputs[0].text[: len(text)]


def test_abort_before_the_engine_accepted_ends_generate(async_llm):
    """abort() from another task while generate still awaits the engine's acceptance of the
    add: generate ends with the abort output (it hung forever: the abort output was taken as
    the acceptance, and nothing more ever came). Deterministic: both tasks run in one turn of
    the loop, before the reader can see the engine's reply."""

    async def abort_at_once():
        await _collect(async_llm, [1, 2, 3], SamplingParams(max_tokens=1), "bind-early")
        task = asyncio.ensure_future(_collect(async_llm, PROMPT, SamplingParams(max_tokens=50), "early-ab"))
        await asyncio.sleep(0)  # the task sends its add and waits for the reply
        assert async_llm.num_unfinished_requests == 1
        await async_llm.abort("early-ab")
        outs = await asyncio.wait_for(task, 60)  # bounded: the old code never returned
        await _resume_and_wait_idle(async_llm)
        return outs

    outs = asyncio.run(abort_at_once())
    assert len(outs) == 1 and outs[0].finished
    assert outs[0].outputs[0].finish_reason == "abort" and outs[0].outputs[0].token_ids == []
    # an int, as LLM.generate's and vLLM's (0 before the first step): it read None, and code
    # summing the field over outputs (vLLM's is an int from the start) raised a TypeError
    assert outs[0].num_cached_tokens == 0


def test_a_request_id_reused_after_an_abort_gets_none_of_the_old_requests_outputs(async_llm, llm):
    """Leave a generate, then start another with the same request_id at once: the engine's
    messages already on their way still carry the aborted request's deltas under that id. They
    went to the new request's stream (its output showed the old tokens, or generate raised an
    AttributeError: an output came before the engine had accepted the add). Deterministic: the
    reader is taken off the pipe, a message with a delta of the old request is read by hand and
    handed to the client as the reader would hand it, after the new add went out."""
    short = SamplingParams(max_tokens=3, temperature=0)
    want = llm.generate([{"prompt_token_ids": [9, 10, 11, 12, 13]}], short, use_tqdm=False)[0]

    async def abort_and_reuse():
        client = async_llm._client
        await _collect(async_llm, [1, 2, 3], SamplingParams(max_tokens=1), "reuse-bind")
        gen = async_llm.generate(PROMPT, SamplingParams(max_tokens=150, ignore_eos=True), "reuse")
        await gen.__anext__()
        loop = asyncio.get_running_loop()
        loop.remove_reader(client._from_engine.fileno())
        stale = client._from_engine.recv()
        while not any(delta[0] == "reuse" for delta in stale[1]):
            client._handle(*stale[1:])
            stale = client._from_engine.recv()
        await gen.aclose()
        task = asyncio.ensure_future(_collect(async_llm, [9, 10, 11, 12, 13], short, "reuse"))
        await asyncio.sleep(0)  # the new add is sent; it awaits the engine's reply
        client._handle(*stale[1:])  # the aborted request's delta, read after the new add
        client.start(loop)
        return await asyncio.wait_for(task, 60)

    outs = asyncio.run(abort_and_reuse())
    assert _summary(outs[-1]) == _summary(want)
    assert async_llm.num_unfinished_requests == 0


def test_a_closed_event_loop_s_pending_requests_are_aborted_when_a_new_loop_takes_over(async_llm, llm):
    """A loop closed while one of its requests was pending (run_until_complete of one output,
    then close(): nothing ever finalized the generator) can never read that request again.
    Every later generate and abort (the way to clean up) raised "AsyncLLM has requests pending
    on a stopped event loop" for the rest of the process, and the request held its blocks. Now
    the next loop aborts such requests and takes over."""
    params = SamplingParams(max_tokens=5, temperature=0)
    want = llm.generate([{"prompt_token_ids": [5, 6, 7]}], params, use_tqdm=False)[0]
    loop = asyncio.new_event_loop()
    gen = async_llm.generate(PROMPT, SamplingParams(max_tokens=150, ignore_eos=True), "orphan")
    assert loop.run_until_complete(gen.__anext__()).request_id == "orphan"
    loop.close()
    assert async_llm.num_unfinished_requests == 1

    async def next_loop():
        outs = await _collect(async_llm, [5, 6, 7], params, "after-close")
        await _wait(lambda: async_llm._client.state.num_unfinished == 0, "the orphan kept running")
        return outs

    outs = asyncio.run(next_loop())
    assert _summary(outs[-1]) == _summary(want)
    assert async_llm.num_unfinished_requests == 0
    state = async_llm._client.state
    assert state.num_free_blocks == state.num_blocks


def test_another_event_loop_is_refused_while_a_request_is_pending(async_llm):
    """generate and abort from a loop other than the one reading the engine (here: another
    thread's asyncio.run) are a RuntimeError while that loop runs: abort touched the pending
    request's inbox and futures from the wrong thread."""
    import threading

    async def from_another_loop():
        task = await _live_request(async_llm, "bound", _outputs)
        errors = []

        def other_thread():
            async def use():
                for call in (
                    lambda: _collect(async_llm, [1, 2], SamplingParams(max_tokens=2), "o"),
                    lambda: async_llm.abort("bound"),
                ):
                    try:
                        await call()
                    except RuntimeError as e:
                        errors.append(str(e))

            asyncio.run(use())

        thread = threading.Thread(target=other_thread)
        thread.start()
        await _wait(lambda: not thread.is_alive(), "the other thread never ended")
        assert async_llm.num_unfinished_requests == 1  # the abort did not take
        await async_llm._client.resume()
        outs = await task
        await _resume_and_wait_idle(async_llm)
        return errors, outs

    errors, outs = asyncio.run(from_another_loop())
    assert len(errors) == 2 and all("another running event loop" in e for e in errors)
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason != "abort"


def test_bad_input_is_a_value_error_and_queues_nothing(async_llm, llm):
    vocab = llm.engine.model.vocab_size

    async def bad(prompt, params, request_id):
        async for _ in async_llm.generate(prompt, params, request_id):
            pass

    greedy = SamplingParams(max_tokens=4, temperature=0)
    for prompt, params, request_id, match in [
        ([1, 2], greedy, None, "request_id"),
        ([1, 2], greedy, "", "request_id"),
        (3.5, greedy, "x", "prompt"),
        ([1, 2], {"max_tokens": 4}, "x", "sampling_params"),
        ([1, vocab], greedy, "x", str(vocab)),  # the engine's own check, sent back
        ({"prompt_token_ids": [1, 2], "cache_salt": ""}, greedy, "x", "cache_salt"),
    ]:
        with pytest.raises(ValueError, match=match):
            asyncio.run(bad(prompt, params, request_id))
        assert async_llm.num_unfinished_requests == 0

    async def same_id_twice():
        task = await _live_request(async_llm, "dup", _outputs)
        with pytest.raises(ValueError, match="dup"):
            await bad([1, 2], greedy, "dup")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _resume_and_wait_idle(async_llm)

    asyncio.run(same_id_twice())


def test_shutdown_ends_live_requests_with_engine_dead(model_dir):
    engine = AsyncLLM(str(model_dir), in_process=True, start_timeout=120, **ENGINE)

    async def shut_down_midway():
        task = await _live_request(engine, "live", _outputs)
        engine.shutdown()
        with pytest.raises(EngineDead):
            await task
        with pytest.raises(EngineDead):
            await _collect(engine, [1, 2], SamplingParams(max_tokens=2), "new")
        with pytest.raises(EngineDead):
            await engine.check_health()

    asyncio.run(shut_down_midway())
    assert not engine.is_running
    engine.shutdown()  # idempotent


def test_an_engine_death_ends_every_stream_with_an_error_of_its_own(model_dir):
    """The engine's death (here its loop ends without the client asking, as a crashed engine
    process's does) ends every live generate with EngineDead, and every later call raises it.
    Each raise is its own exception: one shared instance, raised by every stream and again by
    each later call, gathered every raise's frames in its one traceback (each stream's showed
    the other streams' generate frames, and the stored error kept them all alive, growing with
    every call after the death)."""
    engine = AsyncLLM(str(model_dir), in_process=True, start_timeout=120, **ENGINE)

    async def die_midway():
        await _collect(engine, [1, 2, 3], SamplingParams(max_tokens=1), "bind")
        await engine._client.pause()  # the streams stay live until the engine dies
        params = SamplingParams(max_tokens=50, temperature=0)
        tasks = [asyncio.ensure_future(_collect(engine, PROMPT, params, f"die-{i}")) for i in range(4)]
        await _wait(lambda: engine.num_unfinished_requests == 4, "the requests never became pending")
        engine._client._to_engine.send(("shutdown",))  # behind the client's back: the engine ends
        streams = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        later = []
        for _ in range(3):
            with pytest.raises(EngineDead) as raised:
                await engine.check_health()
            later.append(raised.value)
        return streams, later

    streams, later = asyncio.run(die_midway())
    assert engine.errored and all(isinstance(e, EngineDead) for e in streams)
    assert len({id(e) for e in streams + later}) == len(streams) + len(later)
    for error in streams:
        frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
        assert frames.count("generate") == 1, frames
    assert len({len(traceback.extract_tb(e.__traceback__)) for e in later}) == 1
    engine.shutdown()


def test_an_async_llm_dropped_without_shutdown_stops_its_engine(model_dir):
    """An AsyncLLM nobody holds any more (a notebook cell run again, a helper that built one
    and returned) stops its engine when collected, as vLLM's does: its engine (a process, or
    here a thread, each holding the whole model) and pipes lived on until interpreter exit,
    held by the exit hook, one more each time."""
    import gc
    import weakref

    engine = AsyncLLM(str(model_dir), in_process=True, start_timeout=120, **ENGINE)
    asyncio.run(_collect(engine, [1, 2, 3], SamplingParams(max_tokens=2), "used"))
    worker, front = engine._client._worker, weakref.ref(engine)
    del engine
    gc.collect()
    assert front() is None
    assert not worker.is_alive(), "the dropped AsyncLLM's engine still runs"


def test_shutdown_after_a_loop_closed_on_a_waiting_stream_stops_the_engine(model_dir):
    """A loop closed while a task of it still awaited a generate's next output (its
    run_until_complete ended, then close()): that wait belongs to the closed loop, and nothing
    can wake it. shutdown() raised RuntimeError("Event loop is closed") waking it, before it
    told the engine to stop; the exit hook failed the same way, so a script whose engine runs
    in a process of its own hung at exit, in multiprocessing's join of that process."""
    engine = AsyncLLM(str(model_dir), in_process=True, start_timeout=120, **ENGINE)
    loop = asyncio.new_event_loop()
    stranded = loop.run_until_complete(_live_request(engine, "stranded", _outputs))
    loop.close()
    assert not stranded.done() and engine.num_unfinished_requests == 1
    engine.shutdown()
    assert not engine.is_running and engine.num_unfinished_requests == 0
    assert not engine._client._worker.is_alive()


def test_abort_after_shutdown_on_a_new_loop_leaves_no_reader_on_the_closed_pipe(model_dir):
    """abort() after shutdown(), from a new event loop (asyncio.run of a cleanup), moved the
    reader onto that loop: the engine's pipe, closed, is readable forever (EOF), and the reader
    ignored the EOF of an engine it had stopped without leaving the loop, so the loop spun at
    full CPU for as long as it ran. Now abort ignores the ids (none can be pending) and the
    loop holds no reader on the pipe."""
    engine = AsyncLLM(str(model_dir), in_process=True, start_timeout=120, **ENGINE)
    asyncio.run(_collect(engine, [1, 2, 3], SamplingParams(max_tokens=2), "before"))
    engine.shutdown()

    async def abort_then_look():
        await engine.abort("before")
        for _ in range(3):
            await asyncio.sleep(0)  # the reader, if any, fires on the EOF
        return asyncio.get_running_loop().remove_reader(engine._client._from_engine.fileno())

    assert asyncio.run(abort_then_look()) is False  # there was no reader to remove


def test_shutdown_ends_a_reset_prefix_cache_awaiting_its_reply(model_dir):
    """A reset_prefix_cache still awaiting the engine's reply when shutdown() runs raises
    EngineDead (it waited forever: stop() took the reader away, so the reply never came, and
    nothing failed the call's future). Deterministic: the call is sent, then shutdown() runs in
    the same turn of the loop, before the reader could see any reply."""
    engine = AsyncLLM(str(model_dir), in_process=True, start_timeout=120, **ENGINE)

    async def shut_down_while_calling():
        call = asyncio.ensure_future(engine.reset_prefix_cache())
        await asyncio.sleep(0)  # the call is sent and awaits its reply
        engine.shutdown()
        with pytest.raises(EngineDead):
            await asyncio.wait_for(call, 30)  # bounded: the old code never returned
        with pytest.raises(EngineDead):
            await engine.reset_prefix_cache()

    asyncio.run(shut_down_while_calling())


def test_a_profile_traces_the_engines_steps_and_calls_out_of_order_raise(async_llm, tmp_path, monkeypatch):
    """vLLM's AsyncLLM.start_profile / stop_profile (an AttributeError here): taken by the engine
    loop, so the trace holds its steps' ranges; a stop with none running and a second start are
    RuntimeErrors, and the engine serves on. Without the directory, start is an error naming it."""
    params = SamplingParams(max_tokens=2, temperature=0)

    async def profile():
        monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
        with pytest.raises(RuntimeError, match="VLLM_TORCH_PROFILER_DIR"):
            await async_llm.start_profile()
        monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))
        with pytest.raises(RuntimeError, match="no profile is running"):
            await async_llm.stop_profile()
        await async_llm.start_profile()
        with pytest.raises(RuntimeError, match="already running"):
            await async_llm.start_profile()
        outs = await _collect(async_llm, PROMPT, params, "profiled")
        await async_llm.stop_profile()
        return outs[-1]

    assert len(asyncio.run(profile()).outputs[0].token_ids) == 2
    (trace,) = tmp_path.glob("*.pt.trace.json")
    assert "enginespec.schedule" in trace.read_text()


def test_the_engine_core_runs_in_its_own_process(model_dir, llm, tmp_path, monkeypatch):
    """Its profile is taken there too; one left running at shutdown is written as the engine
    loop ends (left to the process's exit, torch's profiler crashed it: exit status -11)."""
    params = SamplingParams(max_tokens=5, temperature=0)
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))  # the spawned engine's too

    async def profiled():
        await engine.start_profile()
        return await _collect(engine, PROMPT, params, "proc")

    with AsyncLLM(str(model_dir), start_timeout=300, **ENGINE) as engine:
        assert engine.info.pid != os.getpid()
        outs = asyncio.run(profiled())
        want = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
        assert _summary(outs[-1])[2] == _summary(want)[2]
        worker = engine._client._worker
    assert not worker.is_alive() and worker.exitcode == 0
    (trace,) = tmp_path.glob(f"*_{engine.info.pid}.*.pt.trace.json")
    assert "enginespec.schedule" in trace.read_text()


def test_an_unguarded_script_is_told_to_guard_itself(model_dir, tmp_path):
    """The engine process is spawned, so it imports the user's script again: built at the
    script's top level, the engine would start itself again and the child fails while starting.
    The parent's error says what to do (it said only 'exited while starting')."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(
        "from enginespec import AsyncLLM\n"
        f"AsyncLLM({str(model_dir)!r}, device='cpu', dtype='float32', num_blocks=64, start_timeout=300)\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert run.returncode != 0
    assert "if __name__ == '__main__':" in run.stderr.splitlines()[-1]


def test_output_kinds(async_llm, llm):
    """DELTA: the yields concatenate to LLM.generate's output (ids, text, logprobs), the last
    alone finished; FINAL_ONLY: one yield, the finished output."""
    from enginespec import RequestOutputKind

    base = SamplingParams(max_tokens=12, temperature=0, logprobs=1)
    want = llm.generate([{"prompt_token_ids": PROMPT}], base, use_tqdm=False)[0].outputs[0]
    delta = SamplingParams(max_tokens=12, temperature=0, logprobs=1, output_kind=RequestOutputKind.DELTA)
    outs = asyncio.run(_collect(async_llm, PROMPT, delta, "delta"))
    parts = [o.outputs[0] for o in outs]
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert sum((p.token_ids for p in parts), []) == want.token_ids
    assert "".join(p.text for p in parts) == want.text
    assert sum((p.logprobs for p in parts), []) == want.logprobs
    final_only = SamplingParams(max_tokens=12, temperature=0, output_kind=RequestOutputKind.FINAL_ONLY)
    outs = asyncio.run(_collect(async_llm, PROMPT, final_only, "final"))
    assert len(outs) == 1 and outs[0].finished and outs[0].outputs[0].token_ids == want.token_ids


def test_a_script_that_never_shuts_down_still_exits(model_dir, tmp_path):
    """multiprocessing joins the engine process at interpreter exit, and the engine only ends
    when told: without AsyncLLM's exit hook such a script hung forever after its last line."""
    import subprocess
    import sys

    script = tmp_path / "no_shutdown.py"
    script.write_text(
        "import asyncio\n"
        "from enginespec import AsyncLLM, SamplingParams\n"
        "async def main(llm):\n"
        "    async for out in llm.generate([1, 2, 3], SamplingParams(max_tokens=2), 'a'):\n"
        "        pass\n"
        "    print('done', len(out.outputs[0].token_ids))\n"
        "if __name__ == '__main__':\n"
        f"    llm = AsyncLLM({str(model_dir)!r}, device='cpu', dtype='float32', num_blocks=64, start_timeout=300)\n"
        "    asyncio.run(main(llm))\n"
    )
    try:
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:  # a hang, not slowness: the script takes ~10 s here
        raise AssertionError("the script never exited (the engine process was never stopped)") from e
    assert run.returncode == 0, run.stderr[-2000:]
    assert "done 2" in run.stdout


# What `pip install 'enginespec[serve]'` adds (and pydantic, fastapi's), beyond the runtime deps.
SERVE_EXTRA = ("fastapi", "uvicorn", "starlette", "pydantic", "prometheus_client")


def test_async_llm_needs_only_the_runtime_dependencies(model_dir, tmp_path):
    """AsyncLLM is "a service of your own without HTTP" (README): on an install without the
    `serve` extra it generates and beam-searches, in this process and the engine's (the script
    hides those packages at its top level, which the spawned engine process imports too).
    It was a ModuleNotFoundError for pydantic on `from enginespec import AsyncLLM`: the beam
    search helpers imported the server's request models, the client its Prometheus metrics."""
    import subprocess
    import sys

    script = tmp_path / "no_serve_extra.py"
    script.write_text(
        "import asyncio, sys\n"
        f"sys.modules.update(dict.fromkeys({SERVE_EXTRA!r}))  # import X: ImportError, as if not installed\n"
        "from enginespec import AsyncLLM, SamplingParams\n"
        "from enginespec.beam_search import BeamSearchParams\n"
        "async def main(llm):\n"
        "    async for out in llm.generate([1, 2, 3], SamplingParams(max_tokens=2), 'a'):\n"
        "        pass\n"
        "    async for beams in llm.beam_search([1, 2, 3], 'b', BeamSearchParams(beam_width=2, max_tokens=2)):\n"
        "        pass\n"
        "    print('done', len(out.outputs[0].token_ids), len(beams.outputs))\n"
        "if __name__ == '__main__':\n"
        f"    with AsyncLLM({str(model_dir)!r}, device='cpu', dtype='float32', num_blocks=64, start_timeout=300) as llm:\n"
        "        asyncio.run(main(llm))\n"
        f"    assert not any(sys.modules[m] for m in {SERVE_EXTRA!r})\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "done 2 2" in run.stdout


# ---- beam search ------------------------------------------------------------------------------


async def _beam(engine, prompt, params, request_id) -> list:
    return [out async for out in engine.beam_search(prompt, request_id, params)]


@pytest.mark.parametrize(
    "params",
    [
        BeamSearchParams(beam_width=3, max_tokens=6),
        BeamSearchParams(beam_width=2, max_tokens=5, length_penalty=0.5, include_stop_str_in_output=True),
    ],
    ids=["w3", "w2-lp0.5-stop-str"],
)
def test_beam_search_yields_once_the_beams_llm_beam_search_finds(async_llm, llm, params):
    """One yield, finished, whose samples are LLM.beam_search's best sequences in its order: the
    generated ids (an ending EOS only with include_stop_str_in_output), their text, cumulative
    logprob and finish reason, and for each token its step's candidates (the token among them)."""
    outs = asyncio.run(_beam(async_llm, PROMPT, params, "beam"))
    assert len(outs) == 1 and outs[0].finished
    out = outs[0]
    assert out.request_id == "beam" and out.prompt_token_ids == PROMPT
    expected = llm.beam_search([PROMPT], params)[0].sequences
    assert [s.index for s in out.outputs] == list(range(len(expected))) == list(range(params.beam_width))
    tok = llm.engine.tokenizer
    for sample, seq in zip(out.outputs, expected):
        generated = seq.tokens[len(PROMPT) :]
        shown = generated[:-1] if seq.finish_reason == "stop" else generated
        assert sample.token_ids == (generated if params.include_stop_str_in_output else shown)
        assert sample.text == (tok.decode(shown) if tok is not None else "")
        assert sample.cumulative_logprob == pytest.approx(seq.cum_logprob, abs=1e-5)
        assert (sample.finish_reason, sample.stop_reason) == (seq.finish_reason, seq.stop_reason)
        assert len(sample.logprobs) == len(sample.token_ids)
        assert all(t in step for t, step in zip(sample.token_ids, sample.logprobs))
    assert async_llm.num_unfinished_requests == 0


def test_beam_search_of_a_text_prompt_equals_its_ids(async_llm, llm):
    tok = llm.engine.tokenizer
    if tok is None:
        pytest.skip("the tiny checkpoint has no tokenizer")
    text = "hello world"
    params = BeamSearchParams(beam_width=2, max_tokens=4)
    by_text = asyncio.run(_beam(async_llm, text, params, "beam-text"))[0]
    by_ids = asyncio.run(_beam(async_llm, tok.encode(text), params, "beam-ids"))[0]
    assert by_text.prompt == text and by_text.prompt_token_ids == tok.encode(text)
    assert [s.token_ids for s in by_text.outputs] == [s.token_ids for s in by_ids.outputs]


def test_beam_search_bad_input_is_a_value_error_and_queues_nothing(async_llm):
    cap = async_llm.engine_args.max_logprobs
    good = BeamSearchParams(beam_width=2, max_tokens=3)
    for prompt, params, request_id, match in [
        (PROMPT, SamplingParams(max_tokens=3), "b", "BeamSearchParams"),
        (PROMPT, BeamSearchParams(beam_width=cap // 2 + 1, max_tokens=3), "b", "beam_width"),
        (PROMPT, good, "", "request_id"),
        (3.5, good, "b", "prompt"),
    ]:
        with pytest.raises(ValueError, match=match):
            asyncio.run(_beam(async_llm, prompt, params, request_id))
        assert async_llm.num_unfinished_requests == 0


def test_two_beam_searches_under_one_request_id_refuse_the_second_before_any_step(async_llm, llm):
    """A request_id still in use by a beam search is a ValueError naming it, raised before the
    second search runs a step, as generate() refuses an id in use. It was a race: the two
    searches' step requests ("{id}-step{k}-{i}") collided only when both were at the same step,
    failing one mid-search with an error naming a step id the caller never chose. The id is
    free again once the first search ends."""
    params = BeamSearchParams(beam_width=2, max_tokens=3)

    async def both():
        async_llm._bind_loop()
        first = async_llm.beam_search(PROMPT, "twice", params)
        running = asyncio.ensure_future(first.__anext__())
        await asyncio.sleep(0)  # the first search is under way (its first step submitted)
        with pytest.raises(ValueError, match="request_id 'twice' is already in use"):
            await async_llm.beam_search([5, 6, 7], "twice", params).__anext__()
        out = await running
        await first.aclose()
        return out, [o async for o in async_llm.beam_search([5, 6, 7], "twice", params)]

    out, again = asyncio.run(both())
    assert [s.token_ids for s in out.outputs] == [
        s.tokens[len(PROMPT) :] for s in llm.beam_search([PROMPT], params)[0].sequences
    ]
    assert len(again) == 1 and len(again[0].outputs) == 2
    assert async_llm.num_unfinished_requests == 0


@pytest.mark.parametrize("max_logprobs", [-1, 1000])
def test_beam_search_without_a_logprobs_cap_bounds_beam_width_by_the_vocabulary(model_dir, max_logprobs):
    """max_logprobs -1 lifts the cap to the vocabulary (vLLM's rule, LLM.beam_search's too), and
    a cap above the vocabulary leaves the vocabulary the bound: a beam_width whose 2 * beam_width
    candidates exceed it is the ValueError naming beam_width before any step, not a failed
    first step naming SamplingParams.logprobs, a field the caller never set."""
    args = {**ENGINE, "max_logprobs": max_logprobs}
    engine = AsyncLLM(str(model_dir), in_process=True, start_timeout=120, **args)
    try:
        too_wide = BeamSearchParams(beam_width=engine.info.vocab_size // 2 + 1, max_tokens=2)
        with pytest.raises(ValueError, match=f"beam_width must be <= {engine.info.vocab_size // 2}"):
            asyncio.run(_beam(engine, PROMPT, too_wide, "wide"))
        assert engine.num_unfinished_requests == 0
        out = asyncio.run(_beam(engine, PROMPT, BeamSearchParams(beam_width=2, max_tokens=2), "ok"))
        assert len(out[0].outputs) == 2
    finally:
        engine.shutdown()


def test_beam_search_step_the_engine_fails_raises_and_the_engine_serves_on(async_llm):
    """A fault injected into the engine's next step fails that step's beams: beam_search raises
    EngineRequestError (as generate does for a failed request), leaves nothing pending, and the
    next search runs to its end."""
    from enginespec.async_llm import EngineRequestError

    params = BeamSearchParams(beam_width=2, max_tokens=3)

    async def failed_then_fine():
        async_llm._bind_loop()  # the client's calls need the reader on this loop
        await async_llm._client.fail_next_step()
        with pytest.raises(EngineRequestError):
            await _beam(async_llm, PROMPT, params, "beam-fault")
        assert async_llm.num_unfinished_requests == 0
        return await _beam(async_llm, PROMPT, params, "beam-after")

    outs = asyncio.run(failed_then_fine())
    assert outs[-1].finished and len(outs[-1].outputs) == 2


def test_a_failed_step_ends_generate_with_an_error_output_and_an_engine_fault_raises(model_dir, monkeypatch):
    """The module doc's two rules: a step whose forward raised (EngineCore.fault_hook at
    "execute") ends generate with a last output of finish_reason "error" and the fault in
    `error`, as LLM.generate reports it; a fault of the engine loop itself (fail_next_step)
    raises EngineRequestError. Either way nothing is left pending and the next request runs."""
    from enginespec.async_llm import EngineRequestError
    from enginespec.engine import core_proc

    armed = threading.Event()

    def fault(phase: str) -> None:
        if phase == "execute" and armed.is_set():
            armed.clear()
            raise RuntimeError("planted forward fault")

    serve = core_proc.serve_engine

    def serve_with_fault(engine, inbox, outbox):
        engine.fault_hook = fault
        serve(engine, inbox, outbox)

    monkeypatch.setattr(core_proc, "serve_engine", serve_with_fault)
    params = SamplingParams(max_tokens=4, temperature=0.0)
    engine = AsyncLLM(str(model_dir), in_process=True, start_timeout=120, **ENGINE)

    async def run():
        engine._bind_loop()
        armed.set()
        failed = await _collect(engine, PROMPT, params, "forward-fault")
        assert engine.num_unfinished_requests == 0
        await engine._client.fail_next_step()
        with pytest.raises(EngineRequestError, match="injected engine fault"):
            await _collect(engine, PROMPT, params, "loop-fault")
        assert engine.num_unfinished_requests == 0
        return failed, await _collect(engine, PROMPT, params, "after")

    try:
        failed, after = asyncio.run(run())
    finally:
        engine.shutdown()
    last = failed[-1].outputs[0]
    assert failed[-1].finished and last.finish_reason == "error" and "planted forward fault" in last.error
    assert after[-1].finished and after[-1].outputs[0].finish_reason == "length"
