"""Compile-only launches of every sampler kernel variant the engine meets, before the warm-up.

Without them the warm-up (engine/warmup.py) meets the sampler's Triton kernels one batch at a
time and each compiles on the spot, one after another: on the H200 (benchmarks/RESULTS.md,
twenty-seventh session) 18 kernels 0.15-2.7 s apart, most of the warm-up's 14.6 s. Here each
variant is one job calling the kernel's own launch wrapper with compile_only=True, on arguments
built by the Sampler's own code (a real `BatchPlan` uploads the per-row tables, so pointers,
dtypes and ints specialise as in a real step: the same Triton cache keys), and the jobs run on
`kernels.compile_pool.precompile`'s pool, so the variants compile side by side.

The variants, for a model whose logits come in `dtype` (the "model" dtype below):
- argmax (greedy batches of up to GREEDY_KERNEL_MAX_ROWS rows): the model dtype (no edits) and,
  on the serial path, float32 (greedy rows with edits);
- cut_draw's draw: the model dtype without edits; float32 with the edited rows read through the
  row map (sample_deferred); float32 without (the serial path edits a float32 copy); the spread
  cut's launches too when SPREAD_CUT is on;
- reject_top_p's rounds (loose top-p rows, when REJECT_TOP_P is on): the same three inputs;
- the penalty launch: in place on float32 rows, and written from a source (the edited copy);
- logprobs (sample_deferred): the model dtype.
Which batch reaches which is the Sampler's business (sampler.py); `sampler_jobs` lists them all,
and tests/sample/test_precompile.py checks on the CPU that a warm-up launches no variant that
the list does not compile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from enginespec.kernels import argmax as argmax_kernel
from enginespec.kernels import cut_draw, reject_top_p
from enginespec.kernels import logprobs as logprob_kernels
from enginespec.kernels import sampling as sampling_triton
from enginespec.kernels.compile_pool import precompile
from enginespec.sample import draw as sampling_draw
from enginespec.sample import sampler as sampler_mod
from enginespec.spec import SamplingParams

log = logging.getLogger(__name__)

# One row that asks for every per-row table the kernels read: a loose top-p (a rejection row,
# REJECT_TOP_P), a penalty (an edited row, with penalty columns) and logprobs.
PLAN_PARAMS = SamplingParams(temperature=1.0, top_p=0.9, presence_penalty=0.1, logprobs=1)


class CompileJob(NamedTuple):
    """One compile-only launch (or a wrapper's few): `name` says which wrapper and variant."""

    name: str
    run: Callable[[], object]


@dataclass
class _Inputs:
    """Tensors shaped as a one-row step's: logits in the model dtype (`raw`, a view of the real
    logits buffer where there is one) and float32 (`upcast`, as raw.float() makes it), an
    edited copy, and the Sampler's BatchPlan for PLAN_PARAMS."""

    raw: torch.Tensor
    upcast: torch.Tensor
    edited: torch.Tensor
    plan: sampler_mod.BatchPlan


def _inputs(sampler: sampler_mod.Sampler, logits: torch.Tensor) -> _Inputs:
    """The tensors the jobs launch on (see _Inputs). logits: [1, W >= vocab] like a step's."""
    vocab, device = sampler.vocab_size, sampler.device
    raw = logits[:1, :vocab]
    spec = sampler_mod.RowSpec.of(PLAN_PARAMS, vocab)
    plan = sampler_mod.BatchPlan([PLAN_PARAMS], [spec], vocab, device)
    edited = torch.empty((1, vocab), dtype=torch.float32, device=device)
    return _Inputs(raw, raw.float(), edited, plan)


def _draw(inp: _Inputs, x: torch.Tensor, edited: bool) -> None:
    """cut_draw.draw and reject_top_p.refine as Sampler._fused_draw launches them."""
    plan, e = inp.plan, inp.edited if edited else None
    e_map = plan.edit_map if edited else None
    prm, keys = plan.fused_params()
    tokens = cut_draw.draw(
        x, prm, keys, (0, 0), chunk=sampling_draw.CHUNK, edited=e, edit_map=e_map,
        spread=sampler_mod.SPREAD_CUT, compile_only=True,
    )  # fmt: skip
    if sampler_mod.REJECT_TOP_P:
        reject_top_p.refine(
            x, plan.reject_index, plan.x_scale, plan.reject_p, keys, (0, 0), tokens,
            chunk=sampling_draw.CHUNK, edited=e, edit_map=e_map, compile_only=True,
        )  # fmt: skip


def _penalties(inp: _Inputs, source: bool) -> None:
    """The penalty launch as device_edits / penalize_rows make it: in place on the edited rows,
    or (source) written from the float32 logits' rows (EditPlan.edited_copy)."""
    cols, vocab, device = inp.plan.penalties, inp.edited.shape[1], inp.edited.device
    prompt = torch.zeros((1, vocab), dtype=torch.bool, device=device)  # OutputCounts' tables
    counts = torch.zeros((1, vocab), dtype=torch.int32, device=device)
    slots = torch.zeros(1, dtype=torch.int64, device=device)
    src = (inp.upcast, inp.plan.edit_index) if source else None
    sampling_triton.apply_penalties(
        inp.edited, cols.index, prompt, counts, cols.rep, cols.freq, cols.pres, slots, src, compile_only=True
    )


def _logprobs(inp: _Inputs) -> None:
    """device_logprobs' launch on the raw logits."""
    tokens = torch.zeros(1, dtype=torch.int64, device=inp.raw.device)
    logprob_kernels.logprobs(inp.raw, inp.plan.logprob_index, tokens, 1, compile_only=True)


def sampler_jobs(sampler: sampler_mod.Sampler, logits: torch.Tensor) -> list[CompileJob]:
    """Every compile-only job of the module docstring, for the sampler's vocabulary and device
    and logits like `logits` ([rows, W >= vocab] in the model's dtype; only its dtype, row
    stride and alignment matter). Builds the plan's tensors (one small upload)."""
    inp = _inputs(sampler, logits)
    model = str(inp.raw.dtype).removeprefix("torch.")
    jobs = [
        CompileJob(f"argmax[{model}]", lambda: argmax_kernel.argmax(inp.raw, compile_only=True)),
        CompileJob("argmax[float32]", lambda: argmax_kernel.argmax(inp.upcast, compile_only=True)),
        CompileJob(f"draw[{model}]", lambda: _draw(inp, inp.raw, edited=False)),
        CompileJob("draw[float32, edited rows]", lambda: _draw(inp, inp.upcast, edited=True)),
        CompileJob("draw[float32]", lambda: _draw(inp, inp.upcast, edited=False)),
        CompileJob("penalties[float32]", lambda: _penalties(inp, source=False)),
        CompileJob("penalties[float32, from a source]", lambda: _penalties(inp, source=True)),
        CompileJob(f"logprobs[{model}]", lambda: _logprobs(inp)),
    ]
    return jobs


def precompile_sampler(sampler: sampler_mod.Sampler, logits: torch.Tensor) -> int:
    """Compile every sampler kernel variant side by side (`sampler_jobs` on the compile pool)
    where the sampler's kernels run (CUDA); returns how many jobs raised. Never raises: a
    variant that was not compiled here compiles when first launched, as before."""
    if not cut_draw.available(sampler.device):
        return 0
    try:
        jobs = sampler_jobs(sampler, logits)
    except Exception as e:  # noqa: BLE001 - an optimisation of startup, never a requirement
        log.info("sampler precompile skipped: %s: %s", type(e).__name__, e)
        return 0
    return precompile([job.run for job in jobs])
