"""Programmatic dependent launch (PDL, Hopper and later): a kernel's launch overlaps the tail of
the kernel before it in the stream.

A kernel launched with `launch_pdl=True` may start once every program of the kernel before it
has executed `gdc_launch_dependents()` (or exited). Until it executes `gdc_wait()` it may run
alongside that kernel, and alongside any earlier one of the same PDL chain (each kernel's
trigger may come before its own wait, so the overlap can reach back several launches). Rules
for a kernel with USE_PDL, which every caller here follows:

- before `gdc_wait()`: only reads of what no kernel of the chain writes (weights, the step's
  block table, seq_lens, positions, slot mapping and cos/sin, all written by copies or by
  non-PDL kernels, which end a chain); no stores;
- an L2 prefetch (`prefetch_l2`) may come before the wait, of anything: it loads nothing into
  the program and L2 is where the GPU's writes meet, so a line written later is simply
  current when read;
- after `gdc_wait()`: everything launched before it has finished and its writes are visible,
  transitively (each earlier kernel passed its own wait before it finished).

Batch-1 decode is ~220 launches of 1-5 us each; PDL hides part of each launch's fixed cost
(benchmarks/RESULTS.md, issue 19). On by default on sm_90 and later; ENGINESPEC_PDL=0 turns
it off everywhere. Off on the CPU and under the interpreter (the kernels then see
USE_PDL=False and never reach the instructions).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from enginespec.kernels.switches import env_switch

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - an older triton: PDL stays off
    gdc_launch_dependents = gdc_wait = None

PDL_ENV = "ENGINESPEC_PDL"
_PDL_DEVICES: dict = {}


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: NVIDIA CUDA (not ROCm, whose devices torch
    also calls "cuda" and whose capability numbers mean other chips), compute capability >= 9,
    a triton with gdc_wait, not under the interpreter (TRITON_INTERPRET, which has no
    griddepcontrol and no inline PTX), and ENGINESPEC_PDL not "0" (env_switch: read for a CUDA
    device only, and anything but 0, 1 or unset is a ValueError naming it)."""
    if device.type != "cuda" or env_switch(PDL_ENV) is False or gdc_wait is None:
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or getattr(torch.version, "hip", None):
        return False
    if device not in _PDL_DEVICES:
        _PDL_DEVICES[device] = torch.cuda.get_device_capability(device)[0] >= 9
    return _PDL_DEVICES[device]


def launch_options(pdl: bool) -> dict:
    """The launch keyword a USE_PDL kernel needs: {"launch_pdl": True} when pdl, else {}."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the 128-byte line at each pointer (PTX prefetch.global.L2): a hint with no
    result, so a kernel can start its first DRAM reads while it waits (gdc_wait) and find them in
    L2 after. CUDA only: never reached under the interpreter (callers gate it on USE_PDL)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )
