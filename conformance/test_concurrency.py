"""Threads, interleaved calls and interrupts on one LLM.

The contract (api/llm.py): calls into the engine are serialised by a lock and each call gets
all of its own outputs (others' go to their mailbox); any BaseException while adding or
stepping leaves the pool and scheduler as if the call's requests had never been sent (or had
been aborted)."""

from __future__ import annotations

import threading

import pytest

from enginespec.conformance.invariants import check_llm_idle
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [7 + i, 8 + 2 * i, 9, 10 + i, 3]} for i in range(8)]


def make_llm(impl, **kwargs):
    from enginespec.llm import LLM

    args = dict(dtype="float32", device="cpu", block_size=4, num_blocks=48, max_model_len=64, max_num_seqs=4)
    return LLM(str(tiny_model_dir("qwen3")), impl=impl, **{**args, **kwargs})


def tokens(outs) -> list:
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_generate_from_several_threads(impl, async_scheduling):
    llm = make_llm(impl, async_scheduling=async_scheduling)
    expected = tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    results, errors = {}, []

    def worker(k: int) -> None:
        try:
            mine = PROMPTS[k::4]
            for _ in range(2):
                results[k] = tokens(llm.generate(mine, GREEDY, use_tqdm=False))
        except BaseException as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for k in range(4):
        assert results[k] == expected[k::4]
    check_llm_idle(llm)


def test_a_half_read_stream_then_generate_loses_nothing(impl):
    llm = make_llm(impl)
    expected = tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    stream = llm.stream(PROMPTS[:4], GREEDY)
    first = next(stream)
    assert first and all(not o.finished for o in first)
    assert tokens(llm.generate(PROMPTS[4:], GREEDY, use_tqdm=False)) == expected[4:]
    finals = {}
    for outs in stream:
        finals.update({o.request_id: o for o in outs if o.finished})
    assert len(finals) == 4
    assert [finals[k].outputs[0].token_ids for k in sorted(finals, key=int)] == expected[:4]
    check_llm_idle(llm)


def test_abort_from_another_call_while_streaming(impl):
    llm = make_llm(impl)
    stream = llm.stream(PROMPTS[:3], GREEDY)
    next(stream)
    stream.close()  # the consumer gives up: its requests are aborted, nothing else changes
    assert tokens(llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False))
    check_llm_idle(llm)


def test_keyboard_interrupt_while_tokenizing_leaves_nothing(impl, monkeypatch):
    llm = make_llm(impl)
    tokenizer = llm.get_tokenizer()
    calls = {"n": 0}
    encode = tokenizer.encode

    def interrupted(text, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return encode(text, *a, **k)

    monkeypatch.setattr(tokenizer, "encode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["a b", "c d", "e f", "g h"], GREEDY, use_tqdm=False)
    check_llm_idle(llm)
    monkeypatch.setattr(tokenizer, "encode", encode)
    assert len(llm.generate(["a b"], GREEDY, use_tqdm=False)) == 1


def test_keyboard_interrupt_while_adding_siblings_leaves_nothing(impl, monkeypatch):
    llm = make_llm(impl)
    scheduler = llm.engine.scheduler
    add = scheduler.add
    calls = {"n": 0}

    def interrupted(request):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return add(request)

    monkeypatch.setattr(scheduler, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS[:1], SamplingParams(n=3, max_tokens=3, temperature=0.0), use_tqdm=False)
    monkeypatch.setattr(scheduler, "add", add)
    check_llm_idle(llm)
    outs = llm.generate(PROMPTS[:1], SamplingParams(n=3, max_tokens=3, temperature=0.0), use_tqdm=False)
    assert len(outs[0].outputs) == 3
    check_llm_idle(llm)


def test_keyboard_interrupt_in_a_generate_step_aborts_its_requests(impl):
    llm = make_llm(impl)
    expected = tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    count = {"n": 0}

    def hook(phase):
        if phase == "execute":
            count["n"] += 1
            if count["n"] == 3:
                raise KeyboardInterrupt

    llm.engine.fault_hook = hook
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.engine.fault_hook = None
    while llm.engine.has_unfinished:  # the failed step's report; nobody is waiting for it
        llm.engine.step()
    check_llm_idle(llm)
    assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == expected


@pytest.mark.parametrize(
    "method, nth", [("cache_full_blocks", 1), ("allocate_slots", 3), ("find_cached_prefix", 3)]
)
def test_a_ctrl_c_inside_the_scheduler_interrupts_generate_once_the_step_ends(impl, ctrl_c, method, nth):
    """A Ctrl-C that lands while schedule() is midway (here just after a block-manager call
    returned, before the scheduler recorded it) used to raise KeyboardInterrupt right there:
    blocks published for a forward that never ran kept their hashes, and once generate()
    aborted its requests the next generate() of the same prompts adopted them, KV never
    written, and answered other tokens than a fresh LLM. The LLM holds the signal until the
    step has ended: the KeyboardInterrupt still ends the call, and leaves nothing behind."""
    llm = make_llm(impl)
    expected = tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    assert llm.reset_prefix_cache()  # as fresh as a new LLM: nothing cached
    block_manager = llm.engine.block_manager
    call, calls = getattr(block_manager, method), {"n": 0}

    def then_ctrl_c(*args, **kwargs):
        result = call(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == nth:
            ctrl_c()
        return result

    setattr(block_manager, method, then_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        setattr(block_manager, method, call)
    check_llm_idle(llm)
    assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == expected
    check_llm_idle(llm)


def test_check_llm_idle_refuses_each_thing_a_call_may_leave_behind(impl):
    """check_llm_idle (the between-calls check the tests above use) refuses an LLM left with any
    one of: a request the scheduler holds that the engine does not know, a request the engine
    still counts that the scheduler does not hold, a block still referenced, an output left in
    the mail, an id still owned. Each is played alone on an idle LLM (which passes) and undone."""
    from contextlib import contextmanager

    llm = make_llm(impl)
    engine = llm.engine
    check_llm_idle(llm)

    @contextmanager
    def refused(what: str):
        yield
        try:
            check_llm_idle(llm)
        except AssertionError:
            return
        pytest.fail(f"check_llm_idle took an LLM with {what}")

    stray = engine.impl.new_request("stray", [5, 6, 7])
    with refused("a request only the scheduler holds"):
        engine.scheduler.add(stray)
    engine.scheduler.abort("stray")
    check_llm_idle(llm)
    with refused("a request only the engine counts"):
        engine.parents["ghost"] = engine.parents.get("ghost")
    del engine.parents["ghost"]
    with refused("a held block"):
        assert engine.block_manager.allocate_slots(stray, 3)
    engine.block_manager.free(stray)
    with refused("mail nobody takes"):
        llm._mail["ghost"] = None
    del llm._mail["ghost"]
    with refused("an id still owned"):
        llm._owned.add("ghost")
    llm._owned.discard("ghost")
    check_llm_idle(llm)
