"""A structured-output request's grammar compiles off the engine loop (engine/core_proc.py parks
its add; EngineCore.prepare_grammar compiles on a grammar thread): the other requests step
meanwhile, an abort drops the parked request, and a constraint that does not compile is still
the submit's ValueError (a 400 over HTTP).

A compile is held open by a gate (StructuredOutputManager._compile waits on it for one regex),
so "meanwhile" is a fact of the test, not a race."""

from __future__ import annotations

import asyncio
import re
import threading

import pytest

from enginespec.engine.core_messages import NewRequest
from enginespec.engine.structured_output import StructuredOutputManager
from enginespec.spec import SamplingParams
from enginespec.spec.structured_outputs import StructuredOutputsParams
from enginespec.testing.checkpoints import json_model_dir
from tests.entrypoints.client_helpers import final_output, in_process_client

pytest.importorskip("xgrammar")

HELD = "[a-c]+"  # the regex whose compile waits on the gate
LIVENESS_S = 60  # how long a request that should run may take (a hang, not a speed, fails)
# A small pool the test names, not one sized by gpu_memory_utilization: on a GPU whose memory
# other test processes hold, the default sizing refused to start (7 failures in a parallel run
# on an H100, passing alone).
ENGINE = dict(num_blocks=64, max_num_seqs=4)


@pytest.fixture
def gate(monkeypatch):
    """A threading.Event that the compile of HELD waits on (set at teardown, so a failing test
    never leaves the grammar thread waiting); its `compiled` Event is set once that compile has
    returned."""
    event = threading.Event()
    event.compiled = threading.Event()
    real = StructuredOutputManager._compile

    def held(self, params, kind):
        if params.regex != HELD:
            return real(self, params, kind)
        event.wait(LIVENESS_S)
        try:
            return real(self, params, kind)
        finally:
            event.compiled.set()

    monkeypatch.setattr(StructuredOutputManager, "_compile", held)
    yield event
    event.set()


def _request(rid: str, regex=None, max_tokens: int = 8, ignore_eos: bool = False) -> NewRequest:
    constraint = None if regex is None else StructuredOutputsParams(regex=regex)
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0, structured_outputs=constraint, ignore_eos=ignore_eos
    )
    return NewRequest(rid, None, [5, 6, 7], params)


def test_other_requests_step_while_a_grammar_compiles(gate):
    with in_process_client(json_model_dir(), **ENGINE) as client:

        async def run():
            client.start(asyncio.get_running_loop())
            held = asyncio.create_task(client.submit([_request("held", HELD, max_tokens=4)]))
            await asyncio.sleep(0)  # its add goes to the engine first
            plain = await asyncio.wait_for(client.submit([_request("plain", max_tokens=8)]), LIVENESS_S)
            plain_out = await asyncio.wait_for(final_output(plain), LIVENESS_S)
            still_compiling = not held.done()
            gate.set()
            held_out = await asyncio.wait_for(final_output(await held), LIVENESS_S)
            return plain_out, still_compiling, held_out

        plain_out, still_compiling, held_out = asyncio.run(run())
    assert len(plain_out.outputs[0].token_ids) == 8 and plain_out.finished
    assert still_compiling  # accepted only once its grammar had compiled
    text = held_out.outputs[0].text
    assert held_out.finished and re.fullmatch(HELD, text), text


def test_a_long_compile_does_not_hold_up_another_requests_compile(gate):
    """Grammars compile side by side (EngineCore.prepare_grammar's pool): while one request's
    compile is held open, another structured-output request is compiled, added and run to its
    end. With one grammar thread it queued behind the held compile, so a tenant's slow schema
    stalled every other tenant's JSON mode for as long as that compile took."""
    with in_process_client(json_model_dir(), **ENGINE) as client:

        async def run():
            client.start(asyncio.get_running_loop())
            held = asyncio.create_task(client.submit([_request("held", HELD, max_tokens=4)]))
            await asyncio.sleep(0)  # its add (and its compile) goes to the engine first
            other = await asyncio.wait_for(client.submit([_request("other", "[0-9]{3}")]), LIVENESS_S)
            other_out = await asyncio.wait_for(final_output(other), LIVENESS_S)
            compiled_first = gate.compiled.is_set()
            gate.set()
            await asyncio.wait_for(final_output(await held), LIVENESS_S)
            return other_out, compiled_first

        other_out, compiled_first = asyncio.run(run())
    assert other_out.finished and re.fullmatch("[0-9]{3}", other_out.outputs[0].text)
    assert not compiled_first  # it ran while the other grammar was still compiling


def test_a_request_whose_grammar_compiles_counts_as_waiting(gate):
    """vllm:num_requests_waiting (EngineState.num_waiting) counts the samples of an add parked
    while its grammar compiles, as vLLM's scheduler keeps such a request in its waiting queue:
    they used to count nowhere, so a dashboard read an idle server (nothing running, nothing
    waiting) while requests queued behind a slow schema. An abort takes them off again."""
    with in_process_client(json_model_dir(), **ENGINE) as client:

        async def run():
            client.start(asyncio.get_running_loop())
            held = NewRequest(
                "held",
                None,
                [5, 6, 7],
                SamplingParams(n=2, max_tokens=4, structured_outputs=StructuredOutputsParams(regex=HELD)),
            )
            parked = asyncio.create_task(client.submit([held]))
            await asyncio.sleep(0)  # its add goes to the engine first
            plain = await asyncio.wait_for(client.submit([_request("plain", max_tokens=4)]), LIVENESS_S)
            await asyncio.wait_for(final_output(plain), LIVENESS_S)
            while_compiling = (client.state.num_waiting, client.state.num_running, parked.done())
            client.abort(["held"])
            await asyncio.wait_for(client.reset_prefix_cache(), LIVENESS_S)  # a round trip
            return while_compiling, client.state.num_waiting

        while_compiling, after_abort = asyncio.run(run())
    assert while_compiling == (2, 0, False)
    assert after_abort == 0


async def _park_then_abort(client) -> asyncio.Task:
    """Submit a 200-token request of HELD (its add parks while the gate holds its compile), then
    abort it; the task of its submit, which must never complete."""
    parked = asyncio.create_task(client.submit([_request("held", HELD, 200, ignore_eos=True)]))
    await asyncio.sleep(0.2)  # its add reaches the engine and parks
    client.abort(["held"])
    return parked


def test_an_abort_while_compiling_drops_the_request(gate):
    with in_process_client(json_model_dir(), **ENGINE) as client:

        async def run():
            client.start(asyncio.get_running_loop())
            # were it added after all, its 200 tokens would outlast the next request's 8
            parked = await _park_then_abort(client)
            gate.set()
            after = await asyncio.wait_for(client.submit([_request("next", "[a-c]+x?")]), LIVENESS_S)
            out = await asyncio.wait_for(final_output(after), LIVENESS_S)
            await asyncio.sleep(0.2)  # the engine's news after that request's last step
            return parked.done(), out

        parked_done, out = asyncio.run(run())
        state = client.state
    assert not parked_done  # no "accepted" ever came for it (nor an error)
    assert out.finished and state.num_unfinished == 0
    assert state.num_free_blocks == state.num_blocks


def test_an_abort_while_compiling_never_makes_the_engine_wait_for_the_compile(gate):
    """Once every request of a parked add is aborted, the engine drops the add without reading
    its compiles' outcome: it used to ask the Future for its exception, which waits for the
    compile, so the engine loop stood still (no other request stepped) until the aborted
    request's grammar had compiled. Here another request runs to its end while that compile is
    still held open."""
    with in_process_client(json_model_dir(), **ENGINE) as client:

        async def run():
            client.start(asyncio.get_running_loop())
            parked = await _park_then_abort(client)
            plain = await asyncio.wait_for(client.submit([_request("plain", max_tokens=8)]), LIVENESS_S)
            out = await asyncio.wait_for(final_output(plain), LIVENESS_S)
            compiled_first = gate.compiled.is_set()
            gate.set()
            return parked.done(), out, compiled_first

        parked_done, out, compiled_first = asyncio.run(run())
    assert not parked_done
    assert len(out.outputs[0].token_ids) == 8 and out.finished
    assert not compiled_first  # it ran while the aborted request's grammar was still compiling


def test_a_constraint_that_does_not_compile_is_still_the_submits_error():
    with in_process_client(json_model_dir(), **ENGINE) as client:

        async def run():
            client.start(asyncio.get_running_loop())
            with pytest.raises(ValueError, match="StructuredOutputsParams.regex is invalid"):
                await asyncio.wait_for(client.submit([_request("bad", "(unclosed")]), LIVENESS_S)
            ok = await client.submit([_request("ok", max_tokens=3)])
            return await asyncio.wait_for(final_output(ok), LIVENESS_S)

        out = asyncio.run(run())
    assert len(out.outputs[0].token_ids) == 3


def test_a_grammar_setup_that_fails_refuses_that_add_and_the_engine_serves_on(monkeypatch):
    """Building the grammar compiler can fail other than with xgrammar missing (a tokenizer
    xgrammar cannot read: its own RuntimeError). That add is refused with the error (a 500 over
    HTTP); the engine loop is not taken down with it, and the next request runs to its end."""

    def broken(self, *args, **kwargs):
        raise RuntimeError("xgrammar could not read this tokenizer")

    monkeypatch.setattr(StructuredOutputManager, "__init__", broken)
    with in_process_client(json_model_dir(), **ENGINE) as client:

        async def run():
            client.start(asyncio.get_running_loop())
            with pytest.raises(Exception, match="could not read this tokenizer"):
                await asyncio.wait_for(client.submit([_request("bad", HELD)]), LIVENESS_S)
            ok = await asyncio.wait_for(client.submit([_request("ok", max_tokens=3)]), LIVENESS_S)
            return await asyncio.wait_for(final_output(ok), LIVENESS_S)

        out = asyncio.run(run())
    assert len(out.outputs[0].token_ids) == 3 and out.finished
