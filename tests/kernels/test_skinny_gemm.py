"""The skinny GEMM kernel (kernels/skinny_gemm.py) against kernels.reference.linear_ref.

Shapes are drawn from a seeded generator (row counts 1-17, cut to a shape's row bound, N and K
not multiples of the tiles, x with a row stride wider than K); every launch shape is covered: tensor-core and broadcast
tiles, one and several K splits, with and without bias. On CPU under TRITON_INTERPRET=1 on tiny
shapes, on CUDA also on the Qwen3-0.6B projections. Split-K must leave its arrival counters at
zero (the invariant that lets launches and graph replays share them) and give the same bits
every time (its reduction runs in split order, whichever program arrives last).
"""

from __future__ import annotations

import random

import pytest
import torch

from enginespec.kernels.reference import linear_ref, rms_norm_ref, row_scaled_linear_ref, silu_mul_ref
from enginespec.kernels.silu_mul import silu_mul
from enginespec.kernels.skinny_gemm import MAX_GEMV_ROWS, SkinnyConfig, SplitBuffers, skinny_linear
from enginespec.testing.paged_batches import TOLERANCES
from enginespec.worker import gemm_tuning

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
CONFIGS = [
    SkinnyConfig(block_n=16, block_k=16, num_splits=1, use_dot=True),
    SkinnyConfig(block_n=32, block_k=16, num_splits=3, use_dot=True),
    SkinnyConfig(block_n=8, block_k=32, num_splits=1, use_dot=False),
    SkinnyConfig(block_n=16, block_k=16, num_splits=4, use_dot=False),
    SkinnyConfig(block_n=1, block_k=128, use_dot=False, gemv=True),  # one tile: K <= 90 < 128
    SkinnyConfig(block_n=4, block_k=128, use_dot=False, gemv=True, num_warps=8),
    SkinnyConfig(block_n=16, block_k=128, num_splits=1, num_stages=1),  # tensor cores, one K step
    SkinnyConfig(block_n=16, block_k=32, num_splits=3, num_stages=1),  # one step a split (K > 64)
]
FUSING = [CONFIGS[1], CONFIGS[2], CONFIGS[5], CONFIGS[6]]
FUSING_IDS = ["dot-split", "broadcast", "gemv", "one-step"]


def _shapes(seed: int, num: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 17), rng.randint(5, 70), rng.randint(9, 90)) for _ in range(num)]


# N of the one-tile kernel's row sweep, at most: its launch is N / block_n programs, each run
# one at a time under the CPU interpreter (the drawn N up to 70, times 2 for gate|up, made the
# sweep over 8 row counts minutes of CI), while what the sweep checks is each row count's
# masked rows. 13 keeps an N tail for block_n 4 (13 and gate|up's 26 are no multiple of it).
GEMV_SWEEP_MAX_N = 13


def _fused_shapes(seed: int, config: SkinnyConfig) -> list[tuple[int, int, int]]:
    """Two drawn shapes, rows cut to the config's bound; for the one-tile kernel every row
    count 1-MAX_GEMV_ROWS instead (each is a different number of masked rows in its tile),
    over the first drawn shape's K and its N cut to GEMV_SWEEP_MAX_N."""
    drawn = [(min(m, config.max_rows or m), n, k) for m, n, k in _shapes(seed, 2)]
    if not config.gemv:
        return drawn
    n, k = drawn[0][1:]
    return [(m, min(n, GEMV_SWEEP_MAX_N), k) for m in range(1, MAX_GEMV_ROWS + 1)]


def _operands(m: int, n: int, k: int, dtype, seed: int):
    """x [m, k] and weight [n, k] are views of rows wider than K whose extra columns are NaN: a
    kernel that reads past K (a K tail without its mask) gets NaN there, deterministically, and
    not only past the allocation's end."""
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(m, k + 7, generator=gen)  # a row stride wider than K
    wide[:, k:] = float("nan")
    weight = torch.full((n, k + 5), float("nan"))
    weight[:, :k] = torch.randn(n, k, generator=gen) / k**0.5
    bias = torch.randn(n, generator=gen)
    x, weight = wide.to(dtype).to(DEVICE)[:, :k], weight.to(dtype).to(DEVICE)[:, :k]
    return x, weight, bias.to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "config",
    CONFIGS,
    ids=lambda c: f"n{c.block_n}k{c.block_k}s{c.num_splits}dot{int(c.use_dot)}gemv{int(c.gemv)}",
)
def test_skinny_linear_matches_reference(dtype, config):
    buffers = SplitBuffers(DEVICE)
    for i, (m, n, k) in enumerate(_shapes(hash((config.block_n, config.num_splits)) & 0xFFFF, 3)):
        m = min(m, config.max_rows or m)
        x, weight, bias = _operands(m, n, k, dtype, seed=i)
        use_bias = bias if i % 2 else None
        got = skinny_linear(x, weight, use_bias, config, buffers)
        torch.testing.assert_close(got, linear_ref(x, weight, use_bias), **TOLERANCES[dtype])
        assert not buffers.counts.any(), "split-K must leave every arrival counter at zero"


@pytest.mark.parametrize("config", FUSING, ids=FUSING_IDS)
def test_fused_silu_mul_epilogue_matches_reference(config):
    """gate|up rows [2 I, K] -> silu(gate) * up [M, I]: the GEMM's stored values, then the
    activation in float32 rounded once."""
    buffers = SplitBuffers(DEVICE)
    for i, (m, n, k) in enumerate(_fused_shapes(7, config)):
        x, weight, bias = _operands(m, 2 * n, k, torch.bfloat16, seed=i)
        use_bias = bias if i % 2 else None
        got = skinny_linear(x, weight, use_bias, config, buffers, silu_mul=True)
        want = silu_mul_ref(linear_ref(x, weight, use_bias))
        assert got.shape == (m, n)
        torch.testing.assert_close(got, want, **TOLERANCES[torch.bfloat16])
        assert not buffers.counts.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", FUSING, ids=FUSING_IDS)
def test_norm_prologue_and_residual_epilogue_match_reference(dtype, config):
    """norm_weight: x rows RMS-normed first (rms_norm_ref's rounding); residual: added after."""
    buffers = SplitBuffers(DEVICE)
    for i, (m, n, k) in enumerate(_fused_shapes(11, config)):
        x, weight, bias = _operands(m, 2 * n, k, dtype, seed=i)
        norm_weight = (
            (1 + 0.1 * torch.randn(k, generator=torch.Generator().manual_seed(i))).to(dtype).to(DEVICE)
        )
        normed = rms_norm_ref(x, norm_weight, 1e-6)
        got = skinny_linear(x, weight, bias, config, buffers, norm_weight=norm_weight, eps=1e-6)
        torch.testing.assert_close(got, linear_ref(normed, weight, bias), **TOLERANCES[dtype])
        got = skinny_linear(
            x, weight, None, config, buffers, silu_mul=True, norm_weight=norm_weight, eps=1e-6
        )
        torch.testing.assert_close(got, silu_mul_ref(linear_ref(normed, weight, None)), **TOLERANCES[dtype])
        # a column slice of a wider tensor: its row stride is not the output's
        residual = torch.cat([x[:, :1].expand(m, 2 * n), x[:, :3]], dim=1)[:, : 2 * n]
        got = skinny_linear(x, weight, bias, config, buffers, residual=residual)
        torch.testing.assert_close(got, linear_ref(x, weight, bias) + residual, **TOLERANCES[dtype])
        assert not buffers.counts.any()


@pytest.mark.parametrize("config", FUSING, ids=FUSING_IDS)
def test_norm_epsilon_is_inside_the_root(config):
    """The fused RMSNorm is x / sqrt(mean(x^2) + eps). At eps 1e-6 against unit rows, eps moved
    outside the root (or dropped) is below the tolerance, so this runs at eps 0.5, where
    1 / sqrt(1.5) and 1 / (1 + 0.5) differ by 22%; one row and three (the one-tile kernel
    takes a single row's statistics apart from several rows')."""
    for m in (1, 3):
        x, weight, bias = _operands(m, 24, 70, torch.float32, seed=m)
        norm_weight = (1 + 0.1 * torch.randn(70, generator=torch.Generator().manual_seed(m))).to(DEVICE)
        want = linear_ref(rms_norm_ref(x, norm_weight, 0.5), weight, bias)
        got = skinny_linear(x, weight, bias, config, SplitBuffers(DEVICE), norm_weight=norm_weight, eps=0.5)
        torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])


def _row_scale_shapes(seed: int, config: SkinnyConfig) -> list[tuple[int, int, int]]:
    """_fused_shapes, fewer: one drawn shape, or for the one-tile kernel 1, 3 and 8 rows (one
    row, a ragged tile, a full one)."""
    shapes = _fused_shapes(seed, config)
    return [shapes[0], shapes[2], shapes[7]] if config.gemv else shapes[:1]


ROW_SCALING = [*FUSING, CONFIGS[0]]  # and one split of many K steps
ROW_SCALING_IDS = [*FUSING_IDS, "dot-steps"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", ROW_SCALING, ids=ROW_SCALING_IDS)
def test_row_scale_epilogue_matches_reference(dtype, config):
    """row_scale (a norm folded into the weight): each row's result times 1 / sqrt(mean(x^2) +
    eps), in float32 before the one rounding, plain and with SiLU * up. Rows of magnitudes 0.05
    to 20, so a scale taken from the wrong row, or none, is far outside the tolerance; eps 0.5
    on unit rows (float32) puts eps outside the root 22% off."""
    buffers, eps = SplitBuffers(DEVICE), 0.5 if dtype == torch.float32 else 1e-6
    for i, (m, n, k) in enumerate(_row_scale_shapes(13, config)):
        x, weight, _ = _operands(m, 2 * n, k, torch.float32, seed=i)
        x = (x * torch.logspace(-1.3, 1.3, m, device=DEVICE)[:, None]).to(dtype)
        weight = weight.to(dtype)
        got = skinny_linear(x, weight, None, config, buffers, eps=eps, row_scale=True)
        torch.testing.assert_close(got, row_scaled_linear_ref(x, weight, eps), **TOLERANCES[dtype])
        got = skinny_linear(x, weight, None, config, buffers, silu_mul=True, eps=eps, row_scale=True)
        want = silu_mul_ref(row_scaled_linear_ref(x, weight, eps))
        torch.testing.assert_close(got, want, **TOLERANCES[dtype])
        assert not buffers.counts.any()


@pytest.mark.parametrize("config", FUSING, ids=FUSING_IDS)
def test_row_scale_over_a_folded_weight_is_the_norm_then_the_gemm(config):
    """What fold_norms relies on: x @ (W diag g).T scaled by the row scale equals RMSNorm(x; g)
    @ W.T (float32: up to the reassociation)."""
    for i, (m, n, k) in enumerate(_row_scale_shapes(17, config)):
        x, weight, _ = _operands(m, n, k, torch.float32, seed=i)
        g = (1 + 0.3 * torch.randn(k, generator=torch.Generator().manual_seed(i))).to(DEVICE)
        got = skinny_linear(
            x, weight * g[None, :], None, config, SplitBuffers(DEVICE), eps=1e-5, row_scale=True
        )
        want = linear_ref(rms_norm_ref(x, g, 1e-5), weight, None)
        torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])


def test_row_scale_refuses_what_a_folded_gemm_has_none_of():
    x, weight, bias = _operands(2, 8, 16, torch.float32, seed=0)
    config = SkinnyConfig(block_n=16, block_k=16)
    kinds = {
        "bias": dict(bias=bias, eps=1e-6),
        "norm": dict(norm_weight=torch.ones(16, device=DEVICE), eps=1e-6),
        "residual": dict(residual=torch.zeros(2, 8, device=DEVICE), eps=1e-6),
        "eps": dict(eps=0.0),
    }
    for kw in kinds.values():
        args = dict(bias=None, norm_weight=None, residual=None, eps=0.0) | kw
        with pytest.raises(ValueError, match="row_scale needs eps > 0"):
            skinny_linear(x, weight, args.pop("bias"), config, row_scale=True, **args)


@pytest.mark.parametrize("fusion", ["plain", "silu", "residual"])
def test_gemv_rows_past_m_are_neither_read_nor_written(fusion):
    """The one-tile kernel's tile holds next_power_of_2(M) rows: rows M and past are masked.
    out and the residual are views of taller buffers (out's spare rows hold a sentinel, the
    residual's and x's NaN); after a launch for every M in 1-MAX_GEMV_ROWS the sentinel rows are
    unchanged and rows < M equal the reference."""
    from enginespec.kernels.skinny_gemm import _launch_gemv

    config = SkinnyConfig(block_n=4, block_k=128, use_dot=False, gemv=True)
    n, k, top = 6, 90, MAX_GEMV_ROWS + 2
    for m in range(1, MAX_GEMV_ROWS + 1):
        xs, weight, _ = _operands(top, 2 * n if fusion == "silu" else n, k, torch.float32, seed=m)
        xs[m:] = float("nan")
        res_rows = torch.full((top, n), float("nan"), device=DEVICE)
        res_rows[:m] = 0.5
        out_rows = torch.full((top, n), 7.0, device=DEVICE)
        residual = res_rows[:m] if fusion == "residual" else None
        _launch_gemv(out_rows[:m], xs[:m], weight, None, config, fusion == "silu", None, 0.0, residual, False)
        want = linear_ref(xs[:m], weight, None)
        want = silu_mul_ref(want) if fusion == "silu" else want + 0.5 if fusion == "residual" else want
        torch.testing.assert_close(out_rows[:m], want, **TOLERANCES[torch.float32])
        assert torch.equal(out_rows[m:], torch.full_like(out_rows[m:], 7.0)), f"rows past M = {m} written"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_reference(dtype):
    gen = torch.Generator().manual_seed(1)
    gate_up = (3 * torch.randn(5, 2 * 37, generator=gen)).to(dtype).to(DEVICE)
    torch.testing.assert_close(silu_mul(gate_up), silu_mul_ref(gate_up), **TOLERANCES[dtype])
    with pytest.raises(ValueError, match="gate_up"):
        silu_mul(gate_up[:, :5])


def test_split_k_is_deterministic_and_equals_one_split():
    """float32, exact operands (small integers): every split count gives the same bits."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (5, 80), generator=gen).float().to(DEVICE)
    weight = torch.randint(-3, 4, (40, 80), generator=gen).float().to(DEVICE)
    buffers = SplitBuffers(DEVICE)
    outs = [
        skinny_linear(x, weight, None, SkinnyConfig(block_n=16, block_k=16, num_splits=s), buffers)
        for s in (1, 2, 5, 5)
    ]
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    assert torch.equal(outs[0], x @ weight.T)


def test_bad_operands_are_clear_errors():
    x = torch.zeros(2, 8, device=DEVICE)
    config = SkinnyConfig(block_n=16, block_k=16)
    with pytest.raises(ValueError, match="weight"):
        skinny_linear(x, torch.zeros(4, 9, device=DEVICE), None, config)
    with pytest.raises(ValueError, match="bias"):
        skinny_linear(x, torch.zeros(4, 8, device=DEVICE), torch.zeros(3, device=DEVICE), config)
    with pytest.raises(ValueError, match="rows"):
        skinny_linear(
            torch.zeros(5, 8, device=DEVICE),
            torch.zeros(4, 8, device=DEVICE),
            None,
            SkinnyConfig(block_n=16, block_k=16, use_dot=False),
        )
    with pytest.raises(ValueError, match="gemv config takes at most 8 rows, got 9"):
        skinny_linear(
            torch.zeros(MAX_GEMV_ROWS + 1, 8, device=DEVICE),
            torch.zeros(4, 8, device=DEVICE),
            None,
            SkinnyConfig(block_n=1, block_k=8, use_dot=False, gemv=True),
        )
    with pytest.raises(ValueError, match="even"):
        skinny_linear(x, torch.zeros(5, 8, device=DEVICE), None, config, silu_mul=True)
    with pytest.raises(ValueError, match="norm_weight"):
        skinny_linear(
            x,
            torch.zeros(4, 8, device=DEVICE),
            None,
            config,
            norm_weight=torch.ones(7, device=DEVICE),
            eps=1e-6,
        )
    with pytest.raises(ValueError, match="residual"):
        skinny_linear(
            x, torch.zeros(4, 8, device=DEVICE), None, config, residual=torch.zeros(2, 5, device=DEVICE)
        )
    with pytest.raises(ValueError, match="block_n"):
        SkinnyConfig(block_n=8, block_k=16, use_dot=True)
    with pytest.raises(ValueError, match="num_splits"):
        SkinnyConfig(block_n=16, block_k=16, num_splits=0)
    with pytest.raises(ValueError, match="block_n must be a power of two >= 8"):
        SkinnyConfig(block_n=4, block_k=16, use_dot=False)  # only the one-tile kernel takes < 8
    with pytest.raises(ValueError, match="gemv configs"):
        SkinnyConfig(block_n=4, block_k=16, num_splits=2, use_dot=False, gemv=True)
    with pytest.raises(ValueError, match="K <= block_k = 8"):  # one tile must hold a whole row
        skinny_linear(torch.zeros(1, 9, device=DEVICE), torch.zeros(4, 9, device=DEVICE), None,
                      SkinnyConfig(block_n=1, block_k=8, use_dot=False, gemv=True))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 3, 8, 16, 64])
@pytest.mark.parametrize("n,k", [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)])
def test_qwen3_projection_shapes_on_cuda(rows, n, k):
    x, weight, bias = _operands(rows, n, k, torch.bfloat16, seed=rows)
    buffers = SplitBuffers(DEVICE)
    want = linear_ref(x, weight, None)
    for config in (
        SkinnyConfig(block_n=32, block_k=128, num_splits=1),
        SkinnyConfig(block_n=64, block_k=128, num_splits=4),
        SkinnyConfig(
            block_n=32, block_k=1024, num_splits=1, num_warps=8, num_stages=1
        ),  # one step where K <= 1,024
        SkinnyConfig(
            block_n=32, block_k=1024, num_splits=k // 1024, num_warps=8, num_stages=1
        ),  # one step a split: K in 1,024-long slices
        SkinnyConfig(block_n=16, block_k=256, num_splits=2, use_dot=False),
        SkinnyConfig(block_n=2, block_k=4096, use_dot=False, gemv=True),
        SkinnyConfig(block_n=4, block_k=4096, use_dot=False, gemv=True, num_warps=8),
    ):
        if rows > (config.max_rows or rows):
            continue
        got = skinny_linear(x, weight, None, config, buffers)
        torch.testing.assert_close(got, want, **TOLERANCES[torch.bfloat16])
        assert torch.equal(skinny_linear(x, weight, None, config, buffers), got)
    assert not buffers.counts.any()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("n,k", [(4096, 1024), (6144, 1024)])
def test_every_tuned_shape_scales_rows_on_cuda(rows, n, k):
    """Every launch shape the tuning offers a Qwen3-0.6B q|k|v or gate|up at 1-32 rows, with the
    row scale (and SiLU * up for gate|up), against the reference. The tuning drops a shape whose
    result is off the baseline's, which would hide a broken one; this test does not."""
    x, weight, _ = _operands(rows, n, k, torch.float32, seed=rows)
    x = (x * torch.logspace(-1, 1, rows, device=DEVICE)[:, None]).to(torch.bfloat16)
    weight, buffers, silu = weight.to(torch.bfloat16), SplitBuffers(DEVICE), n == 6144
    want = row_scaled_linear_ref(x, weight, 1e-6)
    want = silu_mul_ref(want) if silu else want
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = gemm_tuning.candidates(rows, n // 2 if silu else n, k, num_sms, silu_mul=silu)
    assert shapes
    for config in shapes:
        got = skinny_linear(x, weight, None, config, buffers, silu_mul=silu, eps=1e-6, row_scale=True)
        torch.testing.assert_close(
            got, want, **TOLERANCES[torch.bfloat16], msg=lambda m, c=config: f"{c}: {m}"
        )
    assert not buffers.counts.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_tile_over_a_long_row(dtype):
    """A row of K 12,288 (the 8B shape's down projection) in one 16,384-wide tile, with and
    without the residual: a quarter of the tile is masked, and the result is the reference's.
    The kernel takes any tile >= K; the tuning no longer offers this one (slower than the tiled
    kernel on the H200: worker/gemm_tuning.py), but a caller's config may. On CUDA at N 4,096,
    on the CPU (interpreter) at N 6."""
    n, k = (4096, 12288) if CUDA else (6, 12288)
    x, weight, _ = _operands(1, n, k, dtype, seed=12)
    residual = torch.randn(1, n, generator=torch.Generator().manual_seed(3)).to(dtype).to(DEVICE)
    config = SkinnyConfig(block_n=1, block_k=16384, use_dot=False, gemv=True, num_warps=8)
    got = skinny_linear(x, weight, None, config, SplitBuffers(DEVICE))
    torch.testing.assert_close(got, linear_ref(x, weight, None), **TOLERANCES[dtype])
    got = skinny_linear(x, weight, None, config, SplitBuffers(DEVICE), residual=residual)
    torch.testing.assert_close(got, linear_ref(x, weight, None) + residual, **TOLERANCES[dtype])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 4, 7, 16, 64])
def test_qwen3_gate_up_silu_on_cuda(rows):
    x, weight, _ = _operands(rows, 6144, 1024, torch.bfloat16, seed=rows)
    want = silu_mul_ref(linear_ref(x, weight, None))
    torch.testing.assert_close(silu_mul(linear_ref(x, weight, None)), want, **TOLERANCES[torch.bfloat16])
    buffers = SplitBuffers(DEVICE)
    for config in (
        SkinnyConfig(block_n=32, block_k=128, num_splits=1),
        SkinnyConfig(block_n=64, block_k=128, num_splits=4),
        SkinnyConfig(block_n=2, block_k=1024, use_dot=False, gemv=True),
    ):
        if rows > (config.max_rows or rows):
            continue
        got = skinny_linear(x, weight, None, config, buffers, silu_mul=True)
        torch.testing.assert_close(got, want, **TOLERANCES[torch.bfloat16])
    assert not buffers.counts.any()


@pytest.mark.parametrize("config", FUSING[:2], ids=FUSING_IDS[:2])
def test_norm_statistics_stepped_over_rows_too_long_for_one_load(monkeypatch, config):
    """Blocks of rows holding more than ROW_K_MAX_ELEMENTS take the statistics in BLOCK_K steps
    (the 8B shape's 4,096-wide rows); smaller ones in one load. Both match rms_norm_ref's normed
    rows times the weight."""
    import enginespec.kernels.skinny_gemm as sg

    x, weight, bias = _operands(3, 24, 70, torch.float32, seed=3)
    norm_weight = (1 + 0.1 * torch.randn(70, generator=torch.Generator().manual_seed(3))).to(DEVICE)
    want = linear_ref(rms_norm_ref(x, norm_weight, 1e-6), weight, bias)
    assert sg.row_k(70, 4) == 128 and sg.row_k(1024, 32) == 1024
    assert sg.row_k(2048, 32) == 0 and sg.row_k(4096, 1) == 4096 and sg.row_k(4096, 16) == 0
    for limit in (sg.ROW_K_MAX_ELEMENTS, 16):  # one load; then K steps (4 x 128 > 16)
        monkeypatch.setattr(sg, "ROW_K_MAX_ELEMENTS", limit)
        got = skinny_linear(x, weight, bias, config, SplitBuffers(DEVICE), norm_weight=norm_weight, eps=1e-6)
        torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])
