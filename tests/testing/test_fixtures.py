"""The suite's shared fixtures (enginespec.testing.fixtures) that do more than set a folder."""

from __future__ import annotations

import torch

from enginespec.testing import fixtures


def _run_release(monkeypatch, initialized: bool, reserved: int) -> list[str]:
    """Drive release_cuda_cache's body once (as pytest would around a test) with torch's CUDA
    state faked; return what it asked of the allocator."""
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: reserved)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(fixtures.gc, "collect", lambda *a: calls.append("collect") or 0)
    body = fixtures.release_cuda_cache.__wrapped__()
    next(body)  # the test runs here
    assert next(body, "ended") == "ended"
    return calls


def test_release_cuda_cache_collects_then_empties_torchs_cache_past_the_bound(monkeypatch):
    big = fixtures.CUDA_CACHE_RELEASE_BYTES + 1
    assert _run_release(monkeypatch, True, big) == ["collect", "empty_cache"]  # garbage first


def test_release_cuda_cache_does_nothing_without_cuda_or_below_the_bound(monkeypatch):
    assert _run_release(monkeypatch, False, 10 * fixtures.CUDA_CACHE_RELEASE_BYTES) == []
    assert _run_release(monkeypatch, True, fixtures.CUDA_CACHE_RELEASE_BYTES) == []
