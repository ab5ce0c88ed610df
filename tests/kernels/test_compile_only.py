"""Compile-only launches of the model's kernels (kernels/compile_pool.py's
compile_only_launches, which DecodeGraphs.precompile runs a forward a bucket under, before the
capture): inside the context every wrapper's launch is Triton's `warmup` with the very key its
real launch has (so the real launch later finds its variant compiled), nothing runs (in-place
buffers keep their values), and outside it launches run as before. On the CPU under Triton's
interpreter, whose launches carry the `warmup` flag (enginespec.testing.triton_keys)."""

from __future__ import annotations

import inspect
import os
import threading

import pytest
import torch

from enginespec.kernels import compile_pool
from enginespec.kernels.decode_attention import decode_attention
from enginespec.kernels.gather_rows import gather_two
from enginespec.kernels.kv_write import write_kv
from enginespec.kernels.paged_attention import LaunchConfig, paged_attention
from enginespec.kernels.qkv_rope import qkv_rope
from enginespec.kernels.reference import rope_inv_freq, rotary_cos_sin
from enginespec.kernels.rms_norm import rms_norm
from enginespec.kernels.rotary import rotary
from enginespec.kernels.silu_mul import silu_mul
from enginespec.kernels.skinny_gemm import interpreting
from enginespec.testing.paged_batches import random_batch
from enginespec.testing.triton_keys import record_launches

from .test_decode_attention import HEADS, _case

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="the interpreter's launches carry the warmup flag"
)


def _decode(cache_key: str):
    batch, qkv, cos, sin, weight = _case(HEADS[0], 4, torch.float32, 3, [40, 1, 23, 9])
    hq = batch.q.shape[1]
    balanced = LaunchConfig(block_m=16, tile=16, num_splits=4, num_warps=4, num_stages=2, balance_splits=1)
    args = (qkv, cos, sin, weight, 1e-6, batch.cache, batch.slot_mapping)
    if cache_key == "decode_attention":  # the attention launch and its (balanced) merge
        return batch.cache, lambda: decode_attention(
            *args, batch.seq_lens, batch.block_table, hq, max_seq_len=40, config=balanced
        )
    return batch.cache, lambda: qkv_rope(*args, hq)


def _paged():
    batch = random_batch(3, 30, 3, num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4, seed=1, dtype=torch.float32,
                         lengths=([17, 5, 29], [1, 3, 1]))  # fmt: skip
    split = LaunchConfig(block_m=16, tile=16, num_splits=2, num_warps=4, num_stages=2)
    args = (batch.q, batch.cache, batch.query_start_loc, batch.seq_lens, batch.block_table)
    return batch.cache, lambda: paged_attention(*args, max_query_len=3, max_seq_len=29, config=split)


def _small(name: str):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 32, generator=gen)
    if name == "silu_mul":
        return x, lambda: silu_mul(x)
    if name == "gather_two":
        idx = torch.tensor([3, 0, 2], dtype=torch.int64)
        return x, lambda: gather_two(idx, x, idx, x[:, :8])
    if name == "rms_norm":
        res = torch.randn(5, 32, generator=gen)
        return res, lambda: rms_norm(x, torch.ones(32), 1e-6, res)
    if name == "rotary":
        cos, sin = rotary_cos_sin(rope_inv_freq(16, 10000.0), 16)
        q, k = torch.randn(5, 4, 16, generator=gen), torch.randn(5, 2, 16, generator=gen)
        return q, lambda: rotary(q, k, torch.arange(5), cos, sin)
    cache = torch.zeros(2, 4, 4, 2, 16)  # write_kv
    kv = torch.randn(5, 2, 16, generator=gen)
    return cache, lambda: write_kv(cache, kv, kv, torch.tensor([0, 3, 5, -1, 9]))


CASES = {
    "decode_attention": lambda: _decode("decode_attention"),
    "qkv_rope": lambda: _decode("qkv_rope"),
    "paged_attention": _paged,
    **{
        name: (lambda name=name: _small(name))
        for name in ("silu_mul", "gather_two", "rms_norm", "rotary", "write_kv")
    },
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compile_only_launches_compile_the_real_launches_keys_and_run_nothing(monkeypatch, name):
    """Inside compile_only_launches() the wrapper makes compile-only launches only, leaving the
    buffer it would write in place as it was; the real call after it makes real launches with
    exactly those keys (the balanced decode attention's merge among them)."""
    buffer, call = CASES[name]()
    before = buffer.clone()
    seen = record_launches(monkeypatch)
    with compile_pool.compile_only_launches():
        call()
    compiled = list(seen["compile_only"])
    assert compiled and not seen["real"], "compile-only inside the context, and nothing real"
    assert torch.equal(buffer.nan_to_num(7.0), before.nan_to_num(7.0)), "a compile-only launch wrote"
    call()
    assert seen["real"] == compiled, "the real launches' keys are the ones compiled"
    if name == "decode_attention":
        assert [key[0] for key in compiled] == ["_decode_attention_kernel", "_merge_splits_kernel"]


def test_the_context_ends_even_when_its_body_raises():
    """compile_only_launches nests, and a pass that raises (DecodeGraphs.precompile's jobs may)
    leaves later launches real."""
    fake = type("K", (), {"warmup": lambda *a, **k: "warmup", "__getitem__": lambda self, grid: "real"})()
    with pytest.raises(ZeroDivisionError), compile_pool.compile_only_launches():
        with compile_pool.compile_only_launches():
            assert compile_pool.launcher(fake, (1,))() == "warmup"
        assert compile_pool.launcher(fake, (1,))() == "warmup"
        raise ZeroDivisionError
    assert compile_pool.launcher(fake, (1,)) == "real"
    assert compile_pool.launcher(fake, (1,), compile_only=True)() == "warmup"


def test_precompile_runs_no_job_when_switched_off(monkeypatch):
    """ENGINESPEC_PRECOMPILE=0 (A/B runs of the cold start): no job runs, none counts as failed."""
    ran = []
    monkeypatch.setenv(compile_pool.PRECOMPILE_ENV, "0")
    assert compile_pool.precompile([lambda: ran.append(1)]) == 0 and ran == []
    monkeypatch.setenv(compile_pool.PRECOMPILE_ENV, "1")
    assert compile_pool.precompile([lambda: ran.append(1)]) == 0 and ran in (
        [1],
        [],
    )  # [] without AsyncCompileMode


def test_compile_only_is_this_threads_alone():
    """Another thread's launches stay real while one thread runs a compile-only pass (two
    engines in one process: one starting, one serving), and that thread's pass stays
    compile-only whatever the other does."""
    import threading

    fake = type("K", (), {"warmup": lambda *a, **k: "warmup", "__getitem__": lambda self, grid: "real"})()
    inside, seen = threading.Event(), {}

    def other():
        inside.wait(5)
        seen["other"] = compile_pool.launcher(fake, (1,))

    thread = threading.Thread(target=other)
    thread.start()
    with compile_pool.compile_only_launches():
        inside.set()
        thread.join(5)
        seen["self"] = compile_pool.launcher(fake, (1,))()
    assert seen == {"other": "real", "self": "warmup"}


def test_num_workers_reads_the_variable_else_the_usable_cpus(monkeypatch):
    """ENGINESPEC_PRECOMPILE_WORKERS sets the pool's threads; unset, 8 or the CPUs this process
    may run on, whichever is fewer; anything but a positive int is a ValueError naming it."""
    monkeypatch.delenv(compile_pool.WORKERS_ENV, raising=False)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert compile_pool.num_workers() == min(compile_pool.DEFAULT_WORKERS, usable) >= 1
    monkeypatch.setenv(compile_pool.WORKERS_ENV, "3")
    assert compile_pool.num_workers() == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(compile_pool.WORKERS_ENV, bad)
        with pytest.raises(ValueError, match="ENGINESPEC_PRECOMPILE_WORKERS must be a positive int"):
            compile_pool.num_workers()


def test_precompile_issues_on_the_calling_thread_and_waits_for_every_compile(monkeypatch):
    """precompile runs its jobs on the calling thread, counts the ones that raise, and returns
    only once every compile the pool ran is finalized (a kernel cache entry, here a dict); no
    mode stays active after. A fake compile that waits a little stands in for Triton's."""
    _async = pytest.importorskip("triton.runtime._async_compile")
    monkeypatch.setenv(compile_pool.PRECOMPILE_ENV, "1")
    cache, ran = {}, []

    def job(key):
        def submit():
            ran.append((key, threading.current_thread() is threading.main_thread()))
            finalize = lambda kernel: cache.__setitem__(key, kernel)  # noqa: E731
            cleanup = (
                (lambda fk: None,)
                if len(inspect.signature(_async.AsyncCompileMode.submit).parameters) > 4
                else ()
            )
            _async.active_mode.get().submit(
                key, lambda: threading.Event().wait(0.05) or key, finalize, *cleanup
            )

        return submit

    assert compile_pool.precompile([job("a"), job("b"), lambda: 1 / 0]) == 1
    assert ran == [("a", True), ("b", True)] and cache == {"a": "a", "b": "b"}
    assert _async.active_mode.get() is None


def test_precompile_is_a_no_op_when_switched_off(monkeypatch):
    monkeypatch.setenv(compile_pool.PRECOMPILE_ENV, "0")
    ran = []
    assert compile_pool.precompile([lambda: ran.append(1)]) == 0 and ran == []
