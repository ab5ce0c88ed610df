"""The spawned engine process's exit status (engine/core_proc.run_engine_core): 1 when its loop
ended because the engine is dead (a tensor-parallel rank died), so the front end's "the engine
process died (exit code N)" and a process supervisor see a failure; 0 after a clean end."""

from __future__ import annotations

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
