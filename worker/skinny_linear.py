"""The decoder's projection GEMMs through a measured choice: cuBLAS or the skinny GEMM kernel.

Why: at decode a projection has 1-64 rows, and cuBLAS took 5.4-8 us per GEMM against 1-3 us of
weight reads on the H200 (benchmarks/RESULTS.md, issue 6). kernels/skinny_gemm.py streams the
weight with more programs in one launch; whether it wins depends on the shape, the row count
and the device, so nothing here guesses: `LinearTable.tune` times cuBLAS and every candidate
launch shape on the model's own weights, inside a CUDA graph over all layers' distinct
matrices (a cold L2, no launch gaps: a decode step's conditions), and keeps the fastest per
(row bucket, N, K, dtype, bias). A candidate must also reproduce cuBLAS's result within bf16
tolerance to be kept. The table is per process and per device.

How the model reaches it, unaware: the merged decoder calls `self.linear(x, weight, bias)` for
q|k|v, o, gate|up and down (F.linear unless the runner sets it); `install` points every layer
at the custom op `enginespec::linear`, which torch.compile keeps opaque and which looks the
choice up at run time (at graph capture for decode: each captured bucket bakes in its choice).
Rows over `max_rows`, shapes not tuned, CPU tensors and float32 go to F.linear.

The MLP's gate|up GEMM and SiLU * up (layers whose activation is SiLU) go through a second op,
`enginespec::gate_up_silu`, with its own measured choice: the skinny kernel with the activation
in its epilogue (one launch) against the unfused route, which is the table's own gate|up choice
followed by kernels/silu_mul.py (one elementwise launch, as the compiled decoder would fuse it).

Off by default: EngineArgs.skinny_gemm (or ENGINESPEC_SKINNY_GEMM=1) turns it on, so the lead
can A/B it end to end (benchmarks/decode_sweep.py --engine-arg skinny_gemm=true).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from enginespec.worker.gemm_tuning import candidates, graph_us

log = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 64
WIN_MARGIN = 0.97  # a kernel must beat the baseline by 3% to be chosen: noise never flips the choice
ENV_SWITCH = "ENGINESPEC_SKINNY_GEMM"


def resolve_switch(setting: Optional[bool]) -> bool:
    """EngineArgs.skinny_gemm: None reads ENGINESPEC_SKINNY_GEMM (1/true/on), default off."""
    if setting is None:
        return os.environ.get(ENV_SWITCH, "0").strip().lower() in ("1", "true", "on", "yes")
    if not isinstance(setting, bool):
        raise ValueError(f"skinny_gemm must be None, True or False, got {setting!r}")
    return setting


def row_bucket(num_rows: int) -> int:
    """The power of two holding num_rows: the table's row key (measured at the bucket's top)."""
    return 1 << max(0, num_rows - 1).bit_length()


@dataclass(frozen=True)
class Choice:
    """What a key runs: config None = the baseline (cuBLAS; for gate_up_silu, the table's gate|up
    choice then silu_mul). Times are microseconds per call as measured, the baseline's too."""

    config: object  # Optional[SkinnyConfig]; object keeps kernels (triton) out of import time
    us: float
    baseline_us: float


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in one Triton launch on CUDA (or under the interpreter), else in torch."""
    from enginespec.kernels.skinny_gemm import interpreting

    if gate_up.is_cuda or interpreting():
        from enginespec.kernels.silu_mul import silu_mul

        return silu_mul(gate_up)
    from enginespec.kernels.reference import silu_mul_ref

    return silu_mul_ref(gate_up)


class LinearTable:
    """Measured choices for one device (module doc): `linear` and `gate_up_silu` are what the
    custom ops run. Keys: (row bucket, N, K, dtype, has_bias, fused with SiLU * up)."""

    def __init__(self, device, max_rows: int = DEFAULT_MAX_ROWS):
        from enginespec.kernels.skinny_gemm import SplitBuffers

        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.device = torch.device(device)
        self.max_rows = max_rows
        self.buffers = SplitBuffers(self.device)
        self.choices: dict[tuple, Choice] = {}
        self.rejected: list[str] = []  # candidates that failed to build or disagreed with the baseline
        self.measured: list[dict] = []  # every timing taken, the baselines' too (for the probe's report)

    @staticmethod
    def key(num_rows: int, weight: torch.Tensor, bias: Optional[torch.Tensor], fused: bool = False) -> tuple:
        return (row_bucket(num_rows), weight.shape[0], weight.shape[1], weight.dtype, bias is not None, fused)

    def _config(self, x: torch.Tensor, weight, bias, fused: bool):
        if not 0 < x.shape[0] <= self.max_rows or x.stride(-1) != 1:
            return None
        choice = self.choices.get(self.key(x.shape[0], weight, bias, fused))
        return None if choice is None else choice.config

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        config = self._config(x, weight, bias, False)
        if config is None:
            return F.linear(x, weight, bias)
        from enginespec.kernels.skinny_gemm import skinny_linear

        return skinny_linear(x, weight, bias, config, self.buffers)

    def gate_up_silu(
        self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """silu(gate) * up of x @ gate|up weight [2 I, K].T (+ bias) -> [M, I]."""
        config = self._config(x, weight, bias, True)
        if config is None:
            return _silu_mul(self.linear(x, weight, bias))
        from enginespec.kernels.skinny_gemm import skinny_linear

        return skinny_linear(x, weight, bias, config, self.buffers, silu_mul=True)

    @torch.inference_mode()
    def tune(
        self, groups: dict[tuple, list[tuple]], buckets: Optional[list[int]] = None, fused: bool = False
    ):
        """Measure every bucket (powers of two up to max_rows) of every group: (N, K, dtype,
        has_bias) -> [(weight, bias)] of all layers. fused: the gate_up_silu op's choice (tune
        the same groups unfused first: the unfused choice is its baseline)."""
        top = row_bucket(self.max_rows)
        buckets = buckets or [1 << i for i in range(top.bit_length()) if 1 << i <= top]
        num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        for pairs in groups.values():
            for bucket in buckets:
                self._tune_one(bucket, pairs, num_sms, fused)

    def _tune_one(self, bucket: int, pairs: list[tuple], num_sms: int, fused: bool) -> None:
        weight0, bias0 = pairs[0]
        n, k = weight0.shape
        x = torch.randn(bucket, k, device=self.device, dtype=weight0.dtype)
        base = self.gate_up_silu if fused else F.linear  # gate_up_silu without a fused choice yet
        baseline, want = graph_us(lambda: [base(x, w, b) for w, b in pairs], len(pairs))
        best = Choice(None, baseline, baseline)
        where = {"rows": bucket, "n": n, "k": k, "fused": fused}
        self.measured.append({**where, "config": "baseline", "us": baseline})
        for config in candidates(bucket, n // 2 if fused else n, k, num_sms, silu_mul=fused):
            us = self._time_candidate(config, x, pairs, want, fused)
            self.measured.append({**where, "config": str(config), "us": us})
            if us is not None and us < best.us and us < WIN_MARGIN * baseline:
                best = Choice(config, us, baseline)
        self.choices[self.key(bucket, weight0, bias0, fused)] = best

    def _time_candidate(self, config, x: torch.Tensor, pairs: list[tuple], want: list, fused: bool):
        """us per call of one launch shape over `pairs`, or None (recorded in `rejected`) when it
        does not build, or when its outputs (eager on the first pair, then all of them after
        back-to-back graph replays) differ from the baseline's (`want`) beyond bf16 tolerance."""
        from enginespec.kernels.skinny_gemm import skinny_linear

        def run(w, b):
            return skinny_linear(x, w, b, config, self.buffers, silu_mul=fused)

        where = f"{config} at rows {x.shape[0]}, {tuple(pairs[0][0].shape)}, fused {fused}"
        try:
            first = run(*pairs[0]).float()
            us, outs = graph_us(lambda: [run(w, b) for w, b in pairs], len(pairs))
        except Exception as e:  # noqa: BLE001 - a shape that does not build is not a candidate
            self.rejected.append(f"{where}: {type(e).__name__}: {e}")
            return None
        got, ref = [first, *outs], [want[0], *want]
        if not all(torch.allclose(g, r, atol=3e-2, rtol=3e-2) for g, r in zip(got, ref)):
            worst = max((g - r).abs().max().item() for g, r in zip(got, ref))
            self.rejected.append(f"{where}: differs from the baseline by up to {worst:.3g}")
            return None
        return us

    def report(self) -> list[dict]:
        """One row per key: rows bucket, N, K, fused, the choice, its time and the baseline's (us)."""
        return [
            {
                "rows": key[0],
                "n": key[1],
                "k": key[2],
                "fused": key[5],
                "choice": "baseline" if c.config is None else str(c.config),
                "us": c.us,
                "baseline_us": c.baseline_us,
            }
            for key, c in sorted(self.choices.items(), key=lambda kv: (kv[0][5], *kv[0][:3]))
        ]


_TABLES: dict[torch.device, LinearTable] = {}


def _device_key(device) -> torch.device:
    """torch.device("cuda") and a tensor's torch.device("cuda", 0) name one table."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


@torch.library.custom_op("enginespec::linear", mutates_args=())
def linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """F.linear(x [M, K], weight [N, K], bias) -> [M, N], through the device's LinearTable when
    one is installed (its split-K scratch is the table's own, not an argument)."""
    table = _TABLES.get(x.device)  # a tensor's device always has its index
    return F.linear(x, weight, bias) if table is None else table.linear(x, weight, bias)


@linear_op.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("enginespec::gate_up_silu", mutates_args=())
def gate_up_silu_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """silu(gate) * up of F.linear(x [M, K], gate|up weight [2 I, K], bias) -> [M, I]."""
    table = _TABLES.get(x.device)
    if table is None:
        return _silu_mul(F.linear(x, weight, bias))
    return table.gate_up_silu(x, weight, bias)


@gate_up_silu_op.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0] // 2))


def weight_groups(layers, silu_gate_up: bool = False) -> dict[tuple, list[tuple]]:
    """(N, K, dtype, has_bias) -> [(weight, bias)] over the projections the merged layers route
    through `linear` (MergedLayer.projections), or with silu_gate_up the gate|up weights of the
    layers whose MLP activation is SiLU."""
    groups: dict[tuple, list[tuple]] = {}
    for layer in layers:
        if silu_gate_up:
            pairs = [(layer.gate_up_weight, layer.gate_up_bias)] if layer.silu_mlp else []
        else:
            pairs = layer.projections()
        for weight, bias in pairs:
            groups.setdefault((*weight.shape, weight.dtype, bias is not None), []).append((weight, bias))
    return groups


def install(merged_decoder, device, max_rows: int = DEFAULT_MAX_ROWS) -> LinearTable:
    """Tune (once per device and process: later engines extend the same table) and point every
    layer's `linear` (and, for SiLU MLPs, `gate_up_silu`) at the custom ops. bf16/fp16 on CUDA
    only; the caller checks."""
    device = _device_key(device)
    table = _TABLES.get(device)
    if table is None or table.max_rows < max_rows:
        table = LinearTable(device, max_rows)
    _TABLES[device] = table  # before tuning: the fused baseline runs the unfused choice
    for fused in (False, True):
        groups = weight_groups(merged_decoder.layers, silu_gate_up=fused)
        table.tune({g: p for g, p in groups.items() if (1, *g, fused) not in table.choices}, fused=fused)
    for layer in merged_decoder.layers:
        layer.linear = torch.ops.enginespec.linear
        if layer.silu_mlp:
            layer.gate_up_silu = torch.ops.enginespec.gate_up_silu
    for row in table.report():
        log.info("skinny_gemm %s", row)
    return table
