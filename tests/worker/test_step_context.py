"""The active StepContext is the calling thread's (worker/step_context.py's invariants)."""

from __future__ import annotations

import threading

import pytest

from enginespec.worker import step_context
from enginespec.worker.step_context import StepContext, active, current, current_or_none


def _ctx(name: str) -> StepContext:
    return StepContext(meta=name, kv_caches=[], backend=None)  # only identity matters here


def test_two_threads_step_at_once_each_in_its_own_context():
    """Two engines in one process step on their own threads (an in-process AsyncLLM's engine
    thread beside an LLM.generate): each sees its own context while both are active. One
    process-wide slot made the second of two overlapping steps raise "already active"."""
    first, second = _ctx("first"), _ctx("second")
    inside, release, seen, errors = threading.Event(), threading.Event(), {}, []

    def step_a():
        with active(first):
            inside.set()
            release.wait(10)
            seen["a"] = current()

    thread = threading.Thread(target=step_a)
    thread.start()
    try:
        assert inside.wait(10)
        try:
            with active(second):
                seen["b"] = current()
        except RuntimeError as e:  # the old process-wide slot
            errors.append(e)
    finally:
        release.set()
        thread.join(10)
    assert not errors, errors
    assert seen == {"a": first, "b": second}
    assert current_or_none() is None


def test_contexts_do_not_nest_within_a_thread():
    with active(_ctx("outer")), pytest.raises(RuntimeError, match="already active"):
        with active(_ctx("inner")):
            pass
    assert step_context.current_or_none() is None
    with pytest.raises(ValueError, match="needs an active StepContext"):
        current()
