"""Top-p by rejection (sample/reject.py, kernels/reject_top_p.py).

- The torch rounds sample the exact nucleus distribution (chi-square against truncation's exact
  cut), at top-p values that accept in the first round and ones that need many rounds.
- The Triton rounds (interpreter on the CPU, real on CUDA) give the torch rounds' tokens for
  the same round-0 tokens and keys, with edited rows read through a row map, and a row's token
  does not depend on the other rows of the batch.
"""

from __future__ import annotations

import os

import pytest
import torch

from enginespec.kernels import sampling as sampling_kernels
from enginespec.sample.draw import draw_torch
from enginespec.sample.reject import above_and_total, refine_top_p
from enginespec.sample.rng import draw_uniforms, round_uniforms, row_key
from enginespec.sample.truncation import CutPlan, exact_thresholds

LOG2E = 1.4426950408889634
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TRITON = CUDA or os.environ.get("TRITON_INTERPRET") == "1"


def _nucleus_probs(x: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    plan = CutPlan([temperature], [0], [top_p], [0.0], x.shape[0], x.device)
    thr = exact_thresholds(x.unsqueeze(0), plan)[0]
    return torch.softmax(x.masked_fill(x < thr, float("-inf")) / temperature, dim=0)


def _round0(x, scale, keys, chunk):
    return draw_torch(x, scale, None, keys, [True] * x.shape[0], chunk=chunk)


def test_round_uniforms_extend_the_draws_counters():
    keys = [5, 2**40 + 3]
    assert torch.equal(round_uniforms(keys, 0, "cpu"), draw_uniforms(keys, "cpu"))
    assert not torch.equal(round_uniforms(keys, 1, "cpu"), round_uniforms(keys, 0, "cpu"))


def test_above_and_total_are_the_masses_above_a_pivot():
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    scale = torch.full((3,), LOG2E / 0.7)
    pivot = x[:, 7]
    above, total = above_and_total(x, scale, pivot, chunk=16)
    w = torch.softmax(x / 0.7, dim=1)
    want = (w * (x > pivot[:, None])).sum(dim=1)
    torch.testing.assert_close(above / total, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("top_p,temperature", [(0.9, 1.0), (0.3, 0.8), (0.05, 1.3)])
def test_rejection_draws_the_nucleus_distribution(top_p, temperature):
    """Many seeded draws of one row (120 tokens, logits of a peaked head and a flat tail)
    against the exact nucleus: chi-square over the nucleus, and nothing drawn outside it."""
    gen = torch.Generator().manual_seed(7)
    row = torch.cat([3 + torch.randn(6, generator=gen), torch.randn(114, generator=gen)])
    probs = _nucleus_probs(row, temperature, top_p)
    num = 6000
    x = row.expand(num, -1).contiguous()
    scale = torch.full((num,), LOG2E / temperature)
    keys = list(range(1, num + 1))
    tokens = refine_top_p(x, scale, torch.full((num,), top_p), keys, _round0(x, scale, keys, 32), chunk=32)
    counts = torch.bincount(tokens, minlength=row.shape[0]).double()
    kept = probs > 0
    assert counts[~kept].sum() == 0, "a token outside the nucleus was drawn"
    expected = probs[kept].double() * num
    chi2 = ((counts[kept] - expected) ** 2 / expected).sum().item()
    dof = int(kept.sum()) - 1
    assert chi2 < dof + 6 * (2 * max(dof, 1)) ** 0.5 + 10, (chi2, dof)


def _rows(num: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    flat = torch.randn(num, vocab, generator=gen)
    flat[::3, :5] += 6.0  # every third row peaked
    return flat


@pytest.mark.skipif(not TRITON, reason="the Triton rounds need CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("edited", [False, True])
@pytest.mark.parametrize("grid_rounds", [0, 3])
def test_device_rounds_give_the_torch_rounds_tokens(edited, grid_rounds, monkeypatch):
    """grid_rounds 0: every round in the per-row finish kernel; 3: the default split."""
    from enginespec.kernels import reject_top_p

    monkeypatch.setattr(reject_top_p, "GRID_ROUNDS", grid_rounds)
    num, vocab, chunk = 9, 300, 64
    x = _rows(num, vocab, seed=3)
    temps = torch.tensor([0.6, 1.0, 1.4] * 3)
    scale = LOG2E / temps
    top_p = torch.tensor([0.95, 0.5, 0.05, 0.8, 0.99, 0.2, 0.6, 0.9, 0.3])
    keys = [11 * i + 1 for i in range(num)]
    loose = [0, 1, 2, 4, 5, 7, 8]  # rows 3 and 6 are not loose: the rounds leave them alone
    read = x.clone()
    edit_map = None
    if edited:  # rows 1 and 5 are read from an edited copy (a bias on a few tokens)
        edit_map = torch.full((num,), -1, dtype=torch.int64)
        edit_map[1], edit_map[5] = 0, 1
        copy = torch.stack([x[1], x[5]]).clone()
        copy[:, 40:44] += 5.0
        read[1], read[5] = copy[0], copy[1]
    tokens0 = _round0(read, scale, keys, chunk)
    want = tokens0.clone()
    sub = torch.tensor(loose)
    want[sub] = refine_top_p(read[sub], scale[sub], top_p[sub], [keys[i] for i in loose], tokens0[sub], chunk)
    dev = torch.device(DEVICE)
    got = reject_top_p.refine(
        x.to(dev),
        sub.to(dev),
        scale.to(dev),
        top_p[sub].to(dev),
        torch.tensor(keys, dtype=torch.int64, device=dev),
        (0, 0),
        tokens0.clone().to(dev),
        chunk=chunk,
        edited=copy.to(dev) if edited else None,
        edit_map=edit_map.to(dev) if edited else None,
    )
    assert got.cpu().tolist() == want.tolist()
    assert not torch.equal(want[sub], tokens0[sub]), "some row must have needed a second round"
    # batch independence: each loose row alone gives the same token
    for i in loose[:3]:
        one = reject_top_p.refine(
            read[i : i + 1].to(dev),
            torch.zeros(1, dtype=torch.int64, device=dev),
            scale[i : i + 1].to(dev),
            top_p[i : i + 1].to(dev),
            torch.tensor([keys[i]], dtype=torch.int64, device=dev),
            (0, 0),
            tokens0[i : i + 1].clone().to(dev),
            chunk=chunk,
        )
        assert one.item() == want[i].item()


@pytest.mark.skipif(not TRITON, reason="needs CUDA or triton's CPU interpreter")
def test_redraw_above_the_pivot_skips_the_pivot_and_its_ties():
    """The rounds' redraw (`sampling._scan_chunk` with STRICT) walks only tokens strictly above
    the pivot: on a row where the pivot's value holds most of the weight, every target lands on
    a token above it; without STRICT (the draw's cut: x >= thr) small targets land on it."""
    import triton
    import triton.language as tl

    @triton.jit
    def pick(x_ptr, out_ptr, pivot, target, vocab, STRICT: tl.constexpr):
        tok = sampling_kernels._scan_chunk(x_ptr, 0, vocab, 5.0, 1.0, pivot, target, 8, 8, STRICT=STRICT)
        tl.store(out_ptr, tok)

    x = torch.tensor([1.0, 4.0, 4.0, 4.0, 4.0, 5.0, 2.0, 4.0], device=DEVICE)  # pivot 4 at five ids
    out = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    for target in (0.0, 0.3, 0.99):  # fractions of the weight above the pivot (2 ** 0 = 1 for id 5)
        pick[(1,)](x, out, 4.0, target, 8, STRICT=True)
        assert out.item() == 5, target
    pick[(1,)](x, out, 4.0, 0.0, 8, STRICT=False)
    assert out.item() == 1, "without STRICT the pivot's ties carry weight"


def test_a_row_shorter_than_a_chunk_draws_what_it_draws_padded_to_one():
    """A row of fewer tokens than CHUNK is drawn as one chunk of its own length
    (`draw.chunk_size`), not padded to CHUNK columns: the same tokens as the padded row (its
    padding is -inf, weight 0), both for the draw (greedy, cut and seeded rows) and for the
    rejection rounds of top-p rows."""
    from enginespec.sample.draw import CHUNK

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 96, generator=gen) * 2
    padded = torch.nn.functional.pad(x, (0, CHUNK - 96), value=float("-inf"))
    scale = torch.full((64,), LOG2E / 0.9)
    thr = torch.where(torch.arange(64) % 3 == 0, torch.tensor(float("-inf")), x.topk(7, dim=1).values[:, -1])
    keys, noisy = [row_key(i, 0) for i in range(64)], [i % 5 != 0 for i in range(64)]
    drawn = draw_torch(x, scale, thr, keys, noisy)
    assert torch.equal(drawn, draw_torch(padded, scale, thr, keys, noisy))
    top_p = torch.full((64,), 0.5)
    refined = refine_top_p(x, scale, top_p, keys, _round0(x, scale, keys, 0))
    assert torch.equal(refined, refine_top_p(padded, scale, top_p, keys, _round0(padded, scale, keys, CHUNK)))
    assert len(set(refined.tolist())) > 10, "the rows must draw many tokens for the test to mean anything"


def test_above_and_total_stay_finite_for_large_logits_at_a_low_temperature():
    """Each chunk's mass is rescaled by exp2((chunk max - row max) * x_scale) <= 1: logits near 40
    at temperature 0.05 (x_scale ~ 29) over several chunks give the softmax mass, not inf / inf."""
    x = 40.0 + torch.randn(2, 50, generator=torch.Generator().manual_seed(4))
    scale = torch.full((2,), LOG2E / 0.05)
    pivot = x[:, 3]
    above, total = above_and_total(x, scale, pivot, chunk=16)
    w = torch.softmax(x.double() / 0.05, dim=1)
    want = (w * (x > pivot[:, None])).sum(dim=1).float()
    assert torch.isfinite(above).all() and torch.isfinite(total).all()
    torch.testing.assert_close(above / total, want, rtol=1e-4, atol=1e-6)


def test_a_token_whose_mass_above_is_exactly_top_p_is_rejected():
    """The rule is strict (truncation.py's: a token stays iff the mass strictly before it is
    < top_p): weights 1, 1/2, 1/2 (exact in binary) and top_p 1/2, so the mass above token 1 is
    exactly top_p of the total and token 1 is out (the redraw can only give token 0); at top_p
    3/4 it stays."""
    x = torch.tensor([[0.0, -1.0, -1.0]])
    one = torch.ones(1)
    for top_p, want in ((0.5, 0), (0.75, 1)):
        got = refine_top_p(x, one, torch.tensor([top_p]), [3], torch.tensor([1]))
        assert got.tolist() == [want], top_p


@pytest.mark.skipif(not TRITON, reason="the Triton rounds need CUDA or TRITON_INTERPRET=1")
def test_a_redraw_skips_the_rejected_tokens_ties_as_the_device_rounds_do():
    """A rejected token's whole tie group goes with it: the redraw reads only the tokens strictly
    above the pivot, on the CPU as in kernels/reject_top_p.py, so seeded rows whose pivot ties
    hold most of the weight get the same tokens on both (a CPU redraw that kept the ties landed
    on them again and took other rounds' uniforms)."""
    from enginespec.kernels import reject_top_p

    num, chunk = 24, 8
    row = torch.tensor([5.0, 5.2, 4.9] + [4.5] * 20 + [0.0] * 9)  # ties: 80% of the weight
    x = row.expand(num, -1).contiguous()
    scale = torch.full((num,), LOG2E)
    top_p = torch.full((num,), 0.1)  # the nucleus: ids 0 and 1
    keys = [7 * i + 2 for i in range(num)]
    tokens0 = _round0(x, scale, keys, chunk)
    assert (tokens0 >= 3).sum() > num // 2, "most first draws must land in the tie group"
    want = refine_top_p(x, scale, top_p, keys, tokens0, chunk)
    dev = torch.device(DEVICE)
    got = reject_top_p.refine(
        x.to(dev),
        torch.arange(num, device=dev),
        scale.to(dev),
        top_p.to(dev),
        torch.tensor(keys, dtype=torch.int64, device=dev),
        (0, 0),
        tokens0.clone().to(dev),
        chunk=chunk,
    )
    assert got.cpu().tolist() == want.tolist() and set(want.tolist()) <= {0, 1}
