"""The sampler's compile-only launches (sample/precompile.py), on the CPU under Triton's
interpreter: what can go wrong here is the list (a variant the engine meets but no job
compiles), the compile-only paths (one that launches, or whose arguments differ from the real
launch's, so its cache key does), and the failures (a job that raises must cost only its
speed-up). Keys are Triton's own specialisation of each argument (dtype and 16-byte alignment
of pointers, ==1 / multiple-of-16 of ints, constexpr values), as a GPU's cache key has them."""

from __future__ import annotations

import pytest
import torch

from enginespec.kernels import argmax as argmax_kernel
from enginespec.kernels import compile_pool, cut_draw
from enginespec.kernels import logprobs as logprob_kernels
from enginespec.kernels import sampling as sampling_triton
from enginespec.kernels.skinny_gemm import interpreting
from enginespec.sample import precompile as sp
from enginespec.sample import sampler as sampler_mod
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.testing.triton_keys import record_launches

pytestmark = pytest.mark.skipif(
    sampling_triton.triton is None or torch.cuda.is_available() or not interpreting(),
    reason="the CPU checks of the compile-only launches need Triton's interpreter",
)


@pytest.fixture
def launches(monkeypatch):
    """The sampler's kernels on CPU tensors (as on CUDA: argmax for small greedy batches too),
    and every launch recorded: {"real": [keys], "compile_only": [keys]}."""
    for module in (sampling_triton, cut_draw, logprob_kernels):
        monkeypatch.setattr(module, "available", lambda device: True)

    def greedy(x):
        return argmax_kernel.argmax(x) if x.shape[0] <= sampler_mod.GREEDY_KERNEL_MAX_ROWS else x.argmax(1)

    monkeypatch.setattr(sampler_mod, "greedy_tokens", greedy)
    return record_launches(monkeypatch)


def _engine(dtype: str, **kwargs):
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs

    args = EngineArgs.from_kwargs(
        str(tiny_model_dir("qwen3")), dtype=dtype, device="cpu", block_size=4, num_blocks=64, seed=0,
        warmup=False, **kwargs,
    )  # fmt: skip
    return EngineCore(args)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_the_warm_up_launches_no_variant_the_jobs_do_not_compile(launches, async_scheduling):
    """The tiny warm-up (every sampler setting and LATER_BATCHES) through the engine's step(),
    async (sample_deferred) or serial (__call__): each of its launches' keys is one a job
    compiled, and the jobs launched nothing."""
    from enginespec.engine.warmup import logits_like, warm_up

    engine = _engine("bfloat16", async_scheduling=async_scheduling)
    assert sp.precompile_sampler(engine.sampler, logits_like(engine)) == 0
    compiled = set(launches["compile_only"])
    assert compiled and not launches["real"]
    warm_up(engine, tiny=True, progress=False)
    met = set(launches["real"])
    names = {key[0] for key in met}
    assert {"_scan_kernel", "_cut_pick_kernel", "_penalty_kernel", "_above_kernel"} <= names
    assert ("_chunk_kernel" in names) == async_scheduling  # device logprobs: sample_deferred only
    missing = [key for key in met if key not in compiled]
    assert not missing, f"{len(missing)} launched variants not compiled: {missing[:3]}"


def test_the_jobs_cover_each_wrapper_variant_and_launch_nothing(launches):
    """Every job runs its wrapper's compile-only path with the real launch's arguments (no
    exception, no launch), and together they compile each wrapper's variants for a bf16 model:
    argmax in both dtypes, the draw's and the rejection rounds' three inputs (deduplicated where
    the keys coincide), both penalty launches and logprobs."""
    sampler = sampler_mod.Sampler(300, "cpu", seed=0)
    logits = torch.zeros((2, 304), dtype=torch.bfloat16)
    jobs = sp.sampler_jobs(sampler, logits)
    names = [job.name for job in jobs]
    assert len(set(names)) == len(names) and len(jobs) == 8
    for job in jobs:
        job.run()
    assert not launches["real"]
    kernels = [key[0] for key in launches["compile_only"]]
    assert kernels.count("_argmax_kernel") == 2 and kernels.count("_penalty_kernel") == 2
    assert kernels.count("_scan_kernel") == kernels.count("_cut_pick_kernel") == 3
    rounds = 3 if sampler_mod.REJECT_TOP_P else 0
    assert kernels.count("_finish_kernel") == rounds and kernels.count("_above_kernel") == 3 * rounds
    assert {"_chunk_kernel", "_merge_kernel"} <= set(kernels)
    dtypes = {dict(key[1])["x_ptr"][0] for key in launches["compile_only"] if key[0] == "_scan_kernel"}
    assert dtypes == {"*bf16", "*fp32"}


def test_compile_only_leaves_the_outputs_alone(launches):
    """Under the interpreter a compile-only launch runs nothing: the token buffer the rejection
    rounds would write in place keeps its values."""
    sampler = sampler_mod.Sampler(300, "cpu", seed=0)
    inp = sp._inputs(sampler, torch.randn(1, 300))
    plan = inp.plan
    prm, keys = plan.fused_params()
    tokens = torch.full((1,), 7, dtype=torch.int64)
    cut_draw.draw(inp.raw, prm, keys, (0, 0), chunk=8192, compile_only=True)
    from enginespec.kernels import reject_top_p

    reject_top_p.refine(
        inp.raw, plan.reject_index, plan.x_scale, plan.reject_p, keys, (0, 0), tokens, chunk=8192,
        compile_only=True,
    )  # fmt: skip
    assert tokens.tolist() == [7] and not launches["real"] and launches["compile_only"]


def test_a_job_that_raises_stops_neither_the_others_nor_startup(monkeypatch):
    ran = []
    failed = compile_pool.precompile([lambda: ran.append(1), lambda: 1 / 0, lambda: ran.append(3)])
    assert (ran, failed) in (([1, 3], 1), ([], 0))  # ([], 0) where Triton has no AsyncCompileMode
    monkeypatch.setattr(cut_draw, "available", lambda device: True)
    monkeypatch.setattr(sp, "sampler_jobs", lambda *a: 1 / 0)
    assert sp.precompile_sampler(sampler_mod.Sampler(300, "cpu"), torch.zeros(1, 300)) == 0
    jobs = [sp.CompileJob("bad", lambda: 1 / 0), sp.CompileJob("good", lambda: ran.append(5))]
    monkeypatch.setattr(sp, "sampler_jobs", lambda *a: jobs)
    assert sp.precompile_sampler(sampler_mod.Sampler(300, "cpu"), torch.zeros(1, 300)) in (0, 1)
    assert ran[-1] == 5 or ran == []
