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

Off by default: EngineArgs.skinny_gemm (or ENGINESPEC_SKINNY_GEMM=1) turns it on, so the lead
can A/B it end to end (benchmarks/decode_sweep.py --engine-arg skinny_gemm=true).
"""

from __future__ import annotations

import logging
import os
import statistics
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 64
WIN_MARGIN = 0.97  # a kernel must beat cuBLAS by 3% to be chosen: noise never flips the choice
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
    """What a (row bucket, N, K, dtype, bias) key runs: config None = cuBLAS. Times are
    microseconds per GEMM as measured (cuBLAS's too, for the report)."""

    config: object  # Optional[SkinnyConfig]; object keeps kernels (triton) out of import time
    us: float
    cublas_us: float


def graph_us(fn: Callable[[], list], num_calls: int, reps: int = 7) -> tuple[float, list]:
    """Microseconds per call of fn (which makes num_calls GEMMs and returns their outputs)
    replayed from a CUDA graph: the median of `reps` replays timed with events, after a warm-up
    run and one replay. Also returns the outputs as the last replay left them (back-to-back
    replays are where a split-K launch that left a counter set would go wrong)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / num_calls)
    return statistics.median(times), [o.float() for o in outs]


def candidates(bucket: int, n: int, k: int, num_sms: int) -> list:
    """Launch shapes worth timing for a row bucket: tensor-core tiles (BLOCK_N 32/64, BLOCK_K
    128/256 within ~160 KiB of 3-stage shared memory) and, for at most 4 rows, broadcast tiles;
    each with one K split and with the fewest splits (power of two, <= 8) that give every SM a
    program. A list to measure, not a ranking."""
    from enginespec.kernels.skinny_gemm import MAX_BROADCAST_ROWS, SkinnyConfig

    def splits(block_n: int, block_k: int) -> list[int]:
        tiles, num = -(-n // block_n), 1
        while tiles * num < num_sms and num < 8 and k // (2 * num) >= block_k:
            num *= 2
        return sorted({1, num})

    out = []
    block_m = max(16, bucket)
    for block_n in (32, 64):
        for block_k in (128, 256):
            if 3 * (block_m + block_n) * block_k * 2 > 160 * 1024 or block_k > k:
                continue
            out += [SkinnyConfig(block_n, block_k, s) for s in splits(block_n, block_k)]
    if bucket <= MAX_BROADCAST_ROWS:
        block_k = 256 // bucket  # a [bucket, BLOCK_N, BLOCK_K] float32 accumulator of ~32 registers a thread
        for block_n in (8, 16):
            out += [SkinnyConfig(block_n, block_k, s, use_dot=False) for s in splits(block_n, block_k)]
    return out


class LinearTable:
    """Measured choices for one device (module doc). `linear` is what the custom op runs."""

    def __init__(self, device, max_rows: int = DEFAULT_MAX_ROWS):
        from enginespec.kernels.skinny_gemm import SplitBuffers

        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.device = torch.device(device)
        self.max_rows = max_rows
        self.buffers = SplitBuffers(self.device)
        self.choices: dict[tuple, Choice] = {}
        self.rejected: list[str] = []  # candidates that failed to build or disagreed with cuBLAS
        self.measured: list[dict] = []  # every timing taken, cuBLAS's too (for the probe's report)

    @staticmethod
    def key(num_rows: int, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> tuple:
        return (row_bucket(num_rows), weight.shape[0], weight.shape[1], weight.dtype, bias is not None)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        choice = (
            self.choices.get(self.key(x.shape[0], weight, bias)) if 0 < x.shape[0] <= self.max_rows else None
        )
        if choice is None or choice.config is None or x.stride(-1) != 1:
            return F.linear(x, weight, bias)
        from enginespec.kernels.skinny_gemm import skinny_linear

        return skinny_linear(x, weight, bias, choice.config, self.buffers)

    @torch.inference_mode()
    def tune(self, groups: dict[tuple, list[tuple]], buckets: Optional[list[int]] = None) -> None:
        """Measure every bucket (powers of two up to max_rows) of every group: (N, K, dtype,
        has_bias) -> [(weight, bias)] of all layers."""
        top = row_bucket(self.max_rows)
        buckets = buckets or [1 << i for i in range(top.bit_length()) if 1 << i <= top]
        num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        for pairs in groups.values():
            for bucket in buckets:
                self._tune_one(bucket, pairs, num_sms)

    def _tune_one(self, bucket: int, pairs: list[tuple], num_sms: int) -> None:
        weight0, bias0 = pairs[0]
        n, k = weight0.shape
        x = torch.randn(bucket, k, device=self.device, dtype=weight0.dtype)
        cublas, want = graph_us(lambda: [F.linear(x, w, b) for w, b in pairs], len(pairs))
        best = Choice(None, cublas, cublas)
        self.measured.append({"rows": bucket, "n": n, "k": k, "config": "cublas", "us": cublas})
        for config in candidates(bucket, n, k, num_sms):
            us = self._time_candidate(config, x, pairs, want)
            self.measured.append({"rows": bucket, "n": n, "k": k, "config": str(config), "us": us})
            if us is not None and us < best.us and us < WIN_MARGIN * cublas:
                best = Choice(config, us, cublas)
        self.choices[self.key(bucket, weight0, bias0)] = best

    def _time_candidate(self, config, x: torch.Tensor, pairs: list[tuple], want: list) -> Optional[float]:
        """us per GEMM of one launch shape over `pairs`, or None (recorded in `rejected`) when it
        does not build, or when its outputs (eager on the first pair, then all of them after
        back-to-back graph replays) differ from cuBLAS's (`want`) beyond bf16 tolerance."""
        from enginespec.kernels.skinny_gemm import skinny_linear

        where = f"{config} at rows {x.shape[0]}, {tuple(pairs[0][0].shape)}"
        try:
            first = skinny_linear(x, pairs[0][0], pairs[0][1], config, self.buffers).float()
            us, outs = graph_us(
                lambda: [skinny_linear(x, w, b, config, self.buffers) for w, b in pairs], len(pairs)
            )
        except Exception as e:  # noqa: BLE001 - a shape that does not build is not a candidate
            self.rejected.append(f"{where}: {type(e).__name__}: {e}")
            return None
        worst = max((got - ref).abs().max().item() for got, ref in zip([first, *outs], [want[0], *want]))
        if not all(
            torch.allclose(g, r, atol=3e-2, rtol=3e-2) for g, r in zip([first, *outs], [want[0], *want])
        ):
            self.rejected.append(f"{where}: differs from cuBLAS by up to {worst:.3g}")
            return None
        return us

    def report(self) -> list[dict]:
        """One row per key: rows bucket, N, K, the choice, its time and cuBLAS's (us)."""
        return [
            {
                "rows": key[0],
                "n": key[1],
                "k": key[2],
                "choice": "cublas" if c.config is None else str(c.config),
                "us": c.us,
                "cublas_us": c.cublas_us,
            }
            for key, c in sorted(self.choices.items(), key=lambda kv: kv[0][:3])
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


def weight_groups(layers) -> dict[tuple, list[tuple]]:
    """(N, K, dtype, has_bias) -> [(weight, bias)] over the projections the merged layers route
    through `linear` (MergedLayer.projections)."""
    groups: dict[tuple, list[tuple]] = {}
    for layer in layers:
        for weight, bias in layer.projections():
            groups.setdefault((*weight.shape, weight.dtype, bias is not None), []).append((weight, bias))
    return groups


def install(merged_decoder, device, max_rows: int = DEFAULT_MAX_ROWS) -> LinearTable:
    """Tune (once per device and process: later engines extend the same table) and point every
    layer's `linear` at the custom op. bf16/fp16 on CUDA only; the caller checks."""
    device = _device_key(device)
    table = _TABLES.get(device)
    if table is None or table.max_rows < max_rows:
        table = LinearTable(device, max_rows)
    groups = weight_groups(merged_decoder.layers)
    missing = {g: p for g, p in groups.items() if (1, g[0], g[1], g[2], g[3]) not in table.choices}
    table.tune(missing)
    _TABLES[device] = table
    for layer in merged_decoder.layers:
        layer.linear = torch.ops.enginespec.linear
    for row in table.report():
        log.info("skinny_gemm %s", row)
    return table
