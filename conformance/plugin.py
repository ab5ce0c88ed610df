"""pytest plugin: picks the implementation under test (minimal; the conformance work extends it)."""
from __future__ import annotations

import os

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("enginespec")
    group.addoption("--impl", default=None, help="implementation under test: reference, fast, or pkg.module:attr")


@pytest.fixture(scope="session")
def impl(request):
    from spec import load_impl
    return load_impl(request.config.getoption("--impl") or os.environ.get("ENGINESPEC_IMPL") or "reference")
