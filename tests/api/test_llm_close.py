"""LLM.close() and `with LLM(...)`: afterwards every call is a RuntimeError naming close(), on one
rank as under tensor parallelism (where the workers are gone), never a silent success on one
GPU that turns into an EngineDeadError on two; a call under way in another thread (or a
half-read stream) fails at its next step with its requests aborted; and close() waits for a
step under way, so the TP workers never stop in the middle of one."""

from __future__ import annotations

import threading

import pytest

from enginespec.beam_search import BeamSearchParams
from enginespec.conformance.invariants import check_llm_idle
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [7 + i, 8, 9 + i, 3]} for i in range(3)]
CLOSED = "closed"


def make_llm() -> LLM:
    return LLM(
        str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", block_size=4, num_blocks=32
    )


def test_every_call_after_close_is_a_clear_error():
    with make_llm() as llm:
        assert len(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == 3
    chat = [{"role": "user", "content": "hi"}]
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    calls = {
        "generate": lambda: llm.generate(PROMPTS, GREEDY, use_tqdm=False),
        "generate([])": lambda: llm.generate([], GREEDY, use_tqdm=False),
        "stream": lambda: next(llm.stream(PROMPTS, GREEDY)),
        "chat": lambda: llm.chat(chat, GREEDY, use_tqdm=False, chat_template=template),
        "beam_search": lambda: llm.beam_search(PROMPTS[:1], BeamSearchParams(beam_width=2, max_tokens=2)),
        "reset_prefix_cache": llm.reset_prefix_cache,
        "get_metrics": llm.get_metrics,
    }
    for call in calls.values():
        with pytest.raises(RuntimeError, match=CLOSED):
            call()
    llm.close()  # idempotent
    check_llm_idle(llm)


def test_a_half_read_stream_fails_at_its_next_step_after_close():
    llm = make_llm()
    stream = llm.stream(PROMPTS, GREEDY)
    assert all(not o.finished for o in next(stream))
    llm.close()
    with pytest.raises(RuntimeError, match=CLOSED):
        next(stream)
    check_llm_idle(llm)  # its requests were aborted, their blocks freed


def test_close_waits_for_the_step_under_way_in_another_call():
    """close() from a second thread while generate() is inside a step: the engine is shut down
    between steps, never during one (under TP the workers would stop mid-collective), and the
    generate() either finished or fails with the closed error, leaving nothing behind."""
    llm = make_llm()
    engine = llm.engine
    step, shutdown = engine.step, engine.shutdown
    state = {"in_step": False, "steps": 0, "shut_in_step": None}
    closer = threading.Thread(target=llm.close)

    def recording_shutdown():
        state["shut_in_step"] = state["in_step"]
        shutdown()

    def stepping(*args, **kwargs):
        state["in_step"] = True
        state["steps"] += 1
        try:
            if state["steps"] == 2:  # close from another thread while this step runs
                closer.start()
                closer.join(timeout=1.0)  # returns at once where close() does not wait
            return step(*args, **kwargs)
        finally:
            state["in_step"] = False

    engine.step, engine.shutdown = stepping, recording_shutdown
    try:
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    except RuntimeError as e:
        assert CLOSED in str(e)
    closer.join()
    assert state["shut_in_step"] is False, "close() shut the engine down in the middle of a step"
    with pytest.raises(RuntimeError, match=CLOSED):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    check_llm_idle(llm)


# A host program's view of an LLM it built, used and closed: what the process held before the
# LLM (after a first one, so that import-time and first-use caches are not counted) is all it
# holds after. Run in a fresh interpreter: a test process's threads and bars are not a host's.
HOST_SCRIPT = """
import gc, os, sys, threading, multiprocessing as mp
from enginespec import LLM, SamplingParams
from enginespec.beam_search import BeamSearchParams

def held():
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add(os.readlink("/proc/self/fd/" + fd))
        except OSError:
            pass
    return {t.name for t in threading.enumerate()}, fds

PARAMS = SamplingParams(max_tokens=3)
with LLM(sys.argv[1], dtype="float32", device="cpu", block_size=4, num_blocks=32) as llm:
    llm.generate(["hi"], PARAMS, use_tqdm=False)
gc.collect()
before = held()
with LLM(sys.argv[1], dtype="float32", device="cpu", block_size=4, num_blocks=32) as llm:
    llm.generate(["hi"], PARAMS, use_tqdm=False)
    llm.chat([{"role": "user", "content": "hi"}], PARAMS, use_tqdm=False, chat_template="{{ messages[0]['content'] }}")
    llm.beam_search(["hi"], BeamSearchParams(beam_width=2, max_tokens=2))  # vLLM's default: no bar
del llm
gc.collect()
print(repr(before[0]))
print(repr(tuple(after - was for after, was in zip(held(), before)) + (mp.active_children(),)))
"""


def test_a_closed_llm_leaves_its_host_no_thread_child_or_fd(tmp_path):
    """Build, generate with use_tqdm=False, close, drop: the host process is left with the
    threads, fds and child processes it had. generate(use_tqdm=False) made a disabled tqdm
    bar all the same, and tqdm starts its monitor thread for any bar, disabled or not: a
    host that never asked for a bar kept a 'tqdm_monitor' thread for the rest of its life
    (and Python 3.12 warns at every os.fork() of a process with threads)."""
    import subprocess
    import sys

    script = tmp_path / "host.py"
    script.write_text(HOST_SCRIPT)
    run = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir("qwen3"))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    threads_before, leftovers = run.stdout.splitlines()[-2:]  # beam_search's bar the same
    assert threads_before == "{'MainThread'}"
    assert leftovers == "(set(), set(), [])"
