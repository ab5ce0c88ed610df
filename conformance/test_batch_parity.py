"""Batch parity: an impl's own `build_batch` must produce exactly the tensors of the plain
builder (spec/batch_layout.py), on random scheduler traces of that impl.

Each step of a Hypothesis-drawn trace (chunked prefills, prefix-cache hits, preemption by
recompute or swap, priority order, staggered arrivals, aborts, padding for CUDA graphs) is laid
out by both builders and every field is compared: values, dtypes, shapes, host copies. The batch
of the previous step is compared again after the next build, so a builder that reuses buffers
must not let a later step overwrite a batch already handed out.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from enginespec.conformance.strategies import scenarios
from enginespec.spec import build_batch as plain_build_batch
from enginespec.testing.fake_model import FakeModel

MODEL = FakeModel(vocab_size=16)
TENSOR_FIELDS = ("input_ids", "positions", "logits_indices")
META_TENSORS = (
    "query_start_loc",
    "seq_lens",
    "block_table",
    "slot_mapping",
    "query_start_loc_cpu",
    "seq_lens_cpu",
)


def assert_same_batch(got, want, context: str = "") -> None:
    """Every field equal: tensors by value, dtype and shape; host metadata by value."""
    for name in TENSOR_FIELDS:
        _same_tensor(getattr(got, name), getattr(want, name), f"{context}{name}")
    for name in META_TENSORS:
        _same_tensor(getattr(got.meta, name), getattr(want.meta, name), f"{context}meta.{name}")
    assert got.meta.query_start_loc_cpu.device.type == "cpu", f"{context}query_start_loc_cpu not on host"
    assert got.meta.seq_lens_cpu.device.type == "cpu", f"{context}seq_lens_cpu not on host"
    for name in ("block_size", "max_query_len", "max_seq_len"):
        assert getattr(got.meta, name) == getattr(want.meta, name), f"{context}meta.{name}"
    for name in ("sample_request_ids", "num_scheduled_tokens", "num_reqs", "prompt_logprob_rows"):
        assert getattr(got, name) == getattr(want, name), f"{context}{name}"


def _same_tensor(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.equal(got.cpu(), want.cpu()), f"{name}: {got.tolist()} != {want.tolist()}"


def _builder(impl):
    build = getattr(impl, "build_batch", None)
    if build is None:
        pytest.skip(f"impl {impl.name!r} has no build_batch of its own (the engine uses the plain one)")
    return build


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@given(scenario=scenarios(max_requests=6, max_tokens=6), data=st.data())
def test_build_batch_matches_plain_builder(impl, device, scenario, data):
    build = _builder(impl)
    bm = impl.new_block_manager(scenario.num_blocks, scenario.block_size, scenario.enable_prefix_caching)
    scheduler = impl.new_scheduler(scenario.config, bm)
    pending = list(scenario.requests)
    kept = None  # (batch handed out last step, its expected copy)
    for step in range(60):
        for _ in range(data.draw(st.integers(0, 2), label="arrivals")):
            if pending:
                scheduler.add(pending.pop(0).build(impl))
        if not pending and not scheduler.has_unfinished:
            break
        if scheduler.requests and data.draw(st.integers(0, 9), label="abort") == 0:
            scheduler.abort(data.draw(st.sampled_from(sorted(scheduler.requests)), label="abort id"))
        output = scheduler.schedule()
        extra = data.draw(st.one_of(st.none(), st.integers(0, 3)), label="padding")
        pad_to = None if extra is None else output.num_scheduled_tokens + extra
        got = build(output, bm, device, pad_to)
        want = plain_build_batch(output, bm, device, pad_to)
        assert got.input_ids.device.type == device and got.meta.block_table.device.type == device
        assert_same_batch(got, want, f"step {step}: ")
        if kept is not None:
            assert_same_batch(kept[0], kept[1], f"step {step - 1} after step {step} was built: ")
        kept = (got, want)
        scheduler.update_from_output(output, MODEL.sample(output))


def test_build_batch_refuses_what_the_plain_builder_refuses(impl):
    """Bad counts and short tables are ValueErrors in both builders (a fast path must not skip
    the checks)."""
    from enginespec.spec import SchedulerConfig, SchedulerOutput

    build = _builder(impl)
    bm = impl.new_block_manager(8, 4)
    r = impl.new_request("a", [1, 2, 3, 4, 5, 6], arrival_time=0.0)
    unallocated = impl.new_request("b", [1, 2], arrival_time=1.0)
    scheduler = impl.new_scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=2), bm)
    scheduler.add(r)
    scheduler.schedule()  # allocates 2 blocks for r's 6 tokens
    for bad in ([(r, 0)], [(r, 7)], [(r, 6), (unallocated, 1)]):
        output = SchedulerOutput(scheduled=bad)
        with pytest.raises(ValueError):
            plain_build_batch(output, bm)
        with pytest.raises(ValueError):
            build(output, bm)
    with pytest.raises(ValueError, match="pad_to"):
        build(SchedulerOutput(scheduled=[(r, 6)]), bm, "cpu", 3)
