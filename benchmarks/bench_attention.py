"""Attention benchmarks: each impl's AttentionBackend, and the Triton kernel itself.

    pytest benchmarks/bench_attention.py --benchmark-enable

Backends are reached through spec.load_impl, as the engine reaches them. On CUDA the shapes
are Qwen3-8B's (32 q / 8 kv heads, head_dim 128, bf16, block 16) at batch 64 x context 4096;
on CPU a tiny batch (the fast backend then runs the kernels' torch references, and the kernel
case runs under the Triton interpreter). Without --benchmark-enable (CI) each case runs once
and checks its output against kernels.reference, never its speed. The H200 numbers in
benchmarks/RESULTS.md come from benchmarks/gpu_kernels.py, which times with CUDA graphs.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enginespec.kernels.paged_attention import paged_attention  # noqa: E402
from enginespec.kernels.reference import paged_attention_ref, write_kv_ref  # noqa: E402
from enginespec.spec import BatchMeta, load_impl  # noqa: E402
from enginespec.testing.paged_batches import TOLERANCES, random_batch  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float32
SHAPE = (
    dict(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16)
    if CUDA
    else dict(num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4)
)
NUM_REQS, CONTEXT = (64, 4096) if CUDA else (6, 48)


def _sync():
    if CUDA:
        torch.cuda.synchronize()


@pytest.fixture(scope="module")
def decode_batch():
    """Decode-only batch: every request has one query row at the end of its context."""
    lengths = ([CONTEXT] * NUM_REQS, [1] * NUM_REQS)
    return random_batch(
        NUM_REQS, CONTEXT, 1, dtype=DTYPE, device=DEVICE, seed=0, lengths=lengths, num_padding=2, **SHAPE
    )


def _meta(batch) -> BatchMeta:
    return BatchMeta(
        batch.query_start_loc,
        batch.seq_lens,
        batch.block_table,
        batch.slot_mapping,
        batch.cache.shape[2],
        batch.query_start_loc.cpu(),
        batch.seq_lens.cpu(),
        batch.max_query_len,
        batch.max_seq_len,
    )


def _expected(batch):
    return paged_attention_ref(batch.q, batch.cache, batch.query_start_loc, batch.seq_lens, batch.block_table)


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_backend_decode(benchmark, impl, decode_batch):
    backend = load_impl(impl).attention_backend(DEVICE)
    meta = _meta(decode_batch)

    def run():
        out = backend.forward(decode_batch.q, decode_batch.cache, meta)
        _sync()
        return out

    out = benchmark(run)
    torch.testing.assert_close(out.float(), _expected(decode_batch).float(), **TOLERANCES[DTYPE])


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_backend_write(benchmark, impl, decode_batch):
    backend = load_impl(impl).attention_backend(DEVICE)
    meta = _meta(decode_batch)
    k = torch.randn(decode_batch.q.shape[0], SHAPE["num_kv_heads"], SHAPE["head_dim"], device=DEVICE).to(
        DTYPE
    )
    v = torch.randn_like(k)
    cache = decode_batch.cache.clone()

    def run():
        backend.write(cache, k, v, meta)
        _sync()

    benchmark(run)
    want = decode_batch.cache.clone()
    write_kv_ref(want, k, v, decode_batch.slot_mapping)
    torch.testing.assert_close(cache[:, :-1], want[:, :-1], equal_nan=True, atol=0, rtol=0)


def test_kernel_decode(benchmark, decode_batch):
    b = decode_batch
    out = torch.full_like(b.q, float("nan"))

    def run():
        paged_attention(
            b.q,
            b.cache,
            b.query_start_loc,
            b.seq_lens,
            b.block_table,
            max_query_len=b.max_query_len,
            max_seq_len=b.max_seq_len,
            out=out,
        )
        _sync()

    benchmark(run)
    torch.testing.assert_close(out.float(), _expected(b).float(), **TOLERANCES[DTYPE])
