"""Where each row's program of the fused draw's second launch spends its time. CUDA only.

    python3 benchmarks/cut_draw_phases.py OUT.json [--kernel PATH/TO/cut_draw.py]

Writes a copy of `kernels/cut_draw.py` (or PATH, e.g. `git show REV:kernels/cut_draw.py >
old.py`) whose `_cut_pick_kernel` reads %globaltimer at phase boundaries (after a CTA barrier)
and %smid once, into a [rows, 16] int64 buffer, then draws 256 rows x 151,936 (randn x 3, as
`sampler_probe.py`) at four settings with the module's default warps. Per case: the compiled
kernel's registers and spills, how many programs ran at once on one SM (`max_concurrent`: 1
means 256 rows take two waves over 132 SMs), the latest start, a row's time (median, max), the
launch's span, and each phase's median and max (us): 0 start, 1 after the chunk statistics, 2
after the ranking of the sub-block maxima, 3 after the candidates are gathered, 4 after the
cut, 5 before the pick, 6 the end. Phases 2-4 need the candidate layout of 90d339f and later
(on older files only 0, 1, 5 and 6 are stamped). The stamps cost a barrier each: the span
runs a little longer than the uninstrumented launch. Nothing asserts speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import sampler_probe as probe  # noqa: E402
from benchmarks import stamping  # noqa: E402
from enginespec.sample.draw import CHUNK  # noqa: E402

STAMP = stamping.helpers("row", "    ") + "\n    @triton.jit\n    def _row_ptr("

# (old, new) edits every layout needs: the buffer, the outer stamps, the launch
OUTER = [
    ("\n    @triton.jit\n    def _row_ptr(", STAMP),
    ("key_ptr, stats_ptr, bmax_ptr, work_ptr, out_ptr,\n        cut_ptr,",
     "key_ptr, stats_ptr, bmax_ptr, work_ptr, out_ptr, times_ptr,\n        cut_ptr,"),
    ("        row = tl.program_id(0)\n        parts = tl.arange(0, NC_BLOCK)\n",
     "        row = tl.program_id(0)\n        _stamp(times_ptr, row, 0)\n        _smid(times_ptr, row)\n"
     "        parts = tl.arange(0, NC_BLOCK)\n"),
    ("        cut_row = cut_ptr + row.to(tl.int64) * (4 + NC_BLOCK)\n        if MODE == 2:",
     "        cut_row = cut_ptr + row.to(tl.int64) * (4 + NC_BLOCK)\n        _stamp(times_ptr, row, 1)\n"
     "        if MODE == 2:"),
    ("        if MODE != 1:\n", "        _stamp(times_ptr, row, 5)\n        if MODE != 1:\n"),
    ("            tl.store(out_ptr + row, tok.to(tl.int64))\n",
     "            tl.store(out_ptr + row, tok.to(tl.int64))\n        _stamp(times_ptr, row, 6)\n"),
    ("    args = (*rows, keys, stats, bmax, work, out, cut,", "    args = (*rows, keys, stats, bmax, work, out, TIMES, cut,"),
    ("        cut_pick(*args, MODE=0, **launch)\n        return out, cut",
     "        LAST[:] = [cut_pick(*args, MODE=0, **launch)]\n        return out, cut"),
    # (sources before the compile-only launcher, 2026-12-04, launched the kernel by name)
    ("        _cut_pick_kernel[(num_rows,)](*args, MODE=0, **launch)\n        return out, cut",
     "        LAST[:] = [_cut_pick_kernel[(num_rows,)](*args, MODE=0, **launch)]\n        return out, cut"),
    ("\nFLOAT_TYPES =", "\nTIMES = None\nLAST = []\nFLOAT_TYPES ="),
]  # fmt: skip

# the inner stamps, for the candidate layout (times_ptr threaded through _row_cut and the gather)
INNER = [
    ("    def _row_cut(\n        row_ptr, prm,", "    def _row_cut(\n        times_ptr, row, row_ptr, prm,"),
    ("                thr, masses, spread, base, cand, cand_cols, settled = _row_cut(\n                    row_ptr, prm,",
     "                thr, masses, spread, base, cand, cand_cols, settled = _row_cut(\n"
     "                    times_ptr, row, row_ptr, prm,"),
    ("        cand, cand_cols, certain = _gather_candidates(\n            row_ptr,",
     "        cand, cand_cols, certain = _gather_candidates(\n            times_ptr, row, row_ptr,"),
    ("    def _gather_candidates(\n        row_ptr,", "    def _gather_candidates(\n        times_ptr, row, row_ptr,"),
    ("        sel = bm > t\n", "        _stamp(times_ptr, row, 2)\n        sel = bm > t\n"),
    ("        thr, ok = _candidate_cut(", "        _stamp(times_ptr, row, 3)\n        thr, ok = _candidate_cut("),
    ("        if SPREAD:\n            masses = _candidate_masses(",
     "        _stamp(times_ptr, row, 4)\n        if SPREAD:\n            masses = _candidate_masses("),
]  # fmt: skip


def stamped_source(src: str) -> str:
    """src with the stamps; every OUTER edit must apply once (of the pick launch's two layouts,
    one), INNER ones all or none."""
    launch = [i for i, (old, _) in enumerate(OUTER) if "MODE=0" in old]
    skip = [i for i in launch if src.count(OUTER[i][0]) == 0][: len(launch) - 1]
    for i, (old, new) in enumerate(OUTER):
        if i in skip:
            continue
        assert src.count(old) == 1, f"anchor not found once: {old[:60]!r}"
        src = src.replace(old, new)
    if all(src.count(old) == 1 for old, _ in INNER):
        for old, new in INNER:
            src = src.replace(old, new)
    return src


def load_stamped(path: str):
    with open(path) as f:
        return stamping.load_edited(stamped_source(f.read()), "cut_draw_stamped")


def params(case: str) -> torch.Tensor:
    """sampler_probe's cases, plus top-k 50 + top-p 0.9 at T 1 (the mixed case's third group)."""
    if case == "topk50_topp09":
        prm = probe.params("chat").clone()
        prm[:, 0], prm[:, 4], prm[:, 5], prm[:, 6] = probe.LOG2E, 50, 0.9, 1.0
        return prm
    return probe.params(case)


def measure(mod, x: torch.Tensor, case: str) -> dict:
    rows = x.shape[0]
    keys, prm = torch.arange(rows, dtype=torch.int64, device="cuda"), params(case)
    mod.TIMES = torch.zeros(rows * 16, dtype=torch.int64, device="cuda")
    for _ in range(4):
        mod.draw(x, prm, keys, (1, 2), chunk=CHUNK)
    torch.cuda.synchronize()
    kernel, t = mod.LAST[0], mod.TIMES.view(rows, 16).cpu()
    start = (t[:, 0] - t[:, 0].min()).double() / 1000
    end = (t[:, 6] - t[:, 0].min()).double() / 1000
    per_sm: dict = {}
    for i in range(rows):
        per_sm.setdefault(int(t[i, 15]), []).append((float(start[i]), float(end[i])))
    concurrent = max(sum(1 for a, b in iv if a <= s0 < b) for iv in per_sm.values() for s0, _ in iv)
    out = dict(
        regs=getattr(kernel, "n_regs", None), spills=getattr(kernel, "n_spills", None), max_concurrent=concurrent,
        start_max=round(float(start.max()), 2), row_us=round(float((end - start).median()), 2),
        row_max=round(float((end - start).max()), 2), span=round(float(end.max()), 2),
    )  # fmt: skip
    prev = 0
    for i in range(1, 7):
        if bool((t[:, i] == 0).all()):
            continue
        d = (t[:, i] - t[:, prev]).double() / 1000
        out[f"{prev}-{i}"] = (round(float(d.median()), 2), round(float(d.max()), 2))
        prev = i
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--kernel", default=os.path.join(os.path.dirname(probe.cut_draw.__file__), "cut_draw.py"))
    args = ap.parse_args()
    mod = load_stamped(args.kernel)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(probe.ROWS, probe.VOCAB, generator=gen, device="cuda") * 3.0
    res = {"kernel": args.kernel}
    for case in ("temperature", "chat", "topk50_topp09", "minp_topp"):
        res[case] = measure(mod, x, case)
        print(case, json.dumps(res[case]))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
