"""The sampler's Triton kernels (kernels/sampling.py) compile for an NVIDIA H100/H200
(sm_90) with triton's bundled ptxas, also on a CPU-only machine: the interpreter tests in
conformance/test_sampler.py check what the kernels compute, but the interpreter accepts code
that the real compiler rejects (an earlier draw kernel failed on CUDA over a loop-carried
name). The compile runs in a subprocess (tests/kernels/sm90.py). Also one helper probed
directly (interpreted on CPU): `_scan_chunk` on a row's last, partial chunk.
"""

import os

import pytest
import torch
import triton
import triton.language as tl

from enginespec.kernels import sampling as st

from .sm90 import compile_script

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TRITON = CUDA or os.environ.get("TRITON_INTERPRET") == "1"

SCRIPT = r"""
from enginespec.kernels import sampling as st
from enginespec.kernels import top_p as tp
from enginespec.kernels import cut_draw as cd
from enginespec.kernels import logprobs as lp

F, I, C = "*fp32", "i32", "constexpr"


def cut_pick(mode):
    # cut_draw._cut_pick_kernel in one of its modes (0 cut and pick, 1 cut only, 2 pick only)
    sig = dict(x_ptr=F, x_stride=I, e_ptr=F, e_stride=I, map_ptr="*i64", prm_ptr=F, key_ptr="*i64", stats_ptr=F,
               bmax_ptr=F, work_ptr=F, out_ptr="*i64", cut_ptr=F, vocab=I, num_chunks=I, has_edits=I, base_lo=I,
               base_hi=I, CHUNK=C, NB=C, GATHER=C, CAND=C, ROUNDS=C, NC_BLOCK=C, BLOCK=C, WIDE_BLOCK=C, NUM_PARAMS=C, MODE=C,
               SPLIT=C, STEPS=C)
    consts = dict(CHUNK=8192, NB=64, GATHER=cd.GATHER, CAND=cd.CAND, ROUNDS=cd.MIN_P_ROUNDS, NC_BLOCK=32, BLOCK=2048, WIDE_BLOCK=512,
                  NUM_PARAMS=8, MODE=mode, SPLIT=cd.CUT_SPLIT, STEPS=cd.split_steps(cd.CUT_SPLIT))
    return cd._cut_pick_kernel, sig, consts


KERNELS = {
    "chunk_stats": (st._chunk_stats_kernel,
                    dict(x_ptr=F, x_stride=I, scale_ptr=F, thr_ptr=F, stats_ptr=F, vocab=I, num_chunks=I,
                         CHUNK=C, BLOCK=C), dict(CHUNK=8192, BLOCK=2048)),
    "pick": (st._pick_kernel,
             dict(x_ptr=F, x_stride=I, scale_ptr=F, thr_ptr=F, noisy_ptr=F, key_ptr="*i64", stats_ptr=F,
                  out_ptr="*i64", vocab=I, num_chunks=I, base_lo=I, base_hi=I, CHUNK=C, BLOCK=C, NC_BLOCK=C),
             dict(CHUNK=8192, BLOCK=2048, NC_BLOCK=32)),
    "penalty": (st._penalty_kernel,
                dict(x_ptr=F, x_stride=I, src_ptr=F, src_stride=I, src_map_ptr="*i64", rows_ptr="*i64",
                     slots_ptr="*i64", prompt_ptr="*u8", counts_ptr="*i32", rep_ptr=F, freq_ptr=F, pres_ptr=F,
                     vocab=I, BLOCK=C, USE_SOURCE=C), dict(BLOCK=2048, USE_SOURCE=1)),
    "top_p": (tp._top_p_bisect_kernel,
              dict(x_ptr=F, x_stride=I, rows_ptr="*i64", unsure_ptr="*u8", base_off_ptr=F, inv_t_ptr=F,
                   top_p_ptr=F, thr_ptr=F, vocab=I, NUM_STEPS=C, BLOCK=C), dict(NUM_STEPS=64, BLOCK=2048)),
    "cut_scan": (cd._scan_kernel,
                 dict(x_ptr=F, x_stride=I, e_ptr=F, e_stride=I, map_ptr="*i64", prm_ptr=F, stats_ptr=F,
                      bmax_ptr=F, vocab=I, num_chunks=I, has_edits=I, CHUNK=C, NB=C, NUM_PARAMS=C),
                 dict(CHUNK=8192, NB=64, NUM_PARAMS=8)),
    "cut_pick": cut_pick(0),
    "cut_only": cut_pick(1),
    "pick_only": cut_pick(2),
    "spread_round": (cd._spread_round_kernel,
                     dict(x_ptr=F, x_stride=I, e_ptr=F, e_stride=I, map_ptr="*i64", prm_ptr=F, cut_ptr=F,
                          round_ptr=F, total_ptr=F, vocab=I, num_chunks=I, num_rows=I, has_edits=I,
                          round_index=I, CHUNK=C, NC_BLOCK=C, WIDE_BLOCK=C, NUM_PARAMS=C),
                     dict(CHUNK=8192, NC_BLOCK=32, WIDE_BLOCK=512, NUM_PARAMS=8)),
    "spread_finish": (cd._spread_finish_kernel,
                      dict(x_ptr=F, x_stride=I, e_ptr=F, e_stride=I, map_ptr="*i64", prm_ptr=F, stats_ptr=F,
                           cut_ptr=F, round_ptr=F, total_ptr=F, vocab=I, num_chunks=I, num_rows=I,
                           has_edits=I, num_rounds=I, CHUNK=C, NC_BLOCK=C, BLOCK=C, NUM_PARAMS=C),
                      dict(CHUNK=8192, NC_BLOCK=32, BLOCK=2048, NUM_PARAMS=8)),
    "lp_chunk": (lp._chunk_kernel,
                 dict(x_ptr=F, x_stride=I, rows_ptr="*i64", stats_ptr=F, sub_ptr=F, vocab=I, num_chunks=I, k=I,
                      CHUNK=C, SUB=C), dict(CHUNK=4096, SUB=128)),
    "lp_merge": (lp._merge_kernel,
                 dict(x_ptr=F, x_stride=I, rows_ptr="*i64", tok_ptr="*i64", stats_ptr=F, sub_ptr=F, sub_stride=I,
                      out_ptr="*fp64", vocab=I, num_chunks=I, k=I, NC_BLOCK=C, NS_BLOCK=C, SUB=C, KP=C),
                 dict(NC_BLOCK=64, NS_BLOCK=2048, SUB=128, KP=32)),
}
for name, (fn, sig, consts) in KERNELS.items():
    ptx = ptx_of(fn, sig, consts, {"num_warps": 8})
    print(name, "ex2.approx", ptx.count("ex2.approx"), "div.full", ptx.count("div.full"))
"""


def test_sampler_kernels_compile_for_sm90():
    lines = dict(line.split(" ", 1) for line in compile_script(SCRIPT).strip().splitlines())
    assert set(lines) == {
        "chunk_stats",
        "pick",
        "penalty",
        "top_p",
        "cut_scan",
        "cut_pick",
        "cut_only",
        "pick_only",
        "spread_round",
        "spread_finish",
        "lp_chunk",
        "lp_merge",
    }
    assert "div.full 0" in lines["penalty"], "penalty division must be IEEE-rounded, as torch's"
    assert "ex2.approx 0" not in lines["chunk_stats"]


class _Recorder:
    """Stands in for a @triton.jit kernel: kernel[grid](*args, **kw) records the tensor args."""

    def __init__(self, seen: list):
        self.seen = seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            import torch

            self.seen.extend(a for a in args if isinstance(a, torch.Tensor))

        return launch


@pytest.mark.parametrize("num_rows", [1, 2, 3, 5, 6, 7, 9])
def test_fused_draw_passes_16_byte_aligned_pointers_at_every_row_count(monkeypatch, num_rows):
    """Triton specialises pointer arguments on 16-byte alignment. The fused draw cuts its scratch
    into parts; if a part's offset followed the row count, a batch size the warm-up never met
    would compile new kernel variants inside a user's first generate() call (seen on the H200:
    two compiles, about 1 s each). Every tensor the draw hands its kernels starts aligned."""
    import torch

    from enginespec.kernels import cut_draw

    seen: list = []
    monkeypatch.setattr(cut_draw, "_scan_kernel", _Recorder(seen))
    monkeypatch.setattr(cut_draw, "_cut_pick_kernel", _Recorder(seen))
    monkeypatch.setattr(cut_draw, "triton", cut_draw.triton or pytest.importorskip("triton"))
    x = torch.randn(num_rows, 700)  # 6 chunks of 128: part sizes that are not multiples of 4 floats
    prm = torch.zeros(num_rows, cut_draw.NUM_PARAMS)
    keys = torch.zeros(num_rows, dtype=torch.int64)
    cut_draw.draw(x, prm, keys, (0, 0), chunk=128)
    assert len(seen) >= 10
    assert all(t.data_ptr() % 16 == 0 for t in seen), [t.data_ptr() % 16 for t in seen]


@triton.jit
def _scan_chunk_probe(x_ptr, out_ptr, vocab, start, chunk_top, scale, thr, target, CHUNK: tl.constexpr,
                      BLOCK: tl.constexpr):  # fmt: skip
    tl.store(out_ptr, st._scan_chunk(x_ptr, start, vocab, chunk_top, scale, thr, target, CHUNK, BLOCK))


@pytest.mark.skipif(not TRITON, reason="needs CUDA or TRITON_INTERPRET=1")
def test_scan_chunk_never_picks_a_column_past_the_row():
    """sampling._scan_chunk over a row's last, partial chunk (vocab 50, chunk 32: columns
    32-49), the row a view of wider rows whose column 50 holds the largest value: the first id
    whose running weight passes the target, and where none does (a target at or past the
    chunk's mass: the kernels' sums round apart, so u2 near 1 can get there) the last id of
    positive weight. Never column 50: that is not a token."""
    gen = torch.Generator().manual_seed(5)
    wide = torch.randn(2, 64, generator=gen)
    wide[:, 50:] = 30.0
    x, vocab, start, chunk = wide.to(DEVICE), 50, 32, 32
    top, scale = wide[0, start:vocab].max().item(), 1.4426950408889634
    weights = torch.exp2((wide[0, start:vocab] - top) * scale).double()
    run, mass = weights.cumsum(0), weights.sum().item()
    out = torch.empty(1, dtype=torch.int32, device=DEVICE)
    # targets: none passed yet, midway between two running sums (clear of rounding), past the mass
    for target, want in ((0.0, start), ((run[8] + run[9]).item() / 2, start + 9), (2 * mass, vocab - 1)):
        _scan_chunk_probe[(1,)](
            x, out, vocab, start, top, scale, float("-inf"), target, CHUNK=chunk, BLOCK=16
        )
        assert int(out) == want, (target, int(out), want)
