"""Counter-based randomness for the draw: a row's uniforms are a pure function of its key.

Why a hash and not a `torch.Generator` per row: a per-request generator makes a row's draw depend
on how many draws that generator served before (batch history), and one generator per row means
a Python loop of device launches. Hashing (key, counter), where a seeded row's key is
row_key(seed, output index), gives the same uniforms for a request whatever batch it lands in,
on CPU and CUDA alike (the Triton kernel computes the same bits). The draw uses two uniforms
per row (`draw_uniforms`: counters 0 and 1); unseeded rows take keys derived from one random
base per call (`derived_key`).

The hash works on 32-bit lanes held in int64 tensors. Every multiplier is odd and below 2**31, so
a product of a 32-bit lane and a multiplier stays below 2**63 and never overflows int64; masking
with 0xFFFFFFFF keeps the low 32 bits (multiplication modulo 2**32, a bijection for odd factors).
Shifts are applied to non-negative values only, so arithmetic and logical shifts agree.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
# Odd multipliers below 2**31 (see module docstring).
_M1 = 0x7FEB352D
_M2 = 0x6C8E9CF5
_M3 = 0x2C1B3C6D


def row_key(seed: int, output_index: int) -> int:
    """A 63-bit key for one draw: splitmix64 over the seed and the output token index, top bit
    dropped so that keys fit a non-negative int64. Plain Python integers, so exact; distinct
    (seed, index) pairs give unrelated keys."""
    x = (seed * 0x9E3779B97F4A7C15 + output_index * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """An avalanche mix on 32-bit lanes (values in [0, 2**32) held in int64)."""
    x = x ^ (x >> 16)
    x = (x * _M1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _M2) & _MASK32
    x = x ^ (x >> 13)
    x = (x * _M3) & _MASK32
    return x ^ (x >> 16)


def split_keys(keys: Sequence[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """The low and high 32-bit halves of 64-bit keys, as int64 [R] tensors."""
    lo = torch.tensor([k & _MASK32 for k in keys], dtype=torch.int64, device=device)
    hi = torch.tensor([(k >> 32) & _MASK32 for k in keys], dtype=torch.int64, device=device)
    return lo, hi


def hash_bits(tokens: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """32 random bits per (row key, token): two rounds of `_mix32`, keyed by both halves.
    tokens [1, V] or [R, V], lo / hi [R, 1]; all int64 holding 32-bit lanes. The Triton
    kernel (`sampling_triton`) computes the same bits with uint32 arithmetic."""
    x = _mix32((tokens + lo) & _MASK32)
    return _mix32(x ^ hi)


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """Top 24 bits -> float32 in (0, 1): the half-step offset keeps 0 and 1 out."""
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def seeded_uniform(keys: Sequence[int], vocab_size: int, device) -> torch.Tensor:
    """Uniform noise in (0, 1), float32 [len(keys), vocab_size]; row r depends only on keys[r]."""
    lo, hi = split_keys(keys, device)
    tokens = torch.arange(vocab_size, dtype=torch.int64, device=device).unsqueeze(0)
    return bits_to_uniform(hash_bits(tokens, lo.unsqueeze(1), hi.unsqueeze(1)))


def _mix32_int(x: int) -> int:
    """`_mix32` on one Python int in [0, 2**32)."""
    x ^= x >> 16
    x = (x * _M1) & _MASK32
    x ^= x >> 15
    x = (x * _M2) & _MASK32
    x ^= x >> 13
    x = (x * _M3) & _MASK32
    return x ^ (x >> 16)


def derived_key(base: tuple[int, int], row: int) -> int:
    """The key of unseeded row `row` in a call whose random base is (base_lo, base_hi): halves
    lo = mix32(row + base_lo), hi = mix32(lo ^ base_hi) (mod 2**32), returned as hi * 2**32 + lo.
    The Triton pick kernel derives the same halves on the device (`sampling_triton._row_halves`)."""
    lo = _mix32_int((row + base[0]) & _MASK32)
    return (_mix32_int(lo ^ base[1]) << 32) | lo


def resolve_keys(keys: Sequence[int], base: tuple[int, int]) -> list[int]:
    """Per-row keys with every negative (unseeded) entry replaced by its `derived_key`."""
    return [k if k >= 0 else derived_key(base, i) for i, k in enumerate(keys)]


def draw_uniforms(keys: Sequence[int], device) -> torch.Tensor:
    """The two uniforms of each row's draw (chunk choice, token choice): float32 [R, 2], the hash
    of (key, 0) and (key, 1). Keys are non-negative Python ints (any width; halves are taken)."""
    return seeded_uniform(keys, 2, device)


def round_uniforms(keys: Sequence[int], round_index: int, device) -> torch.Tensor:
    """The two uniforms of a rejection round's draw (sample/reject.py): float32 [R, 2], the hash
    of (key, 2 r) and (key, 2 r + 1); round 0 is `draw_uniforms`."""
    lo, hi = split_keys(keys, device)
    counters = torch.arange(2 * round_index, 2 * round_index + 2, dtype=torch.int64, device=device)
    return bits_to_uniform(hash_bits(counters.unsqueeze(0), lo.unsqueeze(1), hi.unsqueeze(1)))


def row_keys(seeds: np.ndarray, output_index: np.ndarray) -> np.ndarray:
    """`row_key` over arrays (uint64 seeds and output indices, any length), vectorised: numpy
    uint64 arithmetic wraps modulo 2**64 as the masked Python version does. Returns int64."""
    x = seeds * np.uint64(0x9E3779B97F4A7C15) + output_index * np.uint64(0xD1B54A32D192ED03)
    x = x + np.uint64(0x632BE59BD9B4E019)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((x ^ (x >> np.uint64(31))) >> np.uint64(1)).astype(np.int64)
