"""Where each program of the one-launch decode attention spends its time (issue 19). CUDA only.

    python3 benchmarks/decode_attention_phases.py OUT.json [--batches 1,4,16] [--contexts 517,2048]

The decode attention (kernels/decode_attention.py) takes 6 us a layer at 1 row, 8.5 at 4 and
19 at 16 (517-token contexts; the K/V's floor is 0.5, 2 and 8), and every launch config of
decode_attention_probe.py lies within 17.6-38 us at 16 rows: the cost is in the kernel's
structure, not its config. This probe writes a copy of the module whose kernel reads
%globaltimer (after a CTA barrier) at phase boundaries and %smid once, into an int64
[programs, 16] buffer, then runs the config decode_config gives a graph (Qwen3-0.6B heads,
bf16, q|k norms on; decode_attention_probe.make_case's inputs, L2 cold) and reports per
batch x context: the compiled kernel's registers and spills, programs that ran (splits that
own no tile exit at once and are counted apart), how many ran at once on one SM, the latest
start, a program's time (median, max), the launch's span, and each phase's median and max (us):

    0 start; 1 before the q|k|v row's loads (after the preload and the PDL wait: with nothing
    before it in the probe, the wait returns at once); 2 after the q|k norm and rotary; 3 after
    the new K/V's write and its score; 4 after the preloaded first tile (at once without
    preloading); 5 after the loop over the split's keys; 6 after the partials' store.

The stamps cost a barrier each: the span runs a little longer than the plain launch. Nothing
asserts speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import decode_attention_probe as probe  # noqa: E402
from benchmarks import stamping  # noqa: E402

NUM_STAMPS = 7

STAMP = stamping.helpers("pid") + "\n\n@triton.jit\ndef _norm_rope("

# (old, new) edits of kernels/decode_attention.py; each old text must occur once
EDITS = [
    ("\n@triton.jit\ndef _norm_rope(", STAMP),
    ("    order_ptr,  # [B] int32 (USE_ORDER only): a permutation of range(B), launch order\n",
     "    order_ptr,  # [B] int32 (USE_ORDER only): a permutation of range(B), launch order\n"
     "    times_ptr,  # [programs, 16] int64: the phase stamps\n"),
    ("    split = tl.program_id(2)\n",
     "    split = tl.program_id(2)\n    pid = (tl.program_id(0) * NUM_KV_HEADS + kv_head) * num_splits + split\n"
     "    _stamp(times_ptr, pid, 0)\n    _smid(times_ptr, pid)\n"),
    ("    in_ty = qkv_ptr.dtype.element_ty\n", "    _stamp(times_ptr, pid, 1)\n    in_ty = qkv_ptr.dtype.element_ty\n"),
    ("    if split == 0:  # the one writer", "    _stamp(times_ptr, pid, 2)\n    if split == 0:  # the one writer"),
    ("    # Then the pool's keys before it,", "    _stamp(times_ptr, pid, 3)\n    # Then the pool's keys before it,"),
    ("    # The rest of the split's keys:", "    _stamp(times_ptr, pid, 4)\n    # The rest of the split's keys:"),
    ("    _store_rows(\n        out_ptr, part_ptr,", "    _stamp(times_ptr, pid, 5)\n    _store_rows(\n        out_ptr, part_ptr,"),
    ("        stride_o_tok, stride_o_head, NUM_Q_HEADS, HEAD_DIM, IS_SPLIT,\n    )  # fmt: skip\n",
     "        stride_o_tok, stride_o_head, NUM_Q_HEADS, HEAD_DIM, IS_SPLIT,\n    )  # fmt: skip\n"
     "    _stamp(times_ptr, pid, 6)\n"),
    ("        order if order is not None else seq_lens,\n", "        order if order is not None else seq_lens,\n        TIMES,\n"),
    ("    launcher(_decode_attention_kernel, (num_reqs, num_kv_heads, cfg.num_splits))(",
     "    LAST[:] = [None]\n    LAST[0] = launcher(_decode_attention_kernel, (num_reqs, num_kv_heads, cfg.num_splits))("),
    ("\nPRELOAD_ROWS_ENV =", "\nTIMES = None\nLAST = []\nPRELOAD_ROWS_ENV ="),
]  # fmt: skip


def stamped_source(src: str) -> str:
    """src (kernels/decode_attention.py) with the stamps and the buffer threaded through."""
    for old, new in EDITS:
        assert src.count(old) == 1, f"anchor not found once: {old[:60]!r}"
        src = src.replace(old, new)
    return src


def load_stamped(path: str):
    with open(path) as f:
        return stamping.load_edited(stamped_source(f.read()), "decode_attention_stamped")


def summarize(t: torch.Tensor) -> dict:
    """Figures of one launch from its stamps (int64 [programs, 16], ns; 0 where not stamped)."""
    ran = t[:, NUM_STAMPS - 1] > 0
    t = t[ran]
    t0 = t[:, 0].min()
    start, end = (t[:, 0] - t0).double() / 1e3, (t[:, NUM_STAMPS - 1] - t0).double() / 1e3
    per_sm: dict = {}
    for s, e, sm in zip(start.tolist(), end.tolist(), t[:, 15].tolist()):
        per_sm.setdefault(int(sm), []).append((s, e))
    concurrent = max(sum(1 for a, b in iv if a <= s0 < b) for iv in per_sm.values() for s0, _ in iv)
    out = dict(
        programs_ran=int(ran.sum()), programs_idle=int((~ran).sum()), sms=len(per_sm), max_concurrent=concurrent,
        start_max=round(float(start.max()), 2), program_us=round(float((end - start).median()), 2),
        program_max=round(float((end - start).max()), 2), span=round(float(end.max()), 2),
    )  # fmt: skip
    prev = 0
    for i in range(1, NUM_STAMPS):
        if bool((t[:, i] == 0).all()):
            continue  # a phase this config does not have (4: no preload)
        d = (t[:, i] - t[:, prev]).double() / 1e3
        out[f"{prev}-{i}"] = (round(float(d.median()), 2), round(float(d.max()), 2))
        prev = i
    return out


def measure(mod, batch: int, ctx: int, max_model_len: int) -> dict:
    case = probe.make_case(batch, ctx, "cuda", torch.bfloat16)
    cfg = mod.decode_config(batch, probe.HQ, probe.HKV, probe.HEAD, max_model_len, torch.device("cuda"))
    mod.TIMES = torch.zeros(batch * probe.HKV * cfg.num_splits * 16, dtype=torch.int64, device="cuda")
    calls = probe.calls_of(case, max_model_len, cfg, attention=mod.decode_attention)
    for call in calls[:4] + calls[-1:]:  # the last set, L2 cold for it after the others
        mod.TIMES.zero_()
        call()
    torch.cuda.synchronize()
    out = dict(batch=batch, context=ctx, config=str(cfg), **summarize(mod.TIMES.view(-1, 16).cpu()))
    kernel = mod.LAST[0]  # the launch's compiled kernel
    out.update(regs=getattr(kernel, "n_regs", None), spills=getattr(kernel, "n_spills", None))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--contexts", default="517,2048")
    ap.add_argument("--max-model-len", type=int, default=40960)
    ap.add_argument(
        "--kernel", default=os.path.join(os.path.dirname(probe.pa.__file__), "decode_attention.py")
    )
    args = ap.parse_args(argv)
    mod = load_stamped(args.kernel)
    rows = []
    for b in map(int, args.batches.split(",")):
        for ctx in map(int, args.contexts.split(",")):
            rows.append(measure(mod, b, ctx, args.max_model_len))
            print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"kernel": args.kernel, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
