"""Paged attention kernel vs the plain-torch reference on random ragged batches.

On CPU these run under TRITON_INTERPRET=1 (repo-root conftest) on tiny shapes; on CUDA on
the model shapes we serve. Every run poisons the output with NaN first and draws fresh inputs.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from enginespec.kernels.paged_attention import LaunchConfig, paged_attention
from enginespec.kernels.reference import paged_attention_ref
from enginespec.testing.paged_batches import TOLERANCES, random_batch

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# (num_q_heads, num_kv_heads, head_dim): GQA 2, odd group 3, MHA, and a non-power-of-2 dim.
HEADS = [(16, 8, 128), (32, 8, 128), (12, 4, 80)] if CUDA else [(4, 2, 16), (6, 2, 16), (2, 2, 24)]
SIZES = (
    dict(num_reqs=12, max_seq_len=700, max_query_len=96)
    if CUDA
    else dict(num_reqs=4, max_seq_len=40, max_query_len=9)
)


def _run(batch, *, window=0, config=None, scale=None):
    out = torch.full_like(batch.q, float("nan"))
    got = paged_attention(
        batch.q,
        batch.cache,
        batch.query_start_loc,
        batch.seq_lens,
        batch.block_table,
        max_query_len=batch.max_query_len,
        max_seq_len=batch.max_seq_len,
        scale=scale,
        window=window,
        out=out,
        config=config,
    )
    want = paged_attention_ref(
        batch.q,
        batch.cache,
        batch.query_start_loc,
        batch.seq_lens,
        batch.block_table,
        scale=scale,
        window=window,
    )
    assert got.data_ptr() == out.data_ptr()
    assert not torch.isnan(got).any(), "kernel left rows unwritten or read a poisoned slot"
    torch.testing.assert_close(got.float(), want.float(), **TOLERANCES[batch.q.dtype])
    return got


def _batch(heads, block_size, dtype, seed, num_padding=0, **overrides):
    hq, hkv, d = heads
    sizes = {**SIZES, **overrides}
    return random_batch(
        sizes["num_reqs"],
        sizes["max_seq_len"],
        sizes["max_query_len"],
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        block_size=block_size,
        dtype=dtype,
        device=DEVICE,
        num_padding=num_padding,
        seed=seed,
    )


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("block_size,window", [(16, 0), (5, 0), (3, 7), (16, 300 if CUDA else 11)])
def test_mixed_batch_matches_reference(heads, block_size, window):
    seed = hash((heads, block_size, window)) % 10_000
    dtype = torch.bfloat16 if CUDA else torch.float32
    _run(_batch(heads, block_size, dtype, seed, num_padding=2), window=window)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dtypes(dtype):
    _run(_batch(HEADS[0], 16, dtype, seed=7))


@pytest.mark.parametrize("num_splits", [2, 4])
@pytest.mark.parametrize("window", [0, 13])
def test_split_kv_matches_reference(num_splits, window):
    """Few long requests: the split path with its merge pass (forced, so tiny shapes use it)."""
    batch = _batch(
        HEADS[0],
        4,
        torch.float32,
        seed=11 + num_splits,
        num_reqs=3,
        max_seq_len=2000 if CUDA else 70,
        max_query_len=3,
        num_padding=1,
    )
    config = LaunchConfig(block_m=16, tile=16, num_splits=num_splits, num_warps=4, num_stages=2)
    _run(batch, window=window, config=config)


def test_split_kv_merge_with_a_padded_head_dim():
    """Split-KV at a head_dim that is not a power of two (24 on CPU, 80 on CUDA: padded to 32 /
    128): the partials hold the padded dims, and the merge must store only the head's own. The
    output is a view of a taller buffer whose spare row holds a sentinel: a merge that stored the
    pad dims would write them into the next head (a race on a GPU) and, for the last row's last
    head, past the output."""
    batch = _batch(HEADS[2], 4, torch.float32, seed=17, num_reqs=3, max_seq_len=2000 if CUDA else 40,
                   max_query_len=3, num_padding=1)  # fmt: skip
    n = batch.q.shape[0]
    buf = torch.full((n + 1, *batch.q.shape[1:]), float("nan"), device=DEVICE)
    buf[n] = 7.0
    config = LaunchConfig(block_m=16, tile=16, num_splits=2, num_warps=4, num_stages=2)
    args = (batch.q, batch.cache, batch.query_start_loc, batch.seq_lens, batch.block_table)
    got = paged_attention(*args, max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len,
                          out=buf[:n], config=config)  # fmt: skip
    torch.testing.assert_close(got, paged_attention_ref(*args), **TOLERANCES[torch.float32])
    assert torch.equal(buf[n], torch.full_like(buf[n], 7.0)), "the merge stored past the head's dims"


def test_decode_only_heuristic_splits():
    """Decode-only batch with long contexts: the default heuristic picks split-KV on a GPU."""
    batch = _batch(
        HEADS[1],
        16,
        torch.bfloat16 if CUDA else torch.float32,
        seed=3,
        num_reqs=2,
        max_seq_len=5000 if CUDA else 60,
        max_query_len=1,
    )
    _run(batch, scale=0.3)


def test_padding_rows_are_zero_and_prefill_rows_match():
    hq, hkv, d = HEADS[0]
    batch = random_batch(
        2,
        0,
        0,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        block_size=4,
        dtype=torch.float32,
        device=DEVICE,
        num_padding=3,
        seed=5,
        lengths=([9, 4], [9, 1]),
    )
    got = _run(batch)
    assert torch.count_nonzero(got[-3:]) == 0
    assert torch.count_nonzero(got[:-3]) > 0


def test_bad_inputs_raise():
    batch = _batch(HEADS[0], 4, torch.float32, seed=1)
    args = (batch.query_start_loc, batch.seq_lens, batch.block_table)
    kw = dict(max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len)
    with pytest.raises(ValueError, match="window"):
        paged_attention(batch.q, batch.cache, *args, window=-1, **kw)
    with pytest.raises(ValueError, match="Hq"):
        paged_attention(batch.q[:, :1].repeat(1, 3, 1), batch.cache, *args, **kw)
    with pytest.raises(ValueError, match="int32"):
        paged_attention(batch.q, batch.cache, batch.query_start_loc.long(), *args[1:], **kw)


@pytest.mark.parametrize(
    "config", [None, LaunchConfig(block_m=16, tile=128, num_splits=2, num_warps=4, num_stages=2)]
)
def test_decode_launch_order_changes_nothing(config):
    """A decode-only batch served in a given order (longest first, or any permutation) gives
    the unordered result, padding requests included; 128-key split tiles too."""
    gen = torch.Generator().manual_seed(21)
    n = 9 if CUDA else 5
    seq_lens = torch.randint(1, SIZES["max_seq_len"] + 1, (n,), generator=gen).tolist()
    batch = random_batch(
        n,
        0,
        0,
        num_q_heads=HEADS[0][0],
        num_kv_heads=HEADS[0][1],
        head_dim=HEADS[0][2],
        block_size=16,
        dtype=torch.float32,
        device=DEVICE,
        num_padding=2,
        seed=22,
        lengths=(seq_lens, [1] * n),
    )
    args = (batch.q, batch.cache, batch.query_start_loc, batch.seq_lens, batch.block_table)
    kw = dict(max_query_len=1, max_seq_len=batch.max_seq_len, config=config)
    plain = paged_attention(*args, **kw)
    want = paged_attention_ref(*args)
    torch.testing.assert_close(plain, want, **TOLERANCES[torch.float32])
    longest_first = torch.argsort(batch.seq_lens, descending=True).to(torch.int32)
    shuffled = torch.randperm(n + 2, generator=gen).to(torch.int32).to(DEVICE)
    for order in (longest_first, shuffled):
        got = paged_attention(*args, order=order, out=torch.full_like(batch.q, float("nan")), **kw)
        torch.testing.assert_close(got, plain, atol=0, rtol=0)


def test_launch_order_is_refused_off_decode_batches():
    batch = _batch(HEADS[0], 4, torch.float32, seed=2, max_query_len=3)
    order = torch.arange(batch.seq_lens.shape[0], dtype=torch.int32, device=DEVICE)
    args = (batch.q, batch.cache, batch.query_start_loc, batch.seq_lens, batch.block_table)
    with pytest.raises(ValueError, match="order"):
        paged_attention(*args, max_query_len=3, max_seq_len=batch.max_seq_len, order=order)
    with pytest.raises(ValueError, match="order"):
        paged_attention(*args, max_query_len=1, max_seq_len=batch.max_seq_len, order=order[:-1])


def test_split_decode_takes_wide_tiles_where_they_fit():
    """choose_config: a split decode reads 128-key tiles (2-byte K/V on a GPU with the shared
    memory for them; always under the interpreter); unsplit or prefill-heavy launches keep 64."""
    from enginespec.kernels.paged_attention import choose_config

    device = torch.device(DEVICE)
    few = choose_config(1, 1, 16, 2, 128, 1, 4096, device)  # 2 programs: split
    assert few.num_splits > 1 and few.tile == 128
    many = choose_config(512, 512, 16, 8, 128, 1, 4096, device)  # 4096 programs: no split
    assert many.num_splits == 1 and many.tile == 64
    prefill = choose_config(4096, 1, 16, 8, 128, 4096, 4096, device)
    assert prefill.tile == 64
    if CUDA:
        assert choose_config(1, 1, 16, 2, 128, 1, 4096, device, itemsize=4).tile == 64


@pytest.mark.parametrize("num_reqs", [1, 2, 3, 4, 8, 16, 64])
@pytest.mark.parametrize("max_seq_len", [512, 4096, 40960])
def test_split_decode_stays_within_two_waves(num_reqs, max_seq_len):
    """choose_config: a decode launch's programs (requests x KV heads x splits) never exceed
    twice what the chip holds at once. A graph captured at max_model_len runs mostly empty
    splits at a short context, and past two waves those queue behind the working ones (64
    splits at batch 1 on the H200: 4 waves, up to 32% slower). A lone request with a long
    context still splits, and no split holds fewer than MIN_KEYS_PER_SPLIT keys of max_seq_len."""
    from enginespec.kernels import paged_attention as pa

    device = torch.device(DEVICE)
    cfg = pa.choose_config(num_reqs, num_reqs, 16, 8, 128, 1, max_seq_len, device)
    resident = pa._num_sms(device) * pa._programs_per_sm(device, cfg.tile, 128, cfg.num_stages, 2)
    programs = num_reqs * 8 * cfg.num_splits
    assert cfg.num_splits == 1 or programs <= 2 * resident, cfg
    assert cfg.num_splits * pa.MIN_KEYS_PER_SPLIT <= max(max_seq_len, pa.MIN_KEYS_PER_SPLIT), cfg
    if CUDA and num_reqs == 1 and max_seq_len >= 4096:  # 8 programs, 132 SMs: split
        assert cfg.num_splits > 1, cfg


class LargestOutput(TorchDispatchMode):
    """Records the most elements any one op's output tensor had (einsum's bmm, softmax, the
    mask...): what the plain-torch path allocates at once, without allocating much here. Also
    used by tests/impls/test_reference_examples.py (the reference impl's attention)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _one_prefill(num_rows, seq_len, heads=(4, 2, 16), block_size=16):
    hq, hkv, d = heads
    return random_batch(
        1,
        0,
        0,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        block_size=block_size,
        dtype=torch.float32,
        lengths=([seq_len], [num_rows]),
    )


def test_reference_scores_stay_within_the_budget(monkeypatch):
    """paged_attention_ref (FastAttention's path on the CPU) holds at most SCORE_BUDGET score
    elements at once, whatever the chunk: a prefill chunk of 8192 rows over a 100k context
    once built [Hq, 8192, 100k] float32 scores (13 GB, three copies) and the OOM killer took a
    24 GiB host. Every intermediate stays within the budget or one context's K/V."""
    from enginespec.kernels import reference

    batch = _one_prefill(256, 1024)
    budget = 16 * 4 * 1024  # 16 rows of 4 heads over 1024 keys
    monkeypatch.setattr(reference, "SCORE_BUDGET", budget, raising=False)
    args = (batch.q, batch.cache, batch.query_start_loc, batch.seq_lens, batch.block_table)
    with LargestOutput() as seen:
        paged_attention_ref(*args)
    context_kv = 1024 * 2 * 16  # one request's K (or V): [S, Hkv, D]
    assert seen.largest <= max(budget, context_kv), f"{seen.largest} elements in one tensor"


@pytest.mark.parametrize("window", [0, 5, 300])
@pytest.mark.parametrize("heads", [(4, 2, 16), (6, 2, 16), (2, 2, 24)])
def test_reference_pieces_match_one_dense_piece(monkeypatch, heads, window):
    """Rows attended in pieces (a tiny budget: a row or a few per piece, keys cut to what the
    piece can see) give what one dense masked softmax over the whole chunk gives."""
    from enginespec.kernels import reference

    batch = _batch(heads, 5, torch.float32, seed=31, num_padding=2, max_seq_len=400, max_query_len=120)
    args = (batch.q, batch.cache, batch.query_start_loc, batch.seq_lens, batch.block_table)
    dense = paged_attention_ref(*args, window=window)
    for budget in (1, heads[0] * 400 * 3 + 7):
        monkeypatch.setattr(reference, "SCORE_BUDGET", budget, raising=False)
        torch.testing.assert_close(
            paged_attention_ref(*args, window=window), dense, **TOLERANCES[torch.float32]
        )
