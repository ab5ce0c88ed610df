"""benchmarks/decode_attention_phases.py: its stamped copy of kernels/decode_attention.py carries
every phase stamp, its launch passes the stamp buffer, and it compiles for sm_90 (the inline PTX
reads of %globaltimer and %smid included), with and without the preloaded first tile."""

import os

import torch

from benchmarks import decode_attention_phases as phases
from tests.kernels.sm90 import ROOT, compile_script


def test_every_phase_is_stamped_and_the_launch_passes_the_buffer():
    with open(os.path.join(ROOT, "kernels/decode_attention.py")) as f:
        src = phases.stamped_source(f.read())
    assert [i for i in range(8) if f"_stamp(times_ptr, pid, {i})" in src] == list(range(phases.NUM_STAMPS))
    assert "        TIMES,\n" in src and "LAST[0] = launcher(_decode_attention_kernel" in src
    compile(src, "stamped", "exec")


def test_summary_reads_programs_sms_and_phases():
    """Two programs on one SM one after the other, one on another SM, one idle split (stamp 0
    only): the idle one is counted apart, at most one ran at once on an SM, phase 0-1 is the
    median of the three programs' first phases."""
    t = torch.zeros(4, 16, dtype=torch.int64)
    for row, (start, sm) in enumerate([(0, 3), (10_000, 3), (500, 7)]):
        t[row, :7] = start + torch.arange(7) * 1_000  # 1 us a phase
        t[row, 15] = sm
    t[3, 0] = 200  # an idle split: started, exited at once
    out = phases.summarize(t)
    assert (out["programs_ran"], out["programs_idle"], out["sms"], out["max_concurrent"]) == (3, 1, 2, 1)
    assert out["program_us"] == 6.0 and out["span"] == 16.0 and out["0-1"] == (1.0, 1.0)


SCRIPT = r"""
from benchmarks import decode_attention_phases
mod = decode_attention_phases.load_stamped("kernels/decode_attention.py")
fn = mod._decode_attention_kernel
dec = dict(NUM_Q_HEADS=16, NUM_KV_HEADS=8, GROUP=2, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_M=16, TILE=128,
           IS_SPLIT=True, USE_WINDOW=False, USE_ORDER=False, USE_NORM=True, DOT_FP32=False, USE_PDL=True,
           LINE=64, PRELOAD=False, LOOP_TILE=128, LONG_TILE=0, PREFETCH_TILES=1, HIDDEN=1024,
           H_BLOCK=1024, USE_ROW_SCALE=False, BALANCE=False, MAX_ROWS=16)
ptrs = dict(out_ptr="*bf16", part_ptr="*fp32", cache_ptr="*bf16", qkv_ptr="*bf16", cos_ptr="*bf16",
            sin_ptr="*bf16", norm_ptr="*bf16", slot_ptr="*i64", block_table_ptr="*i32", seq_lens_ptr="*i32",
            order_ptr="*i32", times_ptr="*i64", h_ptr="*bf16")
for name, extra in (("plain", {}), ("preload", dict(TILE=16, PRELOAD=True, LOOP_TILE=32, LONG_TILE=128))):
    consts = dict(dec, **extra)
    sig = {n: "constexpr" if n in consts else ptrs.get(n) or ("fp32" if n in ("scale_log2", "eps", "row_eps") else "i32")
           for n in fn.arg_names}
    ptx = ptx_of(fn, sig, consts, {"num_warps": 4, "num_stages": 2})
    print(name, ptx.count("%globaltimer"), ptx.count("%smid"))
"""


def test_stamped_kernel_compiles_for_sm90():
    out = compile_script(SCRIPT).split()
    counts = {out[i]: (int(out[i + 1]), int(out[i + 2])) for i in range(0, len(out), 3)}
    assert set(counts) == {"plain", "preload"}, out
    assert all(g >= phases.NUM_STAMPS and s >= 1 for g, s in counts.values()), counts
