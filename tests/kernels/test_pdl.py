"""Programmatic dependent launch (kernels/pdl.py) in the GEMV, the tiled GEMM, attention (decode attention
too), q|k|v, RMSNorm and SiLU*up kernels, compiled for an H100/H200 (sm_90) with triton's ptxas on any machine
(tests/kernels/sm90.py): each
kernel's PTX has its griddepcontrol.wait, what it reads before the wait is only what no kernel
of the chain writes, and no global store comes before it (a store there could land while the
kernel before still reads the same scratch)."""

import pytest
import torch

from enginespec.kernels import pdl

from .sm90 import compile_script

SCRIPT = r"""
from enginespec.kernels import decode_attention as da, paged_attention as pa, pdl, qkv_rope as qr
from enginespec.kernels import gather_rows as gr, rms_norm as rn, silu_mul as sm, skinny_gemm as sg
if pdl.gdc_wait is None:
    print("this triton has no gdc_wait"); sys.exit(3)


def sig_of(fn, consts, ptrs, floats=()):
    return {n: "constexpr" if n in consts else ptrs.get(n) or ("fp32" if n in floats else "i32")
            for n in fn.arg_names}


def report(name, ptx):
    lines = ptx.splitlines()
    wait = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    trig = [i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line]
    loads = [i for i, line in enumerate(lines) if "ld.global" in line]
    stores = [i for i, line in enumerate(lines) if "st.global" in line]
    prefetches = [i for i, line in enumerate(lines) if "prefetch.global.L2" in line]
    w = wait[0] if wait else -1
    bars = [i for i, line in enumerate(lines) if "bar.sync" in line or "barrier.sync" in line]
    b = next((i for i in bars if i > w), len(lines))  # the first barrier after the wait
    print(name, len(wait), len(trig), sum(i < w for i in loads), sum(i > w for i in loads),
          sum(i < w for i in stores), sum(i > w for i in stores), sum(i < w for i in prefetches),
          sum(i > w for i in prefetches), sum(i > b for i in loads))


att = dict(NUM_Q_HEADS=16, GROUP=2, HEAD_DIM=128, HEAD_PAD=128, BLOCK_SIZE=16, BLOCK_Q=8, BLOCK_M=16,
           TILE=128, IS_SPLIT=True, USE_WINDOW=False, USE_ORDER=True, DOT_FP32=False, USE_PDL=True)
ptrs = dict(out_ptr="*bf16", part_ptr="*fp32", q_ptr="*bf16", cache_ptr="*bf16", block_table_ptr="*i32",
            seq_lens_ptr="*i32", query_start_loc_ptr="*i32", order_ptr="*i32")
fn = pa._paged_attention_kernel
report("attention", ptx_of(fn, sig_of(fn, att, ptrs, ("scale_log2",)), att, {"num_warps": 4, "num_stages": 2}))
dec = dict(NUM_Q_HEADS=16, NUM_KV_HEADS=8, GROUP=2, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_M=16, TILE=128,
           IS_SPLIT=True, USE_WINDOW=False, USE_ORDER=True, USE_NORM=True, DOT_FP32=False, USE_PDL=True,
           LINE=64, PRELOAD=False, LOOP_TILE=128, LONG_TILE=0, PREFETCH_TILES=1, HIDDEN=1024, H_BLOCK=1024,
           USE_ROW_SCALE=False, BALANCE=False, MAX_ROWS=16)
ptrs = dict(out_ptr="*bf16", part_ptr="*fp32", cache_ptr="*bf16", qkv_ptr="*bf16", cos_ptr="*bf16",
            sin_ptr="*bf16", norm_ptr="*bf16", slot_ptr="*i64", block_table_ptr="*i32", seq_lens_ptr="*i32",
            order_ptr="*i32", h_ptr="*bf16")
fn = da._decode_attention_kernel
fl = ("scale_log2", "eps", "row_eps")
report("decode_attention", ptx_of(fn, sig_of(fn, dec, ptrs, fl), dec, {"num_warps": 4, "num_stages": 2}))
folded = dict(dec, USE_ROW_SCALE=True)  # a folded input norm: the hidden row is read after the wait
report("decode_attention_folded", ptx_of(fn, sig_of(fn, folded, ptrs, fl), folded, {"num_warps": 4, "num_stages": 2}))
bal = dict(dec, BALANCE=True, MAX_ROWS=32)  # the batch's lengths read before the wait; rows one split owns stored
report("decode_attention_balanced", ptx_of(fn, sig_of(fn, bal, ptrs, fl), bal, {"num_warps": 4, "num_stages": 2}))
pf3 = dict(dec, PREFETCH_TILES=3)  # three loop steps asked of L2 before the wait
report("decode_attention_prefetch3", ptx_of(fn, sig_of(fn, pf3, ptrs, fl), pf3,
                                            {"num_warps": 4, "num_stages": 2}))
import os, torch  # the preloading config as decode_config hands it to a batch-1 launch by default
os.environ.pop(da.PRELOAD_ROWS_ENV, None), os.environ.pop(da.DECODE_ATTN_ENV, None)
cfg = da.decode_config(1, 16, 8, 128, 40960, torch.device("cpu"))
assert cfg.preload and cfg.long_tile > cfg.loop_tile, cfg
pre = dict(dec, TILE=cfg.tile, PRELOAD=True, LOOP_TILE=cfg.loop_tile, LONG_TILE=cfg.long_tile)
report("decode_attention_preload", ptx_of(fn, sig_of(fn, pre, ptrs, fl), pre,
                                          {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}))
fn = pa._merge_splits_kernel
for name, active, balance in (("merge", False, False), ("merge_decode", True, False), ("merge_balanced", True, True)):
    merge = dict(NUM_Q_HEADS=16, HEAD_DIM=128, HEAD_PAD=128, NUM_SPLITS=16, TILE=128, USE_WINDOW=False,
                 USE_ACTIVE=active, USE_PDL=True, BLOCK_D=128, BALANCE=balance, MAX_ROWS=32)
    ptrs = dict(out_ptr="*bf16", part_ptr="*fp32", seq_lens_ptr="*i32")
    report(name, ptx_of(fn, sig_of(fn, merge, ptrs), merge, {"num_warps": 4}))
rope = dict(NUM_Q=16, NUM_KV=8, QK_PAD=32, KV_PAD=8, HEAD_DIM=128, HALF=64, BLOCK_SIZE=16, USE_NORM=True,
            USE_PDL=True, HIDDEN=1024, H_BLOCK=1024, USE_ROW_SCALE=False)
ptrs = dict(q_out_ptr="*bf16", cache_ptr="*bf16", qkv_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16",
            norm_ptr="*bf16", slot_ptr="*i64", h_ptr="*bf16")
fn = qr._qkv_rope_kernel
report("qkv_rope", ptx_of(fn, sig_of(fn, rope, ptrs, ("eps", "row_eps")), rope, {"num_warps": 4}))
rope = dict(rope, USE_ROW_SCALE=True)
report("qkv_rope_folded", ptx_of(fn, sig_of(fn, rope, ptrs, ("eps", "row_eps")), rope, {"num_warps": 4}))
gemv = dict(BLOCK_M=1, BLOCK_N=4, BLOCK_K=1024, USE_BIAS=False, USE_SILU_MUL=True, USE_NORM=True,
            USE_RESIDUAL=False, USE_PDL=True)
ptrs = {n: "*bf16" for n in ("out_ptr", "x_ptr", "w_ptr", "bias_ptr", "norm_ptr", "res_ptr")}
fn = sg._gemv_kernel
report("gemv", ptx_of(fn, sig_of(fn, gemv, ptrs, ("eps",)), gemv, {"num_warps": 4, "num_stages": 1}))
gemv = dict(gemv, BLOCK_M=4, USE_SILU_MUL=False)  # several rows: their norms before the row loop
report("gemv_rows", ptx_of(fn, sig_of(fn, gemv, ptrs, ("eps",)), gemv, {"num_warps": 4, "num_stages": 1}))
ptrs = dict(ptrs, part_ptr="*fp32", count_ptr="*i32")
fn = sg._skinny_gemm_kernel
for name, tiled, warps in (
    ("tiled", dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, USE_DOT=True, USE_SILU_MUL=True, USE_NORM=True,
                   USE_RESIDUAL=False, ROW_K=1024), 4),
    ("tiled_stepped_norm", dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, USE_DOT=True, USE_SILU_MUL=False,
                                USE_NORM=True, USE_RESIDUAL=False, ROW_K=0), 4),
    ("tiled_broadcast", dict(BLOCK_M=2, BLOCK_N=16, BLOCK_K=128, USE_DOT=False, USE_SILU_MUL=False,
                             USE_NORM=False, USE_RESIDUAL=True, ROW_K=0), 4),
):
    tiled = dict(tiled, USE_SPLIT=True, USE_BIAS=False, DOT_FP32=False, USE_PDL=True)
    report(name, ptx_of(fn, sig_of(fn, tiled, ptrs, ("eps",)), tiled, {"num_warps": warps, "num_stages": 3}))
norm = dict(BLOCK_H=4096, USE_RESIDUAL=True, USE_PDL=True)
ptrs = {n: "*bf16" for n in ("out_ptr", "res_out_ptr", "x_ptr", "res_ptr", "weight_ptr")}
fn = rn._rms_norm_kernel
report("rms_norm", ptx_of(fn, sig_of(fn, norm, ptrs, ("eps",)), norm, {"num_warps": 8}))
block, warps = sm.launch_config(3072, False)  # the 0.6B shape's intermediate, as silu_mul launches it
silu = dict(BLOCK=block, USE_PDL=True, HIDDEN=1024, H_BLOCK=1024, USE_ROW_SCALE=False)
fn = sm._silu_mul_kernel
ptrs = dict(out_ptr="*bf16", gate_up_ptr="*bf16", h_ptr="*bf16")
report("silu_mul", ptx_of(fn, sig_of(fn, silu, ptrs, ("row_eps",)), silu, {"num_warps": warps}))
block, warps = sm.launch_config(3072, True)  # a row-scaled program covers the whole row
silu = dict(silu, BLOCK=block, USE_ROW_SCALE=True)
report("silu_mul_folded", ptx_of(fn, sig_of(fn, silu, ptrs, ("row_eps",)), silu, {"num_warps": warps}))
gather = dict(BLOCK_A=1024, BLOCK_B=256, USE_PDL=True)
ptrs = dict(out_a_ptr="*bf16", out_b_ptr="*bf16", index_a_ptr="*i64", index_b_ptr="*i64", table_a_ptr="*bf16",
            table_b_ptr="*bf16")
fn = gr._gather_two_kernel
report("gather_two", ptx_of(fn, sig_of(fn, gather, ptrs), gather, {"num_warps": 4}))
"""


@pytest.fixture(scope="module")
def reports():
    return {
        name: tuple(int(v) for v in rest)
        for name, *rest in (line.split() for line in compile_script(SCRIPT).strip().splitlines())
    }


@pytest.mark.parametrize(
    "kernel",
    ["attention", "decode_attention", "decode_attention_preload", "decode_attention_prefetch3", "merge", "merge_decode",
     "decode_attention_balanced", "merge_balanced", "qkv_rope", "gemv", "decode_attention_folded", "qkv_rope_folded", "silu_mul_folded",
     "gemv_rows", "tiled", "tiled_stepped_norm", "tiled_broadcast", "rms_norm", "silu_mul", "gather_two"],
)  # fmt: skip
def test_kernel_waits_once_and_stores_only_after_the_wait(reports, kernel):
    waits, triggers, loads_before, loads_after, stores_before, stores_after = reports[kernel][:6]
    assert (waits, triggers) == (1, 1)
    assert stores_before == 0 and stores_after > 0
    assert loads_after > 0


@pytest.mark.parametrize(
    "kernel, reads_before",
    [
        ("attention", True),
        ("decode_attention", True),
        ("decode_attention_preload", True),
        ("merge", False),
        ("merge_decode", True),
        ("decode_attention_balanced", True),
        ("merge_balanced", True),
        ("qkv_rope", True),
        ("gemv", True),
        ("gemv_rows", True),
        ("tiled", True),
        ("tiled_stepped_norm", True),
        ("tiled_broadcast", True),
        ("rms_norm", True),
        ("silu_mul", False),
        ("gather_two", False),
    ],
)
def test_what_comes_before_the_wait(reports, kernel, reads_before):
    """attention looks its request up (order, query_start_loc, seq_lens), decode_attention
    too (order, seq_lens, slot, its first tile's block-table entries) and reads cos/sin and the
    norm weights, qkv_rope reads its
    norm weights, cos/sin and slot, and the GEMV its weight and the norm's before waiting (x, the norm's input
    and the residual after), the tiled GEMM its slice's first weight tile, and the RMSNorm its weight; the decode merge its row's seq_len;
    the other merge, the SiLU*up and the step's first gathers (their indices come from the input
    copies) read only after it."""
    assert (reports[kernel][2] > 0) == reads_before


@pytest.mark.parametrize("kernel", ["decode_attention", "qkv_rope", "silu_mul"])
def test_folded_norms_read_the_hidden_row_after_the_wait(reports, kernel):
    """With USE_ROW_SCALE the kernel reads the hidden rows a folded norm would have normed (the
    residual GEMM two launches back wrote them): after its wait, so it reads no more before the
    wait than without, and more after it."""
    plain, folded = reports[kernel], reports[kernel + "_folded"]
    assert folded[2] == plain[2] and folded[3] > plain[3]
    assert folded[4] == 0


@pytest.mark.parametrize("kernel", ["silu_mul", "qkv_rope_folded", "silu_mul_folded"])
def test_one_load_round_after_the_wait(reports, kernel):
    """Everything the row-scaled q|k|v rotary and SiLU * up read after the wait (the row, and
    the hidden row the scale is read from: kernels/row_scale.py) is loaded before the first
    barrier (the scale's reduction has one), so it goes out in one round: no load follows a
    barrier. (The unscaled qkv_rope loads v where it stores it, after its q|k norms.)"""
    assert reports[kernel][8] == 0


def test_pdl_is_off_under_the_interpreter_and_on_rocm(monkeypatch):
    """griddepcontrol and the L2 prefetch are NVIDIA PTX: neither the interpreter nor a ROCm
    build (torch names its devices "cuda" too) may reach them. Decided before the device is
    asked its capability, so this runs on a CPU-only machine."""
    cuda = torch.device("cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.pdl_enabled(cuda)
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    assert not pdl.pdl_enabled(cuda)


def test_pdl_is_off_off_hopper_and_when_asked(monkeypatch):
    assert not pdl.pdl_enabled(torch.device("cpu"))
    assert pdl.launch_options(False) == {} and pdl.launch_options(True) == {"launch_pdl": True}
    if torch.cuda.is_available():
        monkeypatch.setenv(pdl.PDL_ENV, "0")
        assert not pdl.pdl_enabled(torch.device("cuda"))
        monkeypatch.delenv(pdl.PDL_ENV)
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # interpreted kernels never reach griddepcontrol
        assert not pdl.pdl_enabled(torch.device("cuda"))


@pytest.mark.parametrize(
    "kernel",
    ["attention", "decode_attention", "decode_attention_preload", "decode_attention_prefetch3", "merge", "qkv_rope",
     "gemv", "tiled", "rms_norm", "silu_mul"],
)  # fmt: skip
def test_only_decode_attention_prefetches_and_only_before_its_wait(reports, kernel):
    """decode_attention asks L2 for its first tile of pooled K/V while it waits (the pool's
    keys before the new one were written by earlier steps; with PRELOAD, for its second tile,
    the first being read into registers); nothing prefetches after a wait."""
    before, after = reports[kernel][6:8]
    assert after == 0
    assert (before > 0) == kernel.startswith("decode_attention")


def test_prefetch_tiles_asks_l2_for_that_many_steps(reports):
    """PREFETCH_TILES=3: three times the default's L2 prefetches, all before the wait."""
    assert reports["decode_attention_prefetch3"][6] == 3 * reports["decode_attention"][6]


def test_preload_reads_the_pool_before_the_wait(reports):
    """With PRELOAD the decode attention reads its first tile's K and V (two loads of a
    [TILE, D] tile each) before the wait, beside what it read there without."""
    assert reports["decode_attention_preload"][2] > reports["decode_attention"][2]
