"""kernels/argmax.py against torch.argmax: exact token ids, ties, NaN, signed zeros, rows that span
one and many programs, and launch after launch on the same per-stream state. On CPU under
TRITON_INTERPRET=1 (the repo conftest) on tiny rows; on CUDA also at the Qwen vocabulary."""

import os
import subprocess
import sys

import pytest
import torch

from enginespec.kernels import argmax as am

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _logits(rows: int, vocab: int, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=gen).to(dtype)


def _check(x: torch.Tensor) -> None:
    x = x.to(DEVICE)
    assert torch.equal(am.argmax(x), x.argmax(dim=1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,vocab", [(1, 7), (3, am.BLOCK), (2, am.BLOCK + 1), (5, 3 * am.BLOCK - 5)])
def test_argmax_matches_torch(dtype, rows, vocab):
    x = _logits(rows, vocab, dtype, seed=rows * vocab)
    top = x.max(dim=1).values
    x[0, vocab // 2] = top[0]  # a tie after the first max (in another program when wide)
    x[0, vocab - 1] = top[0]
    _check(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_keeps_torchs_rules_for_nan_zeros_and_infinities(dtype):
    vocab = am.BLOCK + 300  # two programs a row
    x = _logits(6, vocab, dtype, seed=1)
    x[0, [9, am.BLOCK + 7]] = float("nan")  # the first NaN wins
    x[1, am.BLOCK + 7] = -float("nan")  # a NaN with its sign bit set, in the second program only
    x[2] = -0.0
    x[2, am.BLOCK + 1] = 0.0  # equal to -0.0: column 0 wins
    x[3] = float("-inf")  # every value -inf: column 0
    x[4, am.BLOCK + 2] = float("inf")
    x[5] = -1.0  # all negative and equal but one
    x[5, 3] = -0.5
    _check(x)


def test_argmax_state_is_clean_after_every_launch():
    """Launch after launch (fewer rows, then more than the state held) gives torch's ids, and
    leaves every row's running best EMPTY and its count 0."""
    for seed, rows in enumerate([3, 1, 70, 2]):
        _check(_logits(rows, 2 * am.BLOCK + 3, torch.float32, seed))
    for best, count in am._STATES.values():
        assert (best == am.EMPTY).all() and (count == 0).all()


def test_argmax_rejects_bad_shapes_and_reads_strided_rows():
    with pytest.raises(ValueError, match=r"\[S, V\]"):
        am.argmax(torch.zeros(4, device=DEVICE))
    with pytest.raises(ValueError, match="V = 0"):
        am.argmax(torch.zeros(2, 0, device=DEVICE))
    assert am.argmax(torch.zeros(0, 5, device=DEVICE)).shape == (0,)
    x = _logits(3, 2 * am.BLOCK, torch.float32, seed=4).to(DEVICE)
    view = x[:, : am.BLOCK + 9]  # a row stride wider than the row
    assert torch.equal(am.argmax(view), view.argmax(dim=1))
    cols = x.t().contiguous().t()  # column-major: copied to rows first
    assert torch.equal(am.argmax(cols), x.argmax(dim=1))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 4, 33])
def test_argmax_at_the_qwen_vocabulary_on_cuda(rows):
    x = _logits(rows, 151_936, torch.bfloat16, seed=rows)
    x[-1, 151_935] = 100.0  # the last column, in the row's last, partial program
    _check(x)


def test_argmax_kernel_compiles_for_sm90_with_its_atomics():
    """The interpreter runs what the real compiler may reject: compile the kernel for sm_90
    (triton's ptxas, any machine) and find the row's 64-bit max, its count and its exchange."""
    from tests.kernels.sm90 import compile_script

    ptx = compile_script(
        r"""
from enginespec.kernels.argmax import BLOCK, _argmax_kernel
sig = {"tokens_ptr": "*i64", "best_ptr": "*i64", "count_ptr": "*i32", "x_ptr": "*bf16",
       "vocab": "i32", "stride_x": "i32", "BLOCK": "constexpr"}
print(ptx_of(_argmax_kernel, sig, {"BLOCK": BLOCK}, {"num_warps": 4}))
"""
    )
    assert "atom.global" in ptx and ".max.s64" in ptx
    assert ".add.u32" in ptx or ".add.s32" in ptx
    assert ".exch.b64" in ptx


#: Run in a fresh interpreter with triton hidden (`sys.modules["triton"] = None` makes every
#: `import triton` raise ImportError and `find_spec` answer None, as on a machine without it).
WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None
import torch
import enginespec.llm  # the engine's whole import chain: engine_core -> spec_decode -> sampler
from enginespec.kernels import argmax as am
from enginespec.sample.sampler import greedy_tokens
x = torch.tensor([[0.0, 2.0, 2.0], [5.0, 1.0, float("nan")]])
assert am.triton is None
assert am.argmax(x).tolist() == x.argmax(dim=1).tolist() == [1, 2]
assert greedy_tokens(x).tolist() == [1, 2]
print("ok")
"""


def test_engine_imports_and_argmax_falls_back_to_torch_without_triton():
    """triton is optional (the `kernels` extra): the engine, and with it the conformance suite's
    engine-level modules, must import on a machine without it, and argmax is torch's there.
    kernels/argmax.py imported triton unguarded, so `import enginespec.llm` failed and a
    `pytest --pyargs enginespec.conformance` run stopped at collection."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRITON], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
