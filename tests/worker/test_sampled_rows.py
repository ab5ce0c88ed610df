"""worker/runner.sampled_rows: the rows of a step's hidden states that sample. A steady decode
step takes rows 0..num_reqs-1 as a view; every other layout indexes by logits_indices. Either
way the rows equal hidden[batch.logits_indices], for the spec's batch layout and the impl's."""

from __future__ import annotations

import pytest
import torch

from enginespec.spec import SamplingParams, SchedulerOutput
from enginespec.spec import build_batch as spec_build_batch
from enginespec.worker.runner import sampled_rows

from .test_flat_model import ShuffledTables

PARAMS = SamplingParams(max_tokens=4)


def _request(impl, rid: str, num_tokens: int, num_computed: int):
    req = impl.new_request(rid, list(range(3, 3 + num_tokens)), PARAMS)
    req.num_computed_tokens = num_computed
    return req


# (tokens, computed, scheduled) per request
LAYOUTS = {
    "decodes": [(6, 5, 1), (9, 8, 1), (4, 3, 1)],
    "decodes_and_a_chunk": [(6, 5, 1), (12, 2, 5), (4, 3, 1)],
    "a_one_token_chunk_that_does_not_sample": [(6, 5, 1), (9, 2, 1), (4, 3, 1)],
    "a_finishing_chunk": [(6, 5, 1), (9, 4, 5)],
}


@pytest.mark.parametrize("builder", ["spec", "impl"])
@pytest.mark.parametrize("pad_to", [None, 8])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sampled_rows_are_the_logits_rows(impl, builder, pad_to, layout):
    reqs = [_request(impl, f"r{i}", *shape[:2]) for i, shape in enumerate(LAYOUTS[layout])]
    scheduled = [(r, shape[2]) for r, shape in zip(reqs, LAYOUTS[layout])]
    output = SchedulerOutput(scheduled=scheduled)
    tables = ShuffledTables(64, 4, [r.request_id for r in reqs])
    build = getattr(impl, "build_batch", None) if builder == "impl" else spec_build_batch
    if build is None:
        pytest.skip(f"impl {impl.name!r} uses the spec's build_batch")
    num_tokens = sum(shape[2] for shape in LAYOUTS[layout])
    batch = build(output, tables, "cpu", pad_to=max(pad_to or 0, num_tokens) if pad_to else None)
    hidden = torch.randn(batch.input_ids.shape[0], 5, generator=torch.Generator().manual_seed(1))
    got = sampled_rows(hidden, batch)
    assert torch.equal(got, hidden[batch.logits_indices])
    steady = layout == "decodes"
    assert (got.data_ptr() == hidden.data_ptr()) == steady  # a view of the first rows, or a copy
