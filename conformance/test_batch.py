"""The flat batch: build_batch's layout on hand-built steps, and on every step of real schedules.

Hand-built cases pin the exact layout (positions, slots, logits indices, padding, prompt-logprob
rows) with values derived by hand from the spec's slot formula. The scheduled cases drive the
impl under test with the fake model and check, at every step, that the batch is the one its
SchedulerOutput describes; an impl with its own `build_batch` must produce identical tensors.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from enginespec.conformance.strategies import scenarios
from enginespec.spec import SamplingParams, SchedulerOutput, build_batch, slot_of
from enginespec.testing.fake_model import FakeModel


class FixedTables:
    """A stand-in block manager: fixed tables, so the hand-built cases control every slot."""

    def __init__(self, block_size: int, tables: dict[str, list[int]]):
        self.block_size = block_size
        self.tables = tables

    def block_table(self, request_id: str) -> list[int]:
        return list(self.tables.get(request_id, []))


def _request(impl, rid, prompt, outputs=(), computed=0, params=None):
    req = impl.new_request(rid, list(prompt), params or SamplingParams(max_tokens=8))
    for tok in outputs:
        req.append(tok)
    req.num_computed_tokens = computed
    return req


@pytest.fixture
def mixed_step(impl):
    """a: a 5-token prefill; b: a decode (3 prompt + 2 out, 4 computed); c: a mid-prompt chunk."""
    a = _request(impl, "a", [11, 12, 13, 14, 15])
    b = _request(impl, "b", [21, 22, 23], outputs=[24, 25], computed=4)
    c = _request(impl, "c", list(range(30, 40)), computed=4)
    manager = FixedTables(4, {"a": [3, 1], "b": [0, 2], "c": [5, 6, 7]})
    return SchedulerOutput(scheduled=[(a, 5), (b, 1), (c, 3)]), manager


def test_mixed_step_layout(mixed_step):
    output, manager = mixed_step
    batch = build_batch(output, manager)
    assert batch.input_ids.tolist() == [11, 12, 13, 14, 15, 25, 34, 35, 36]
    assert batch.positions.tolist() == [0, 1, 2, 3, 4, 4, 4, 5, 6]
    # slot = table[p // 4] * 4 + p % 4
    assert batch.meta.slot_mapping.tolist() == [12, 13, 14, 15, 4, 8, 24, 25, 26]
    assert batch.meta.query_start_loc.tolist() == [0, 5, 6, 9]
    assert batch.meta.seq_lens.tolist() == [5, 5, 7]
    assert batch.meta.block_table.tolist() == [[3, 1], [0, 2], [5, 6]]
    assert batch.logits_indices.tolist() == [4, 5]  # c is mid-prompt: no sample
    assert batch.sample_request_ids == ["a", "b"]
    assert (batch.meta.max_query_len, batch.meta.max_seq_len) == (5, 7)
    assert (batch.num_scheduled_tokens, batch.num_reqs) == (9, 3)
    assert batch.prompt_logprob_rows == {}


def test_dtypes_and_host_copies(mixed_step):
    batch = build_batch(*mixed_step)
    meta = batch.meta
    assert batch.input_ids.dtype == batch.positions.dtype == torch.int64
    assert meta.slot_mapping.dtype == batch.logits_indices.dtype == torch.int64
    assert meta.query_start_loc.dtype == meta.seq_lens.dtype == meta.block_table.dtype == torch.int32
    assert meta.query_start_loc_cpu.device.type == meta.seq_lens_cpu.device.type == "cpu"
    assert torch.equal(meta.query_start_loc_cpu, meta.query_start_loc.cpu())
    assert torch.equal(meta.seq_lens_cpu, meta.seq_lens.cpu())
    assert meta.num_tokens == 9 and meta.num_reqs == 3


def test_pad_to_adds_dummy_requests(mixed_step):
    batch = build_batch(*mixed_step, pad_to=12)
    meta = batch.meta
    assert batch.input_ids.tolist()[9:] == [0, 0, 0] and batch.positions.tolist()[9:] == [0, 0, 0]
    assert meta.slot_mapping.tolist()[9:] == [-1, -1, -1]
    assert meta.query_start_loc.tolist() == [0, 5, 6, 9, 10, 11, 12]
    assert meta.seq_lens.tolist() == [5, 5, 7, 0, 0, 0]
    assert meta.block_table.tolist()[3:] == [[0, 0]] * 3
    assert batch.logits_indices.tolist() == [4, 5]
    assert (batch.num_scheduled_tokens, batch.num_reqs, meta.num_reqs, meta.num_tokens) == (9, 3, 6, 12)
    unpadded = build_batch(*mixed_step, pad_to=9)
    assert unpadded.meta.slot_mapping.tolist() == build_batch(*mixed_step).meta.slot_mapping.tolist()


def test_pad_to_below_num_tokens_is_refused(mixed_step):
    with pytest.raises(ValueError, match="pad_to"):
        build_batch(*mixed_step, pad_to=8)


def test_short_block_table_is_refused(impl):
    req = _request(impl, "x", list(range(1, 10)))
    with pytest.raises(ValueError, match="'x'.*block table"):
        build_batch(SchedulerOutput(scheduled=[(req, 9)]), FixedTables(4, {"x": [0, 1]}))


def test_prompt_logprob_rows_across_chunks(impl):
    """Rows at positions < num_prompt - 1 predict prompt token p + 1; the last prompt position
    predicts the first output token, so it is a sampled row, not a prompt-logprob row."""
    params = SamplingParams(max_tokens=4, prompt_logprobs=2)
    prompt = [10, 11, 12, 13, 14]
    manager = FixedTables(2, {"p": [4, 0, 9], "q": [1]})
    first = _request(impl, "p", prompt, params=params)
    other = _request(impl, "q", [7], params=SamplingParams(max_tokens=2))
    batch = build_batch(SchedulerOutput(scheduled=[(other, 1), (first, 3)]), manager)
    assert batch.prompt_logprob_rows == {"p": ([1, 2, 3], [11, 12, 13])}
    assert batch.sample_request_ids == ["q"]
    second = _request(impl, "p", prompt, computed=3, params=params)
    batch = build_batch(SchedulerOutput(scheduled=[(second, 2)]), manager)
    assert batch.prompt_logprob_rows == {"p": ([0], [14])}
    assert batch.logits_indices.tolist() == [1] and batch.sample_request_ids == ["p"]


def test_no_prompt_logprob_rows_after_output(impl):
    """A request recomputed after preemption already reported its prompt logprobs."""
    params = SamplingParams(max_tokens=4, prompt_logprobs=1)
    req = _request(impl, "p", [10, 11, 12], outputs=[13], params=params)
    batch = build_batch(SchedulerOutput(scheduled=[(req, 4)]), FixedTables(4, {"p": [2]}))
    assert batch.prompt_logprob_rows == {}
    assert batch.logits_indices.tolist() == [3]


def _check_step(batch, output, manager):
    """The batch is exactly what `output` schedules (called before update_from_output)."""
    bs, row = manager.block_size, 0
    slots = batch.meta.slot_mapping.tolist()
    expected_samples = []
    for r, (req, n) in enumerate(output.scheduled):
        c = req.num_computed_tokens
        table = manager.block_table(req.request_id)
        assert batch.positions.tolist()[row : row + n] == list(range(c, c + n))
        assert batch.input_ids.tolist()[row : row + n] == list(req.token_ids[c : c + n])
        assert slots[row : row + n] == [slot_of(table, p, bs) for p in range(c, c + n)]
        assert int(batch.meta.seq_lens[r]) == c + n
        if c + n >= req.num_tokens:
            expected_samples.append((row + n - 1, req.request_id))
        row += n
    assert batch.num_scheduled_tokens == row == len(slots)
    assert len(set(slots)) == len(slots), "two rows of one step write the same KV slot"
    assert all(0 <= s < manager.num_blocks * bs for s in slots)
    assert list(zip(batch.logits_indices.tolist(), batch.sample_request_ids)) == expected_samples


def _assert_same_batch(a, b):
    for name in ("input_ids", "positions", "logits_indices"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name in (
        "query_start_loc",
        "seq_lens",
        "block_table",
        "slot_mapping",
        "query_start_loc_cpu",
        "seq_lens_cpu",
    ):
        assert torch.equal(getattr(a.meta, name).cpu(), getattr(b.meta, name).cpu()), f"meta.{name}"
    assert (a.meta.max_query_len, a.meta.max_seq_len, a.meta.block_size) == (
        b.meta.max_query_len,
        b.meta.max_seq_len,
        b.meta.block_size,
    )
    assert (a.sample_request_ids, a.num_scheduled_tokens, a.num_reqs, a.prompt_logprob_rows) == (
        b.sample_request_ids,
        b.num_scheduled_tokens,
        b.num_reqs,
        b.prompt_logprob_rows,
    )


@given(scenario=scenarios(max_requests=5))
def test_batches_of_a_real_schedule(impl, scenario):
    """Every step of a real schedule (chunks, preemption, prefix hits) lays out as scheduled;
    the impl's own build_batch, if it has one, builds the identical batch, padded or not."""
    manager = impl.new_block_manager(scenario.num_blocks, scenario.block_size, scenario.enable_prefix_caching)
    scheduler = impl.new_scheduler(scenario.config, manager)
    for spec_ in scenario.requests:
        scheduler.add(spec_.build(impl))
    model, own_builder = FakeModel(vocab_size=16), getattr(impl, "build_batch", None)
    for _ in range(400):
        if not scheduler.has_unfinished:
            break
        output = scheduler.schedule()
        if output.scheduled:
            batch = build_batch(output, manager)
            _check_step(batch, output, manager)
            if own_builder is not None:
                _assert_same_batch(own_builder(output, manager), batch)
                pad = batch.num_scheduled_tokens + 3
                _assert_same_batch(
                    own_builder(output, manager, pad_to=pad), build_batch(output, manager, pad_to=pad)
                )
        scheduler.update_from_output(output, model.sample(output))
    assert not scheduler.has_unfinished, "schedule did not finish"


@given(scenario=scenarios(max_requests=4), data=st.data())
def test_tables_longer_than_the_step_needs(impl, scenario, data):
    """Tables may hold more blocks than computed + scheduled tokens need (slots reserved ahead,
    e.g. for drafts). The layout must not depend on the table's length: same positions, slots,
    seq_lens and samples as the step describes, block_table rows starting with the needed part of the table, and
    an impl's own build_batch identical to the plain builder."""
    manager = impl.new_block_manager(scenario.num_blocks, scenario.block_size, scenario.enable_prefix_caching)
    scheduler = impl.new_scheduler(scenario.config, manager)
    for spec_ in scenario.requests:
        scheduler.add(spec_.build(impl))
    model, own_builder, bs = FakeModel(vocab_size=16), getattr(impl, "build_batch", None), scenario.block_size
    for _ in range(400):
        if not scheduler.has_unfinished:
            break
        output = scheduler.schedule()
        for req, n in output.scheduled:  # reserve ahead where the pool has room
            manager.allocate_slots(req, n + data.draw(st.integers(0, 2 * bs), label="extra tokens"))
        if output.scheduled:
            batch = build_batch(output, manager)
            _check_step(batch, output, manager)
            for row, (req, n) in enumerate(output.scheduled):
                need = -(-(req.num_computed_tokens + n) // bs)
                assert (
                    batch.meta.block_table[row, :need].tolist() == manager.block_table(req.request_id)[:need]
                )
            if own_builder is not None:
                _assert_same_batch(own_builder(output, manager), batch)
        for req, n in output.scheduled:  # give the reserve back before the step is applied
            manager.trim(req, req.num_computed_tokens + n)
        scheduler.update_from_output(output, model.sample(output))
    assert not scheduler.has_unfinished, "schedule did not finish"
