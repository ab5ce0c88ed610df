"""Weight prefetch into L2 while a batch-1 layer attends (issue 19).

A fused decode layer (MergedLayer._forward_fused) runs, in order: norm + q|k|v GEMV, the q|k|v
epilogue (norm, rotary, K/V write), attention, its split merge, then the o, gate|up and down
GEMVs. The middle three read a few MB at most: several microseconds in which HBM idles. With
prefetch on, the layer calls `start` right after its q|k|v GEMV: a side stream, ordered after
everything issued so far on the layer's stream, launches kernels/l2_prefetch.py over the
layer's o, gate|up and down weights (and, with "next", the next layer's q|k|v weight), so the
projections that follow read them from L2. `join` (at the end of the decoder's forward) orders
the side stream back into the main one, which stream capture requires before a graph closes.

Only while a CUDA graph is being captured: a replayed graph pays nothing on the host for the
fork and join, an eager step would pay two event records and a wait per layer. Off under
torch.compile (dynamo would have to trace the stream switch). Correctness never depends on it:
the prefetch writes nothing.

ENGINESPEC_L2_PREFETCH: "0" off, "1" the layer's own three projections, "next" those and the
next layer's q|k|v. The default is what measured fastest on the H200 (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import os
from typing import Optional

import torch

PREFETCH_ENV = "ENGINESPEC_L2_PREFETCH"
DEFAULT_MODE = "0"
MODES = ("0", "1", "next")


def resolve_mode() -> str:
    mode = os.environ.get(PREFETCH_ENV, DEFAULT_MODE)
    if mode not in MODES:
        raise ValueError(f"{PREFETCH_ENV} must be one of {MODES}, got {mode!r}")
    return mode


class WeightPrefetch:
    """The side stream and, per layer, the weights to ask L2 for (in the order they are read)."""

    def __init__(self, device: torch.device, plan: list[list[torch.Tensor]]):
        self.stream = torch.cuda.Stream(device)
        self.plan = plan
        self.pending = False

    def active(self) -> bool:
        return not torch.compiler.is_compiling() and torch.cuda.is_current_stream_capturing()

    def start(self, layer_idx: int) -> None:
        """After layer_idx's q|k|v GEMV: prefetch its plan on the side stream (capture only)."""
        if not self.active():
            return
        from enginespec.kernels.l2_prefetch import l2_prefetch

        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            l2_prefetch(self.plan[layer_idx])
        self.pending = True

    def join(self) -> None:
        """Order the side stream's work before whatever the main stream issues next."""
        if self.pending and not torch.compiler.is_compiling():
            torch.cuda.current_stream().wait_stream(self.stream)
            self.pending = False


def build(merged_decoder, device: torch.device, mode: Optional[str] = None) -> Optional[WeightPrefetch]:
    """A WeightPrefetch over the fused layers' weights, or None (mode "0", not sm_90+, or a
    layer that cannot fuse)."""
    from enginespec.kernels.l2_prefetch import MAX_TENSORS, supported

    mode = resolve_mode() if mode is None else mode
    layers = list(merged_decoder.layers)
    if mode == "0" or not supported(device) or not all(layer.can_fuse() for layer in layers):
        return None
    plan = []
    for i, layer in enumerate(layers):
        weights = [layer.o_proj.weight, layer.gate_up_weight, layer.down_proj.weight]
        if mode == "next" and i + 1 < len(layers):
            weights.append(layers[i + 1].qkv_weight)
        plan.append([w for w in weights if w.is_contiguous()][:MAX_TENSORS])
    return WeightPrefetch(device, plan)
