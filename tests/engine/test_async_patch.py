"""engine/async_scheduling.apply_patch: a step's placeholder rows take the previous step's
sampled ids, whether the rows and sources are runs of consecutive indices (steady decode: one
slice copy) or scattered (requests joined, left or reordered: gather and scatter)."""

from __future__ import annotations

import random

import pytest
import torch

from enginespec.engine.async_scheduling import _is_run, apply_patch


def _patched(rows, src, n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    input_ids = torch.arange(100, 100 + n, dtype=torch.int64)
    ids = torch.arange(500, 500 + n, dtype=torch.int64)
    want = input_ids.clone()
    for r, s in zip(rows, src):
        want[r] = ids[s]
    apply_patch(input_ids, rows, src, ids)
    return input_ids, want


@pytest.mark.parametrize(
    "rows,src",
    [
        ([0, 1, 2, 3], [0, 1, 2, 3]),  # steady decode
        ([2, 3, 4], [0, 1, 2]),  # runs at different starts (a prefill chunk ahead of them)
        ([0, 1, 2], [1, 2, 3]),  # the request before them finished
        ([0, 2, 5], [0, 1, 2]),  # rows scattered (mixed step)
        ([0, 1, 2], [2, 0, 1]),  # sources reordered
        ([7], [3]),
        ([], []),
    ],
)
def test_apply_patch_puts_each_source_id_in_its_row(rows, src):
    got, want = _patched(rows, src)
    assert torch.equal(got, want)


def test_apply_patch_random_cases_match_indexing():
    rng = random.Random(0)
    for _ in range(200):
        k = rng.randint(1, 6)
        if rng.random() < 0.5:
            start_r, start_s = rng.randint(0, 6), rng.randint(0, 6)
            rows, src = list(range(start_r, start_r + k)), list(range(start_s, start_s + k))
        else:
            rows, src = sorted(rng.sample(range(12), k)), rng.sample(range(12), k)
        got, want = _patched(rows, src)
        assert torch.equal(got, want), (rows, src)


def test_is_run():
    assert _is_run([4]) and _is_run([0, 1, 2]) and _is_run([5, 6])
    assert not _is_run([0, 2]) and not _is_run([0, 2, 1, 3]) and not _is_run([3, 2, 1, 0])
