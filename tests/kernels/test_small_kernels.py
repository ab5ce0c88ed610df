"""KV write, fused residual add + RMSNorm, rotary and q|k|v rotary + KV write kernels vs their
plain-torch references.

Outputs are poisoned before each run (NaN-filled pool, fresh random inputs); on CPU the
kernels run under TRITON_INTERPRET=1 on tiny shapes, on CUDA on model shapes.
"""

import pytest
import torch

from enginespec.kernels.kv_write import write_kv
from enginespec.kernels.reference import (
    rms_norm_ref,
    rope_inv_freq,
    rotary_cos_sin,
    rotary_ref,
    scratch_slot,
    write_kv_ref,
)
from enginespec.kernels.rms_norm import rms_norm
from enginespec.kernels.rotary import rotary
from enginespec.testing.paged_batches import TOLERANCES

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=_gen(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,heads,dim", [(16, 8, 128), (5, 3, 24), (1, 2, 16)])
def test_write_kv_matches_reference(dtype, block_size, heads, dim):
    num_blocks, num_tokens = 12, 11
    gen = _gen(block_size)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1  # padding rows
    slots = slots.to(DEVICE)
    cache = torch.full((2, num_blocks + 1, block_size, heads, dim), float("nan"), dtype=dtype, device=DEVICE)
    want = cache.clone()
    k = _randn(num_tokens, heads, dim, dtype=dtype, seed=1)
    v = _randn(num_tokens, heads, dim, dtype=dtype, seed=2)
    write_kv(cache, k, v, slots)
    write_kv_ref(want, k, v, slots)
    # Everything but the scratch block must match bit for bit (NaN where nothing was written).
    torch.testing.assert_close(cache[:, :-1], want[:, :-1], equal_nan=True, atol=0, rtol=0)
    written = cache.view(2, -1, heads, dim)[:, slots[slots >= 0]]
    assert not torch.isnan(written).any()
    scratch = cache.view(2, -1, heads, dim)[:, scratch_slot(cache)]
    assert not torch.isnan(scratch).any(), "padding rows must write the scratch block"


def test_write_kv_bad_slots_dtype_raises():
    cache = torch.zeros(2, 3, 4, 2, 16, device=DEVICE)
    k = torch.randn(2, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv(cache, k, k, torch.zeros(2, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1024, 4096] if CUDA else [64, 40])
@pytest.mark.parametrize("fused", [False, True])
def test_rms_norm_matches_reference(dtype, hidden, fused):
    rows = 37 if CUDA else 5
    x = _randn(rows, hidden, dtype=dtype, seed=hidden)
    weight = 1 + 0.1 * _randn(hidden, dtype=dtype, seed=3)
    residual = _randn(rows, hidden, dtype=dtype, seed=4) if fused else None
    got = rms_norm(x, weight, 1e-6, residual)
    want = rms_norm_ref(x, weight, 1e-6, residual)
    if fused:
        # Exact on a GPU; the interpreter rounds float32 -> bf16 differently (1 ulp).
        exact = CUDA or dtype != torch.bfloat16
        tol = dict(atol=0, rtol=0) if exact else TOLERANCES[dtype]
        torch.testing.assert_close(got[1], want[1], **tol)
        got, want = got[0], want[0]
    assert got.dtype == dtype and not torch.isnan(got).any()
    torch.testing.assert_close(got.float(), want.float(), **TOLERANCES[dtype])


def test_rms_norm_per_head_rows():
    """Qwen3's q/k norm: the same kernel over [N, H, D] rows of one head each."""
    x = _randn(4, 3, 32, dtype=torch.float32, seed=9)
    weight = _randn(32, dtype=torch.float32, seed=10)
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5))
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, weight[:-1], 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
# rot_dim 24: a half of 12 dims, padded to 16 in the kernel (GPT-NeoX-20B's 24 of 96)
@pytest.mark.parametrize(
    "heads,dim,rot_dim", [((16, 8), 128, 128), ((3, 1), 48, 32), ((2, 2), 16, 16), ((2, 1), 40, 24)]
)
def test_rotary_matches_reference(dtype, heads, dim, rot_dim):
    num_tokens, max_pos = 9, 64
    cos, sin = rotary_cos_sin(rope_inv_freq(rot_dim, 10000.0), max_pos)
    cos, sin = cos.to(DEVICE), sin.to(DEVICE)
    positions = torch.randint(0, max_pos, (num_tokens,), generator=_gen(dim)).to(DEVICE)
    q = _randn(num_tokens, heads[0], dim, dtype=dtype, seed=5)
    k = _randn(num_tokens, heads[1], dim, dtype=dtype, seed=6)
    got_q, got_k = rotary(q, k, positions, cos, sin)
    want_q, want_k = rotary_ref(q, k, positions, cos, sin)
    for got, want in ((got_q, want_q), (got_k, want_k)):
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got.float(), want.float(), **TOLERANCES[dtype])
    assert not torch.equal(got_q, q), "rotation must change q at nonzero positions"


def _qkv_case(dtype, heads, dim, block_size, num_tokens=11, num_blocks=12):
    """A q|k|v batch with shuffled slots (two padding rows), cos/sin rows of random positions
    and a NaN-poisoned pool."""
    num_q, num_kv = heads
    gen = _gen(dim + num_q)
    qkv = _randn(num_tokens, (num_q + 2 * num_kv) * dim, dtype=dtype, seed=11)
    cos_table, sin_table = rotary_cos_sin(rope_inv_freq(dim, 10000.0), 64)
    positions = torch.randint(0, 64, (num_tokens,), generator=gen)
    # transformers' [N, D] layout: the half-dim table repeated for both halves, model dtype.
    cos = torch.cat([cos_table[positions]] * 2, dim=-1).to(dtype).to(DEVICE)
    sin = torch.cat([sin_table[positions]] * 2, dim=-1).to(dtype).to(DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[1, 6]] = -1
    cache = torch.full((2, num_blocks + 1, block_size, num_kv, dim), float("nan"), dtype=dtype, device=DEVICE)
    return qkv, cos, sin, slots.to(DEVICE), cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("heads,dim,block_size", [((16, 8), 128, 16), ((3, 1), 32, 5), ((2, 2), 16, 1)])
def test_qkv_rope_matches_reference(dtype, norm, heads, dim, block_size):
    from enginespec.kernels.qkv_rope import qkv_rope
    from enginespec.kernels.reference import qkv_rope_ref

    qkv, cos, sin, slots, cache = _qkv_case(dtype, heads, dim, block_size)
    weight = (1 + 0.1 * _randn(heads[0] + heads[1], dim, dtype=dtype, seed=12)) if norm else None
    want_cache = cache.clone()
    got = qkv_rope(qkv, cos, sin, weight, 1e-6, cache, slots, heads[0])
    want = qkv_rope_ref(qkv, cos, sin, weight, 1e-6, want_cache, slots, heads[0])
    assert got.shape == (qkv.shape[0], heads[0], dim) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOLERANCES[dtype])
    # The pool: NaN exactly where nothing was written (outside the scratch block), the rest close.
    body, want_body = cache[:, :-1], want_cache[:, :-1]
    assert torch.equal(torch.isnan(body), torch.isnan(want_body))
    torch.testing.assert_close(body.float(), want_body.float(), equal_nan=True, **TOLERANCES[dtype])
    written = cache.view(2, -1, heads[1], dim)[:, slots[slots >= 0]]
    assert not torch.isnan(written).any()
    scratch = cache.view(2, -1, heads[1], dim)[:, scratch_slot(cache)]
    assert not torch.isnan(scratch).any(), "padding rows must write the scratch block"
    # v is stored untouched: bit for bit.
    v = qkv[:, (heads[0] + heads[1]) * dim :].reshape(qkv.shape[0], heads[1], dim)
    keep = slots >= 0
    assert torch.equal(cache.view(2, -1, heads[1], dim)[1, slots[keep]], v[keep])


def test_qkv_rope_norm_epsilon_is_inside_the_root():
    """The q|k norm is x / sqrt(mean(x^2) + eps). At eps 1e-6 against unit rows, eps moved
    outside the root (or dropped) changes nothing measurable, so this runs at eps 0.5, where
    1 / sqrt(1.5) and 1 / (1 + 0.5) differ by 22%."""
    from enginespec.kernels.qkv_rope import qkv_rope
    from enginespec.kernels.reference import qkv_rope_ref

    qkv, cos, sin, slots, cache = _qkv_case(torch.float32, (3, 1), 16, 4)
    weight = 1 + 0.1 * _randn(4, 16, dtype=torch.float32, seed=14)
    want_cache = cache.clone()
    got = qkv_rope(qkv, cos, sin, weight, 0.5, cache, slots, 3)
    want = qkv_rope_ref(qkv, cos, sin, weight, 0.5, want_cache, slots, 3)
    torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])
    torch.testing.assert_close(cache[:, :-1], want_cache[:, :-1], equal_nan=True, **TOLERANCES[torch.float32])


def test_qkv_rope_is_the_composed_ops():
    """The reference equals RMSNorm per head (the merged decoder's own helper), then rotate-half
    rotary, then the K/V write: float32, so up to reassociation."""
    from enginespec.kernels.reference import qkv_rope_ref
    from enginespec.worker.merged_decoder import rms_norm as module_norm
    from enginespec.worker.merged_decoder import rotate_neox

    heads, dim = (4, 2), 16
    qkv, cos, sin, slots, cache = _qkv_case(torch.float32, heads, dim, 4)
    weight = 1 + 0.1 * _randn(6, dim, dtype=torch.float32, seed=13)
    q = qkv_rope_ref(qkv, cos, sin, weight, 1e-6, cache, slots, heads[0])
    qk = rotate_neox(module_norm(qkv[:, : 6 * dim].reshape(-1, 6, dim), weight, 1e-6), cos, sin)
    torch.testing.assert_close(q, qk[:, :4], atol=1e-6, rtol=1e-6)
    want = torch.full_like(cache, float("nan"))
    write_kv_ref(want, qk[:, 4:], qkv[:, 6 * dim :].reshape(-1, 2, dim), slots)
    torch.testing.assert_close(cache, want, equal_nan=True, atol=1e-6, rtol=1e-6)


def test_qkv_rope_bad_input_raises():
    from enginespec.kernels.qkv_rope import qkv_rope

    qkv, cos, sin, slots, cache = _qkv_case(torch.float32, (2, 1), 16, 4)
    with pytest.raises(ValueError, match="qkv must be"):
        qkv_rope(qkv[:, :-16], cos, sin, None, 1e-6, cache, slots, 2)
    with pytest.raises(ValueError, match="cos must be"):
        qkv_rope(qkv, cos[:-1], sin, None, 1e-6, cache, slots, 2)
    with pytest.raises(ValueError, match="slot_mapping"):
        qkv_rope(qkv, cos, sin, None, 1e-6, cache, slots.int(), 2)
    with pytest.raises(ValueError, match="head_dim"):
        qkv_rope(
            torch.zeros(3, 4 * 12, device=DEVICE),
            cos[:3, :12],
            sin[:3, :12],
            None,
            1e-6,
            torch.zeros(2, 3, 4, 1, 12, device=DEVICE),
            slots[:3],
            2,
        )


# ---- folded norms: the row scale inside qkv_rope and silu_mul (kernels/row_scale.py) ----------


def _row_source(n, hidden, dtype, seed):
    """Rows of a residual stream: random, with per-row magnitudes spread over 100x (the scale
    differs row to row, so a kernel that reads another row's scale fails)."""
    mags = torch.logspace(-1, 1, n)[torch.randperm(n, generator=_gen(seed))]
    return (torch.randn(n, hidden, generator=_gen(seed)) * mags[:, None]).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("hidden", [24, 1100])  # one H_BLOCK step; two (1,024 a step), ragged
def test_qkv_rope_row_scale_matches_reference(dtype, norm, hidden):
    from enginespec.kernels.qkv_rope import qkv_rope
    from enginespec.kernels.reference import qkv_rope_ref

    heads, dim = (3, 1), 32
    qkv, cos, sin, slots, cache = _qkv_case(dtype, heads, dim, 5)
    h = _row_source(qkv.shape[0], hidden, dtype, seed=hidden)
    weight = (1 + 0.1 * _randn(sum(heads), dim, dtype=dtype, seed=12)) if norm else None
    want_cache = cache.clone()
    got = qkv_rope(qkv, cos, sin, weight, 1e-6, cache, slots, 3, row_source=h, row_eps=1e-5)
    want = qkv_rope_ref(qkv, cos, sin, weight, 1e-6, want_cache, slots, 3, h, 1e-5)
    # The scaled value is rounded before the rotary (as the un-folded GEMM's output was); where
    # kernel and reference sum h^2 in another order that rounding may fall one ulp apart, and the
    # rotary's cancellation keeps that ulp of the largest value: so the half dtypes' tolerance is
    # two ulps of the largest value (rows are scaled up to 10x here).
    tol = dict(TOLERANCES[dtype])
    if dtype != torch.float32:
        tol["atol"] = 2 * torch.finfo(dtype).eps * want.abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), **tol)
    torch.testing.assert_close(cache[:, :-1].float(), want_cache[:, :-1].float(), equal_nan=True, **tol)
    # The scale reached v too: the stored v is not the raw one (rows' scales are 0.1-10).
    keep = slots >= 0
    v = qkv[:, 4 * dim :].reshape(-1, 1, dim)
    assert not torch.allclose(cache.view(2, -1, 1, dim)[1, slots[keep]].float(), v[keep].float())


def test_row_scale_is_the_norm_it_replaces():
    """The folding identity the merged decoder relies on, in float64: RMSNorm(h; g) @ W^T ==
    scale_rows_ref(h @ (W diag g)^T, h, eps), and silu_mul_ref with the row source equals
    silu_mul_ref of the normed GEMM."""
    from enginespec.kernels.reference import scale_rows_ref, silu_mul_ref

    h = _row_source(5, 24, torch.float64, seed=3).cpu()
    g = 1 + 0.3 * torch.randn(24, generator=_gen(4), dtype=torch.float64)
    w = torch.randn(16, 24, generator=_gen(5), dtype=torch.float64)
    normed = rms_norm_ref(h, g, 1e-6)
    folded = h @ (w * g[None, :]).T
    torch.testing.assert_close(scale_rows_ref(folded, h, 1e-6), normed @ w.T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        silu_mul_ref(folded, h, 1e-6), silu_mul_ref(normed @ w.T), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [24, 1100])
def test_silu_mul_row_scale_matches_reference(dtype, hidden):
    from enginespec.kernels.reference import silu_mul_ref
    from enginespec.kernels.silu_mul import silu_mul

    gate_up = _randn(7, 2 * 40, dtype=dtype, seed=21)
    h = _row_source(7, hidden, dtype, seed=22)
    got = silu_mul(gate_up, row_source=h, row_eps=1e-6)
    torch.testing.assert_close(got.float(), silu_mul_ref(gate_up, h, 1e-6).float(), **TOLERANCES[dtype])
    assert not torch.allclose(got.float(), silu_mul_ref(gate_up).float(), **TOLERANCES[dtype])


@pytest.fixture
def h_block_max(request, monkeypatch):
    """The widest step row_rms_scale reads h in (kernels/row_scale.py H_BLOCK_MAX), shrunk to 16
    so hidden 48 takes three whole static steps and 200 twelve and a ragged 8-element tail; at
    1,024, each is one masked step."""
    from enginespec.kernels import row_scale

    monkeypatch.setattr(row_scale, "H_BLOCK_MAX", request.param)
    return request.param


def _strided_row_source(n, hidden, dtype, seed):
    """_row_source's rows as a slice of wider rows: the row stride is not hidden."""
    wide = _row_source(n, hidden + 24, dtype, seed)
    return wide[:, 7 : 7 + hidden]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("hidden", [48, 200])
@pytest.mark.parametrize("h_block_max", [16, 1024], indirect=True)
def test_qkv_rope_row_scale_static_steps(dtype, rows, hidden, h_block_max):
    """The static read of h: whole steps only (48 in 16s), whole steps and a tail (200 in 16s),
    one masked step (both at 1,024); row counts 1, 3 (a padding row) and 17; a strided h."""
    from enginespec.kernels.qkv_rope import qkv_rope
    from enginespec.kernels.reference import qkv_rope_ref

    heads, dim = (3, 1), 16
    qkv, cos, sin, slots, cache = _qkv_case(dtype, heads, dim, 4, num_tokens=17)
    qkv, cos, sin, slots = qkv[:rows], cos[:rows], sin[:rows], slots[:rows]
    h = _strided_row_source(rows, hidden, dtype, seed=rows + hidden)
    weight = 1 + 0.1 * _randn(sum(heads), dim, dtype=dtype, seed=13)
    want_cache = cache.clone()
    got = qkv_rope(qkv, cos, sin, weight, 1e-6, cache, slots, 3, row_source=h, row_eps=1e-5)
    want = qkv_rope_ref(qkv, cos, sin, weight, 1e-6, want_cache, slots, 3, h, 1e-5)
    tol = dict(TOLERANCES[dtype])  # bfloat16: two ulps of the largest value (see above)
    if dtype != torch.float32:
        tol["atol"] = 2 * torch.finfo(dtype).eps * want.abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), **tol)
    torch.testing.assert_close(cache[:, :-1].float(), want_cache[:, :-1].float(), equal_nan=True, **tol)


def test_silu_mul_launch_config():
    """Unscaled: 1,024-column programs of 4 warps, as before. Row-scaled: one program a row up
    to 4,096 columns, 8 columns a thread (4-16 warps)."""
    from enginespec.kernels.silu_mul import launch_config

    assert launch_config(3072, False) == (1024, 4) and launch_config(40, False) == (64, 4)
    assert launch_config(3072, True) == (4096, 16) and launch_config(12288, True) == (4096, 16)
    assert launch_config(2000, True) == (2048, 8) and launch_config(40, True) == (64, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("hidden", [48, 200])
@pytest.mark.parametrize("inter", [40, 53])
@pytest.mark.parametrize("row_block", [16, 4096])
@pytest.mark.parametrize("h_block_max", [16], indirect=True)
def test_silu_mul_row_scale_programs(monkeypatch, dtype, rows, hidden, inter, row_block, h_block_max):
    """Row-scaled programs of at most `row_block` columns: with 16, three or four programs a
    row (53: a ragged last one), each reading h; with 4,096 one a row (a masked 64-column
    block). h in 16-element static steps (48: whole steps; 200: a tail too), strided."""
    from enginespec.kernels import silu_mul as sm
    from enginespec.kernels.reference import silu_mul_ref

    monkeypatch.setattr(sm, "ROW_SCALE_BLOCK", row_block)
    gate_up = _randn(rows, 2 * inter, dtype=dtype, seed=inter + rows)
    h = _strided_row_source(rows, hidden, dtype, seed=hidden + rows)
    got = sm.silu_mul(gate_up, row_source=h, row_eps=1e-6)
    want = silu_mul_ref(gate_up, h, 1e-6)
    assert got.shape == (rows, inter)
    torch.testing.assert_close(got.float(), want.float(), **TOLERANCES[dtype])


def test_row_source_bad_input_raises():
    from enginespec.kernels.qkv_rope import qkv_rope
    from enginespec.kernels.silu_mul import silu_mul

    qkv, cos, sin, slots, cache = _qkv_case(torch.float32, (2, 1), 16, 4)
    h = torch.ones(qkv.shape[0], 8, device=DEVICE)
    with pytest.raises(ValueError, match="row_source must be"):
        qkv_rope(qkv, cos, sin, None, 1e-6, cache, slots, 2, row_source=h[:-1], row_eps=1e-6)
    with pytest.raises(ValueError, match="row_eps must be > 0"):
        qkv_rope(qkv, cos, sin, None, 1e-6, cache, slots, 2, row_source=h, row_eps=0.0)
    with pytest.raises(ValueError, match="row_source must be"):
        silu_mul(torch.ones(3, 8, device=DEVICE), row_source=h.T, row_eps=1e-6)
