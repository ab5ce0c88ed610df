"""benchmarks/cut_draw_phases.py: its stamped copy of kernels/cut_draw.py carries every phase
stamp on this tree's layout, only the outer ones on the layout before the candidate pick, and
compiles for sm_90 (the inline PTX reads of %globaltimer and %smid included)."""

import os
import subprocess

import pytest

from benchmarks import cut_draw_phases
from tests.kernels.sm90 import ROOT, compile_script


def _source(rev_path: str) -> str:
    with open(os.path.join(ROOT, rev_path)) as f:
        return f.read()


def test_every_phase_is_stamped_on_this_layout():
    src = cut_draw_phases.stamped_source(_source("kernels/cut_draw.py"))
    assert [i for i in range(7) if f"_stamp(times_ptr, row, {i})" in src] == list(range(7))
    compile(src, "stamped", "exec")


def test_older_layout_gets_the_outer_stamps():
    try:
        old = subprocess.run(
            ["git", "show", "c79f0e0:kernels/cut_draw.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git history here")
    src = cut_draw_phases.stamped_source(old)
    assert [i for i in range(7) if f"_stamp(times_ptr, row, {i})" in src] == [0, 1, 5, 6]


SCRIPT = r"""
from benchmarks import cut_draw_phases
mod = cut_draw_phases.load_stamped("kernels/cut_draw.py")
fn = mod._cut_pick_kernel
consts = dict(CHUNK=8192, NB=64, GATHER=mod.GATHER, CAND=mod.CAND, ROUNDS=mod.MIN_P_ROUNDS, NC_BLOCK=32,
              BLOCK=2048, WIDE_BLOCK=512, NUM_PARAMS=8, MODE=0, SPLIT=mod.CUT_SPLIT, STEPS=mod.split_steps(mod.CUT_SPLIT))
i64 = {"map_ptr", "key_ptr", "out_ptr", "times_ptr"}
sig = {n: "constexpr" if n in consts else ("*i64" if n in i64 else "*fp32") if n.endswith("_ptr") else "i32"
       for n in fn.arg_names}
ptx = ptx_of(fn, sig, consts, {"num_warps": 4})
print("globaltimer", ptx.count("%globaltimer"), "smid", ptx.count("%smid"))
"""


def test_stamped_kernel_compiles_for_sm90():
    out = compile_script(SCRIPT)
    counts = dict(zip(out.split()[::2], map(int, out.split()[1::2])))
    assert counts["globaltimer"] >= 7 and counts["smid"] >= 1, out
