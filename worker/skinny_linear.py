"""The decoder's projection GEMMs through a measured choice: cuBLAS or the skinny GEMM kernel.

Why: at decode a projection has 1-64 rows, and cuBLAS took 5.4-8 us per GEMM against 1-3 us of
weight reads on the H200 (benchmarks/RESULTS.md, issue 6). kernels/skinny_gemm.py streams the
weight with more programs in one launch, and can run the layer's neighbouring elementwise work
in the same launch; whether that wins depends on the shape, the row count and the device, so
nothing here guesses: `LinearTable.tune` times the baseline and every candidate launch shape on
the model's own weights, inside a CUDA graph over all layers' distinct matrices (a cold L2, no
launch gaps: a decode step's conditions), and keeps the fastest per key (row bucket, N, K,
dtype, bias, variant). A candidate must also reproduce the baseline's results within bf16
tolerance, after back-to-back graph replays, to be kept. The table is per process and device,
saved to a file in enginespec's cache folder (or ENGINESPEC_SKINNY_TABLE's path) and loaded at
the next start (skinny_table_file.py).

Variants (what runs in the GEMM's launch) and their baselines (what runs without the kernel):
- "plain": x @ W.T; baseline cuBLAS (F.linear).
- "silu": silu(gate) * up of the gate|up GEMM; baseline the table's plain choice, then
  kernels/silu_mul.py (one elementwise launch, as the compiled decoder would fuse it).
- "norm", "norm_silu": the same after the layer's RMSNorm of x (input_layernorm before q|k|v,
  post_attention_layernorm before gate|up); baseline kernels/rms_norm.py, then plain / silu.
- "residual": x @ W.T + residual (o_proj and down_proj with the residual add); baseline the
  plain choice, then the add.
- "rscale", "rscale_silu" (layers whose norms are folded into q|k|v and gate|up: merged_decoder's
  fold_norms): the norm's work left is each row's RMS scale, which commutes with the GEMM, so the
  kernel multiplies its float32 results by it in the epilogue (skinny_linear's row_scale) and no
  dot waits for the statistics; baseline the "norm" / "norm_silu" choice over the module's
  unit-weight RMSNorm (tuned first), which is what such a layer ran before.

How the model reaches it, unaware: the merged decoder calls `self.linear(x, weight, bias)` for
each projection (F.linear unless the runner sets it), or, when the runner sets `fused_linear`,
wires a layer as four fused calls (norm+q|k|v, o+residual, norm+gate|up+SiLU*up, down+residual;
MergedLayer.forward). `install` points them at the custom ops `enginespec::linear` and
`enginespec::fused_linear`, which torch.compile keeps opaque and which look the choice up at
run time (at graph capture for decode: each captured bucket bakes in its choice). Rows over
`max_rows` and shapes not tuned run the baseline.

On by default for steps of up to ENGINE_MAX_ROWS rows (engine_max_rows(); bf16/fp16 on CUDA); EngineArgs.skinny_gemm=False
(or ENGINESPEC_SKINNY_GEMM=0) turns it off, so it can be A/B'd end to end
(benchmarks/step_anatomy.py --engine-arg skinny_gemm=false).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from enginespec.kernels.compile_pool import precompile
from enginespec.worker.gemm_tuning import candidates, graph_us, rows_from_env

log = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 64
# What an engine tunes and routes (row buckets 1-32). On the H200 the one-tile GEMV took batch-1
# decode from 1.43 to 1.05 ms/step and batch 8 from 1.65 to 1.35 (fifth session); 16-64 rows
# gained nothing over cuBLAS then. With the tiled kernel under PDL and its one-step K slices
# (fourteenth session, two rounds) routing 16 and 32 rows measured 7-9% and 4-6% faster decode
# steps, 64 rows -0.3% to +1%: the bound stops at 32 (fewer buckets also tune faster).
ENGINE_MAX_ROWS = 32
# ENGINESPEC_SKINNY_MAX_ROWS overrides it (a power of two, 1-64), for A/B runs.
MAX_ROWS_ENV = "ENGINESPEC_SKINNY_MAX_ROWS"
WIN_MARGIN = 0.97  # a kernel must beat the baseline by 3% to be chosen: noise never flips the choice
# Shapes within 3% of the fastest are a tie: the tuning graph (each candidate after itself) does
# not see what the decode graph does, where the launch overlaps its neighbours under PDL. The
# smaller per-thread tile wins a tie: at one row the gate|up GEMV with its norm and SiLU timed
# block_n 8 1.5-6% faster than 4 in the tuning graph, while every decode graph that had taken 4
# ran 0.676-0.693 ms against 0.697-0.723 with 8 (benchmarks/RESULTS.md, thirteenth and fourteenth
# sessions: fourteen sweeps). The rule catches the closest of those; `refine` (below) then times
# the close ones in the decode step's order, each after its real neighbours.
TIE_MARGIN = 0.03
# refine: the fused shapes within REFINE_MARGIN of a key's fastest (at most REFINE_TRIES of them),
# and the baseline when it is within REFINE_MARGIN of the pick, are timed again inside a graph
# of every layer's four fused calls in decode order; another option replaces the pick only when
# that step graph runs REFINE_WIN faster with it.
REFINE_MARGIN = 0.10
REFINE_TRIES = 3
REFINE_WIN = 0.005
STEP_VARIANTS = (
    "norm",
    "residual",
    "norm_silu",
    "rscale",
    "rscale_silu",
)  # MergedLayer.fused_calls(): what refine re-times
ENV_SWITCH = "ENGINESPEC_SKINNY_GEMM"
# its values (lower case, spaces stripped) -> whether it is on; "" is unset
SWITCH_WORDS = {
    "": True,
    "0": False,
    "1": True,
    "false": False,
    "off": False,
    "no": False,
    "true": True,
    "on": True,
    "yes": True,
}
FUSED_TRIES = 3  # launch shapes timed per fused variant (the plain variant's fastest)
VARIANTS = (
    "plain",
    "silu",
    "norm",
    "norm_silu",
    "rscale",
    "rscale_silu",
    "residual",
)  # tuning order: each one's baseline comes first


def engine_max_rows() -> int:
    """The most rows an engine's decode step routes through the table: ENGINE_MAX_ROWS, or
    ENGINESPEC_SKINNY_MAX_ROWS when set (a power of two from 1 to DEFAULT_MAX_ROWS)."""
    return rows_from_env(MAX_ROWS_ENV, ENGINE_MAX_ROWS, DEFAULT_MAX_ROWS)


def resolve_switch(setting: Optional[bool]) -> bool:
    """EngineArgs.skinny_gemm: None reads ENGINESPEC_SKINNY_GEMM (0/false/off/no turns it off,
    1/true/on/yes or unset leaves it on; anything else is a ValueError naming it: a typo had
    meant on), default on."""
    if setting is None:
        raw = os.environ.get(ENV_SWITCH, "").strip().lower()
        if raw not in SWITCH_WORDS:
            raise ValueError(f"{ENV_SWITCH} must be 0 or 1 (or false/off/no, true/on/yes), got {raw!r}")
        return SWITCH_WORDS[raw]
    if not isinstance(setting, bool):
        raise ValueError(f"skinny_gemm must be None, True or False, got {setting!r}")
    return setting


def row_bucket(num_rows: int) -> int:
    """The power of two holding num_rows: the table's row key (measured at the bucket's top)."""
    return 1 << max(0, num_rows - 1).bit_length()


def variant_of(norm_weight, residual, silu_mul: bool, row_scale: bool = False) -> str:
    """The VARIANTS name of a run() call's fusions."""
    if residual is not None:
        return "residual"
    if row_scale:
        return "rscale_silu" if silu_mul else "rscale"
    if norm_weight is not None:
        return "norm_silu" if silu_mul else "norm"
    return "silu" if silu_mul else "plain"


@dataclass(frozen=True)
class Choice:
    """What a key runs: config None = the variant's baseline (module doc). Times are
    microseconds per call as measured, the baseline's too."""

    config: object  # Optional[SkinnyConfig]; object keeps kernels (triton) out of import time
    us: float
    baseline_us: float


def _on_triton(t: torch.Tensor) -> bool:
    from enginespec.kernels.skinny_gemm import interpreting

    return t.is_cuda or interpreting()


def silu_mul_any(
    gate_up: torch.Tensor, row_source: Optional[torch.Tensor] = None, row_eps: float = 0.0
) -> torch.Tensor:
    """silu(gate) * up (of rows scaled by row_source's norm scales, when given: folded norms) in
    one Triton launch on CUDA (or under the interpreter), else in torch."""
    if _on_triton(gate_up):
        from enginespec.kernels.silu_mul import silu_mul

        return silu_mul(gate_up, row_source, row_eps)
    from enginespec.kernels.reference import silu_mul_ref

    return silu_mul_ref(gate_up, row_source, row_eps)


def rms_norm_any(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in one Triton launch on CUDA (or under the interpreter), the reference elsewhere."""
    if _on_triton(x):
        from enginespec.kernels.rms_norm import rms_norm

        return rms_norm(x, weight, eps)
    from enginespec.kernels.reference import rms_norm_ref

    return rms_norm_ref(x, weight, eps)


def gather_two_any(
    index_a: torch.Tensor, table_a: torch.Tensor, index_b: torch.Tensor, table_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(table_a[index_a], table_b[index_b]) in one Triton launch on CUDA (or under the
    interpreter), two index_selects elsewhere."""
    if _on_triton(index_a):
        from enginespec.kernels.gather_rows import gather_two

        return gather_two(index_a, table_a, index_b, table_b)
    from enginespec.kernels.reference import gather_two_ref

    return gather_two_ref(index_a, table_a, index_b, table_b)


class LinearTable:
    """Measured choices for one device (module doc): `run` is what the custom ops call."""

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
        # (bucket, N, K) -> the plain variant's valid launch shapes, fastest first: the fused
        # variants of the same weight time only the best few of them (fewer Triton compiles).
        self.ranked: dict[tuple, list] = {}
        # key -> the shapes `refine` may still choose between ((us, config), fastest first).
        self.close: dict[tuple, list] = {}
        # Wall seconds of the tuning by part, summed over calls: "compile" (the candidates'
        # compile-only pool, tune's first part), "time" (timing them, _tune_one), "refine".
        self.seconds: dict[str, float] = {"compile": 0.0, "time": 0.0, "refine": 0.0}

    @staticmethod
    def key(
        num_rows: int, weight: torch.Tensor, bias: Optional[torch.Tensor], variant: str = "plain"
    ) -> tuple:
        return (
            row_bucket(num_rows),
            weight.shape[0],
            weight.shape[1],
            weight.dtype,
            bias is not None,
            variant,
        )

    def run(
        self,
        x,
        weight,
        bias,
        norm_weight=None,
        eps: float = 0.0,
        residual=None,
        silu_mul: bool = False,
        row_scale: bool = False,
    ):
        """The projection (and what runs around it: module doc) by the measured choice.
        row_scale: norm_weight is a folded norm's (all ones); a chosen kernel applies only the
        row scale, the baseline the module's norm."""
        variant = variant_of(norm_weight, residual, silu_mul, row_scale)
        choice = None
        dense = x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1)
        if 0 < x.shape[0] <= self.max_rows and dense:
            choice = self.choices.get(self.key(x.shape[0], weight, bias, variant))
        if choice is None or choice.config is None:
            return self._baseline(x, weight, bias, norm_weight, eps, residual, silu_mul, row_scale)
        from enginespec.kernels.skinny_gemm import skinny_linear

        return skinny_linear(
            x, weight, bias, choice.config, self.buffers, silu_mul, *_kernel_norm(norm_weight, eps, row_scale),
            residual, row_scale=row_scale,
        )  # fmt: skip

    def _baseline(self, x, weight, bias, norm_weight, eps, residual, silu_mul, row_scale=False):
        if row_scale:  # the norm variant's choice over the folded norm's unit weight
            return self.run(x, weight, bias, norm_weight, eps, None, silu_mul)
        if norm_weight is not None:  # rms_norm, then the measured plain/silu choice
            return self.run(rms_norm_any(x, norm_weight, eps), weight, bias, silu_mul=silu_mul)
        if silu_mul:
            return silu_mul_any(self.run(x, weight, bias))
        if residual is not None:
            return self.run(x, weight, bias) + residual
        return F.linear(x, weight, bias)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return self.run(x, weight, bias)

    @torch.inference_mode()
    def tune(
        self, groups: dict[tuple, list[dict]], variant: str = "plain", buckets: Optional[list[int]] = None
    ):
        """Measure every bucket (powers of two up to max_rows) of every group: (N, K, dtype,
        has_bias) -> per-layer run() arguments ({"weight", "bias"}, plus "norm_weight" and "eps"
        for the norm variants). Tune VARIANTS in order: each baseline runs earlier choices."""
        self.tune_variants([(groups, variant)], buckets)

    @torch.inference_mode()
    def tune_variants(self, work: list[tuple[dict, str]], buckets: Optional[list[int]] = None):
        """tune(groups, variant) for each (groups, variant) of `work`, in its order (VARIANTS'),
        with the candidates compiled in two precompile calls rather than one a variant: the
        plain variant's, then every fused variant's at once (their candidates are the plain
        variant's fastest shapes, so they are known once it is timed). A precompile call waits
        for its slowest compile (about 2 s of the H200's), so one call for the four fused
        variants waits once, not four times. The timings run in `work`'s order as before."""
        top = row_bucket(self.max_rows)
        buckets = buckets or [1 << i for i in range(top.bit_length()) if 1 << i <= top]
        num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        plain = [w for w in work if w[1] == "plain"]
        for batch in (plain, [w for w in work if w[1] != "plain"]):
            if not batch:
                continue
            started = time.perf_counter()
            precompile(
                [
                    lambda b=bucket, c=config, a=layers[0], v=variant: self._compile(b, a, c, v)
                    for groups, variant in batch
                    for layers in groups.values()
                    for bucket in buckets
                    for config in self._candidates(bucket, *layers[0]["weight"].shape, num_sms, variant)
                ]
            )
            compiled = time.perf_counter()
            for groups, variant in batch:
                for layers in groups.values():
                    for bucket in buckets:
                        self._tune_one(bucket, layers, num_sms, variant)
            self.seconds["compile"] += compiled - started
            self.seconds["time"] += time.perf_counter() - compiled

    def _compile(self, bucket: int, call: dict, config, variant: str) -> None:
        """Compile (not launch) the kernel variant one candidate of _tune_one will run."""
        from enginespec.kernels.skinny_gemm import skinny_linear

        weight, k = call["weight"], call["weight"].shape[1]
        x = torch.empty(bucket, k, device=self.device, dtype=weight.dtype)
        res = torch.empty(bucket, weight.shape[0], device=self.device, dtype=weight.dtype)
        a = _args(dict(call, residual=res if variant == "residual" else None, silu_mul="silu" in variant))
        skinny_linear(
            x,
            weight,
            a["bias"],
            config,
            self.buffers,
            a["silu_mul"],
            *_kernel_norm(a["norm_weight"], a["eps"], a["row_scale"]),
            a["residual"],
            compile_only=True,
            row_scale=a["row_scale"],
        )

    def _tune_one(self, bucket: int, layers: list[dict], num_sms: int, variant: str) -> None:
        weight0, bias0 = layers[0]["weight"], layers[0]["bias"]
        n, k = weight0.shape
        silu = "silu" in variant
        x = torch.randn(bucket, k, device=self.device, dtype=weight0.dtype)
        res = (
            torch.randn(bucket, n, device=self.device, dtype=weight0.dtype) if variant == "residual" else None
        )
        calls = [dict(a, residual=res, silu_mul=silu) for a in layers]
        try:
            baseline, want = graph_us(lambda: [self._baseline(x, **_args(c)) for c in calls], len(calls))
        except Exception as e:  # noqa: BLE001 - no baseline time: the key keeps its baseline, untimed
            self.rejected.append(f"baseline of {variant} at rows {bucket}, {(n, k)}: {type(e).__name__}: {e}")
            return
        where = {"rows": bucket, "n": n, "k": k, "variant": variant}
        self.measured.append({**where, "config": "baseline", "us": baseline})
        timed = []
        for config in self._candidates(bucket, n, k, num_sms, variant):
            us = self._time_candidate(config, x, calls, want)
            self.measured.append({**where, "config": str(config), "us": us})
            if us is not None:
                timed.append((us, config))
        ranked = sorted(timed, key=lambda t: t[0])
        if variant == "plain":
            self.ranked[(bucket, n, k)] = [c for _, c in ranked]
        key = self.key(bucket, weight0, bias0, variant)
        self.choices[key] = choice = pick(timed, baseline)
        if choice.config is not None and variant in STEP_VARIANTS:
            close = [t for t in ranked if t[0] <= ranked[0][0] * (1 + REFINE_MARGIN)][:REFINE_TRIES]
            if baseline <= choice.us * (1 + REFINE_MARGIN):  # the baseline's launches may win in order
                close.append((baseline, None))
            self.close[key] = close

    def _candidates(self, bucket: int, n: int, k: int, num_sms: int, variant: str) -> list:
        """Every launch shape for "plain"; for a fused variant the plain variant's best
        FUSED_TRIES shapes on the same weight when it was measured (the fusions add little
        traffic, so the ranking carries over; it is measured again all the same)."""
        ranked = self.ranked.get((bucket, n, k))
        if variant == "plain" or not ranked:
            silu = "silu" in variant
            return candidates(bucket, n // 2 if silu else n, k, num_sms, silu_mul=silu)
        return ranked[:FUSED_TRIES]

    def _time_candidate(self, config, x: torch.Tensor, calls: list[dict], want: list) -> Optional[float]:
        """us per call of one launch shape over `calls`, or None (recorded in `rejected`) when it
        does not build, or when its outputs (eager on the first layer, then all of them after
        back-to-back graph replays) differ from the baseline's (`want`) beyond bf16 tolerance."""
        from enginespec.kernels.skinny_gemm import skinny_linear

        def one(c):
            a = _args(c)
            return skinny_linear(
                x,
                c["weight"],
                c["bias"],
                config,
                self.buffers,
                a["silu_mul"],
                *_kernel_norm(a["norm_weight"], a["eps"], a["row_scale"]),
                a["residual"],
                row_scale=a["row_scale"],
            )

        where = f"{config} at rows {x.shape[0]}, {tuple(calls[0]['weight'].shape)}, {variant_of(**_variant_args(calls[0]))}"
        try:
            first = one(calls[0]).float()
            us, outs = graph_us(lambda: [one(c) for c in calls], len(calls))
        except Exception as e:  # noqa: BLE001 - a shape that does not build is not a candidate
            self.rejected.append(f"{where}: {type(e).__name__}: {e}")
            return None
        got, ref = [first, *outs], [want[0], *want]
        if not all(torch.allclose(g, r, atol=3e-2, rtol=3e-2) for g, r in zip(got, ref)):
            worst = max((g - r).abs().max().item() for g, r in zip(got, ref))
            self.rejected.append(f"{where}: differs from the baseline by up to {worst:.3g}")
            return None
        return us

    @torch.inference_mode()
    def refine(self, layer_calls: list[list[dict]], buckets: Optional[list[int]] = None) -> None:
        """Time each fused key's close shapes (self.close) in a graph of the decode step's fused
        calls in their order (layer_calls: per layer, MergedLayer.fused_calls()), attention left
        out: under PDL a launch overlaps its neighbours, which the tuning graph (each shape after
        itself) does not see. Keeps the pick unless another shape makes the step REFINE_WIN
        faster. Runs after tune() of every fused variant; each key is refined once."""
        started = time.perf_counter()
        top = row_bucket(self.max_rows)
        buckets = buckets or [1 << i for i in range(top.bit_length()) if 1 << i <= top]
        flat = [dict(c) for calls in layer_calls for c in calls]
        for bucket in buckets:
            step = self._step_fn(bucket, flat)
            keys = dict.fromkeys(self.key(bucket, c["weight"], c["bias"], c["variant"]) for c in flat)
            for key in keys:
                options = self.close.pop(key, [])
                if len(options) > 1 and key in self.choices:
                    self.choices[key] = self._refine_key(
                        key, options, lambda s=step: graph_us(s, len(flat))[0]
                    )
        self.seconds["refine"] += time.perf_counter() - started

    def _step_fn(self, bucket: int, flat: list[dict]):
        """A callable running every call of `flat` through run() on random rows of `bucket`."""
        inputs = {}
        for c in flat:
            n, k = c["weight"].shape
            inputs.setdefault(("x", k), torch.randn(bucket, k, device=self.device, dtype=c["weight"].dtype))
            if c["variant"] == "residual":
                inputs.setdefault(
                    ("res", n), torch.randn(bucket, n, device=self.device, dtype=c["weight"].dtype)
                )
        args = [
            dict(
                _args(c),
                residual=inputs[("res", c["weight"].shape[0])] if c["variant"] == "residual" else None,
            )
            for c in flat
        ]
        xs = [inputs[("x", c["weight"].shape[1])] for c in flat]
        return lambda: [self.run(x, **a) for x, a in zip(xs, args)]

    def _refine_key(self, key: tuple, options: list, time_step) -> Choice:
        """The choice for `key` among options ((tuning us, config)) by time_step() (the step
        graph's us per call with self.choices[key] set to each), two interleaved rounds, the
        faster of each option's two; the current pick stays unless beaten by REFINE_WIN."""
        current = self.choices[key]
        if all(c != current.config for _, c in options):
            options = [*options, (current.us, current.config)]
        best: dict = {}
        for _ in range(2):
            for us, config in options:
                self.choices[key] = Choice(config, us, current.baseline_us)
                t = time_step()
                best[config] = min(best.get(config, t), t)
        where = {"rows": key[0], "n": key[1], "k": key[2], "variant": key[5]}
        for _, config in options:
            self.measured.append({**where, "config": str(config), "step_us": best[config]})
        us, config = min(options, key=lambda o: best[o[1]])
        won = best[config] < best[current.config] * (1 - REFINE_WIN)
        self.choices[key] = Choice(config, us, current.baseline_us) if won else current
        return self.choices[key]

    def report(self) -> list[dict]:
        """One row per key: rows bucket, N, K, variant, the choice, its time and the baseline's (us)."""
        order = {v: i for i, v in enumerate(VARIANTS)}
        return [
            {
                "rows": key[0],
                "n": key[1],
                "k": key[2],
                "variant": key[5],
                "choice": "baseline" if c.config is None else str(c.config),
                "us": c.us,
                "baseline_us": c.baseline_us,
            }
            for key, c in sorted(self.choices.items(), key=lambda kv: (order[kv[0][5]], *kv[0][:3]))
        ]


def pick(timed: list[tuple[float, object]], baseline_us: float) -> Choice:
    """The choice of one key from its timed candidates ((us, config) pairs): the baseline unless a
    candidate beats it by WIN_MARGIN; of the candidates within TIE_MARGIN of the fastest, the one
    whose threads hold the fewest weight elements (then the faster, then the earlier)."""
    winners = [(us, i, c) for i, (us, c) in enumerate(timed) if us < WIN_MARGIN * baseline_us]
    if not winners:
        return Choice(None, baseline_us, baseline_us)
    fastest = min(us for us, _, _ in winners)
    tied = [w for w in winners if w[0] <= fastest * (1 + TIE_MARGIN)]
    us, _, config = min(tied, key=lambda w: (per_thread(w[2]), w[0], w[1]))
    return Choice(config, us, baseline_us)


def per_thread(config) -> float:
    """Weight elements of one tile per thread (a key's candidates all fuse the same work, so the
    gate|up variants' second tile scales them alike and is left out)."""
    return config.block_n * config.block_k / (32 * config.num_warps)


def _args(call: dict) -> dict:
    """run()'s keyword arguments of one tuning call (norm_weight/eps absent = no norm)."""
    return {
        "weight": call["weight"],
        "bias": call["bias"],
        "norm_weight": call.get("norm_weight"),
        "eps": call.get("eps", 0.0),
        "residual": call.get("residual"),
        "silu_mul": call.get("silu_mul", False),
        "row_scale": call.get("row_scale", False),
    }


def _variant_args(call: dict) -> dict:
    a = _args(call)
    keys = ("norm_weight", "residual", "silu_mul", "row_scale")
    return {k: a[k] for k in keys}


def _kernel_norm(norm_weight, eps: float, row_scale: bool) -> tuple:
    """skinny_linear's (norm_weight, eps) for a run() call: with row_scale the kernel takes the
    epsilon alone (the norm's unit weight is folded into the GEMM's)."""
    return (None, eps) if row_scale else (norm_weight, eps)
