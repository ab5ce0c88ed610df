"""A stream() abandoned half-read in a reference cycle is finalized by the cyclic garbage
collector, which may run at any allocation, also inside an engine step of another call on the
same thread. Its clean-up (aborting its requests) re-enters the LLM there through the
re-entrant engine lock: it must wait for the step's end, never abort requests of the batch
being stepped (which failed the whole step, the other call's requests included, with
finish_reason "error")."""

from __future__ import annotations

import gc
import weakref

import pytest

from enginespec.conformance.invariants import check_idle
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [7 + i, 8, 9 + i, 3, 5, 6]} for i in range(3)]


def make_llm() -> LLM:
    return LLM(
        str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", block_size=4, num_blocks=64
    )


class _Cycle:
    """Holds a stream in a reference cycle: only the cyclic collector frees it."""

    def __init__(self, stream):
        self.stream, self.me = stream, self


@pytest.mark.parametrize("phase", ["schedule", "prepare", "execute", "sample", "update", "detokenize"])
def test_a_stream_collected_inside_another_calls_step_leaves_that_call_intact(phase):
    llm = make_llm()
    want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    holder = _Cycle(llm.stream(PROMPTS, LONG))
    next(holder.stream)  # its requests run, in the batch of the next step
    gone = weakref.ref(holder.stream)
    del holder
    collected = []

    def collect_once(name):  # the cyclic collector, running in the middle of a step
        if name == phase and not collected:
            gc.collect()
            collected.append(gone() is None)

    llm.engine.fault_hook = collect_once
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.engine.fault_hook = None
    assert collected == [True], "the stream was not collected inside the step"
    assert [(o.outputs[0].finish_reason, o.outputs[0].error) for o in outs] == [("length", None)] * 3
    assert [o.outputs[0].token_ids for o in outs] == want
    engine = llm.engine
    assert not engine.has_unfinished and not engine.scheduler.has_unfinished
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    assert not llm._mail and not llm._owned


def test_a_stream_collected_inside_a_step_that_raises_is_released_too():
    """The step the collector ran in is interrupted (KeyboardInterrupt): both calls' requests
    are still released, and the LLM then answers as before."""
    llm = make_llm()
    want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    holder = _Cycle(llm.stream(PROMPTS, LONG))
    next(holder.stream)
    del holder

    def collect_then_interrupt(name):
        if name == "execute":
            gc.collect()
            raise KeyboardInterrupt

    llm.engine.fault_hook = collect_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.engine.fault_hook = None
    engine = llm.engine
    assert not engine.has_unfinished and not engine.scheduler.has_unfinished
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    assert not llm._mail and not llm._owned and not llm._front.deferred
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == want


def test_a_failed_release_after_a_failed_step_does_not_hide_the_steps_error(monkeypatch):
    """A step that raised (a Ctrl-C inside it) releases the ids deferred during it; if that
    release raises too, the step's own error still reaches the caller, the release's as a note."""
    llm = make_llm()
    engine = llm.engine

    def interrupt(phase: str) -> None:
        if phase == "execute":
            engine.fault_hook = None
            raise KeyboardInterrupt

    real_abort = engine.abort

    def abort(ids, *args, **kwargs):
        if "ghost" in ids:
            raise RuntimeError("abort failed")
        return real_abort(ids, *args, **kwargs)

    monkeypatch.setattr(engine, "abort", abort)
    engine.fault_hook = interrupt
    llm._front.deferred.add("ghost")  # a release that came in while the step ran
    with pytest.raises(KeyboardInterrupt) as info:
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    notes = getattr(info.value, "__notes__", None)
    assert notes is None or any("abort failed" in note for note in notes)
