"""Skinny GEMM benchmarks: the Triton kernel against F.linear (cuBLAS) on a decode projection.

    pytest benchmarks/bench_skinny_gemm.py --benchmark-enable

On CUDA the shape is Qwen3-0.6B's q|k|v projection (4096 x 1024, bf16) at 1 and 16 rows; on
CPU a tiny one under the Triton interpreter. Without --benchmark-enable (CI) each case runs
once and checks its output against kernels.reference.linear_ref, never its speed. The H200
figures come from benchmarks/skinny_gemm_table.py, which times both inside CUDA graphs over
every layer's distinct weight (pytest-benchmark's host-timed loop measures launch overhead too).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enginespec.kernels.reference import linear_ref  # noqa: E402
from enginespec.kernels.skinny_gemm import SkinnyConfig, SplitBuffers, skinny_linear  # noqa: E402
from enginespec.testing.paged_batches import TOLERANCES  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float32
N, K = (4096, 1024) if CUDA else (64, 48)
CONFIG = SkinnyConfig(block_n=32, block_k=128, num_splits=2) if CUDA else SkinnyConfig(16, 16, 2)


def _sync():
    if CUDA:
        torch.cuda.synchronize()


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("which", ["skinny", "cublas"])
def test_projection(benchmark, rows, which):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, K, generator=gen).to(DTYPE).to(DEVICE)
    weight = (torch.randn(N, K, generator=gen) / K**0.5).to(DTYPE).to(DEVICE)
    buffers = SplitBuffers(DEVICE)

    def run():
        out = skinny_linear(x, weight, None, CONFIG, buffers) if which == "skinny" else F.linear(x, weight)
        _sync()
        return out

    out = benchmark(run)
    torch.testing.assert_close(out, linear_ref(x, weight), **TOLERANCES[DTYPE])
