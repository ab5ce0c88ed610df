"""CUDA graphs for decode steps, applied at the call site (the model never knows).

A decode step runs the same kernels every time; only the data changes. Launching 28 layers'
worth of small kernels from Python costs more than the GPU needs to run them at small batch,
so we capture `FlatModel.forward` once per padded batch size (bucket) and replay it.

How a step qualifies: every scheduled request has one new token (a decode, or a one-token
prefill chunk) and there are at most `max(buckets)` of them. The runner then builds the batch
with `pad_to = bucket`, so padding rows are the contract's dummy rows (slot -1 writes to the
scratch block, seq_len 0 reads nothing), copies the batch into the static input buffers the
graph was captured on, and replays.

Invariants that keep graphs from changing outputs:
- The attention kernels read sequence lengths, tables and slots from device memory, never
  from host ints baked in at capture (launch configs are captured for max_model_len and only
  change speed); query_start_loc of a one-row-per-request batch is always arange(b + 1).
- Block-table columns past the batch's width keep stale ids, but no request's seq_len reaches
  them, so they are never read.
- The logits head runs eagerly on the rows that sample, so graphs hold no [b, vocab] buffers.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from enginespec.spec import Batch, BatchMeta

log = logging.getLogger(__name__)


def default_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_num_seqs (and max_num_seqs itself)."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs] + list(range(8, max_num_seqs + 1, 8))
    if not sizes or sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sorted(set(sizes))


class DecodeGraphs:
    """Captured forwards of one model over one set of KV pools, keyed by padded batch size."""

    def __init__(
        self,
        model,
        kv_caches: list[torch.Tensor],
        *,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        buckets: Optional[list[int]] = None,
        body=None,
    ):
        self.model = model
        self.body = body  # what runs the decoder (a compiled body, say); None = the model's own
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.buckets = buckets or default_buckets(max_num_seqs)
        size, device = self.buckets[-1], model.device
        width = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=device)  # [B]
        self.positions = torch.zeros(size, dtype=torch.int64, device=device)  # [B]
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=device)  # [B+1]
        self.seq_lens = torch.zeros(size, dtype=torch.int32, device=device)  # [B]
        self.block_table = torch.zeros(size, width, dtype=torch.int32, device=device)  # [B, W]
        self.slot_mapping = torch.full((size,), -1, dtype=torch.int64, device=device)  # [B]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.hidden: dict[int, torch.Tensor] = {}

    def bucket_for(self, num_rows: int) -> Optional[int]:
        """Smallest captured bucket holding num_rows rows, or None."""
        for b in self.buckets:
            if b >= num_rows:
                return b
        return None

    def _meta(self, b: int) -> BatchMeta:
        return BatchMeta(
            query_start_loc=self.query_start_loc[: b + 1],
            seq_lens=self.seq_lens[:b],
            block_table=self.block_table[:b],
            slot_mapping=self.slot_mapping[:b],
            block_size=self.block_size,
            query_start_loc_cpu=torch.arange(b + 1, dtype=torch.int32),
            seq_lens_cpu=torch.full((b,), self.max_model_len, dtype=torch.int32),
            max_query_len=1,
            max_seq_len=self.max_model_len,
        )

    def _run(self, b: int) -> torch.Tensor:
        return self.model.forward(
            self.input_ids[:b], self.positions[:b], self._meta(b), self.kv_caches, body=self.body
        )

    @torch.inference_mode()
    def capture(self) -> "DecodeGraphs":
        """Capture every bucket, largest first so the smaller ones reuse its memory pool. All
        rows are padding rows while capturing, so the pools' real blocks are never written."""
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.model.device)
        stream.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(stream):
            # Warm-up: Triton and torch.compile compile, cuBLAS picks algorithms. Every bucket
            # runs, because a compiled body may hold several graphs by row count (one for one
            # row; with skinny_gemm, one up to its fused rows) and none may compile mid-capture.
            for _ in range(2):
                for b in reversed(self.buckets):
                    self._run(b)
        torch.cuda.current_stream(self.model.device).wait_stream(stream)
        for b in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.hidden[b] = self._run(b)
            self.graphs[b] = graph
        torch.cuda.synchronize(self.model.device)
        return self

    def can_run(self, batch: Batch) -> bool:
        """A batch built with pad_to = a captured bucket, one row per request, no prompt logprobs."""
        rows = batch.meta.num_tokens
        return (
            rows in self.graphs
            and batch.meta.num_reqs == rows
            and batch.meta.max_query_len <= 1
            and not batch.prompt_logprob_rows
        )

    def forward(self, batch: Batch) -> torch.Tensor:
        """Replay the bucket's graph on the batch; returns hidden [b, hidden] (padding rows too)."""
        b = batch.meta.num_tokens
        meta = batch.meta
        self.input_ids[:b].copy_(batch.input_ids, non_blocking=True)
        self.positions[:b].copy_(batch.positions, non_blocking=True)
        self.seq_lens[:b].copy_(meta.seq_lens, non_blocking=True)
        self.slot_mapping[:b].copy_(meta.slot_mapping, non_blocking=True)
        width = meta.block_table.shape[1]
        self.block_table[:b, :width].copy_(meta.block_table, non_blocking=True)
        self.graphs[b].replay()
        return self.hidden[b]


def try_capture(model, kv_caches, **kwargs) -> Optional[DecodeGraphs]:
    """Capture decode graphs, or log why not and return None (the runner then stays eager:
    graphs are an optimisation, never a requirement)."""
    try:
        return DecodeGraphs(model, kv_caches, **kwargs).capture()
    except Exception as e:  # noqa: BLE001 - any capture failure means "run eagerly"
        log.warning("CUDA graph capture failed, running eagerly: %s", e)
        torch.cuda.synchronize()
        return None
