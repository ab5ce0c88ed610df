"""Paged attention kernel vs the plain-torch reference on random ragged batches.

On CPU these run under TRITON_INTERPRET=1 (repo-root conftest) on tiny shapes; on CUDA on
the model shapes we serve. Every run poisons the output with NaN first and draws fresh inputs.
"""

import pytest
import torch

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
    few = choose_config(1, 1, 16, 8, 128, 1, 4096, device)  # 8 programs: split
    assert few.num_splits > 1 and few.tile == 128
    many = choose_config(512, 512, 16, 8, 128, 1, 4096, device)  # 4096 programs: no split
    assert many.num_splits == 1 and many.tile == 64
    prefill = choose_config(4096, 1, 16, 8, 128, 4096, 4096, device)
    assert prefill.tile == 64
    if CUDA:
        assert choose_config(1, 1, 16, 8, 128, 1, 4096, device, itemsize=4).tile == 64


@pytest.mark.parametrize("heads", HEADS[:2])
@pytest.mark.parametrize("num_splits", [4, 16])
def test_split_decode_merges_in_the_same_launch(heads, num_splits):
    """A split decode launch merges its splits itself (no second launch): only splits that own
    tiles run, the last to finish merges. Contexts from 0 keys (a request that owns no tile:
    its rows are zeros) to more tiles than splits, in any launch order; the arrival counts are
    all zero again after every launch (the next launch relies on it)."""
    from enginespec.kernels import paged_attention as pa

    gen = torch.Generator().manual_seed(31 + num_splits)
    n = 6
    seq_lens = [1, 3] + torch.randint(4, SIZES["max_seq_len"] + 1, (n - 2,), generator=gen).tolist()
    batch = random_batch(
        n, 0, 0, num_q_heads=heads[0], num_kv_heads=heads[1], head_dim=heads[2], block_size=4,
        dtype=torch.float32, device=DEVICE, num_padding=1, seed=32, lengths=(seq_lens, [1] * n),
    )  # fmt: skip
    config = LaunchConfig(block_m=16, tile=16, num_splits=num_splits, num_warps=4, num_stages=2)
    args = (batch.q, batch.cache, batch.query_start_loc, batch.seq_lens, batch.block_table)
    want = paged_attention_ref(*args)
    orders = [None, torch.randperm(batch.seq_lens.shape[0], generator=gen).to(torch.int32).to(DEVICE)]
    launches = []
    monkey_merge = pa._merge_splits_kernel
    try:
        pa._merge_splits_kernel = _Refused(launches)
        for order in orders:
            out = torch.full_like(batch.q, float("nan"))
            got = paged_attention(*args, max_query_len=1, max_seq_len=batch.max_seq_len, config=config,
                                  order=order, out=out)  # fmt: skip
            assert not torch.isnan(got).any()
            torch.testing.assert_close(got, want, **TOLERANCES[torch.float32])
            assert torch.count_nonzero(got[-1]) == 0, "the padding request (no key) attends to nothing"
            assert torch.count_nonzero(pa._ARRIVALS[torch.device(DEVICE)]) == 0
    finally:
        pa._merge_splits_kernel = monkey_merge
    assert launches == [], "the separate merge launch ran"


class _Refused:
    """Stands in for a kernel that must not launch: records the attempt."""

    def __init__(self, seen: list):
        self.seen = seen

    def __getitem__(self, grid):
        return lambda *a, **k: self.seen.append(grid)


COMPILE_SCRIPT = r"""
import sys
try:
    import triton
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as exc:
    print(f"no triton compiler API: {exc}"); sys.exit(3)
if "nvidia" not in backends:
    print("no nvidia backend"); sys.exit(3)
from enginespec.kernels import paged_attention as pa

fn = pa._paged_attention_kernel
consts = dict(NUM_Q_HEADS=16, NUM_KV_HEADS=8, GROUP=2, HEAD_DIM=128, HEAD_PAD=128, BLOCK_SIZE=16, BLOCK_Q=8,
              BLOCK_M=16, TILE=128, IS_SPLIT=True, USE_WINDOW=False, USE_ORDER=True, DOT_FP32=False,
              FUSED_MERGE=True, NUM_SPLITS=64)
ptrs = dict(out_ptr="*bf16", part_ptr="*fp32", q_ptr="*bf16", cache_ptr="*bf16", block_table_ptr="*i32",
            seq_lens_ptr="*i32", query_start_loc_ptr="*i32", order_ptr="*i32", sem_ptr="*i32")
sig = {name: (ptrs.get(name) or ("constexpr" if name in consts else "fp32" if name == "scale_log2" else "i32"))
       for name in fn.arg_names}
try:
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
except TypeError as exc:
    print(f"ASTSource API differs: {exc}"); sys.exit(3)
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2}).asm["ptx"]
print("atom", ptx.count("atom."), "ld.global.cg", ptx.count("ld.global.cg"))
"""


def test_fused_merge_compiles_for_sm90():
    """The split decode variant with its in-launch merge (atomics with acquire/release, loads
    past L1) compiles for an H100/H200 with triton's ptxas, also on a CPU-only machine (the
    interpreter accepts code the compiler rejects). A subprocess: TRITON_INTERPRET is off there."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE_SCRIPT], env=env, cwd=root, capture_output=True, text=True, timeout=600
    )
    if proc.returncode == 3:
        pytest.skip(proc.stdout.strip())
    assert proc.returncode == 0, proc.stderr[-4000:]
    counts = dict(zip(*[iter(proc.stdout.split())] * 2))
    assert int(counts["atom"]) >= 2, proc.stdout  # the arrival count and its reset
