"""Weights asked of L2 ahead of the projections that read them, while a small decode attends.

At batch 1 a layer's attention and split merge take ~6 us in which HBM carries ~2 MB of K/V,
and then the o, gate|up and down projections read their weights (~23 MB for Qwen3-0.6B) in
latency-bound one-tile GEMVs. The split merge's programs wait (PDL) for the attention all that
time; with a plan, they spend it asking L2 for the ranges listed here (kernels/pdl.l2_ahead), so
the projections may find their weights in L2 (50 MB on the H200). A hint: no value changes.

ENGINESPEC_L2_AHEAD (unset or empty: off) is a comma list of parts of the layer, in the order
they are asked for: `o`, `gate_up`, `down`, `next_qkv` (the next layer's q|k|v; none after the
last), and `rows=N` (the most rows of a decode batch that asks, default 1), e.g.
"gate_up,down,rows=4". The seventh session's side-stream prefetch of the same weights was
slower (benchmarks/RESULTS.md); this asks from inside the chain, with no stream join.

Invariant: a table holds (address, bytes) of weights that no kernel writes and that stay where
they are for the model's life (read once, at the first forward on CUDA; the graphs captured
after bake its address in).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

ENV = "ENGINESPEC_L2_AHEAD"
PARTS = ("o", "gate_up", "down", "next_qkv")


@dataclass(frozen=True)
class AheadPlan:
    """Which weights of a layer its decode attention's merge asks L2 for, and up to how many rows."""

    parts: tuple[str, ...]
    max_rows: int = 1


def plan_from_env(raw: Optional[str] = None) -> Optional[AheadPlan]:
    """ENGINESPEC_L2_AHEAD parsed (raw given: that text); None when unset or empty. ValueError
    naming the variable for an unknown part, a repeated part or a bad rows value."""
    raw = os.environ.get(ENV, "") if raw is None else raw
    parts: list[str] = []
    max_rows = 1
    items = [piece.strip() for piece in raw.split(",") if piece.strip()]
    for item in items:
        key, _, value = item.partition("=")
        if key == "rows" and value.strip().isdigit() and int(value) >= 1:
            max_rows = int(value)
        elif key in PARTS and not value and key not in parts:
            parts.append(key)
        else:
            raise ValueError(
                f"{ENV} takes parts of {', '.join(PARTS)} (each once) and rows=N >= 1, got {item!r} in {raw!r}"
            )
    if items and not parts:
        raise ValueError(f"{ENV}: name at least one of {', '.join(PARTS)}, got {raw!r}")
    return AheadPlan(tuple(parts), max_rows) if parts else None


def _part_weights(layers, i: int, part: str) -> list[torch.Tensor]:
    layer = layers[i]
    if part == "o":
        return [layer.o_proj.weight]
    if part == "gate_up":
        return [layer.gate_up_weight]
    if part == "down":
        return [layer.down_proj.weight]
    return [layers[i + 1].qkv_weight] if i + 1 < len(layers) else []  # next_qkv


def tables(layers, plan: AheadPlan, device: torch.device) -> dict[int, torch.Tensor]:
    """{layer_idx: int64 [R, 2] of (address, bytes)} on `device` for the merged decoder's layers
    (worker/merged_decoder.MergedLayer: o_proj, gate_up_weight, down_proj, qkv_weight); a layer
    whose parts name no weight (next_qkv alone, the last layer) gets none. ValueError for a
    weight that is not a contiguous tensor on `device` (a bulk prefetch reads whole ranges)."""
    out: dict[int, torch.Tensor] = {}
    for i, layer in enumerate(layers):
        rows = []
        for part in plan.parts:
            for weight in _part_weights(layers, i, part):
                if weight.device != device or not weight.is_contiguous():
                    raise ValueError(f"{ENV}: layer {i}'s {part} weight must be contiguous on {device}")
                rows.append((weight.data_ptr(), weight.numel() * weight.element_size()))
        if rows:
            out[layer.layer_idx] = torch.tensor(rows, dtype=torch.int64, device=device)
    return out
