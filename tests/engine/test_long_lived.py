"""A long-lived engine keeps no per-request state of requests long gone: after a few hundred
calls of one LLM, what the engine, its runner and its impl hold per request id is back to what
the requests still live need, not one entry per request ever served."""

from __future__ import annotations

import pytest

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
