"""Ctrl-C and the LLM (api/interrupts.py): a SIGINT inside an engine call is held until the call
ends, a second one is forced through and retires the LLM, SIGINT's handler is what it was
after every call, and a KeyboardInterrupt raised by the caller's own code mid-call (a progress
bar, a stream's consumer) ends generate(), chat() and beam_search() with nothing left behind:
the same LLM then answers what a fresh one answers."""

from __future__ import annotations

import signal
import sys

import pytest

from enginespec.beam_search import BeamSearchParams
from enginespec.conformance.invariants import check_llm_idle
from enginespec.interrupts import HELD_NOTE, Critical, hold_interrupts
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
PROMPTS = [[7, 8, 9, 10, 3], [11, 5, 6, 2], [12, 13, 4, 5, 6, 7], [9, 9, 8, 30, 31]]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
BEAMS = BeamSearchParams(beam_width=2, max_tokens=3)


def make_llm() -> LLM:
    return LLM(
        str(tiny_model_dir("qwen3")),
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=48,
        max_num_seqs=2,
    )


def tokens(outs) -> list:
    return [o.outputs[0].token_ids for o in outs]


def notes(exc: BaseException, stand_in: str) -> list:
    """exc's notes: required from Python 3.11 (add_note), `stand_in` alone before it."""
    if sys.version_info >= (3, 11):
        return list(getattr(exc, "__notes__", []))
    return [stand_in]


def test_a_ctrl_c_inside_a_section_is_raised_when_it_ends(ctrl_c):
    forced = []
    reached = []
    with pytest.raises(KeyboardInterrupt) as info:
        with Critical(forced.append):
            ctrl_c()
            reached.append("the rest of the engine call")
    assert reached and not forced
    assert HELD_NOTE in notes(info.value, HELD_NOTE)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_inside_a_section_is_forced_through_and_reported(ctrl_c):
    forced = []
    reached = []
    with pytest.raises(KeyboardInterrupt) as info:
        with hold_interrupts(), Critical(forced.append):
            ctrl_c()
            reached.append("after the first")
            ctrl_c()
            reached.append("after the second")
    assert reached == ["after the first"] and forced == [info.value]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_a_section_a_ctrl_c_raises_at_once_and_an_ignored_one_stays_ignored(ctrl_c):
    with pytest.raises(KeyboardInterrupt):
        with hold_interrupts():
            ctrl_c()
            pytest.fail("a Ctrl-C outside an engine call must raise where it lands")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with Critical(lambda exc: None):
        ctrl_c()  # SIG_IGN: nothing to hold, nothing raised
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_ctrl_c_runs_the_handler_the_caller_installed_held_or_not(ctrl_c):
    """An application's own SIGINT handler (one that sets a stop flag and raises nothing) is
    the one a Ctrl-C reaches, not Python's KeyboardInterrupt: at once outside a section, at
    the section's end inside one (the handler ours replaced is called with the held signal),
    and it is SIGINT's handler again after both."""
    calls = []

    def stop_flag(signum, frame):
        calls.append(signum)

    signal.signal(signal.SIGINT, stop_flag)
    try:  # (a KeyboardInterrupt here would end the whole pytest run, not fail the test)
        with hold_interrupts():
            ctrl_c()
            assert calls == [signal.SIGINT]
            with Critical(lambda exc: pytest.fail("one Ctrl-C is never forced through")):
                ctrl_c()
                assert calls == [signal.SIGINT]  # held
            assert calls == [signal.SIGINT, signal.SIGINT]
        with Critical(lambda exc: pytest.fail("one Ctrl-C is never forced through")):  # installs itself
            ctrl_c()
            assert len(calls) == 2
    except KeyboardInterrupt:
        pytest.fail(f"Python's handler ran in place of the caller's (after {len(calls)} calls of it)")
    assert calls == [signal.SIGINT] * 3
    assert signal.getsignal(signal.SIGINT) is stop_flag


def test_a_handler_installed_during_a_call_is_left_in_place(ctrl_c):
    """Whether ours is still SIGINT's handler is read when a call ends, never remembered: a
    handler the caller installs meanwhile (in a progress bar's callback, say) stays installed,
    not replaced by the one ours had replaced."""

    def mine(signum, frame):
        pass

    with hold_interrupts():
        signal.signal(signal.SIGINT, mine)
    assert signal.getsignal(signal.SIGINT) is mine
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with Critical(lambda exc: None):
        signal.signal(signal.SIGINT, mine)
    assert signal.getsignal(signal.SIGINT) is mine


def test_generate_installs_the_handler_once_for_the_whole_call(ctrl_c, monkeypatch):
    """generate() installs ours once (hold_interrupts) and restores the previous handler once at
    its end: its steps' sections then only count, with no signal.signal call per step."""
    from enginespec import interrupts

    llm = make_llm()
    handlers = []
    setsignal = interrupts._setsignal

    def recording(signum, handler):
        handlers.append(handler)
        return setsignal(signum, handler)

    monkeypatch.setattr(interrupts, "_setsignal", recording)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 5 for o in outs)  # several steps ran
    assert handlers == [interrupts._on_sigint, signal.default_int_handler]


def test_a_second_ctrl_c_inside_a_step_retires_the_llm(ctrl_c):
    """The second Ctrl-C stops the step midway (a step that never ends stays interruptible),
    so nothing vouches for the engine's structures after it: every later call is a
    RuntimeError saying so, and close() still ends the LLM."""
    llm = make_llm()
    block_manager = llm.engine.block_manager
    allocate = block_manager.allocate_slots

    def twice(*args, **kwargs):
        block_manager.allocate_slots = allocate
        ctrl_c()
        ctrl_c()
        return allocate(*args, **kwargs)

    block_manager.allocate_slots = twice
    with pytest.raises(KeyboardInterrupt) as info:
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert any("interrupted twice" in note for note in notes(info.value, "interrupted twice"))
    with pytest.raises(RuntimeError, match="interrupted twice inside one engine call"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class InterruptingBar:
    """A use_tqdm callable's bar whose update() raises KeyboardInterrupt at the `at`-th
    finished prompt, as a Ctrl-C landing in the caller's progress bar does."""

    def __init__(self, at: int, **_):
        self.done, self.at = 0, at

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.done >= self.at:
            raise KeyboardInterrupt("Ctrl-C in the progress bar")

    def set_postfix_str(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


def test_an_interrupt_from_the_callers_own_code_leaves_an_llm_that_answers_as_a_fresh_one():
    """generate(), chat() and a stream() consumer each stopped midway by a KeyboardInterrupt
    of the caller's (its progress bar, its loop body), with two of four prompts finished and
    two running: the KeyboardInterrupt reaches the caller as raised, the call's requests are
    aborted (none resumed by the next call, every block free), and the next calls answer as
    a fresh LLM's, beam search included."""
    fresh = make_llm()
    want = tokens(fresh.generate(PROMPTS, GREEDY, use_tqdm=False))
    want_beams = [s.tokens for s in fresh.beam_search(PROMPTS[:1], BEAMS)[0].sequences]
    conversations = [[{"role": "user", "content": f"hi {i}"}] for i in range(4)]
    want_chat = tokens(fresh.chat(conversations, GREEDY, use_tqdm=False, chat_template=CHAT_TEMPLATE))
    llm = make_llm()
    with pytest.raises(KeyboardInterrupt, match="progress bar"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=lambda **kw: InterruptingBar(2, **kw))
    check_llm_idle(llm)
    with pytest.raises(KeyboardInterrupt, match="progress bar"):
        llm.chat(
            conversations, GREEDY, chat_template=CHAT_TEMPLATE, use_tqdm=lambda **kw: InterruptingBar(2, **kw)
        )
    check_llm_idle(llm)
    with pytest.raises(KeyboardInterrupt):
        for step, _ in enumerate(llm.stream(PROMPTS, GREEDY)):
            if step == 2:
                raise KeyboardInterrupt
    check_llm_idle(llm)
    assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == want
    assert tokens(llm.chat(conversations, GREEDY, use_tqdm=False, chat_template=CHAT_TEMPLATE)) == want_chat
    assert [s.tokens for s in llm.beam_search(PROMPTS[:1], BEAMS)[0].sequences] == want_beams
    check_llm_idle(llm)


def test_a_ctrl_c_in_a_beam_search_step_ends_the_search_and_the_next_one_finds_the_same_beams(ctrl_c):
    """beam_search() is a loop of generate() steps. A Ctrl-C inside an engine step of its
    first search step (just after the scheduler published the second prompt's blocks, before
    the forward that writes them) raised KeyboardInterrupt there; the search's requests were
    aborted with those blocks still published, and the next search adopted KV never written
    and found other beams than a fresh LLM. Now it is raised when the step ends, the search
    stops, nothing of it is left, and the next search finds a fresh LLM's beams."""
    want = [s.tokens for s in make_llm().beam_search(PROMPTS[:2], BEAMS)[0].sequences]
    llm = make_llm()
    block_manager = llm.engine.block_manager
    publish = block_manager.cache_full_blocks
    calls = {"n": 0}

    def then_ctrl_c(*args, **kwargs):
        publish(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:
            ctrl_c()

    block_manager.cache_full_blocks = then_ctrl_c
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.beam_search(PROMPTS[:2], BEAMS)
    finally:
        block_manager.cache_full_blocks = publish
    check_llm_idle(llm)
    assert [s.tokens for s in llm.beam_search(PROMPTS[:2], BEAMS)[0].sequences] == want
    check_llm_idle(llm)


def test_a_ctrl_c_as_a_stream_starts_leaves_none_of_its_requests(ctrl_c, monkeypatch):
    """stream() added its prompts, then built its output views before its try: a Ctrl-C in
    between (here in the views' one call) left every request it had added running in the
    engine, owned by nobody, stepped by every later call and never freed."""
    from enginespec import llm as llm_module

    llm = make_llm()
    per_prompt, seen = llm_module._per_prompt, []

    def then_ctrl_c(value, count, name):
        result = per_prompt(value, count, name)
        seen.append(name)
        if seen.count("sampling_params") == 2:  # stream()'s own, its prompts added by then
            ctrl_c()
        return result

    monkeypatch.setattr(llm_module, "_per_prompt", then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        next(llm.stream(PROMPTS, GREEDY))
    check_llm_idle(llm)


class HostHandler:
    """A host program's own SIGINT handler that does not raise (a data pipeline's "stop after
    this batch" flag; asyncio.run's, whose first Ctrl-C only cancels the main task): it counts
    the Ctrl-Cs it is given, and raises KeyboardInterrupt from the `raise_at`-th on, if any."""

    def __init__(self, raise_at: int = 0) -> None:
        self.calls, self.raise_at = 0, raise_at

    def __call__(self, signum, frame) -> None:
        self.calls += 1
        if self.raise_at and self.calls >= self.raise_at:
            raise KeyboardInterrupt(f"the host's Ctrl-C number {self.calls}")


def test_a_host_handler_that_does_not_raise_gets_every_ctrl_c_and_nothing_is_forced():
    """Two Ctrl-Cs inside one section under a handler that only counts them: the second was
    'forced through' (the handler ran, raised nothing, the section went on whole), yet the
    section reported it forced, and the held first one was never given to the handler at all:
    the host counted 1 of 2. Now both reach it and nothing is forced, as nothing was cut."""
    host = HostHandler()
    previous = signal.signal(signal.SIGINT, host)
    forced, reached = [], []
    try:
        with hold_interrupts(), Critical(forced.append):
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            reached.append("the rest of the engine call")
        assert signal.getsignal(signal.SIGINT) is host
    finally:
        signal.signal(signal.SIGINT, previous)
    assert reached and not forced and host.calls == 2


def test_a_host_handler_that_raises_on_the_second_ctrl_c_gets_both_and_forces_the_section():
    """asyncio.run's handler: the first Ctrl-C cancels the main task, the second raises. Both
    reach it, in order, when the second lands; its KeyboardInterrupt cuts the section, which
    is then reported forced."""
    host = HostHandler(raise_at=2)
    previous = signal.signal(signal.SIGINT, host)
    forced, reached = [], []
    try:
        with pytest.raises(KeyboardInterrupt, match="number 2") as info:
            with hold_interrupts(), Critical(forced.append):
                signal.raise_signal(signal.SIGINT)
                reached.append("after the first")
                signal.raise_signal(signal.SIGINT)
                reached.append("after the second")
        assert signal.getsignal(signal.SIGINT) is host
    finally:
        signal.signal(signal.SIGINT, previous)
    assert reached == ["after the first"] and forced == [info.value] and host.calls == 2


def test_two_ctrl_cs_in_a_step_under_a_handler_that_does_not_raise_leave_the_llm_serving():
    """A host whose SIGINT handler sets a flag (to stop after the current batch) and whose user
    pressed Ctrl-C twice during one step: generate() raised RuntimeError 'interrupted twice'
    midway and the LLM was retired, though the step had run whole; the host's handler saw one
    of the two. Now generate() answers as usual, the handler sees both, the LLM serves on."""
    want = tokens(make_llm().generate(PROMPTS, GREEDY, use_tqdm=False))
    llm = make_llm()
    block_manager = llm.engine.block_manager
    allocate = block_manager.allocate_slots

    def twice(*args, **kwargs):
        block_manager.allocate_slots = allocate
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        return allocate(*args, **kwargs)

    host = HostHandler()
    previous = signal.signal(signal.SIGINT, host)
    try:
        block_manager.allocate_slots = twice
        assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == want
        assert signal.getsignal(signal.SIGINT) is host
    finally:
        signal.signal(signal.SIGINT, previous)
    assert host.calls == 2
    check_llm_idle(llm)
    assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == want
