"""A long-lived engine keeps no per-request state of requests long gone: after a few hundred
calls of one LLM, what the engine, its runner and its impl hold per request id is back to what
the requests still live need, not one entry per request ever served."""

from __future__ import annotations

import pytest

from enginespec.engine.request_ids import SEP
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9, 10, 11, 12]}]


def _fast_llm(**kwargs) -> LLM:
    return LLM(
        str(tiny_model_dir("qwen3")),
        impl="fast",
        dtype="float32",
        device="cpu",
        num_blocks=64,
        block_size=4,
        max_model_len=64,
        **kwargs,
    )


def _table_rows(llm: LLM):
    """The fast impl's batch builder's per-request block-table mirror (impls/fast/batch_buffers)."""
    (builder,) = llm.engine.impl._builders[llm.engine.block_manager].values()
    return builder._tables


def test_batch_rows_of_finished_requests_are_released_under_async_scheduling():
    """Under async scheduling (the default) a call's last requests finish for length at their
    last placeholder update, so the schedule that reports them finished is empty and builds no
    batch. The builder releases a request's row only when a built batch reports it finished:
    before the runner carried those ids to the next build, every request's row (and its block
    table, which the row keeps alive) stayed behind, one per request served, until 4096 of them
    piled up (TableRows.bound)."""
    llm = _fast_llm()
    assert llm.engine.args.async_scheduling
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    for _ in range(60):
        llm.generate(PROMPTS, params, use_tqdm=False)
    rows = _table_rows(llm)
    # the last call's two requests: their finish is reported with the next call's first batch
    assert len(rows.slot_of) <= len(PROMPTS)
    assert sum(table is not None for table in rows.table_of) <= len(PROMPTS)


def test_a_refused_add_leaves_no_speculative_counters(monkeypatch):
    """EngineCore.add_request promises that any exception leaves nothing behind. Each sample's
    speculative-decoding counters are made before the scheduler's add (EngineCore._new_sample);
    when Scheduler.add refused a sibling (an impl's own rule, an interrupt inside it) the engine
    rolled back everything else but kept those counters: one SpecDecodeStats per refused sample,
    for the life of the engine."""
    llm = _fast_llm(
        speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    )
    engine = llm.engine
    add = engine.scheduler.add

    def refuse_second(request):  # the first sibling is queued, the second refused
        if request.request_id.startswith(f"{SEP}1{SEP}"):
            raise ValueError("refused by the impl")
        add(request)

    monkeypatch.setattr(engine.scheduler, "add", refuse_second)
    for _ in range(20):
        with pytest.raises(ValueError, match="refused by the impl"):
            llm.generate(PROMPTS[0], SamplingParams(max_tokens=4, n=2), use_tqdm=False)
    assert engine.spec.request_stats == {}
    assert not engine.parents and not engine._samples and not engine.scheduler.has_unfinished
    monkeypatch.undo()
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=4, n=2), use_tqdm=False)[0]
    assert len(out.outputs) == 2  # the engine serves on
    assert engine.spec.request_stats == {}


def test_finished_ids_carried_past_empty_steps_stay_bounded():
    """Requests aborted before they were ever scheduled finish on steps that build no batch, so
    the runner carries their ids (apply_swaps, for the next build to release rows). An engine
    that keeps taking such requests and never builds must not keep one id per request: the
    carry is capped (the builder's own TableRows.bound covers rows whose id it dropped)."""
    from enginespec.worker.runner import UNBUILT_IDS

    llm = _fast_llm()
    engine = llm.engine
    for i in range(UNBUILT_IDS + 300):
        engine.add_request(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=3))
        engine.abort(f"r{i}")
        engine.step()
    assert sum(map(len, engine.runner._unbuilt)) <= UNBUILT_IDS
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in out] == [3, 3]  # the engine serves on


def test_a_step_whose_copy_drop_raises_still_carries_its_finished_ids(monkeypatch):
    """apply_swaps keeps a step's finished ids for the next build before it drops their host
    copies: a drop that raises (the step fails there) must not lose them, or the builder keeps
    those requests' rows until its own bound wipes them."""
    from enginespec.spec.scheduler import SchedulerOutput

    llm = _fast_llm()
    runner = llm.engine.runner

    def failing_drop(request_id):
        raise RuntimeError("drop failed")

    monkeypatch.setattr(runner, "drop", failing_drop)
    with pytest.raises(RuntimeError, match="drop failed"):
        runner.apply_swaps(SchedulerOutput(finished=["gone-1", "gone-2"]))
    assert [rid for ids in runner._unbuilt for rid in ids] == ["gone-1", "gone-2"]
