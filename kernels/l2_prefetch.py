"""L2 prefetch: pull tensors into the GPU's L2 without reading them into registers (sm_90+).

At batch 1 a decoder layer's attention, its q|k|v epilogue and its split merge take several
microseconds in which HBM sits nearly idle (a few MB of K/V at most), and then the layer's
o, gate|up and down projections read ~23 MB of weights (Qwen3-0.6B) in three latency-bound
launches. Launched on a side stream as attention starts, this kernel turns that idle time into
the projections' weight reads: each of its threads issues one `cp.async.bulk.prefetch.L2`
(Hopper's bulk-copy engine) for a CHUNK-byte piece of a tensor, and nothing waits for it. The
projections then find their weights in L2 (60 MB on the H200).

It computes and writes nothing: a prefetch is a hint, so correctness never depends on it; only
speed does (benchmarks/RESULTS.md, issue 19). Up to MAX_TENSORS tensors per launch; each must be
contiguous with a 16-byte aligned start (the instruction's rule; torch's allocations are).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_TENSORS = 4
CHUNK = 2048  # bytes per thread: 128 threads x 2 KiB = 256 KiB a program
NUM_WARPS = 4


@triton.jit
def _prefetch_piece(ptr, num_bytes, piece, THREADS: tl.constexpr, CHUNK_BYTES: tl.constexpr):
    """Thread t of program `piece` prefetches bytes [(piece * THREADS + t) * CHUNK_BYTES, +CHUNK_BYTES)
    of the tensor at ptr (a uint8 pointer), clipped to num_bytes and rounded down to 16."""
    start = (piece * THREADS + tl.arange(0, THREADS)).to(tl.int64) * CHUNK_BYTES  # [THREADS]
    size = tl.minimum(tl.maximum(num_bytes - start, 0), CHUNK_BYTES).to(tl.int32) // 16 * 16
    # one bulk prefetch of `size` bytes at the address, only when size > 0; the int32 result
    # is a dummy (inline asm must yield a value)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [ptr + start, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _l2_prefetch_kernel(
    p0,  # *u8 [n0]
    p1,  # *u8 [n1] (NUM_TENSORS >= 2)
    p2,  # *u8 [n2] (NUM_TENSORS >= 3)
    p3,  # *u8 [n3] (NUM_TENSORS == 4)
    n0,
    n1,
    n2,
    n3,
    c1,  # programs of tensor 0: the first program of tensor 1
    c2,  # first program of tensor 2
    c3,  # first program of tensor 3
    NUM_TENSORS: tl.constexpr,
    THREADS: tl.constexpr,
    CHUNK_BYTES: tl.constexpr,
):
    """Program i prefetches piece i - c_k of the tensor k whose programs hold i, tensors in order
    (so the first tensor's bytes are asked for first)."""
    pid = tl.program_id(0)
    if pid < c1:
        _prefetch_piece(p0, n0, pid, THREADS, CHUNK_BYTES)
    elif NUM_TENSORS >= 2 and pid < c2:
        _prefetch_piece(p1, n1, pid - c1, THREADS, CHUNK_BYTES)
    elif NUM_TENSORS >= 3 and pid < c3:
        _prefetch_piece(p2, n2, pid - c2, THREADS, CHUNK_BYTES)
    elif NUM_TENSORS == 4:
        _prefetch_piece(p3, n3, pid - c3, THREADS, CHUNK_BYTES)


def supported(device: torch.device) -> bool:
    """The bulk prefetch needs sm_90 or later; never under the interpreter (no inline asm)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def l2_prefetch(tensors: list[torch.Tensor]) -> None:
    """Ask L2 for the bytes of up to MAX_TENSORS contiguous CUDA tensors of one device, in order,
    in one launch on the current stream; returns at once (nothing to wait for)."""
    if not 1 <= len(tensors) <= MAX_TENSORS:
        raise ValueError(f"l2_prefetch takes 1 to {MAX_TENSORS} tensors, got {len(tensors)}")
    for t in tensors:
        if not t.is_contiguous() or t.data_ptr() % 16 or t.device != tensors[0].device:
            raise ValueError("l2_prefetch needs contiguous, 16-byte aligned tensors on one device")
    per_program = NUM_WARPS * 32 * CHUNK
    flat = [t.view(-1).view(torch.uint8) for t in tensors]
    sizes = [f.numel() for f in flat]
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + triton.cdiv(n, per_program))
    pad = MAX_TENSORS - len(flat)
    ptrs, nums = flat + [flat[0]] * pad, sizes + [0] * pad
    firsts = (starts[1:] + [starts[-1]] * pad)[: MAX_TENSORS - 1]
    _l2_prefetch_kernel[(starts[-1],)](
        *ptrs,
        *nums,
        *firsts,
        NUM_TENSORS=len(flat),
        THREADS=NUM_WARPS * 32,
        CHUNK_BYTES=CHUNK,
        num_warps=NUM_WARPS,
    )
