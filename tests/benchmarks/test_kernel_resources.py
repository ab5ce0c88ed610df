"""benchmarks/kernel_resources.py: every case it lists compiles for sm_90 and its cubin reads
back (registers, stack, SASS counts) with the cuobjdump triton ships; one GEMV and one split
attention case are compiled here (all of them take a minute), and a case that leaves out a
constexpr is refused."""

from benchmarks.kernel_resources import DECODE_PRELOAD_CONFIGS, TILED_CONFIGS, after_wait
from tests.kernels.sm90 import compile_script

SCRIPT = r"""
import os
from benchmarks import kernel_resources as kr
cases = {name: case for name, *case in kr.kernels()}
if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")):
    print("this triton ships no cuobjdump"); sys.exit(3)
for name in ("gemv residual rows=1 block_n=4 block_k=2048 warps=8", "decode_attention split=1 tile=64 warps=8"):
    fn, consts, ptrs, floats, opts = cases[name]
    src = kr.source(fn, consts, ptrs, floats)
    row = kr.resources(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["cubin"])
    print(name.split()[0], row["reg"], row["stack"], row["instructions"], row["ldg"], row["mma"])
print("cases", len(cases))
fn, consts, ptrs, floats, opts = cases["decode_attention split=1 tile=64 warps=8"]
try:
    kr.source(fn, {k: v for k, v in consts.items() if k != "HEAD_DIM"}, ptrs, floats)
except ValueError as exc:
    print("missing", "HEAD_DIM" in str(exc))
"""


def test_cases_compile_and_read_back():
    out = dict(line.split(" ", 1) for line in compile_script(SCRIPT).strip().splitlines())
    reg, stack, instructions, ldg, mma = (int(v) for v in out["gemv"].split())
    assert 0 < reg <= 255 and stack >= 0 and instructions > 100 and ldg > 0 and mma == 0  # no tensor core
    reg, stack, instructions, ldg, mma = (int(v) for v in out["decode_attention"].split())
    assert 0 < reg <= 255 and instructions > 100 and ldg > 0 and mma > 0  # tl.dot on tensor cores
    # attention x 2 kernels, the preloading decode attention, prefill, GEMVs at 1 and 8 rows, tiled,
    # the row-scaled decode attention, q|k|v rotary and SiLU * up with and without the row scale,
    # the balanced decode attention
    assert (
        int(out["cases"]) == 2 * 6 + len(DECODE_PRELOAD_CONFIGS) + 3 + 4 * 2 + len(TILED_CONFIGS) + 1 + 4 + 1
    )
    # a constexpr left out would be compiled as a runtime int: other code than what runs
    assert out["missing"] == "True"


def test_after_wait_counts_barriers_and_load_rounds():
    """Loads before the wait do not count; a stretch between barriers with any global load (or
    async copy from global) is one round; one without is none."""
    ptx = "\n".join(
        [
            "ld.global.v4.b32 {%r1}, [%rd1];",  # before the wait: the weight
            "griddepcontrol.wait; // dummy",
            "@%p1 ld.global.b16 {%rs1}, [%rd2];",  # round 1: x and the residual
            "ld.global.b16 {%rs2}, [%rd3];",
            "bar.sync 0;",
            "add.f32 %f1, %f2, %f3;",  # no load: no round
            "bar.sync 0;",
            "cp.async.cg.shared.global [%r5], [%rd4], 0x10;",  # round 2
            "barrier.sync 0;",
            "st.global.b16 [%rd5], {%rs3};",
        ]
    )
    assert after_wait(ptx) == {"bar_w": 3, "rounds_w": 2}
    assert after_wait(ptx.replace("bar.sync 0;", "")) == {"bar_w": 1, "rounds_w": 1}  # one stretch
    assert after_wait("ld.global.b16 {%rs1}, [%rd2];") == {"bar_w": None, "rounds_w": None}
