"""The spawned engine process's exit status (engine/core_proc.run_engine_core): 1 when its loop
ended because the engine is dead (a tensor-parallel rank died), so the front end's "the engine
process died (exit code N)" and a process supervisor see a failure; 0 after a clean end."""

from __future__ import annotations

import multiprocessing
import signal

import pytest

import enginespec.engine.core_proc as core_proc
import enginespec.engine.engine_core as engine_core


class _Engine:
    def __init__(self, dead):
        self.dead = dead


@pytest.fixture
def served(monkeypatch):
    """run_engine_core over a stand-in EngineCore whose loop ends at once; the process-wide
    signal handlers it installs are left alone."""
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setattr(core_proc, "serve_engine", lambda engine, inbox, outbox: None)

    def run(dead):
        monkeypatch.setattr(engine_core, "EngineCore", lambda args: _Engine(dead))
        return core_proc.run_engine_core(None, None, None)

    return run


def test_a_dead_engine_exits_1_naming_why(served, capsys):
    with pytest.raises(SystemExit) as exit_:
        served("worker rank 1 exited with code -9")
    assert exit_.value.code == 1
    assert "worker rank 1 exited with code -9" in capsys.readouterr().err


def test_an_engine_whose_loop_ended_cleanly_returns(served):
    assert served(None) is None


class _Exited(Exception):
    """os._exit, caught: the handler ended the process."""


@pytest.fixture
def term(monkeypatch):
    """A serving engine's TermSignal whose front end is alive (unless the test says not), with
    os._exit raising _Exited."""

    def exit_(code):
        raise _Exited(code)

    monkeypatch.setattr(core_proc.os, "_exit", exit_)
    monkeypatch.setattr(core_proc, "_front_end_alive", lambda: True)
    handler = core_proc.TermSignal(multiprocessing.Value("b", 0, lock=False))
    handler.serving = True
    return handler


def test_a_serving_engine_defers_its_first_sigterm_and_obeys_a_second(term, capfd):
    """A SIGTERM to the whole process group reaches the engine with the server's: the engine
    leaves it to the server, which drains its requests and then stops the engine (it exited at
    once: every in-flight request failed with 'the engine process died'). A second SIGTERM
    ends it at once."""
    term(signal.SIGTERM, None)
    assert "SIGTERM" in capfd.readouterr().err
    with pytest.raises(_Exited):
        term(signal.SIGTERM, None)


def test_the_front_ends_own_sigterm_ends_the_engine_at_once(term):
    """The front end's SIGTERM (its stop() reaping an engine that did not obey "shutdown" in
    time) is not deferred: it sets stop_now first."""
    term.stop_now.value = 1
    with pytest.raises(_Exited):
        term(signal.SIGTERM, None)


def test_sigterm_ends_the_engine_at_once_without_a_front_end_or_while_it_loads(term, monkeypatch):
    """The engine never outlives its server: with the front end gone there is nothing to defer
    to; while the engine loads there is nothing to drain (the front end reaps it)."""
    monkeypatch.setattr(core_proc, "_front_end_alive", lambda: False)
    with pytest.raises(_Exited):
        term(signal.SIGTERM, None)
    monkeypatch.setattr(core_proc, "_front_end_alive", lambda: True)
    term.serving = False
    with pytest.raises(_Exited):
        term(signal.SIGTERM, None)


# An impl whose schedule() never returns (in Python: signal handlers still run), so the engine
# process is stuck in its first step, and never reads the front end's "shutdown"; the file
# $STUCK says it got there.
STUCK_IMPL = """
import os
import time
from enginespec.spec import load_impl


class Stuck:
    name = "stuck"

    def __init__(self, base):
        self._base = base

    def __getattr__(self, attr):
        return getattr(self._base, attr)

    def new_scheduler(self, config, block_manager):
        scheduler = self._base.new_scheduler(config, block_manager)

        def schedule():
            open(os.environ["STUCK"], "w").close()
            while True:
                time.sleep(0.05)

        scheduler.schedule = schedule
        return scheduler


IMPL = Stuck(load_impl("reference"))
"""


def test_the_front_end_still_ends_a_stuck_engine_process_with_its_sigterm(tmp_path, monkeypatch):
    """EngineClient.stop() on an engine process stuck in a step: its SIGTERM, once "shutdown"
    went unobeyed, ends the engine at once (status 0, TermSignal's exit), not deferred as a
    SIGTERM to the process group is (the engine would then live on to the SIGKILL, -9)."""
    import asyncio

    from enginespec.engine.core_messages import NewRequest
    from enginespec.engine.engine_core import load_engine_tokenizer
    from enginespec.engine_args import EngineArgs
    from enginespec.entrypoints.openai.engine_client import EngineClient
    from enginespec.spec import SamplingParams
    from enginespec.testing.checkpoints import make_checkpoint

    (tmp_path / "stuck_impl.py").write_text(STUCK_IMPL)
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned engine process gets sys.path
    stuck = tmp_path / "stuck"
    monkeypatch.setenv("STUCK", str(stuck))
    model = make_checkpoint("llama", tmp_path / "llama")
    args = EngineArgs.from_kwargs(str(model), impl="stuck_impl:IMPL", device="cpu", num_blocks=16)
    client = EngineClient(args, load_engine_tokenizer(args), max_waiting=4)
    client.launch(timeout=120)

    async def submit_until_stuck():
        client.start(asyncio.get_running_loop())
        params = SamplingParams(max_tokens=4)
        submit = asyncio.ensure_future(client.submit([NewRequest("a", None, [4, 5, 6], params)]))
        while not stuck.exists():
            await asyncio.sleep(0.05)
        submit.cancel()

    try:
        asyncio.run(asyncio.wait_for(submit_until_stuck(), 120))
    finally:
        client.stop(timeout=1.0)
    assert client._worker.exitcode == 0
