"""torch.compile of the decoder, applied at the runner's call site (the model never knows).

Eagerly, a transformers decoder layer launches dozens of small kernels (RMSNorm alone is six
elementwise ops, rotary another ten), each paying a launch from Python and a few microseconds
of GPU time even inside a CUDA graph. Compiling `FlatModel.body` lets inductor fuse them (norms
with residual adds, rotary, SiLU * up) and drops the Python between launches, for prefill and
decode alike.

One compiled graph serves every step: attention is the opaque op `enginespec::paged_attention`
whose per-step inputs live in the StepContext, not in the graph, and the token dimension N is
marked dynamic. dynamo specialises N = 1 (a second graph, compiled on first use: the CUDA-graph
warm-up runs it before capture).

Invariant: compiling never changes what the model computes beyond floating-point reassociation
inside fused kernels; if compilation fails the body falls back to eager for good, with a logged
warning (compilation is an optimisation, never a requirement).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from enginespec.worker.switches import env_switch

log = logging.getLogger(__name__)

COMPILE_ENV = "ENGINESPEC_COMPILE"  # "1"/"0": compile the decoder or not, whatever the default
EAGER_FUSED_ENV = "ENGINESPEC_EAGER_FUSED"  # "0": compile the fused path's steps too (CompiledBody)


class CompiledBody:
    """`model.body` through torch.compile(backend), with the token dimension dynamic."""

    def __init__(self, model, backend: str = "inductor"):
        self.model = model
        self.backend = backend
        self.error: Optional[BaseException] = None
        self._compiled = torch.compile(model.body, backend=backend, fullgraph=True)
        # Steps of at most this many rows run the body uncompiled (0: none). For the skinny
        # GEMM's fused path (worker/skinny_linear.py) nearly every launch is already one of our
        # ops, and those steps replay CUDA graphs, so compiling them buys a few fused glue
        # kernels for two more dynamo graphs at startup (rows 2-8 and the one-row graph: ~15 and
        # ~13 s of a cold H200 start). The runner sets it whenever the fused path is on, unless
        # ENGINESPEC_EAGER_FUSED=0. Measured on the H200 (b971081, benchmarks/gpu_round6a.sh,
        # cold caches): startup 55.2 s against 67.8 (graph capture 8.1 s against 21.9), and
        # batch 1 the same (decode graph 0.911 against 0.918 ms, LLM.generate 1.031 against
        # 1.037 ms/token).
        self.eager_max_rows = 0

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.error is not None or input_ids.shape[0] <= self.eager_max_rows:
            return self.model.body(input_ids, positions)
        if input_ids.shape[0] > 1:
            torch._dynamo.mark_dynamic(input_ids, 0)
            torch._dynamo.mark_dynamic(positions, 0)
        try:
            return self._compiled(input_ids, positions)
        except Exception as e:  # noqa: BLE001 - any compile failure means "run eagerly"
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise
            self.error = e
            log.warning(
                "torch.compile of the decoder failed (%s: %s); running it eagerly", type(e).__name__, e
            )
            return self.model.body(input_ids, positions)


def eager_fused() -> bool:
    """Whether the fused path's steps run uncompiled (CompiledBody.eager_max_rows): on unless
    ENGINESPEC_EAGER_FUSED=0 (env_switch: anything but 0, 1 or unset is a ValueError naming it)."""
    return env_switch(EAGER_FUSED_ENV) is not False


def should_compile(
    setting: Optional[bool], device: torch.device, enforce_eager: bool, folded: bool = False
) -> bool:
    """EngineArgs.compile_model: True/False force it; None means ENGINESPEC_COMPILE ("1" on,
    "0" off) or, unset, on for CUDA unless enforce_eager or the decoder is `folded`.

    Why not for a folded decoder (merged_decoder.py's fold_norms): every launch of its layers is
    then already one of ours or a GEMM (the projections, `paged_attention_qkv`, `add_linear_`,
    `silu_mul_rows`), and its gathers and final norm take one launch each at every row count,
    so inductor has nothing left to fuse, while dynamo's trace and inductor's compile of 28
    layers cost a cold start about 12 s (benchmarks/RESULTS.md, twenty-seventh session)."""
    if setting is None:
        env = env_switch(COMPILE_ENV)
        if env is not None:
            return env
        return device.type == "cuda" and not enforce_eager and not folded
    if not isinstance(setting, bool):
        raise ValueError(f"compile_model must be None, True or False, got {setting!r}")
    return setting
