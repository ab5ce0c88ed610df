"""Where the fused cut-and-draw spends its device time (issue 16's sampler targets). CUDA only.

    python3 benchmarks/sampler_probe.py OUT.json [--old PATH/TO/OLD_cut_draw.py]

256 rows x 151,936 random float32 logits (randn x 3), `triton.testing.do_bench` medians (us):
- `argmax`: torch.argmax over the rows (the floor a sampler pays);
- `scan_<case>` / `draw_<case>`: cut_draw's first launch alone, and its whole draw (so the cut
  and pick launch is their difference), for `temperature` (no cut: T 0.6), `chat` (T 0.7,
  top-k 20, top-p 0.8) and `minp_topp` (T 0.7, top-p 0.95, min-p 0.05: the mixed case's
  fourth group);
- `probe_level<L>`: copies of the b971081 scan's steps, cumulatively (0 the statistics of every
  row, 1 the sub-block maxima and floor, 2 the per-chunk compaction's cumsum, 3 its stores), so
  each step's share of that scan shows (at 0ae5e28: 48, 50, 71 and 240 us: the stores);
- `draw_<case>_split<N>`: the draw with the candidate cut's bisection split N ways a step
  (`cut_draw.CUT_SPLIT`);
- `draw_chat_gather<N>`: the chat draw reading the N sub-blocks of largest max per row for
  its candidates (`cut_draw.GATHER`);
- with `--old`, the same scan and draw figures for another version of `kernels/cut_draw.py`
  (e.g. `git show REV:kernels/cut_draw.py > old.py`), so a change is timed against its base on
  one machine in one process.
With `--cprofile PATH`, cProfile's ranking (by own time) of 200 device-path calls at chat
settings (bench_sampler's `deferred_ids`: sample_deferred, pack, the host copy) goes to PATH:
the host's share of a call. With `--vs-interpreter N`, N rows of each case are drawn on the device and under Triton's
interpreter (CPU) and compared (`vs_interp_*`). `cand_<case>_*` say what the cut's candidates see on those rows (see `candidate_stats`).
Nothing asserts speed; the figures go to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enginespec.kernels import cut_draw  # noqa: E402
from enginespec.sample.draw import CHUNK  # noqa: E402

ROWS, VOCAB = 256, 151_936
LOG2E = 1.4426950408889634


@triton.jit
def _probe_scan(x_ptr, stats_ptr, cand_ptr, vocab, num_chunks, LEVEL: tl.constexpr, CHUNK: tl.constexpr,
                NB: tl.constexpr, CC: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
    # x_ptr: [S, vocab] float32; stats_ptr: [S, 3, num_chunks]; cand_ptr: [S, num_chunks, SLOTS].
    row = tl.program_id(0)
    part = tl.program_id(1)
    cols = part * CHUNK + tl.arange(0, CHUNK)
    xv = tl.load(x_ptr + row.to(tl.int64) * vocab + cols, mask=cols < vocab, other=float("-inf"))
    top = tl.max(xv, axis=0)
    mass = tl.sum(tl.exp2((xv - top) * 2.06), axis=0)
    out = stats_ptr + row.to(tl.int64) * 3 * num_chunks + part
    tl.store(out, top)
    tl.store(out + num_chunks, mass)
    if LEVEL >= 1:
        block_max = tl.max(tl.reshape(xv, [NB, CHUNK // NB]), axis=1)
        num_ge = tl.sum((block_max[None, :] >= block_max[:, None]).to(tl.int32), axis=1)
        floor = tl.max(tl.where(num_ge >= CC, block_max, float("-inf")), axis=0)
        if LEVEL == 1:
            tl.store(out + 2 * num_chunks, floor)
        else:
            take = xv >= floor
            pos = tl.cumsum(take.to(tl.int32), axis=0) - 1
            count = tl.sum(take.to(tl.int32), axis=0)
            if LEVEL == 2:
                tl.store(out + 2 * num_chunks, (count + tl.max(pos, axis=0)).to(tl.float32))
            else:
                slots = cand_ptr + (row.to(tl.int64) * num_chunks + part) * SLOTS
                tl.store(slots + pos, xv, mask=take & (pos < SLOTS))
                tl.store(out + 2 * num_chunks, count.to(tl.float32))


def params(case: str) -> torch.Tensor:
    """cut_draw's parameter table for every row of one case (see cut_draw.draw)."""
    t, top_k, top_p, min_p = {"temperature": (0.6, 0, 1.0, 0.0), "chat": (0.7, 20, 0.8, 0.0),
                              "minp_topp": (0.7, 0, 0.95, 0.05)}[case]  # fmt: skip
    inv_t = 1.0 / t
    base_off = math.log(min_p) / inv_t if min_p > 0 else float("-inf")
    cut = float(top_k > 0 or top_p < 1.0 or min_p > 0)
    row = [LOG2E * inv_t, 1.0, cut, base_off, float(top_k), top_p, inv_t, 0.0]
    return torch.tensor([row] * ROWS, dtype=torch.float32, device="cuda")


def scan_launcher(mod, x: torch.Tensor, prm: torch.Tensor, keys: torch.Tensor):
    """A call that launches `mod`'s first kernel (the scan) alone, for either layout: sub-block
    maxima (this tree) or per-chunk candidate slots (kernels/cut_draw.py up to b971081)."""
    num_chunks = triton.cdiv(VOCAB, CHUNK)
    rows = (x, x.stride(0), x, 0, keys, prm)
    if hasattr(mod, "GATHER"):
        nb = mod.layout(CHUNK)[0]
        stats, bmax = mod._buffers(ROWS, num_chunks, nb, False, x.device)[:2]
        return lambda: mod._scan_kernel[(ROWS, num_chunks)](
            *rows,
            stats,
            bmax,
            VOCAB,
            num_chunks,
            0,
            CHUNK=CHUNK,
            NB=nb,
            NUM_PARAMS=mod.NUM_PARAMS,
            num_warps=8,
        )
    nb, cc, slots = mod.layout(CHUNK)
    stats, floors, cand = mod._buffers(ROWS, num_chunks, slots, False, x.device)[:3]
    extra = {"SCAN_2D": mod.SCAN_2D} if hasattr(mod, "SCAN_2D") else {}
    return lambda: mod._scan_kernel[(ROWS, num_chunks)](
        *rows, stats, cand, floors, VOCAB, num_chunks, 0,
        CHUNK=CHUNK, NB=nb, CC=cc, SLOTS=slots, NUM_PARAMS=mod.NUM_PARAMS, num_warps=8, **extra,
    )  # fmt: skip


def time_module(mod, x: torch.Tensor, prefix: str, out: dict) -> None:
    """scan_<case> and draw_<case> medians (us) of one cut_draw module."""
    keys = torch.arange(ROWS, dtype=torch.int64, device="cuda")
    for case in ("temperature", "chat", "minp_topp"):
        prm = params(case)
        out[f"{prefix}scan_{case}"] = 1000 * triton.testing.do_bench(scan_launcher(mod, x, prm, keys))
        out[f"{prefix}draw_{case}"] = 1000 * triton.testing.do_bench(
            lambda: mod.draw(x, prm, keys, (1, 2), chunk=CHUNK)
        )


def candidate_stats(x: torch.Tensor, out: dict) -> None:
    """Per case, what the cut's candidates see (torch, on the same logits): the sub-blocks whose
    max reaches the min-p cut (`live`: at least GATHER of them means the candidates hold only
    the tokens above the GATHER-th largest max) and the tokens at or above that cut; medians and
    maxima over the rows, as `cand_<case>_<what>`."""
    nb = cut_draw.layout(CHUNK)[0]
    num_chunks = triton.cdiv(VOCAB, CHUNK)
    padded = torch.full((ROWS, num_chunks * CHUNK), float("-inf"), device=x.device)
    padded[:, :VOCAB] = x
    block_max = padded.view(ROWS, num_chunks * nb, CHUNK // nb).amax(dim=2)
    for case in ("chat", "minp_topp"):
        base = x.amax(dim=1) + params(case)[:, 3]
        live = (block_max >= base[:, None]).sum(dim=1).float()
        tokens = (x >= base[:, None]).sum(dim=1).float()
        for what, v in (("live_blocks", live), ("tokens_at_min_p", tokens)):
            out[f"cand_{case}_{what}_median"] = float(v.median())
            out[f"cand_{case}_{what}_max"] = float(v.max())


INTERPRET = r"""
import sys, torch
from enginespec.kernels import cut_draw
x, prm, keys, chunk = torch.load(sys.argv[1])
out, cut = cut_draw._launch(x, prm, keys, (1, 2), chunk, None, None, 0, True, pick=False)
ids = cut_draw.draw(x, prm, keys, (1, 2), chunk=chunk)
torch.save((ids, cut), sys.argv[2])
"""


def versus_interpreter(x: torch.Tensor, num_rows: int, out: dict) -> None:
    """The first num_rows rows of each case through the device and through Triton's interpreter
    (a CPU subprocess): `vs_interp_<case>_ids` and `_cuts` count the rows whose token and cut
    (MODE 1: spread_cuts's pass; a row the candidates cannot settle has its spread flag set,
    `_flagged`) agree."""
    import subprocess
    import tempfile

    keys = torch.arange(num_rows, dtype=torch.int64, device="cuda")
    for case in ("chat", "minp_topp"):
        prm = params(case)[:num_rows].contiguous()
        sub = x[:num_rows].contiguous()
        ids = cut_draw.draw(sub, prm, keys, (1, 2), chunk=CHUNK)
        cut = cut_draw._launch(sub, prm, keys, (1, 2), CHUNK, None, None, 0, True, pick=False)[1]
        with tempfile.TemporaryDirectory() as tmp:
            torch.save((sub.cpu(), prm.cpu(), keys.cpu(), CHUNK), f"{tmp}/in.pt")
            env = {**os.environ, "TRITON_INTERPRET": "1"}
            subprocess.run(
                [sys.executable, "-c", INTERPRET, f"{tmp}/in.pt", f"{tmp}/out.pt"], env=env, check=True
            )
            want_ids, want_cut = torch.load(f"{tmp}/out.pt")
        out[f"vs_interp_{case}_ids"] = int((ids.cpu() == want_ids).sum())
        out[f"vs_interp_{case}_cuts"] = int((cut[:, 0].cpu() == want_cut[:, 0]).sum())
        out[f"vs_interp_{case}_flagged"] = int((cut[:, 1] != 0).sum())
        out[f"vs_interp_{case}_flagged_interp"] = int((want_cut[:, 1] != 0).sum())


def host_profile(x: torch.Tensor, path: str) -> None:
    """cProfile of 200 device-path sampler calls at chat settings, ranked by own time."""
    import cProfile
    import io
    import pstats

    from benchmarks.bench_sampler import chat_params, deferred_ids, make_requests
    from enginespec.sample.sampler import Sampler

    sampler, reqs = Sampler(VOCAB, device="cuda", seed=0), make_requests(ROWS, chat_params)
    for _ in range(20):
        deferred_ids(sampler, x, reqs)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        deferred_ids(sampler, x, reqs)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    with open(path, "w") as f:
        f.write(text.getvalue())
    print(text.getvalue()[:3000])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--old", default=None, help="another kernels/cut_draw.py to time beside this one")
    ap.add_argument(
        "--cprofile", default=None, help="write cProfile's ranking of chat device-path calls here"
    )
    ap.add_argument("--quick", action="store_true", help="only the argmax, this tree's scan and draw, cand_*")
    ap.add_argument("--vs-interpreter", type=int, default=0, help="rows compared with the interpreter")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(ROWS, VOCAB, generator=gen, device="cuda") * 3.0
    out: dict = {"rows": ROWS, "vocab": VOCAB, "chunk": CHUNK}
    out["argmax"] = 1000 * triton.testing.do_bench(lambda: x.argmax(dim=1))
    time_module(cut_draw, x, "", out)
    if args.quick:
        candidate_stats(x, out)
        print(json.dumps(out, indent=1))
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        return
    if args.old:
        spec = importlib.util.spec_from_file_location("old_cut_draw", args.old)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        time_module(old, x, "old_", out)
    keys = torch.arange(ROWS, dtype=torch.int64, device="cuda")
    default_split = cut_draw.CUT_SPLIT
    for split in (2, 4, 8, 16):
        cut_draw.CUT_SPLIT = split
        for case in ("chat", "minp_topp"):
            prm = params(case)
            out[f"draw_{case}_split{split}"] = 1000 * triton.testing.do_bench(
                lambda: cut_draw.draw(x, prm, keys, (1, 2), chunk=CHUNK)
            )
    cut_draw.CUT_SPLIT = default_split
    default_gather = cut_draw.GATHER
    for gather in (32, 64, 128):
        cut_draw.GATHER = gather
        prm = params("chat")
        out[f"draw_chat_gather{gather}"] = 1000 * triton.testing.do_bench(
            lambda: cut_draw.draw(x, prm, keys, (1, 2), chunk=CHUNK)
        )
    cut_draw.GATHER = default_gather
    num_chunks = triton.cdiv(VOCAB, CHUNK)
    nb, cc, slots = 64, 16, 64  # the per-chunk candidate layout the probe levels copy (b971081)
    stats = torch.empty(ROWS * 3 * num_chunks, device="cuda")
    cand = torch.empty(ROWS * num_chunks * slots, device="cuda")
    for level in range(4):
        out[f"probe_level{level}"] = 1000 * triton.testing.do_bench(
            lambda: _probe_scan[(ROWS, num_chunks)](
                x,
                stats,
                cand,
                VOCAB,
                num_chunks,
                LEVEL=level,
                CHUNK=CHUNK,
                NB=nb,
                CC=cc,
                SLOTS=slots,
                num_warps=8,
            )
        )
    candidate_stats(x, out)
    if args.vs_interpreter:
        versus_interpreter(x, args.vs_interpreter, out)
    if args.cprofile:
        host_profile(x, args.cprofile)
    for k, v in out.items():
        print(f"{k:28s} {v:10.1f}" if isinstance(v, float) else f"{k:28s} {v}")
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
