"""The seeded soak (conformance/soak.py), smaller than benchmarks/soak.py: every block free at
the end, and no greedy token differs from an unpressured run."""

from __future__ import annotations

import pytest

from enginespec.conformance.soak import run_soak

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_one_thread")]


def test_soak_leaks_nothing_and_returns_no_wrong_token(impl):
    figures = run_soak(impl, num_requests=1200, seed=1)
    assert figures.requests == 1200
    assert figures.faults_injected > 0 and figures.preemptions > 0 and figures.aborts > 0
    assert figures.blocks_leaked == 0
    assert figures.wrong_tokens == 0
