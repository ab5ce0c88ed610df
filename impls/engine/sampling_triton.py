"""One Triton pass that draws every row: key = x * x_scale + noise over the tokens with
x >= threshold, argmax per row, where x_scale = log2(e) / T and noise is the base-2 Gumbel of
hash(row key, token) (`sampling_rng.gumbel2`). Greedy rows take x_scale 1 and no noise (a plain
argmax, exact: multiplying by 1 rounds nothing).

The noise bits are those of `sampling_rng.hash_bits` (same mixer, uint32 arithmetic, where
multiplication wraps modulo 2**32 as the int64-masked torch version does), so a row draws the
same token here and in the torch path up to float rounding of near-ties. Each program scans one
chunk of one row; per-chunk winners are reduced by torch. Ties in value go to the lowest token
id, matching torch.argmax for greedy rows.
"""
from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional on CPU
    triton = None

BLOCK = 2048      # tokens per loop step of one program
NUM_WARPS = 8
WAVES = 8         # programs per SM to aim for (rows x chunks)

if triton is not None:
    @triton.jit
    def _mix32(x):
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x6C8E9CF5
        x = x ^ (x >> 13)
        x = x * 0x2C1B3C6D
        return x ^ (x >> 16)

    @triton.jit
    def _draw_kernel(x_ptr, x_stride, x_scale_ptr, thr_ptr, key_ptr, noisy_ptr,
                     val_ptr, idx_ptr, vocab, chunk, num_chunks, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        part = tl.program_id(1)
        x_scale = tl.load(x_scale_ptr + row)
        thr = tl.load(thr_ptr + row)
        seed_key = tl.load(key_ptr + row)
        lo = seed_key.to(tl.uint32)           # integer casts truncate: the low 32 bits
        hi = (seed_key >> 32).to(tl.uint32)
        noise_scale = tl.load(noisy_ptr + row)
        lanes = tl.arange(0, BLOCK)
        best_v = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = tl.zeros([BLOCK], dtype=tl.int32)
        start = part * chunk
        base = x_ptr + row.to(tl.int64) * x_stride
        for off in range(0, chunk, BLOCK):
            cols = start + off + lanes
            inside = (cols < vocab) & (off + lanes < chunk)
            x = tl.load(base + cols, mask=inside, other=float("-inf"))
            bits = _mix32(_mix32(cols.to(tl.uint32) + lo) ^ hi)
            u = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
            g = -tl.log2(-tl.log2(u))
            key = x * x_scale + g * noise_scale
            key = tl.where(inside & (x >= thr), key, float("-inf"))
            better = key > best_v
            best_v = tl.where(better, key, best_v)
            best_i = tl.where(better, cols, best_i)
        top = tl.max(best_v, axis=0)
        first = tl.min(tl.where(best_v == top, best_i, 2147483647), axis=0)
        tl.store(val_ptr + row * num_chunks + part, top)
        tl.store(idx_ptr + row * num_chunks + part, first)


def available(device: torch.device) -> bool:
    """The kernel runs on CUDA tensors (and under TRITON_INTERPRET=1 for tests)."""
    return triton is not None and device.type == "cuda"


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _num_chunks(num_rows: int, vocab: int, device: torch.device, block: int, waves: int) -> int:
    """Enough programs for `waves` per SM, chunks no shorter than 4 blocks."""
    sms = _num_sms(device)
    return max(1, min(triton.cdiv(waves * sms, num_rows), triton.cdiv(vocab, 4 * block)))


def draw(x: torch.Tensor, x_scale: torch.Tensor, thr: torch.Tensor, keys: torch.Tensor,
         noise_scale: torch.Tensor, *, block: int = 0, num_warps: int = 0, waves: int = 0) -> torch.Tensor:
    """Token per row of x [S, V] (float32, unit stride along V); per-row float32 x_scale, thr,
    noise_scale (1 or 0) and int64 keys (non-negative, < 2**63). Returns int64 [S]. block / num_warps /
    waves override the module defaults (for tuning)."""
    block, num_warps, waves = block or BLOCK, num_warps or NUM_WARPS, waves or WAVES
    num_rows, vocab = x.shape
    num_chunks = _num_chunks(num_rows, vocab, x.device, block, waves)
    chunk = triton.cdiv(triton.cdiv(vocab, num_chunks), block) * block
    num_chunks = triton.cdiv(vocab, chunk)
    vals = torch.empty((num_rows, num_chunks), dtype=torch.float32, device=x.device)
    idx = torch.empty((num_rows, num_chunks), dtype=torch.int32, device=x.device)
    _draw_kernel[(num_rows, num_chunks)](x, x.stride(0), x_scale, thr, keys, noise_scale, vals, idx,
                                        vocab, chunk, num_chunks, BLOCK=block, num_warps=num_warps)
    best = vals.argmax(dim=1, keepdim=True)
    return idx.gather(1, best).squeeze(1).to(torch.int64)
