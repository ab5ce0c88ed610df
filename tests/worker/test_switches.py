"""worker/switches.py: the one parser of the 0/1 environment switches."""

from __future__ import annotations

import pytest

from enginespec.worker.switches import env_switch

NAME = "ENGINESPEC_TEST_SWITCH"


def test_env_switch_reads_unset_zero_and_one(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert env_switch(NAME) is None
    for raw, want in (("", None), ("  ", None), ("0", False), ("1", True), (" 1 ", True)):
        monkeypatch.setenv(NAME, raw)
        assert env_switch(NAME) is want, raw


@pytest.mark.parametrize("raw", ["yes", "true", "2", "01", "on"])
def test_env_switch_rejects_anything_else_by_name(monkeypatch, raw):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(ValueError, match=f"{NAME} must be 0 or 1, got '{raw}'"):
        env_switch(NAME)
