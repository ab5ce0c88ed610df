"""benchmarks/persistent_gemv_probe.py: its one-launch-a-phase chain computes the torch chain
(interpreted on the CPU), and its persistent kernel compiles for sm_90 with a barrier whose
arrive and polls are one thread's (a release add, acquire loads) between CTA barriers."""

import torch

from benchmarks import persistent_gemv_probe as probe
from tests.kernels.sm90 import compile_script

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU interprets (the repo conftest)


def test_launches_compute_each_phase_of_the_torch_chain():
    """One layer, launch by launch: each phase's output against torch from the kernel's own
    input of it (a chain of bf16 phases drifts too far for one end-to-end tolerance)."""
    w, b = probe.make_weights(1, DEVICE), probe.buffers(DEVICE)
    probe.run_launches(w, b, 1, pdl=False)
    f = torch.float32
    gu = w["gu"][0].to(f) @ b["h"].to(f)
    expected = {
        "qkv": w["qkv"][0].to(f) @ b["x0"].to(f),
        "h": w["o"][0].to(f) @ b["qkv"][: probe.ATTN].to(f) + b["x0"].to(f),
        "act": torch.nn.functional.silu(gu[: probe.INTER]) * gu[probe.INTER :],
        "x": w["down"][0].to(f) @ b["act"].to(f) + b["h"].to(f),
    }
    for name, want in expected.items():
        torch.testing.assert_close(
            b[name].float(), want.to(torch.bfloat16).float(), atol=0.02, rtol=0.02, msg=name
        )


SCRIPT = r"""
import re
from benchmarks import persistent_gemv_probe as P
fn = P._persistent_kernel
for work in (False, True):
    consts = dict(DO_WORK=work, MAX_SPIN=1 << 22)
    sig = {n: "constexpr" if n in consts else ("i32" if n == "num_layers" else "*i32" if n in ("count_ptr", "flag_ptr")
           else "*bf16") for n in fn.arg_names}
    lines = [line.strip() for line in ptx_of(fn, sig, consts, {"num_warps": 8}).splitlines()]
    # triton 3.9 writes the arrive as red (its result unused), 3.6 as atom
    arrives = [line for line in lines if re.search(r"\b(red|atom)\.global\.gpu\.release\.add", line)]
    polls = [line for line in lines if "ld.global.gpu.acquire" in line]
    one_thread = all(line.startswith("@%p") for line in arrives + polls)
    print(work, len(arrives), len(polls), one_thread)
"""


def test_persistent_kernel_compiles_for_sm90_with_one_thread_barriers():
    rows = [line.split() for line in compile_script(SCRIPT).strip().splitlines()]
    assert [r[0] for r in rows] == ["False", "True"], rows
    for _, arrives, polls, one_thread in rows:  # four barriers a layer, each polled, by one thread
        assert int(arrives) == 4 and int(polls) >= 4 and one_thread == "True", rows
