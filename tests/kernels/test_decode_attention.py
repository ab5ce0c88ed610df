"""Fused decode attention (q|k norm, rotary, K/V write and attention in one launch) vs its
reference, decode_attention_ref: qkv_rope_ref, then paged_attention_ref with every query
length 1.

The pool is NaN outside every request's context, and each request's new slot is poisoned too,
so a program that reads the new key from the pool (instead of from registers) or a position
past it fails; so are the split partials, which splits that own no tile never write. On CPU
the kernel runs under TRITON_INTERPRET=1 on tiny shapes; on CUDA on the Qwen3 shapes.
"""

import pytest
import torch
import triton
import triton.language as tl

from enginespec.kernels import decode_attention as da
from enginespec.kernels import paged_attention as pa
from enginespec.kernels.decode_attention import decode_attention
from enginespec.kernels.paged_attention import LaunchConfig
from enginespec.kernels.reference import (
    decode_attention_ref,
    paged_attention_ref,
    qkv_rope_ref,
    rope_inv_freq,
    rotary_cos_sin,
    scratch_slot,
)
from enginespec.testing.paged_batches import TOLERANCES, random_batch

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# (num_q_heads, num_kv_heads, head_dim): Qwen3-0.6B's GQA 2, GQA 4, odd group 3 and MHA.
HEADS = [(16, 8, 128), (32, 8, 128), (12, 4, 64)] if CUDA else [(4, 2, 16), (6, 2, 32), (2, 2, 16)]
MAX_SEQ = 900 if CUDA else 40


@pytest.fixture(autouse=True)
def poisoned_partials(monkeypatch):
    """Split partials and the output start as NaN: a merge that reads a split which owns no
    tile (and so wrote nothing) fails, and so does a row nothing stores."""
    monkeypatch.setattr(da, "_scratch", lambda shape, device: torch.full(shape, float("nan"), device=device))
    monkeypatch.setattr(
        da,
        "_output",
        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device),
    )


def _case(heads, block_size, dtype, seed, seq_lens, norm=True, num_padding=1):
    """A decode batch (one row per request, `num_padding` padding rows at the end) with raw
    q|k|v rows, cos/sin at each row's position and per-head norm weights."""
    hq, hkv, d = heads
    batch = random_batch(
        len(seq_lens),
        max(seq_lens),
        1,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        block_size=block_size,
        dtype=dtype,
        device=DEVICE,
        num_padding=num_padding,
        seed=seed,
        lengths=(list(seq_lens), [1] * len(seq_lens)),
    )
    gen = torch.Generator().manual_seed(seed + 1)
    n = batch.seq_lens.shape[0]
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen).to(dtype).to(DEVICE)
    cos_table, sin_table = rotary_cos_sin(rope_inv_freq(d, 10000.0), MAX_SEQ + 1)
    pos = batch.positions.cpu()
    cos = torch.cat([cos_table[pos]] * 2, dim=-1).to(dtype).to(DEVICE)
    sin = torch.cat([sin_table[pos]] * 2, dim=-1).to(dtype).to(DEVICE)
    weight = (1 + 0.1 * torch.randn(hq + hkv, d, generator=gen)).to(dtype).to(DEVICE) if norm else None
    return batch, qkv, cos, sin, weight


def _check(batch, qkv, cos, sin, weight, *, window=0, config=None, order=None, scale=None, row_source=None,
           eps=1e-6):  # fmt: skip
    hq = batch.q.shape[1]
    want_cache = batch.cache.clone()
    want = decode_attention_ref(
        qkv, cos, sin, weight, eps, want_cache, batch.slot_mapping, batch.seq_lens, batch.block_table, hq,
        scale=scale, window=window, row_source=row_source, row_eps=1e-5,
    )  # fmt: skip
    cache = batch.cache.clone()
    real = batch.slot_mapping[batch.slot_mapping >= 0]
    cache.view(2, -1, *cache.shape[3:])[:, real] = float("nan")  # the new slots: written, never read
    got = decode_attention(
        qkv,
        cos,
        sin,
        weight,
        eps,
        cache,
        batch.slot_mapping,
        batch.seq_lens,
        batch.block_table,
        hq,
        max_seq_len=batch.max_seq_len,
        scale=scale,
        window=window,
        config=config,
        order=order,
        row_source=row_source,
        row_eps=1e-5,
    )
    assert got.shape == batch.q.shape and got.dtype == qkv.dtype
    assert not torch.isnan(got).any(), "a program read a poisoned slot"
    tol = TOLERANCES[qkv.dtype]
    torch.testing.assert_close(got.float(), want.float(), **tol)
    assert not got[batch.seq_lens == 0].any(), "padding rows attend to nothing"
    # The pool: every slot as the reference left it (NaN where nothing was written).
    body, want_body = cache[:, :-1], want_cache[:, :-1]
    assert torch.equal(torch.isnan(body), torch.isnan(want_body))
    torch.testing.assert_close(body.float(), want_body.float(), equal_nan=True, **tol)
    if (batch.slot_mapping < 0).any():
        padded = cache.view(2, -1, *cache.shape[3:])[:, scratch_slot(cache)]
        assert not torch.isnan(padded).any(), "padding rows write the scratch block"
    return got


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("block_size,window", [(16, 0), (5, 0), (3, 7)])
def test_matches_the_reference(heads, norm, block_size, window):
    seed = hash((heads, norm, block_size, window)) % 10_000
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [1, 2, *torch.randint(3, MAX_SEQ, (5,), generator=gen).tolist()]
    dtype = torch.bfloat16 if CUDA else torch.float32
    _check(*_case(heads, block_size, dtype, seed, seq_lens, norm), window=window)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_folded_input_norm_row_scale(norm, num_splits):
    """With row_source (a folded input norm, kernels/row_scale.py): q, k and v of each row are
    scaled by that row's norm scale first; rows' scales spread over 100x, hidden not a power of
    two and over one 1,024-element step on CUDA."""
    heads = HEADS[0]
    seq_lens = [1, 5, MAX_SEQ - 3, 17]
    dtype = torch.bfloat16 if CUDA else torch.float32
    batch, qkv, cos, sin, weight = _case(heads, 5, dtype, 31 + num_splits, seq_lens, norm)
    n, hidden = qkv.shape[0], 1100 if CUDA else 40
    gen = torch.Generator().manual_seed(32)
    mags = torch.logspace(-1, 1, n)[torch.randperm(n, generator=gen)]
    h = (torch.randn(n, hidden, generator=gen) * mags[:, None]).to(dtype).to(DEVICE)
    cfg = LaunchConfig(block_m=16, tile=16, num_splits=num_splits, num_warps=4, num_stages=2)
    got = _check(batch, qkv, cos, sin, weight, config=cfg, row_source=h)
    plain = decode_attention_ref(
        qkv, cos, sin, weight, 1e-6, batch.cache.clone(), batch.slot_mapping, batch.seq_lens, batch.block_table,
        heads[0],
    )  # fmt: skip
    assert not torch.allclose(got.float(), plain.float(), **TOLERANCES[dtype]), "the scale changed nothing"


@pytest.mark.parametrize("requests", [1, 3, 17])
@pytest.mark.parametrize("hidden,h_block_max", [(48, 16), (200, 16), (200, 1024)])
def test_folded_row_scale_static_steps(monkeypatch, requests, hidden, h_block_max):
    """The static read of h (kernels/row_scale.py): 48 in three whole 16-element steps, 200 in
    twelve and a ragged tail, or in one masked step; 1, 3 and 17 requests (and a padding row),
    two splits, h a strided slice of wider rows."""
    from enginespec.kernels import row_scale

    monkeypatch.setattr(row_scale, "H_BLOCK_MAX", h_block_max)
    gen = torch.Generator().manual_seed(requests + hidden)
    seq_lens = torch.randint(1, 24, (requests,), generator=gen).tolist()
    batch, qkv, cos, sin, weight = _case(HEADS[0], 4, torch.float32, 40 + requests, seq_lens)
    n = qkv.shape[0]
    mags = torch.logspace(-1, 1, n)[torch.randperm(n, generator=gen)]
    wide = (torch.randn(n, hidden + 24, generator=gen) * mags[:, None]).to(DEVICE)
    cfg = LaunchConfig(block_m=16, tile=16, num_splits=2, num_warps=4, num_stages=2)
    _check(batch, qkv, cos, sin, weight, config=cfg, row_source=wide[:, 5 : 5 + hidden])


@pytest.mark.parametrize("num_splits", [1, 2, 4])
@pytest.mark.parametrize("window", [0, 13])
@pytest.mark.parametrize(
    "preload,loop_tile,long_tile",
    [(False, 0, 0), (True, 0, 0), (True, 32, 0), (False, 64, 0), (True, 16, 32)],
)
def test_split_kv_with_launch_order(num_splits, window, preload, loop_tile, long_tile):
    """Forced splits (each split's partials merged), requests launched in a shuffled order;
    only split 0 writes the new K/V and counts the new key. 16-key tiles, so one split (or
    split 0 of two) walks several tiles of one request: each tile's block-table entries must
    be its own. preload: the first tile of each split comes from registers read before the
    PDL wait, the loop starts one tile later (a request of 1 or 17 keys has no pooled key past
    its first tile: the loop must not run it twice). loop_tile: the loop steps over the split's
    keys by more than a tile, masked at the split's end (not the request's). long_tile: a split
    with more than loop_tile keys past its first tile steps long_tile keys instead (the 33-key
    request's split 0 of one or two has 16 left: short steps; the longest ones take long)."""
    seq_lens = [MAX_SEQ, 1, MAX_SEQ // 2 + 3, 17, 33]  # 1-3 tiles of 16: some splits own none
    batch, qkv, cos, sin, weight = _case(HEADS[0], 4, torch.float32, 5 + num_splits, seq_lens)
    order = torch.randperm(batch.seq_lens.shape[0], generator=torch.Generator().manual_seed(num_splits))
    config = LaunchConfig(
        block_m=16,
        tile=16,
        num_splits=num_splits,
        num_warps=4,
        num_stages=2,
        preload=preload,
        loop_tile=loop_tile,
        long_tile=long_tile,
    )
    _check(batch, qkv, cos, sin, weight, window=window, config=config, order=order.to(torch.int32).to(DEVICE))


def balanced_tiles_per_split(seq_lens, tile, fill_splits, num_splits, window=0):
    """Plain-Python statement of paged_attention._balanced_tiles_per_split: the batch's tiles
    over fill_splits splits of each live row, at least the longest row's over num_splits."""
    spans = [(-(-n // tile)) - (max(n - window, 0) // tile if window else 0) for n in seq_lens]
    live = max(sum(n > 0 for n in seq_lens), 1)
    even = -(-sum(spans) // (live * fill_splits))
    return max(even, -(-max(spans) // num_splits), 1), spans


@triton.jit
def _per_split_probe(seq_lens_ptr, out_ptr, num_rows, fill_splits, num_splits, window,
                     TILE: tl.constexpr, USE_WINDOW: tl.constexpr, MAX_ROWS: tl.constexpr):  # fmt: skip
    """Row r's program stores the launch's tiles a split and row r's splits that own tiles."""
    row = tl.program_id(0)
    per = pa._balanced_tiles_per_split(
        seq_lens_ptr, num_rows, fill_splits, num_splits, window, TILE, USE_WINDOW, MAX_ROWS
    )
    seq_len = tl.load(seq_lens_ptr + row)
    tl.store(out_ptr + 2 * row, per)
    tl.store(out_ptr + 2 * row + 1, pa._balanced_active_splits(seq_len, per, window, TILE, USE_WINDOW))


@pytest.mark.parametrize(
    "seq_lens,fill_splits,num_splits,window",
    [
        ([517] * 8, 1, 4, 0),  # one context: one split a row
        ([517] * 8, 2, 4, 0),  # ... or the fill count's share of it
        ([100, 2048, 900, 1500, 300, 0], 1, 4, 0),  # mixed, a padding row
        ([8192] + [100] * 20, 1, 4, 0),  # one long row: its share is capped by num_splits
        ([0, 0, 1], 1, 2, 0),
        ([40, 700, 300], 2, 8, 100),  # a window narrows the long rows' ranges
        ([1100] + [100] * 20, 1, 4, 0),  # the long row's share binds: 9 tiles, not a multiple of 4
    ],
)
def test_balanced_tiles_per_split(seq_lens, fill_splits, num_splits, window):
    """The kernel-side share and each row's owning splits equal the plain statement; no row
    needs more than num_splits splits, every live row at least one, padding rows none."""
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    got = torch.full((len(seq_lens), 2), -1, dtype=torch.int32, device=DEVICE)
    _per_split_probe[(len(seq_lens),)](
        lens, got, len(seq_lens), fill_splits, num_splits, window, TILE=128, USE_WINDOW=window > 0,
        MAX_ROWS=pa.balance_max_rows(len(seq_lens)),
    )  # fmt: skip
    per, spans = balanced_tiles_per_split(seq_lens, 128, fill_splits, num_splits, window)
    assert got[:, 0].tolist() == [per] * len(seq_lens)
    active = got[:, 1].tolist()
    assert active == [-(-t // per) for t in spans]
    assert all((a >= 1) == (n > 0) and a <= num_splits for a, n in zip(active, seq_lens))
    if len(set(seq_lens)) == 1:
        assert set(active) == {-(-spans[0] // -(-spans[0] // fill_splits))}


@pytest.mark.parametrize("num_splits,fill_splits", [(2, 1), (4, 1), (4, 2), (8, 4)])
@pytest.mark.parametrize("window", [0, 13])
@pytest.mark.parametrize("preload,loop_tile", [(False, 0), (True, 32)])
def test_balanced_splits_match_the_reference(num_splits, fill_splits, window, preload, loop_tile):
    """Balanced split launches (LaunchConfig.balance_splits) over mixed contexts and a padding
    row, launched in a shuffled order: rows that one split owns are stored by the attention
    launch (the output starts as NaN), the others merged from the splits that own tiles (the
    partials start as NaN), and the pool is written once."""
    seq_lens = [MAX_SEQ, 1, 2, 3, 17, MAX_SEQ - 5, 5]
    batch, qkv, cos, sin, weight = _case(HEADS[0], 4, torch.float32, 70 + num_splits, seq_lens)
    order = torch.randperm(batch.seq_lens.shape[0], generator=torch.Generator().manual_seed(fill_splits))
    config = LaunchConfig(
        block_m=16, tile=16, num_splits=num_splits, num_warps=4, num_stages=2, preload=preload,
        loop_tile=loop_tile, balance_splits=fill_splits,
    )  # fmt: skip
    per, spans = balanced_tiles_per_split(batch.seq_lens.tolist(), 16, fill_splits, num_splits, window)
    if window == 0 or fill_splits > 1:  # (a 13-key window leaves every row <= 2 tiles, the share 2)
        assert any(t <= per for t in spans) and any(t > per for t in spans), "both kinds of row"
    _check(batch, qkv, cos, sin, weight, window=window, config=config, order=order.to(torch.int32).to(DEVICE))


def test_balanced_long_row_takes_more_than_the_even_share():
    """A balanced launch at ratio 1 (balanced_launches(1): as many splits as the fill count)
    where one row is far longer than the rest: the even share (the batch's tiles over the live
    rows' splits) is one tile, so the share is the long row's ceil(tiles / num_splits) instead,
    a tile count that num_splits does not divide. A share that rounded down left that row's
    last tile to no split (its keys silently dropped)."""
    seq_lens = [MAX_SEQ] + [1] * 7  # tiles of 16: 3 (CUDA: 57) and seven of 1
    batch, qkv, cos, sin, weight = _case(HEADS[0], 4, torch.float32, 90, seq_lens)
    splits, fill = da.balanced_splits(2, 1)
    config = LaunchConfig(
        block_m=16, tile=16, num_splits=splits, num_warps=4, num_stages=2, balance_splits=fill
    )
    per, spans = balanced_tiles_per_split(batch.seq_lens.tolist(), 16, fill, splits)
    even = -(-sum(spans) // (len(seq_lens) * fill))
    assert per > even and spans[0] % splits, "the longest row's share binds, at a ragged split"
    _check(batch, qkv, cos, sin, weight, config=config)


@pytest.mark.parametrize("fill_splits", [0, 1])
def test_window_starting_at_a_tile_edge(fill_splits):
    """A 13-key window over 16-key tiles where a row's first visible key (position seq_len -
    13) is the last key of a tile (28 keys: position 15), the first of one (29: 16) or position
    0 (13): the split launch and its merge (or the balanced launch, fill_splits 1) must agree
    on each row's first tile, and a tile skipped at the edge drops that row's oldest keys."""
    seq_lens = [28, 29, 13, MAX_SEQ]
    batch, qkv, cos, sin, weight = _case(HEADS[0], 4, torch.float32, 92, seq_lens)
    config = LaunchConfig(
        block_m=16, tile=16, num_splits=2, num_warps=4, num_stages=2, balance_splits=fill_splits
    )
    _check(batch, qkv, cos, sin, weight, window=13, config=config)


def test_qk_norm_epsilon_is_inside_the_root():
    """The q|k norm is x / sqrt(mean(x^2) + eps). At eps 1e-6 against unit rows, eps moved
    outside the root (or dropped) changes nothing measurable, so this runs at eps 0.5, where
    1 / sqrt(1.5) and 1 / (1 + 0.5) differ by 22%."""
    batch, qkv, cos, sin, weight = _case(HEADS[0], 5, torch.float32, 91, [1, 9, 30])
    _check(batch, qkv, cos, sin, weight, eps=0.5)


@pytest.mark.parametrize(
    "tile,loop_tile,long_tile,merge_block_d",
    [(16, 0, 0, 0), (16, 64, 0, 8), (32, 0, 0, 8), (64, 0, 0, 0), (16, 32, 128, 8)],
)
def test_preload_configs_in_the_serving_dtype(tile, loop_tile, long_tile, merge_block_d):
    """The small-batch preloading configs (ENGINESPEC_DECODE_ATTN's A/B shapes: one stage,
    many splits; a merge of 8 dims a program, 1 warp; the default's 32-key short steps and
    128-key long ones) on the serving dtype, contexts from 1 key to several tiles a split."""
    dtype = torch.bfloat16 if CUDA else torch.float32
    seq_lens = [1, 2, min(tile, MAX_SEQ), min(tile + 1, MAX_SEQ), MAX_SEQ - 3, MAX_SEQ // 3]
    batch, qkv, cos, sin, weight = _case(HEADS[0], 16, dtype, 40 + tile, seq_lens)
    config = LaunchConfig(
        block_m=16, tile=tile, num_splits=4, num_warps=4, num_stages=1 if loop_tile and not long_tile else 2, preload=True,
        loop_tile=loop_tile, long_tile=long_tile, merge_block_d=merge_block_d,
        merge_warps=1 if merge_block_d else 4,
    )  # fmt: skip
    _check(batch, qkv, cos, sin, weight, config=config)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes_default_config(dtype):
    """The heuristic config (split-KV on a GPU for few long requests) in the serving dtypes."""
    seq_lens = [MAX_SEQ, MAX_SEQ - 7, 33]
    _check(*_case(HEADS[1], 16, dtype, 21, seq_lens), scale=0.3)


def test_reference_is_the_two_references():
    """decode_attention_ref is qkv_rope_ref, then paged_attention_ref with the batch's own
    query_start_loc (one row per request): equal outputs and pools, bit for bit."""
    batch, qkv, cos, sin, weight = _case(HEADS[0], 5, torch.float32, 31, [9, 1, 30])
    hq = batch.q.shape[1]
    cache_a, cache_b = batch.cache.clone(), batch.cache.clone()
    got = decode_attention_ref(
        qkv,
        cos,
        sin,
        weight,
        1e-6,
        cache_a,
        batch.slot_mapping,
        batch.seq_lens,
        batch.block_table,
        hq,
        window=4,
    )
    q = qkv_rope_ref(qkv, cos, sin, weight, 1e-6, cache_b, batch.slot_mapping, hq)
    want = paged_attention_ref(q, cache_b, batch.query_start_loc, batch.seq_lens, batch.block_table, window=4)
    assert torch.equal(got, want)
    assert torch.equal(cache_a.nan_to_num(7.0), cache_b.nan_to_num(7.0))


def test_bad_input_raises():
    batch, qkv, cos, sin, weight = _case(HEADS[0], 16, torch.float32, 3, [5, 9], num_padding=0)
    hq = batch.q.shape[1]
    args = (batch.slot_mapping, batch.seq_lens, batch.block_table, hq)
    kw = dict(max_seq_len=9)
    with pytest.raises(ValueError, match="seq_lens must be"):
        decode_attention(
            qkv, cos, sin, weight, 1e-6, batch.cache, *args[:1], batch.seq_lens[:1], *args[2:], **kw
        )
    with pytest.raises(ValueError, match="int32"):
        decode_attention(
            qkv, cos, sin, weight, 1e-6, batch.cache, args[0], batch.seq_lens.long(), *args[2:], **kw
        )
    with pytest.raises(ValueError, match="window"):
        decode_attention(qkv, cos, sin, weight, 1e-6, batch.cache, *args, window=-1, **kw)
    with pytest.raises(ValueError, match="order"):
        decode_attention(qkv, cos, sin, weight, 1e-6, batch.cache, *args, order=batch.seq_lens[:1], **kw)
    with pytest.raises(ValueError, match="block_m 1 must be >= group 2"):
        bad = LaunchConfig(block_m=1, tile=16, num_splits=1, num_warps=4, num_stages=2)
        decode_attention(qkv, cos, sin, weight, 1e-6, batch.cache, *args, config=bad, **kw)
    with pytest.raises(ValueError, match="num_splits 3 a power of two"):
        bad = LaunchConfig(block_m=16, tile=16, num_splits=3, num_warps=4, num_stages=2)
        decode_attention(qkv, cos, sin, weight, 1e-6, batch.cache, *args, config=bad, **kw)
    with pytest.raises(ValueError, match="tile 128 must be <= 64"):
        bad = LaunchConfig(block_m=16, tile=128, num_splits=1, num_warps=4, num_stages=2, preload=True)
        decode_attention(qkv, cos, sin, weight, 1e-6, batch.cache, *args, config=bad, **kw)
    with pytest.raises(ValueError, match="loop_tile 8 must be a power of two >= 16"):
        bad = LaunchConfig(block_m=16, tile=16, num_splits=1, num_warps=4, num_stages=2, loop_tile=8)
        decode_attention(qkv, cos, sin, weight, 1e-6, batch.cache, *args, config=bad, **kw)
    with pytest.raises(ValueError, match="tile 24 must be a power of two"):
        bad = LaunchConfig(block_m=16, tile=24, num_splits=1, num_warps=4, num_stages=2)
        decode_attention(qkv, cos, sin, weight, 1e-6, batch.cache, *args, config=bad, **kw)
    with pytest.raises(ValueError, match="merge block_d 6 must be a power of two"):
        bad = LaunchConfig(block_m=16, tile=16, num_splits=2, num_warps=4, num_stages=2, merge_block_d=6)
        decode_attention(qkv, cos, sin, weight, 1e-6, batch.cache, *args, config=bad, **kw)
    with pytest.raises(ValueError, match="qkv must be"):
        decode_attention(qkv[:, :-16], cos, sin, weight, 1e-6, batch.cache, *args, **kw)


def test_env_override_reaches_small_batches_only(monkeypatch):
    """ENGINESPEC_DECODE_ATTN replaces the config's named fields for batches of at most
    max_rows rows; larger batches keep choose_config's."""
    dev = torch.device("cpu")
    base = da.decode_config(4, 16, 8, 128, 4096, dev)
    monkeypatch.setenv(
        da.DECODE_ATTN_ENV, "tile=32, splits=64,stages=1,preload=1,long_tile=64,prefetch=3,max_rows=2"
    )
    small = da.decode_config(2, 16, 8, 128, 4096, dev)
    assert (small.tile, small.num_splits, small.num_stages, small.preload) == (32, 64, 1, True)
    assert (small.long_tile, small.prefetch_tiles, base.prefetch_tiles) == (64, 3, 1)
    assert (small.block_m, small.num_warps) == (base.block_m, base.num_warps)
    assert da.decode_config(4, 16, 8, 128, 4096, dev) == base


def test_balanced_by_default_at_split_launches_of_8_rows_or_more(monkeypatch):
    """With the H200's 132 SMs and one 128-key program an SM, choose_config splits 4-16-row
    launches (8, 4 and 2 ways); decode_config balances those of at least BALANCED_MIN_ROWS rows
    over BALANCE_RATIO times as many splits, filled as choose_config's count would. Batch 1
    keeps its preloading config, 4 rows and unsplit launches (24+ rows) their plain one, and
    ENGINESPEC_DECODE_ATTN=balance=0 turns balancing off."""
    monkeypatch.delenv(da.DECODE_ATTN_ENV, raising=False)
    monkeypatch.delenv(da.PRELOAD_ROWS_ENV, raising=False)
    monkeypatch.setattr(pa, "_num_sms", lambda device: 132)
    monkeypatch.setattr(pa, "_programs_per_sm", lambda *args: 1)
    dev = torch.device("cpu")
    got = {n: da.decode_config(n, 16, 8, 128, 40960, dev) for n in (1, 4, 8, 16, 24, 64)}
    assert got[1].preload and got[1].balance_splits == 0
    assert (got[4].num_splits, got[4].balance_splits) == (8, 0)
    assert (got[8].num_splits, got[8].balance_splits) == (4 * da.BALANCE_RATIO, 4)
    assert (got[16].num_splits, got[16].balance_splits) == (2 * da.BALANCE_RATIO, 2)
    assert all((got[n].num_splits, got[n].balance_splits) == (1, 0) for n in (24, 64))
    assert got[16].tile == 128 and not got[16].preload
    for raw, want in (("balance=0", (2, 0)), ("balance=4", (8, 2))):
        monkeypatch.setenv(da.DECODE_ATTN_ENV, raw)
        cfg = da.decode_config(16, 16, 8, 128, 40960, dev)
        assert (cfg.num_splits, cfg.balance_splits) == want


def test_env_override_balance_over_a_row_range(monkeypatch):
    """balance=R balances the batch's splits, filling as choose_config's split count F would
    (LaunchConfig.balance_splits = F) over R x F splits (at most 64; `splits` still wins);
    min_rows and max_rows bound the batches it reaches; balance=0 turns it off."""
    dev = torch.device("cpu")
    monkeypatch.delenv(da.DECODE_ATTN_ENV, raising=False)
    base = {n: da.decode_config(n, 16, 8, 128, 4096, dev) for n in (1, 8, 32, 64)}
    monkeypatch.setenv(da.DECODE_ATTN_ENV, "balance=4,min_rows=2,max_rows=32")
    for n in (8, 32):
        got = da.decode_config(n, 16, 8, 128, 4096, dev)
        fill = base[n].num_splits
        assert (got.num_splits, got.balance_splits) == (min(4 * fill, 64), fill)
    assert da.decode_config(1, 16, 8, 128, 4096, dev) == base[1]
    assert da.decode_config(64, 16, 8, 128, 4096, dev) == base[64]
    monkeypatch.setenv(da.DECODE_ATTN_ENV, "balance=4,splits=2")
    assert (da.decode_config(32, 16, 8, 128, 4096, dev).num_splits, da.balanced_splits(16, 8)) == (
        2,
        (64, 16),
    )
    monkeypatch.setenv(da.DECODE_ATTN_ENV, "balance=0")
    assert da.decode_config(32, 16, 8, 128, 4096, dev).balance_splits == 0


@pytest.mark.parametrize(
    "raw,match",
    [
        ("tile=32,bogus=1", "bogus=1"),
        ("splits=3", "splits must be a power of two"),
        ("tile=x", "tile=x"),
        ("stages=0", "stages, min_rows and max_rows must be >= 1"),
        ("min_rows=0", "stages, min_rows and max_rows must be >= 1"),
    ],
)
def test_env_override_rejects_bad_values(monkeypatch, raw, match):
    monkeypatch.setenv(da.DECODE_ATTN_ENV, raw)
    with pytest.raises(ValueError, match=match):
        da.decode_config(1, 16, 8, 128, 4096, torch.device("cpu"))


def test_preload_rows_switch(monkeypatch):
    """decode_config: by default (ENGINESPEC_DECODE_PRELOAD_ROWS unset or 1) a split batch-1
    launch takes the 16-key preloaded first tile, 32-key steps for the rest or choose_config's
    128-key tiles where more than 96 keys remain (two stages) and the narrow merge; 2 rows and unsplit launches keep
    choose_config's; 0 turns it off; a bad value raises."""
    monkeypatch.delenv(da.DECODE_ATTN_ENV, raising=False)
    monkeypatch.delenv(da.PRELOAD_ROWS_ENV, raising=False)
    dev = torch.device("cpu")
    base = pa.choose_config(1, 1, 16, 8, 128, 1, 40960, dev)
    one = da.decode_config(1, 16, 8, 128, 40960, dev)
    assert one.num_splits > 1 and one.preload and one.tile == da.PRELOAD_TILE
    assert base.tile == 128  # (the CPU has no shared memory bound: choose_config's wide tiles)
    assert (one.loop_tile, one.long_tile, one.num_stages) == (32, base.tile, 2)
    assert one.num_splits == base.num_splits
    assert (one.merge_block_d, one.merge_warps) == (da.MERGE_BLOCK_D, da.MERGE_WARPS)
    monkeypatch.setenv(da.PRELOAD_ROWS_ENV, "1")
    assert da.decode_config(1, 16, 8, 128, 40960, dev) == one
    assert not da.decode_config(2, 16, 8, 128, 40960, dev).preload
    unsplit = da.decode_config(1, 16, 8, 128, 128, dev)  # one key tile's worth: no split
    assert unsplit.num_splits == 1 and not unsplit.preload
    wide_tiles_fit = pa._wide_tiles_fit
    monkeypatch.setattr(pa, "_wide_tiles_fit", lambda *args: False)  # a GPU with less shared memory
    narrow = da.decode_config(1, 16, 8, 128, 40960, dev)
    assert narrow.preload and (narrow.loop_tile, narrow.long_tile) == (32, 64)
    monkeypatch.setattr(pa, "_wide_tiles_fit", wide_tiles_fit)
    monkeypatch.setenv(da.PRELOAD_ROWS_ENV, "0")
    assert da.decode_config(1, 16, 8, 128, 40960, dev) == base
    monkeypatch.setenv(da.PRELOAD_ROWS_ENV, "-1")
    with pytest.raises(ValueError, match="ENGINESPEC_DECODE_PRELOAD_ROWS must be an int >= 0"):
        da.decode_config(1, 16, 8, 128, 40960, dev)


def test_balanced_launches_balance_the_unsplit_sizes_too(monkeypatch):
    """Inside balanced_launches(R) decode_config balances every launch of at least
    BALANCED_MIN_ROWS rows, the unsplit ones too (F = 1: R splits, each owning the batch's
    share); inside unbalanced_launches none is balanced; outside, and after a body that raised,
    the default again; R < 1 is refused."""
    monkeypatch.delenv(da.DECODE_ATTN_ENV, raising=False)
    monkeypatch.setattr(pa, "_num_sms", lambda device: 132)
    monkeypatch.setattr(pa, "_programs_per_sm", lambda *args: 1)
    dev = torch.device("cpu")

    def splits(n):
        cfg = da.decode_config(n, 16, 8, 128, 40960, dev)
        return cfg.num_splits, cfg.balance_splits

    default = {n: splits(n) for n in (4, 16, 32, 64)}
    assert default[32] == default[64] == (1, 0)
    with pytest.raises(ZeroDivisionError), da.balanced_launches(2):
        assert (splits(32), splits(64), splits(16), splits(4)) == ((2, 1), (2, 1), default[16], default[4])
        raise ZeroDivisionError
    assert {n: splits(n) for n in default} == default
    with pytest.raises(ValueError, match="ratio must be >= 1"), da.balanced_launches(0):
        pass
    assert default[16] == (4, 2)  # the default balances the 16-row split launch (F = 2)
    with da.unbalanced_launches():  # none balanced: 16 rows at its F splits, the rest as default
        assert (splits(16), splits(4), splits(32), splits(64)) == (
            (2, 0),
            default[4],
            default[32],
            default[64],
        )
        with da.balanced_launches(2):  # the innermost context rules
            assert splits(32) == (2, 1)
    assert {n: splits(n) for n in default} == default
