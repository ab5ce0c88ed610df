"""The custom ops through which the merged decoder reaches the measured GEMM choice
(skinny_linear.py), and `install`, which tunes the table on a model and points its layers at
them (the runner calls it when EngineArgs.skinny_gemm is on).

The ops are opaque to torch.compile (as attention is) and find the device's LinearTable in a
per-process registry, so the traced graph holds no table and one compiled decoder serves every
step; with no table installed they compute the baseline.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F

from enginespec.worker import skinny_table_file as table_file
from enginespec.worker.skinny_linear import DEFAULT_MAX_ROWS, LinearTable, gather_two_any, rms_norm_any

log = logging.getLogger(__name__)

_TABLES: dict[torch.device, LinearTable] = {}


def _device_key(device) -> torch.device:
    """torch.device("cuda") and a tensor's torch.device("cuda", 0) name one table."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _table(device) -> LinearTable:
    """The device's table, or an empty one (every key runs its baseline)."""
    return _TABLES.get(device) or LinearTable(device, max_rows=1)


@torch.library.custom_op("enginespec::linear", mutates_args=())
def linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """F.linear(x [M, K], weight [N, K], bias) -> [M, N] by the device's measured choice."""
    table = _TABLES.get(x.device)  # a tensor's device always has its index
    return F.linear(x, weight, bias) if table is None else table.run(x, weight, bias)


@linear_op.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("enginespec::fused_linear", mutates_args=())
def fused_linear_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    norm_weight: Optional[torch.Tensor],
    eps: float,
    residual: Optional[torch.Tensor],
    silu_mul: bool,
    row_scale: bool = False,
) -> torch.Tensor:
    """RMSNorm(x; norm_weight, eps) when given, @ weight.T (+ bias), then silu(gate) * up when
    silu_mul ([M, N / 2]) or + residual when given ([M, N]); LinearTable.run's variants.
    row_scale: norm_weight is a folded norm's unit weight (LinearTable.run)."""
    return _table(x.device).run(x, weight, bias, norm_weight, eps, residual, silu_mul, row_scale)


@fused_linear_op.register_fake
def _(x, weight, bias, norm_weight, eps, residual, silu_mul, row_scale=False):
    return x.new_empty((x.shape[0], weight.shape[0] // 2 if silu_mul else weight.shape[0]))


@torch.library.custom_op("enginespec::rms_norm", mutates_args=())
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(x [M, H]; weight [H], eps) in one launch (kernels/rms_norm.py) where Triton runs,
    the reference elsewhere: the merged decoder's final norm on the fused path."""
    return rms_norm_any(x, weight, eps)


@rms_norm_op.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@torch.library.custom_op("enginespec::embed_rope", mutates_args=())
def embed_rope_op(
    input_ids: torch.Tensor, positions: torch.Tensor, embed_weight: torch.Tensor, rope_table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_weight[input_ids] [N, hidden], rope_table[positions] [N, 2, D]) in one launch
    (kernels/gather_rows.py) where Triton runs: the merged decoder's first two gathers on the
    fused path."""
    return gather_two_any(input_ids, embed_weight, positions, rope_table)


@embed_rope_op.register_fake
def _(input_ids, positions, embed_weight, rope_table):
    n = input_ids.shape[0]
    return embed_weight.new_empty((n, *embed_weight.shape[1:])), rope_table.new_empty(
        (n, *rope_table.shape[1:])
    )


def tuning_groups(layers, variant: str) -> dict[tuple, list[dict]]:
    """(N, K, dtype, has_bias) -> per-layer LinearTable.run arguments of one variant: "plain"
    over every projection a layer routes through `linear` (MergedLayer.projections), the
    others over the fused calls of layers that can fuse (MergedLayer.fused_calls). "norm" and
    "norm_silu" also take a folded layer's "rscale" and "rscale_silu" calls (as norm calls:
    the norm's unit weight, no row_scale): the row-scale variants' baseline is the norm
    variants' choice, what those calls ran before."""
    groups: dict[tuple, list[dict]] = {}
    for layer in layers:
        if variant == "plain":
            calls = [{"weight": w, "bias": b} for w, b in layer.projections()]
        elif variant == "silu":  # the norm_silu baseline's second half
            calls = [{"weight": layer.gate_up_weight, "bias": layer.gate_up_bias}] if layer.can_fuse() else []
        else:  # the norm variants also over a folded layer's row-scale calls: their baseline
            names = (variant, "rscale" + variant[4:]) if variant.startswith("norm") else (variant,)
            calls = [c for c in layer.fused_calls() if c["variant"] in names] if layer.can_fuse() else []
        for call in calls:
            w, b = call["weight"], call["bias"]
            args = {k: v for k, v in call.items() if k not in ("variant", "row_scale")}
            if variant.startswith("rscale"):
                args["row_scale"] = True
            groups.setdefault((*w.shape, w.dtype, b is not None), []).append(args)
    return groups


def install(merged_decoder, device, max_rows: int = DEFAULT_MAX_ROWS) -> LinearTable:
    """Tune every variant the decoder uses (once per device and process: a later engine only
    adds what is missing; the table file's choices first and what it lacks saved back:
    skinny_table_file.py, a file in enginespec's cache folder unless ENGINESPEC_SKINNY_TABLE
    names one or is 0) and point every layer at the ops: `linear` always, `fused_linear`
    where the layer can fuse. bf16/fp16 on CUDA only; the caller checks."""
    from enginespec.worker.skinny_linear import VARIANTS

    device = _device_key(device)
    table = _TABLES.get(device)
    if table is None or table.max_rows < max_rows:
        table = LinearTable(device, max_rows)
    _TABLES[device] = table
    path = table_file.table_path(device)
    if path is not None and table_file.load(table, path):
        log.info("skinny_gemm: choices from %s", path)
    num_known = len(table.choices)
    work = []  # (the groups a variant lacks, the variant), in VARIANTS' order
    for variant in VARIANTS:
        groups = tuning_groups(merged_decoder.layers, variant)
        missing = {g: c for g, c in groups.items() if (1, *g, variant) not in table.choices}
        if missing:
            work.append((missing, variant))
    if work:
        table.tune_variants(work)
    fused = [layer.fused_calls() for layer in merged_decoder.layers if layer.can_fuse()]
    if fused and table.close:
        table.refine(fused)
    if path is not None and len(table.choices) > num_known:
        table_file.save(table, path)
    merged_decoder.fused_max_rows = table.max_rows
    if merged_decoder.final_norm_fusable():
        merged_decoder.fused_norm = torch.ops.enginespec.rms_norm
    if merged_decoder.embed_rope_fusable():
        merged_decoder.fused_embed_rope = torch.ops.enginespec.embed_rope
    for layer in merged_decoder.layers:
        layer.linear = torch.ops.enginespec.linear
        if layer.can_fuse():
            layer.fused_linear = torch.ops.enginespec.fused_linear
    for row in table.report():
        log.info("skinny_gemm %s", row)
    log.info("skinny_gemm tuning seconds: %s", {k: round(v, 2) for k, v in table.seconds.items()})
    return table
