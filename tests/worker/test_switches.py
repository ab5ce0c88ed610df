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


def _reject_top_p():
    from enginespec.sample.sampler import reject_top_p_from_env

    return reject_top_p_from_env()


def _pdl():
    import torch

    from enginespec.kernels.pdl import pdl_enabled

    return pdl_enabled(torch.device("cuda"))  # the variable is read for a CUDA device only


def _precompile():
    from enginespec.kernels.compile_pool import precompile

    return precompile([])


def _fused_decode():
    from enginespec.impls.fast.attention import FastAttention

    return FastAttention("cpu").fuse_decode


def _eager_fused():
    from enginespec.worker.compiled import eager_fused

    return eager_fused()


def _skinny_gemm():
    from enginespec.worker.skinny_linear import resolve_switch

    return resolve_switch(None)


# The A/B switches each read at its own site: name -> what reads it there
SWITCH_SITES = {
    "ENGINESPEC_REJECT_TOP_P": _reject_top_p,
    "ENGINESPEC_PDL": _pdl,
    "ENGINESPEC_PRECOMPILE": _precompile,
    "ENGINESPEC_FUSED_DECODE": _fused_decode,
    "ENGINESPEC_EAGER_FUSED": _eager_fused,
    "ENGINESPEC_SKINNY_GEMM": _skinny_gemm,
}


@pytest.mark.parametrize("name", sorted(SWITCH_SITES))
@pytest.mark.parametrize("raw", ["fasle", "2", "disabled"])
def test_every_switch_refuses_a_value_it_does_not_know_by_name(monkeypatch, name, raw):
    """Six switches read themselves (`!= "0"`, or a list of off words): any other value, a typo
    or "false" included, silently meant on (ENGINESPEC_PDL=false kept PDL, =fasle skinny GEMMs),
    unlike ENGINESPEC_COMPILE and the others env_switch reads."""
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=rf"^{name} must be "):
        SWITCH_SITES[name]()


@pytest.mark.parametrize(
    "name",
    [
        "ENGINESPEC_REJECT_TOP_P",
        "ENGINESPEC_FUSED_DECODE",
        "ENGINESPEC_EAGER_FUSED",
        "ENGINESPEC_SKINNY_GEMM",
    ],
)
def test_the_switches_read_zero_as_off_and_one_or_unset_as_on(monkeypatch, name):
    monkeypatch.delenv(name, raising=False)
    assert SWITCH_SITES[name]() is True
    for raw, want in (("0", False), ("1", True), (" 0 ", False), ("", True)):
        monkeypatch.setenv(name, raw)
        assert SWITCH_SITES[name]() is want, raw


def test_pdl_and_precompile_read_zero_as_off(monkeypatch):
    monkeypatch.setenv("ENGINESPEC_PDL", "0")
    assert _pdl() is False
    monkeypatch.setenv("ENGINESPEC_PRECOMPILE", "0")
    assert _precompile() == 0
