"""Registers, spills and instruction counts of our decode kernels as the installed triton
compiles them for an H100/H200 (sm_90), on any machine, CPU-only ones included (issue 19).

The decode step's attention and GEMV launches are latency-bound at small batches, so a config
whose program spills registers to local memory pays for it on every tile. Which config spills
depends on the triton (and its bundled ptxas): the device's triton 3.6 and a newer one give
very different answers for the same source. This compiles each kernel x config with triton's
compiler API and reads the cubin with the cuobjdump that triton ships:

- REG, STACK (bytes of local memory a thread: spills), from `cuobjdump --dump-resource-usage`;
- the SASS instruction count and its local loads / stores (LDL, STL), global loads (LDG) and
  tensor-core MMAs (HMMA and Hopper's HGMMA), from `cuobjdump -sass`;
- for a kernel with a PDL wait, what follows it in the PTX (`after_wait`): its barriers (BAR/W)
  and its load rounds (RND/W), the stretches between barriers that issue a global load. A load
  is not moved above a barrier, so each round after the first is another memory latency that
  no earlier kernel overlaps: what a latency-bound decode step waits for. Static counts in
  program text (a loop body counts once).

    python3 benchmarks/kernel_resources.py [--json out.json]

Figures: benchmarks/RESULTS.md. Run as a script it drops TRITON_INTERPRET before importing
triton (it compiles, it runs nothing); imported, it leaves the environment alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

if __name__ == "__main__":  # before triton is imported: a run compiles, it interprets nothing
    os.environ.pop("TRITON_INTERPRET", None)  # (an import leaves it alone: a test session imports this)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402

# The Qwen3-0.6B decode shapes: 16 q / 8 kv heads of 128, bf16, 16-token blocks.
# The fused decode attention's small-batch configs that read their first tile before the wait.
# (tile, loop_tile, long_tile, stages): decode_config's first (sixteenth session), then A/B shapes
DECODE_PRELOAD_CONFIGS = [(16, 32, 128, 2), (16, 64, 0, 1), (16, 16, 0, 1), (16, 128, 0, 2), (32, 32, 0, 1)]
ATTENTION_CONFIGS = [  # (split, tile, warps): the split rows are what batch 1-32 runs
    (True, 128, 4),
    (True, 128, 8),
    (True, 64, 4),
    (True, 64, 8),
    (False, 64, 4),
    (False, 64, 8),
]
PREFILL_CONFIGS = [(128, 4, 3), (128, 8, 3), (64, 4, 2)]  # (block_m, warps, stages): choose_config's
GEMV_CONFIGS = [  # (variant, block_n, block_k, warps): batch 1's tuned choices at 01e0efc (H200); 9d45474 took block_n 1 for o and down
    ("norm", 8, 1024, 8),  # q|k|v 4096 x 1024 with the input norm
    ("norm_silu", 4, 1024, 4),  # gate|up 2 x 3072 x 1024 with the norm, SiLU * up
    ("residual", 4, 2048, 8),  # o 1024 x 2048 plus the residual
    ("residual", 2, 4096, 8),  # down 1024 x 3072 plus the residual
]
GEMV_ROWS = (1, 8)  # x rows (BLOCK_M): the one-tile kernel takes them one at a time
TILED_CONFIGS = [  # (variant, block_m, block_n, block_k, warps, stages, split): the tiled kernel at 4-32 rows
    ("plain", 16, 64, 256, 4, 3, True),  # o at 8 rows, as tuned at c0a6966 (8 splits)
    ("plain", 16, 16, 1024, 4, 1, False),  # one-step tiles (K 1,024: q|k|v, gate|up), 4-32 rows
    ("plain", 16, 32, 1024, 8, 1, False),
    ("norm", 16, 16, 1024, 4, 1, False),
    ("norm", 16, 32, 1024, 8, 1, False),
    ("silu", 16, 16, 1024, 4, 1, False),  # one-step gate|up with SiLU * up: two weight tiles
    ("silu", 16, 16, 1024, 8, 1, False),
    ("silu", 16, 32, 1024, 8, 1, False),
    ("plain", 32, 16, 1024, 4, 1, False),  # one-step tiles at 32 rows
    ("plain", 32, 32, 1024, 8, 1, False),
    ("plain", 16, 16, 2048, 8, 1, False),  # one-step tiles for o (K 2,048)
    ("residual", 16, 16, 2048, 8, 1, False),
    ("residual", 16, 16, 2048, 8, 1, True),  # down (K 3,072) in two splits of 2,048
    ("residual", 16, 32, 1024, 8, 1, True),  # o and down in 1,024-long one-step slices: tuned at 8-32 rows
]
BF16 = "*bf16"


def _signature(fn, consts: dict, ptrs: dict, floats=()) -> dict:
    return {
        name: "constexpr" if name in consts else ptrs.get(name) or ("fp32" if name in floats else "i32")
        for name in fn.arg_names
    }


def _attrs(fn, signature: dict) -> dict:
    """The specialization the JIT gives a real launch of these shapes: every pointer (torch's
    allocations) and every integer argument divisible by 16 (strides, sizes and the scratch slot
    are multiples of 16 here), except the arguments the kernel asks not to specialize (batch
    sizes, split counts, windows). Without these the compiler cannot vectorize or fold address
    arithmetic, and the code (registers, spills) is not the code that runs."""
    skip = set(getattr(fn, "do_not_specialize", None) or ())
    return {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if name not in skip and (signature[name].startswith("*") or signature[name] == "i32")
    }


def source(fn, consts: dict, ptrs: dict, floats=()):
    """The kernel's ASTSource as the JIT would build it for a launch of these shapes. Every
    constexpr without a default must be given, and those not given take their defaults (one
    taken for a runtime int would compile both branches of its ifs: not the code that runs)."""
    from triton.compiler import ASTSource

    missing = [p.name for p in fn.params if p.is_constexpr and p.name not in consts and not p.has_default]
    if missing:
        raise ValueError(f"{fn.__name__}: constexprs not given: {missing}")
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    consts = {**defaults, **consts}

    signature = _signature(fn, consts, ptrs, floats)
    return ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=_attrs(fn, signature))


def kernels() -> list:
    """(name, fn, constexprs, pointer types, float args, compile options) of every case."""
    from enginespec.kernels import decode_attention as da
    from enginespec.kernels import paged_attention as pa
    from enginespec.kernels import skinny_gemm as sg

    cases = []
    for split, tile, warps in ATTENTION_CONFIGS:
        opts = {"num_warps": warps, "num_stages": 2}
        paged = dict(
            NUM_Q_HEADS=16, GROUP=2, HEAD_DIM=128, HEAD_PAD=128, BLOCK_SIZE=16, BLOCK_Q=1, BLOCK_M=16
        )
        paged["TILE"] = tile
        paged.update(IS_SPLIT=split, USE_WINDOW=False, USE_ORDER=True, DOT_FP32=False, USE_PDL=True)
        ptrs = dict(out_ptr=BF16, part_ptr="*fp32", q_ptr=BF16, cache_ptr=BF16, block_table_ptr="*i32")
        ptrs.update(seq_lens_ptr="*i32", query_start_loc_ptr="*i32", order_ptr="*i32")
        tag = f"split={int(split)} tile={tile} warps={warps}"
        cases.append(
            (f"paged_attention {tag}", pa._paged_attention_kernel, paged, ptrs, ("scale_log2",), opts)
        )
        dec = dict(
            NUM_Q_HEADS=16, NUM_KV_HEADS=8, GROUP=2, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_M=16, TILE=tile
        )
        dec.update(
            IS_SPLIT=split, USE_WINDOW=False, USE_ORDER=True, USE_NORM=True, DOT_FP32=False, USE_PDL=True
        )
        dec.update(LINE=64, PRELOAD=False, LOOP_TILE=tile, LONG_TILE=0, PREFETCH_TILES=1)
        dec.update(HIDDEN=1024, H_BLOCK=1024, USE_ROW_SCALE=False, BALANCE=False, MAX_ROWS=16)
        ptrs = dict(out_ptr=BF16, part_ptr="*fp32", cache_ptr=BF16, qkv_ptr=BF16, cos_ptr=BF16, sin_ptr=BF16)
        ptrs.update(
            norm_ptr=BF16, slot_ptr="*i64", block_table_ptr="*i32", seq_lens_ptr="*i32", order_ptr="*i32"
        )
        ptrs.update(h_ptr=BF16)
        floats = ("scale_log2", "eps", "row_eps")
        cases.append((f"decode_attention {tag}", da._decode_attention_kernel, dec, ptrs, floats, opts))
    balanced = dict(dec, TILE=128, IS_SPLIT=True, LOOP_TILE=128, BALANCE=True, MAX_ROWS=64)
    cases.append(
        ("decode_attention balanced tile=128", da._decode_attention_kernel, balanced, ptrs, floats, opts)
    )
    for tile, loop_tile, long_tile, stages in DECODE_PRELOAD_CONFIGS:
        pre = dict(dec, TILE=tile, IS_SPLIT=True, PRELOAD=True, LOOP_TILE=loop_tile, LONG_TILE=long_tile)
        name = f"decode_attention preload split=1 tile={tile} loop_tile={loop_tile} long_tile={long_tile} stages={stages}"
        cases.append(
            (name, da._decode_attention_kernel, pre, ptrs, floats, {"num_warps": 4, "num_stages": stages})
        )
    for block_m, warps, stages in PREFILL_CONFIGS:
        paged = dict(
            NUM_Q_HEADS=16,
            GROUP=2,
            HEAD_DIM=128,
            HEAD_PAD=128,
            BLOCK_SIZE=16,
            BLOCK_Q=block_m // 2,
            BLOCK_M=block_m,
        )
        paged.update(TILE=64, IS_SPLIT=False, USE_WINDOW=False, USE_ORDER=False, DOT_FP32=False, USE_PDL=True)
        ptrs = dict(out_ptr=BF16, part_ptr="*fp32", q_ptr=BF16, cache_ptr=BF16, block_table_ptr="*i32")
        ptrs.update(seq_lens_ptr="*i32", query_start_loc_ptr="*i32", order_ptr="*i32")
        opts = {"num_warps": warps, "num_stages": stages}
        name = f"paged_attention prefill block_m={block_m} tile=64 warps={warps} stages={stages}"
        cases.append((name, pa._paged_attention_kernel, paged, ptrs, ("scale_log2",), opts))
    for (variant, block_n, block_k, warps), rows in itertools.product(GEMV_CONFIGS, GEMV_ROWS):
        consts = dict(BLOCK_M=rows, BLOCK_N=block_n, BLOCK_K=block_k, USE_BIAS=False, USE_PDL=True)
        consts.update(
            USE_SILU_MUL="silu" in variant, USE_NORM="norm" in variant, USE_RESIDUAL=variant == "residual"
        )
        ptrs = {n: BF16 for n in ("out_ptr", "x_ptr", "w_ptr", "bias_ptr", "norm_ptr", "res_ptr")}
        name = f"gemv {variant} rows={rows} block_n={block_n} block_k={block_k} warps={warps}"
        cases.append((name, sg._gemv_kernel, consts, ptrs, ("eps",), {"num_warps": warps, "num_stages": 1}))
    for variant, block_m, block_n, block_k, warps, stages, split in TILED_CONFIGS:
        consts = dict(
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, USE_DOT=True, USE_SPLIT=split, USE_BIAS=False
        )
        consts.update(
            USE_SILU_MUL=variant == "silu",
            USE_NORM=variant == "norm",
            USE_RESIDUAL=variant == "residual",
            DOT_FP32=False,
        )
        consts.update(USE_PDL=True, ROW_K=block_k if variant == "norm" else 0)
        ptrs = {n: BF16 for n in ("out_ptr", "x_ptr", "w_ptr", "bias_ptr", "norm_ptr", "res_ptr")}
        ptrs.update(part_ptr="*fp32", count_ptr="*i32")
        name = f"tiled {variant} rows={block_m} block_n={block_n} block_k={block_k} warps={warps} stages={stages} split={int(split)}"
        opts = {"num_warps": warps, "num_stages": stages}
        cases.append((name, sg._skinny_gemm_kernel, consts, ptrs, ("eps",), opts))
    # The one-split decode attention (what a 64-row decode runs) with the folded input norm's row scale.
    one_split = next(c for c in cases if c[0].startswith("decode_attention split=0"))
    name, fn, consts, ptrs, floats, opts = one_split
    name = name.replace("decode_attention", "decode_attention folded")
    cases.append((name, fn, dict(consts, USE_ROW_SCALE=True), ptrs, floats, opts))
    return cases + _row_scale_cases()


def _row_scale_cases() -> list:
    """q|k|v rotary and SiLU * up without and with the folded norms' row scale, at hidden 1,024
    and intermediate 3,072 (silu_mul's launch config for it)."""
    from enginespec.kernels import qkv_rope as qr
    from enginespec.kernels import silu_mul as sm

    rope = dict(NUM_Q=16, NUM_KV=8, QK_PAD=32, KV_PAD=8, HEAD_DIM=128, HALF=64, BLOCK_SIZE=16)
    rope.update(USE_NORM=True, USE_PDL=True, HIDDEN=1024, H_BLOCK=1024)
    rope_ptrs = dict(q_out_ptr=BF16, cache_ptr=BF16, qkv_ptr=BF16, cos_ptr=BF16, sin_ptr=BF16, norm_ptr=BF16)
    rope_ptrs.update(slot_ptr="*i64", h_ptr=BF16)
    silu_ptrs = dict(out_ptr=BF16, gate_up_ptr=BF16, h_ptr=BF16)
    cases = []
    for scaled in (False, True):
        tag = " folded" if scaled else ""
        consts = dict(rope, USE_ROW_SCALE=scaled)
        opts = {"num_warps": 4}
        cases.append((f"qkv_rope{tag}", qr._qkv_rope_kernel, consts, rope_ptrs, ("eps", "row_eps"), opts))
        block, warps = sm.launch_config(3072, scaled)
        consts = dict(BLOCK=block, USE_PDL=True, HIDDEN=1024, H_BLOCK=1024, USE_ROW_SCALE=scaled)
        name = f"silu_mul{tag} inter=3072 block={block} warps={warps}"
        cases.append((name, sm._silu_mul_kernel, consts, silu_ptrs, ("row_eps",), {"num_warps": warps}))
    return cases


def _tool(name: str) -> str:
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise SystemExit(f"this triton ships no {name} ({path}): nothing to read the cubin with")
    return path


def resources(cubin: bytes) -> dict:
    """REG and STACK of the kernel, and its SASS instruction counts."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run(
            [_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True
        )
        sass = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    found = {key: re.search(rf"{key}:(\d+)", usage.stdout) for key in ("REG", "STACK")}
    lines = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,6}\*/", line)]

    def count(op: str) -> int:
        return sum(1 for line in lines if re.search(rf"\b{op}\b", line))

    row = {key.lower(): int(m.group(1)) if m else None for key, m in found.items()}
    row.update(
        instructions=len(lines),
        ldl=count("LDL"),
        stl=count("STL"),
        ldg=count(r"LDG\.E"),
        mma=count("HMMA") + count("HGMMA"),
    )
    return row


def after_wait(ptx: str) -> dict:
    """Barriers and load rounds in the PTX after its first griddepcontrol.wait (None each when
    there is none): a round is a stretch between barriers (bar.sync / barrier.sync) holding a
    global load (ld.global or an async copy, cp.async ... .global)."""
    lines = ptx.splitlines()
    start = next((i for i, line in enumerate(lines) if "griddepcontrol.wait" in line), None)
    if start is None:
        return {"bar_w": None, "rounds_w": None}
    bars = rounds = 0
    loads = False
    for line in lines[start + 1 :]:
        if re.search(r"\b(bar|barrier)\.sync\b", line):
            bars, rounds, loads = bars + 1, rounds + loads, False
        elif re.search(r"\bld\.global|\bcp\.async\S*\.global", line):
            loads = True
    return {"bar_w": bars, "rounds_w": rounds + loads}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--match", default="", help="only the kernels whose name contains this")
    args = parser.parse_args(argv)
    from triton.backends.compiler import GPUTarget

    from enginespec import kernels as compiled_from

    rows = []
    print(f"triton {triton.__version__}, sm_90, kernels of {os.path.dirname(compiled_from.__file__)}")
    print("| kernel, config | REG | STACK B | SASS | LDL | STL | LDG | MMA | BAR/W | RND/W |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, fn, consts, ptrs, floats, opts in kernels():
        if args.match not in name:
            continue
        src = source(fn, consts, ptrs, floats)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
        row = dict(kernel=name, **resources(compiled.asm["cubin"]), **after_wait(compiled.asm["ptx"]))
        rows.append(row)
        keys = ("reg", "stack", "instructions", "ldl", "stl", "ldg", "mma", "bar_w", "rounds_w")
        cells = ["-" if row[k] is None else row[k] for k in keys]
        print(f"| {name} | " + " | ".join(str(c) for c in cells) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(triton=triton.__version__, target="sm_90", rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
