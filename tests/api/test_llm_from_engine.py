"""Several LLMs over one EngineCore (LLM.from_engine(engine), as a program wraps an engine it
built once wherever it needs the offline API): they share one lock, one request-id counter and
one mailbox, so their calls interleave as calls on one LLM do (api/llm.py's module doc). Each
call gets its own outputs; no call's error or step takes another's requests."""

from __future__ import annotations

import threading

import pytest

from enginespec.conformance.invariants import check_llm_idle
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [7 + i, 8 + 2 * i, 9, 10 + i, 3]} for i in range(8)]


def make_llm() -> LLM:
    return LLM(
        str(tiny_model_dir("qwen3")),
        impl="fast",
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=48,
        max_model_len=64,
        max_num_seqs=4,
    )


def tokens(outs) -> list:
    return [o.outputs[0].token_ids for o in outs]


def test_a_half_read_stream_of_one_wrapper_then_generate_on_another():
    """The second wrapper's request ids must not collide with the first's live ones (a
    collision failed its add and aborted the first's request), and the step it runs must mail
    the first's outputs (they were dropped: the stream then found the engine idle)."""
    first = make_llm()
    expected = tokens(first.generate(PROMPTS, GREEDY, use_tqdm=False))
    second = LLM.from_engine(first.engine)
    stream = first.stream(PROMPTS[:4], GREEDY)
    assert all(not o.finished for o in next(stream))
    assert tokens(second.generate(PROMPTS[4:], GREEDY, use_tqdm=False)) == expected[4:]
    finals = {}
    for outs in stream:
        finals.update({o.request_id: o for o in outs if o.finished})
    assert [finals[k].outputs[0].token_ids for k in sorted(finals, key=int)] == expected[:4]
    check_llm_idle(first)
    check_llm_idle(second)


def test_fresh_wrappers_from_several_threads():
    engine = make_llm().engine
    expected = tokens(LLM.from_engine(engine).generate(PROMPTS, GREEDY, use_tqdm=False))
    results, errors = {}, []

    def worker(k: int) -> None:
        try:
            for _ in range(2):
                results[k] = tokens(LLM.from_engine(engine).generate(PROMPTS[k::4], GREEDY, use_tqdm=False))
        except BaseException as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert [results[k] for k in range(4)] == [expected[k::4] for k in range(4)]
    check_llm_idle(LLM.from_engine(engine))


def test_closing_one_wrapper_closes_them_all():
    first = make_llm()
    second = LLM.from_engine(first.engine)
    first.close()
    with pytest.raises(RuntimeError, match="closed"):
        second.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
