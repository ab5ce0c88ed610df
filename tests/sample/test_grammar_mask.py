"""The structured-outputs bitmask on the logits (sample/grammar_mask.py), and the device
sampler drawing a masked constrained row as any other."""

from __future__ import annotations

import pytest
import torch

from enginespec.sample.grammar_mask import apply_token_bitmask, unpack_bitmask
from enginespec.sample.sampler import Sampler
from enginespec.spec import SamplingParams, StructuredOutputsParams


def _bitmask(allowed: list[list[int]], vocab: int) -> torch.Tensor:
    """xgrammar's layout built by hand: bit t % 32 of int32 word t // 32."""
    words = torch.zeros((len(allowed), -(-vocab // 32)), dtype=torch.int64)
    for row, ids in enumerate(allowed):
        for t in ids:
            words[row, t // 32] |= 1 << (t % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # as int32 bits


def test_unpack_reads_every_bit_the_sign_bit_included():
    allowed = [[0, 31, 32, 63, 70], [5]]
    got = unpack_bitmask(_bitmask(allowed, 72), 80)  # 8 padded columns past the vocabulary
    assert [row.nonzero().flatten().tolist() for row in got] == allowed


def test_only_the_listed_rows_are_masked_and_the_input_is_untouched():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    out = apply_token_bitmask(logits, [2, 0], _bitmask([[1, 39], [7]], 40))
    assert torch.equal(logits, before)
    assert torch.equal(out[1], before[1])
    assert torch.isfinite(out[2]).nonzero().flatten().tolist() == [1, 39]
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [7]
    assert torch.equal(out[0, 7], before[0, 7])
    assert apply_token_bitmask(logits, [], _bitmask([], 40)) is logits


def test_matches_xgrammar_s_own_apply():
    xgr = pytest.importorskip("xgrammar")
    gen = torch.Generator().manual_seed(1)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, 3), generator=gen, dtype=torch.int64).to(torch.int32)
    logits = torch.randn(4, 90, generator=gen)
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask, vocab_size=90)
    assert torch.equal(apply_token_bitmask(logits, range(4), bitmask), want)


def make_request(impl, params, rid):
    return impl.new_request(rid, [1, 2, 3], params, eos_token_id=5)


def test_a_masked_constrained_row_draws_on_the_device_path(impl):
    """sample_deferred draws a constrained row like any other (the engine masks the logits
    first, once the previous step's tokens are accepted): the row takes the best token its mask
    allows, not the row's argmax."""
    logits = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    sampler = Sampler(8)
    plain = make_request(impl, SamplingParams(temperature=0.0), rid="p")
    so = StructuredOutputsParams(choice=["a"])
    constrained = make_request(impl, SamplingParams(temperature=0.0, structured_outputs=so), rid="c")
    allowed = [t for t in range(8) if t != int(logits[1].argmax())][:2]
    masked = apply_token_bitmask(logits, [1], _bitmask([allowed], 8))
    drawn = sampler.sample_deferred(masked, [plain, constrained])
    assert drawn is not None
    best = max(allowed, key=lambda t: float(logits[1, t]))
    assert drawn.token_ids.tolist() == [int(logits[0].argmax()), best]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_mask_never_makes_the_host_wait_for_the_device():
    """Under async scheduling the mask is applied while the step's forward runs: a copy that
    synchronises (a pageable upload, a host read) would make the host wait for it."""
    logits = torch.randn(4, 100, device="cuda")
    for _ in range(2):  # the second call too (cached tensors must stay on the device)
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = apply_token_bitmask(logits, [3, 0], _bitmask([[1, 99], [50]], 100))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(out[3]).nonzero().flatten().tolist() == [1, 99]
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [50]
    assert torch.equal(out[1:3], logits[1:3])
