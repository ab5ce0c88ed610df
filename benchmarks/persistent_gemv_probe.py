"""Is a grid barrier inside one persistent kernel cheaper than a kernel boundary under PDL?
(issue 19's moonshot, measured before it is built). CUDA only for timing.

    python3 benchmarks/persistent_gemv_probe.py [--layers 28] [--out probe.json]

At batch 1 a Qwen3-0.6B layer's four projections (q|k|v 4,096 x 1,024, o 1,024 x 2,048,
gate|up 2 x 3,072 x 1,024 with SiLU * up, down 1,024 x 3,072 with the residual) take 12.7 us
of the decode chain against 7.4 us of weight reads (RESULTS, nineteenth session): about 1.3 us
a launch over the weights, with PDL. This probe runs the same four GEMV phases, 28 layers of
distinct weights, L2 cold, two ways, each captured in a CUDA graph:

- `launches`: one launch a phase (112), each program loading its weight tile, then (PDL)
  `gdc_launch_dependents`, `gdc_wait`, the input row, the dot, the store: the engine's scheme;
- `persistent`: one launch of GRID programs (one an SM, all resident) running every phase; a
  program loads its next weight tile, then waits at a grid barrier (one int32 counter, a
  release add and acquire polls), then reads the input row (.cg: not from a stale L1).

and two without work: `barriers` (the persistent kernel's 112 barriers alone) and
`empty_launches` (112 PDL launches that only wait). Every phase has GRID tiles: q|k|v 32 rows
a tile, o and down 8, gate|up 24 (a 32-row tile masked). Outputs of the two ways are compared
(the same tile code: equal unless the two compiles order a sum differently) and against torch. A barrier that spins
past MAX_SPIN polls gives up and sets a flag, so a non-resident program cannot hang the GPU;
the probe reports it. Nothing asserts speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enginespec.kernels.pdl import gdc_launch_dependents, gdc_wait  # noqa: E402
from enginespec.worker.gemm_tuning import graph_us  # noqa: E402

HIDDEN, QKV, ATTN, INTER = 1024, 4096, 2048, 3072
GRID = 128
MAX_SPIN = 1 << 22


@triton.jit
def _grid_barrier(count_ptr, target, flag_ptr, MAX_SPIN: tl.constexpr):
    """Every program adds one to *count_ptr (release) and polls it (acquire) until it reaches
    target (the barrier's generation x programs); past MAX_SPIN polls it sets *flag_ptr."""
    tl.debug_barrier()  # every thread's stores of the phase are issued before the arrive
    tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < MAX_SPIN):
        seen = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if spins >= MAX_SPIN:
        tl.store(flag_ptr, 1)
    tl.debug_barrier()


@triton.jit
def _load_tile(w_ptr, row0, n_rows, K: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_N, K_PAD] weight rows row0.. of a row-major [*, K] matrix (rows past n_rows of the
    tile and columns past K masked to 0; K_PAD the next power of two)."""
    K_PAD: tl.constexpr = triton.next_power_of_2(K)
    rows = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, K_PAD)
    ok = (rows < n_rows)[:, None] & (cols < K)[None, :]
    return tl.load(w_ptr + (row0 + rows)[:, None] * K + cols[None, :], mask=ok, other=0.0)


@triton.jit
def _dot_row(w, x_ptr, K: tl.constexpr):
    """w [BLOCK_N, K_PAD] . x [K] (read past L1) -> [BLOCK_N] float32."""
    K_PAD: tl.constexpr = triton.next_power_of_2(K)
    cols = tl.arange(0, K_PAD)
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0, cache_modifier=".cg").to(tl.float32)
    return tl.sum(w.to(tl.float32) * x[None, :], 1)


@triton.jit
def _phase_qkv(w, x_ptr, out_ptr, tile):
    acc = _dot_row(w, x_ptr, 1024)  # [32]
    tl.store(out_ptr + tile * 32 + tl.arange(0, 32), acc.to(out_ptr.dtype.element_ty))


@triton.jit
def _phase_residual(w, x_ptr, res_ptr, out_ptr, tile, K: tl.constexpr):
    rows = tile * 8 + tl.arange(0, 8)
    acc = _dot_row(w, x_ptr, K) + tl.load(res_ptr + rows, cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty))


@triton.jit
def _phase_gate_up(wg, wu, x_ptr, out_ptr, tile):
    g = _dot_row(wg, x_ptr, 1024)  # [32], rows >= 24 are 0
    u = _dot_row(wu, x_ptr, 1024)
    act = g / (1.0 + tl.exp(-g)) * u
    rows = tl.arange(0, 32)
    tl.store(out_ptr + tile * 24 + rows, act.to(out_ptr.dtype.element_ty), mask=rows < 24)


@triton.jit
def _persistent_kernel(
    w_qkv_ptr,  # [L, 4096, 1024]
    w_o_ptr,  # [L, 1024, 2048]
    w_gu_ptr,  # [L, 6144, 1024]: gate rows, then up rows
    w_down_ptr,  # [L, 1024, 3072]
    x_ptr,  # [1024] the layer's input and output
    qkv_ptr,  # [4096]
    h_ptr,  # [1024] after attention's residual
    act_ptr,  # [3072]
    count_ptr,  # [1] int32, 0 at launch
    flag_ptr,  # [1] int32: set when a barrier gave up
    num_layers,
    DO_WORK: tl.constexpr,
    MAX_SPIN: tl.constexpr,
):
    tile = tl.program_id(0)
    grid = tl.num_programs(0)
    gen = 0
    for layer in range(num_layers):
        if DO_WORK:
            w = _load_tile(w_qkv_ptr + layer * 4096 * 1024, tile * 32, 32, 1024, 32)
        gen += 1
        _grid_barrier(count_ptr, gen * grid, flag_ptr, MAX_SPIN)  # x of the layer before is written
        if DO_WORK:
            _phase_qkv(w, x_ptr, qkv_ptr, tile)
            w = _load_tile(w_o_ptr + layer * 1024 * 2048, tile * 8, 8, 2048, 8)
        gen += 1
        _grid_barrier(count_ptr, gen * grid, flag_ptr, MAX_SPIN)
        if DO_WORK:
            _phase_residual(w, qkv_ptr, x_ptr, h_ptr, tile, 2048)
            wg = _load_tile(w_gu_ptr + layer * 6144 * 1024, tile * 24, 24, 1024, 32)
            wu = _load_tile(w_gu_ptr + layer * 6144 * 1024 + 3072 * 1024, tile * 24, 24, 1024, 32)
        gen += 1
        _grid_barrier(count_ptr, gen * grid, flag_ptr, MAX_SPIN)
        if DO_WORK:
            _phase_gate_up(wg, wu, h_ptr, act_ptr, tile)
            w = _load_tile(w_down_ptr + layer * 1024 * 3072, tile * 8, 8, 3072, 8)
        gen += 1
        _grid_barrier(count_ptr, gen * grid, flag_ptr, MAX_SPIN)
        if DO_WORK:
            _phase_residual(w, act_ptr, h_ptr, x_ptr, tile, 3072)


@triton.jit
def _launch_kernel(
    w_ptr, in_ptr, res_ptr, out_ptr, w2_ptr,
    PHASE: tl.constexpr,  # 0 q|k|v, 1 o, 2 gate|up, 3 down, -1 no work
    USE_PDL: tl.constexpr,
):  # fmt: skip
    """One phase as its own launch: weight tile, PDL trigger and wait, input, dot, store."""
    tile = tl.program_id(0)
    if PHASE == 0:
        w = _load_tile(w_ptr, tile * 32, 32, 1024, 32)
    elif PHASE == 1:
        w = _load_tile(w_ptr, tile * 8, 8, 2048, 8)
    elif PHASE == 2:
        w = _load_tile(w_ptr, tile * 24, 24, 1024, 32)
        wu = _load_tile(w2_ptr, tile * 24, 24, 1024, 32)
    elif PHASE == 3:
        w = _load_tile(w_ptr, tile * 8, 8, 3072, 8)
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()
    if PHASE == 0:
        _phase_qkv(w, in_ptr, out_ptr, tile)
    elif PHASE == 1:
        _phase_residual(w, in_ptr, res_ptr, out_ptr, tile, 2048)
    elif PHASE == 2:
        _phase_gate_up(w, wu, in_ptr, out_ptr, tile)
    elif PHASE == 3:
        _phase_residual(w, in_ptr, res_ptr, out_ptr, tile, 3072)


def make_weights(num_layers: int, device, seed: int = 0) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def w(n, k):
        return (torch.randn(num_layers, n, k, generator=g) * k**-0.5).to(torch.bfloat16).to(device)

    return dict(qkv=w(QKV, HIDDEN), o=w(HIDDEN, ATTN), gu=w(2 * INTER, HIDDEN), down=w(HIDDEN, INTER))


def buffers(device, seed: int = 1) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(HIDDEN, generator=g).to(torch.bfloat16).to(device)
    z = dict(dtype=torch.bfloat16, device=device)
    return dict(
        x=x, x0=x.clone(), qkv=torch.zeros(QKV, **z), h=torch.zeros(HIDDEN, **z), act=torch.zeros(INTER, **z),
        count=torch.zeros(1, dtype=torch.int32, device=device), flag=torch.zeros(1, dtype=torch.int32, device=device),
    )  # fmt: skip


def run_persistent(w: dict, b: dict, num_layers: int, do_work: bool = True, max_spin: int = MAX_SPIN) -> None:
    b["count"].zero_()
    _persistent_kernel[(GRID,)](
        w["qkv"], w["o"], w["gu"], w["down"], b["x"], b["qkv"], b["h"], b["act"], b["count"], b["flag"],
        num_layers, DO_WORK=do_work, MAX_SPIN=max_spin, num_warps=8,
    )  # fmt: skip


def run_launches(w: dict, b: dict, num_layers: int, pdl: bool, do_work: bool = True) -> None:
    opts = {"launch_pdl": True} if pdl else {}
    for layer in range(num_layers):
        steps = [
            (0, w["qkv"][layer], b["x"], b["x"], b["qkv"], b["x"]),
            (1, w["o"][layer], b["qkv"], b["x"], b["h"], b["x"]),
            (2, w["gu"][layer][:INTER], b["h"], b["h"], b["act"], w["gu"][layer][INTER:]),
            (3, w["down"][layer], b["act"], b["h"], b["x"], b["x"]),
        ]
        for phase, wt, inp, res, out, w2 in steps:
            _launch_kernel[(GRID,)](
                wt, inp, res, out, w2, PHASE=phase if do_work else -1, USE_PDL=pdl, num_warps=8, **opts
            )


def reference(w: dict, x: torch.Tensor, num_layers: int) -> torch.Tensor:
    """The same chain in torch (float32 sums, bf16 between phases)."""
    f = torch.float32
    for layer in range(num_layers):
        qkv = (w["qkv"][layer].to(f) @ x.to(f)).to(torch.bfloat16)
        h = (w["o"][layer].to(f) @ qkv[:ATTN].to(f) + x.to(f)).to(torch.bfloat16)
        gu = w["gu"][layer].to(f) @ h.to(f)
        act = (torch.nn.functional.silu(gu[:INTER]) * gu[INTER:]).to(torch.bfloat16)
        x = (w["down"][layer].to(f) @ act.to(f) + h.to(f)).to(torch.bfloat16)
    return x


def time_graph(fn, reps: int = 20) -> float:
    """us per replay of a CUDA graph of fn (the median of reps; the engine's tuning timer)."""
    return graph_us(lambda: fn() or [], 1, reps)[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    n = args.layers
    w, b = make_weights(n, dev), buffers(dev)
    floor_us = sum(t.numel() * 2 for t in w.values()) / 4.2e12 * 1e6
    results = {"layers": n, "grid": GRID, "weight_floor_us": floor_us}
    # correctness: both ways from the same x, over 1 layer (against torch too) and over n
    for layers in (1, n):
        b["x"].copy_(b["x0"])
        run_persistent(w, b, layers)
        torch.cuda.synchronize()
        got_p, flag = b["x"].clone(), int(b["flag"].item())
        b["x"].copy_(b["x0"])
        run_launches(w, b, layers, pdl=True)
        torch.cuda.synchronize()
        got_l = b["x"].clone()
        ref = reference(w, b["x0"], layers).float()
        results[f"check_{layers}_layers"] = {
            "barrier_gave_up": flag,
            "persistent_equals_launches": bool(torch.equal(got_p, got_l)),
            "max_abs_diff_persistent_launches": float((got_p.float() - got_l.float()).abs().max()),
            "max_abs_err_launches_vs_torch": float((got_l.float() - ref).abs().max()),
            "torch_max_abs": float(ref.abs().max()),
        }
        print(f"check over {layers} layers: {results[f'check_{layers}_layers']}", flush=True)
    cases = {
        "persistent": lambda: run_persistent(w, b, n),
        "launches_pdl": lambda: run_launches(w, b, n, pdl=True),
        "launches_no_pdl": lambda: run_launches(w, b, n, pdl=False),
        "barriers": lambda: run_persistent(w, b, n, do_work=False),
        "empty_launches_pdl": lambda: run_launches(w, b, n, pdl=True, do_work=False),
    }
    for name, fn in cases.items():
        us = time_graph(fn)
        results[name] = {"us": us, "us_per_layer": us / n, "us_per_phase": us / (4 * n)}
        print(f"{name:20s} {us:9.1f} us  {us / n:7.2f} us/layer  {us / (4 * n):6.2f} us/phase", flush=True)
    results["flag_after_timing"] = int(b["flag"].item())
    print(f"barrier gave up after timing: {results['flag_after_timing']}")
    print(f"weight floor {floor_us:.1f} us ({floor_us / n:.2f} us/layer)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
