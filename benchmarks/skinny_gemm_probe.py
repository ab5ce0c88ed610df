"""Decode-sized GEMMs (Qwen3-0.6B's four layer projections at 1-128 rows): cuBLAS through
F.linear, cuBLAS with the operands swapped, and the best of a small sweep of a Triton split-K
kernel (partials plus a reduce kernel), each timed over 28 distinct weight matrices (a cold L2,
as in a real step) inside a CUDA graph, so launch gaps do not count. Needs a CUDA device.

    python3 benchmarks/skinny_gemm_probe.py OUT.json

On the H200 (benchmarks/RESULTS.md, issue 6) cuBLAS took 5.4-8 us per GEMM at every row
count and the Triton kernel did not beat it, so the engine keeps cuBLAS.
"""

import itertools
import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=['M', 'K_SPLIT'])
def _lin(
    x_ptr,
    w_ptr,
    o_ptr,
    M,
    N,
    K,
    K_SPLIT,
    sxm,
    swn,
    som,
    sos,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k0 = pid_k * K_SPLIT
    for k in range(k0, k0 + K_SPLIT, BLOCK_K):
        x = tl.load(x_ptr + rm[:, None] * sxm + (k + rk)[None, :], mask=(rm < M)[:, None], other=0.0)
        w = tl.load(w_ptr + rn[None, :] * swn + (k + rk)[:, None])
        acc += tl.dot(x, w)
    off = pid_k * sos + rm[:, None] * som + rn[None, :]
    if SPLIT:
        tl.store(o_ptr + off, acc, mask=(rm < M)[:, None])
    else:
        tl.store(o_ptr + off, acc.to(o_ptr.dtype.element_ty), mask=(rm < M)[:, None])


@triton.jit
def _red(p_ptr, o_ptr, MN, S: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < MN
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(S):
        acc += tl.load(p_ptr + s * MN + i, mask=ok, other=0.0)
    tl.store(o_ptr + i, acc.to(o_ptr.dtype.element_ty), mask=ok)


def tri(x, w, bn, bk, s, warps, stages, part, out):
    M, K = x.shape
    N = w.shape[0]
    bm = max(16, triton.next_power_of_2(M))
    ks = K // s
    if s == 1:
        _lin[(N // bn, 1)](
            x,
            w,
            out,
            M,
            N,
            K,
            ks,
            x.stride(0),
            w.stride(0),
            out.stride(0),
            0,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            SPLIT=False,
            num_warps=warps,
            num_stages=stages,
        )
    else:
        _lin[(N // bn, s)](
            x,
            w,
            part,
            M,
            N,
            K,
            ks,
            x.stride(0),
            w.stride(0),
            N,
            M * N,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            SPLIT=True,
            num_warps=warps,
            num_stages=stages,
        )
        _red[(triton.cdiv(M * N, 1024),)](part, out, M * N, S=s, BLOCK=1024)
    return out


def graph_time(fn, reps=3):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps


def main(path: str) -> None:
    L = 28
    shapes = {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024)}
    dev = "cuda"
    res = []
    for name, (K, N) in shapes.items():
        Ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / 32 for _ in range(L)]
        for M in [1, 8, 16, 32, 64, 128]:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x, Ws[0])
            row = {"shape": name, "M": M}
            row["cublas"] = graph_time(lambda: [torch.nn.functional.linear(x, w) for w in Ws]) / L
            row["cublas_swap"] = graph_time(lambda: [torch.mm(w, x.t()) for w in Ws]) / L
            best = (1e9, None)
            for bn, bk, s, warps, stages in itertools.product(
                [16, 32, 64], [128, 256], [1, 2, 4, 8], [4], [3]
            ):
                if N % bn or K % (bk * s):
                    continue
                if M > 64 and bn < 32:
                    continue
                part = torch.empty(s, M, N, device=dev, dtype=torch.float32)
                try:
                    got = tri(x, Ws[0], bn, bk, s, warps, stages, part, out)
                    err = (got.float() - ref.float()).abs().max().item()
                    t = graph_time(lambda: [tri(x, w, bn, bk, s, warps, stages, part, out) for w in Ws]) / L
                except Exception:
                    continue
                if t < best[0]:
                    best = (t, dict(bn=bn, bk=bk, s=s, stages=stages, err=err))
            row["triton"], row["triton_cfg"] = best
            row["weight_us_at_4.3TBs"] = N * K * 2 / 4.3e6
            print(
                json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}),
                flush=True,
            )
            res.append(row)
    json.dump(res, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
