"""CUDA graphs for decode and small mixed steps, applied at the call site (the model never knows).

A step runs the same kernels every time; only the data changes. Launching 28 layers' worth of
small kernels from Python costs more than the GPU needs to run them at small batch (about 12 ms
for any step outside a graph on the H200, against 2 ms for a replayed decode), so we capture
`FlatModel.forward` once per padded size (bucket) and replay it. Two kinds of bucket:

- Decode buckets (`buckets`, up to max_num_seqs rows): every scheduled request has one new
  token. The batch is built with `pad_to = bucket`; rows == requests; attention launches the
  requests longest first (the backend's decode order).
- Mixed buckets (`mixed_buckets`, token counts up to max_cudagraph_capture_size): any step
  whose requests carry more than one token (prefill chunks next to decodes, speculative
  verification rows) and whose tokens fit a bucket. The graph is captured with one request
  slot per token (no batch of n tokens has more than n requests); a replay fills the slots past
  the batch's requests as empty requests (query_start_loc = n: no rows), which the attention
  kernel's programs find by binary search and leave at once.

In both, padding rows are the contract's dummy rows (slot -1 writes to the scratch block,
seq_len 0 reads nothing); the runner copies the batch into the static input buffers the graph
was captured on, and replays. A decode bucket's input_ids, positions, slot_mapping,
query_start_loc and seq_lens sit in one byte buffer at spec.packed_offsets (each bucket its own
views of it), so a batch staged the same way (the fast builder's) loads them with one copy
(`packed_span`), and its block table with a second; other batches load them one by one. On the
H200 the five copies were 5.6 us of device time and five host calls at every step.

Invariants that keep graphs from changing outputs:
- The attention kernels read sequence lengths, tables and slots from device memory, never
  from host ints baked in at capture (launch configs are captured for max_model_len and only
  change speed); query_start_loc of a one-row-per-request batch is always arange(b + 1).
- Block-table columns past the batch's width, and rows past its requests, keep stale ids, but no
  request's seq_len reaches them, so they are never read.
- A mixed graph's attention launch config is fixed at capture (mixed_capture_query_len);
  configs change speed, never results. A decode replay's query_start_loc is the batch's,
  always arange(b + 1) (padding requests are one-row requests).
- The logits head: decode graphs of at most `logits_max_rows` rows also run the head over all
  their rows (one launch fewer on the host per step, where small steps are host-bound). Their
  [b, vocab] output is used only when every row is a real request that samples, rows
  0..num_reqs-1 in order (`decode_logits`); any other step, larger decode graphs and every
  mixed graph run the head eagerly on the rows that sample. Each graph's outputs stay
  allocated as long as the graph (they are read after each replay), so the bound keeps the
  logits buffers small: 31 rows for buckets 1-16 (9.4 MB at a 151,936 vocabulary in bf16),
  where all decode buckets up to 256 would hold 4,231 rows (1.3 GB).
- Balanced graphs (ENGINESPEC_BALANCED_GRAPHS, default 1; 0 turns them off): decode buckets
  of 8-64 rows are captured twice, once with the decode attention's splits balanced over the
  batch (kernels/decode_attention.py's balanced_launches) and once with none balanced
  (unbalanced_launches); a batch whose host-side lengths spread (`lengths_spread`) replays the
  balanced one, any other the plain one. Each has its own outputs (hidden rows and, up to
  logits_max_rows, the head's logits); both read the same static inputs; the choice changes
  speed, never results.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import Optional

import torch

from enginespec.spec import Batch, BatchMeta, packed_offsets
from enginespec.worker.switches import env_switch

log = logging.getLogger(__name__)


def _short_query_tokens() -> int:
    """512, or ENGINESPEC_MIXED_SHORT_QUERY_TOKENS (an int >= 0, for A/B runs)."""
    raw = os.environ.get("ENGINESPEC_MIXED_SHORT_QUERY_TOKENS", "512")
    if not raw.isdigit():
        raise ValueError(f"ENGINESPEC_MIXED_SHORT_QUERY_TOKENS must be an int >= 0, got {raw!r}")
    return int(raw)


# Mixed graphs of up to this many tokens read queries in blocks of 8: see mixed_capture_query_len.
SHORT_QUERY_TOKENS = _short_query_tokens()


def mixed_capture_query_len(num_tokens: int) -> int:
    """The max_query_len a mixed graph of num_tokens tokens is captured with. It only steers the
    attention launch config, frozen in the graph, and one config serves every request of the
    step: query blocks of 8 tokens (16 rows: what a decode graph uses) up to SHORT_QUERY_TOKENS,
    32 tokens above. A decode row in a 32-token block does 4x the attention work of its own
    block, and a small step is mostly decode rows (the serving case: a decode batch beside one
    chunk capped by long_prefill_token_threshold), while a prefill chunk of c tokens in 8-token
    blocks re-reads its keys c / 8 times (from L2: cheap for a few hundred tokens, not for
    2,048)."""
    return max(2, min(num_tokens, 8)) if num_tokens <= SHORT_QUERY_TOKENS else 32


def default_mixed_buckets(max_tokens: int) -> list[int]:
    """Token counts of mixed-step graphs: 8 to 64 by doubling, then 96, 128, 192, 256, every 128
    up to 1024 and every 256 up to max_tokens (and max_tokens itself when it falls between).
    Empty when max_tokens < 8 (off). Past 64 tokens a step pads by at most half of its size, and
    past 256 by at most an eighth to a third: a decode batch beside one prefill chunk (the
    serving case, chunks capped by long_prefill_token_threshold) lands close to a bucket."""
    if max_tokens < 8:
        return []
    sizes = [8, 16, 32, 64, 96, 128, 192, 256]
    sizes += list(range(384, 1025, 128)) + list(range(1280, max_tokens + 1, 256))
    sizes = [n for n in sizes if n <= max_tokens]
    if sizes[-1] != max_tokens:
        sizes.append(max_tokens)
    return sorted(set(sizes))


def default_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_num_seqs (and max_num_seqs itself)."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs] + list(range(8, max_num_seqs + 1, 8))
    if not sizes or sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sorted(set(sizes))


class DecodeGraphs:
    """Captured forwards of one model over one set of KV pools: decode graphs keyed by padded
    batch size, mixed-step graphs keyed by padded token count (module doc)."""

    def __init__(
        self,
        model,
        kv_caches: list[torch.Tensor],
        *,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        buckets: Optional[list[int]] = None,
        mixed_buckets: Optional[list[int]] = None,
        body=None,
        logits_max_rows: int = 0,
    ):
        if getattr(model, "rope_per_request", False):
            # its cos/sin come from a host loop over the step's requests (PerRequestRope): a
            # graph would replay the capture's requests, not the step's
            raise ValueError(
                "the model's rope scaling is computed request by request (dynamic or longrope): "
                "its steps run eagerly, without CUDA graphs"
            )
        self.model = model
        self.logits_max_rows = logits_max_rows
        self.body = body  # what runs the decoder (a compiled body, say); None = the model's own
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.buckets = buckets or default_buckets(max_num_seqs)
        self.mixed_buckets = list(mixed_buckets or [])
        size = max([self.buckets[-1], *self.mixed_buckets])
        device = model.device
        width = -(-max_model_len // block_size)
        # decode buckets: input_ids .. seq_lens packed at spec.packed_offsets (module doc);
        # mixed buckets: the separate buffers below
        self.packed = torch.zeros(
            max(packed_offsets(n, n)[5] for n in self.buckets), dtype=torch.uint8, device=device
        )
        self.packed_inputs = {n: _packed_views(self.packed, n) for n in self.buckets}
        self.input_ids, self.positions = static_token_inputs(size, device)  # [S], [S]
        self.mixed_query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=device)  # [S+1]
        self.seq_lens = torch.zeros(size, dtype=torch.int32, device=device)  # [S]
        self.block_table = torch.zeros(size, width, dtype=torch.int32, device=device)  # [S, W]
        self.slot_mapping = torch.full((size,), -1, dtype=torch.int64, device=device)  # [S]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.hidden: dict[int, torch.Tensor] = {}
        self.mixed_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.mixed_hidden: dict[int, torch.Tensor] = {}
        self.logits: dict[int, torch.Tensor] = {}  # decode bucket <= logits_max_rows -> [n, vocab]
        # decode buckets captured a second time with balanced decode attention (module doc)
        self.balanced_buckets = balanced_graph_buckets(self.buckets)
        self.balanced_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.balanced_hidden: dict[int, torch.Tensor] = {}
        self.balanced_logits: dict[int, torch.Tensor] = {}
        self._replayed_logits: Optional[torch.Tensor] = None  # the last decode replay's head output
        self.last_graph: Optional[torch.cuda.CUDAGraph] = None  # the last one replayed (benchmarks time it)

    def bucket_for(self, num_rows: int) -> Optional[int]:
        """Smallest captured decode bucket holding num_rows rows, or None."""
        return _smallest_at_least(self.buckets, num_rows)

    def mixed_bucket_for(self, num_tokens: int) -> Optional[int]:
        """Smallest mixed bucket holding num_tokens tokens, or None (the step runs eagerly)."""
        return _smallest_at_least(self.mixed_buckets, num_tokens)

    def _inputs(self, n: int, mixed: bool) -> tuple:
        """The static (input_ids, positions, slot_mapping, query_start_loc, seq_lens) of a graph
        of n rows: the bucket's packed views (decode) or the shared buffers' first rows (mixed)."""
        if not mixed:
            return self.packed_inputs[n]
        qsl = self.mixed_query_start_loc[: n + 1]
        return self.input_ids[:n], self.positions[:n], self.slot_mapping[:n], qsl, self.seq_lens[:n]

    def _pad(self, n: int, mixed: bool) -> None:
        """Every row of a decode bucket a padding row (seq_len 0, slot -1) before it runs to be
        captured: the buckets' packed views overlap, so each is reset before its own capture.
        Mixed buckets keep their buffers' construction state (all padding)."""
        if mixed:
            return
        ids, positions, slots, qsl, seq_lens = self.packed_inputs[n]
        ids.zero_()
        positions.zero_()
        slots.fill_(-1)
        seq_lens.zero_()
        qsl.copy_(torch.arange(n + 1, dtype=torch.int32, device=qsl.device))

    def _meta(self, n: int, mixed: bool) -> BatchMeta:
        """The static batch a graph of n rows is captured on: n requests of the static buffers;
        host ints are bounds that only steer launch configs."""
        _, _, slots, qsl, seq_lens = self._inputs(n, mixed)
        return BatchMeta(
            query_start_loc=qsl,
            seq_lens=seq_lens,
            block_table=self.block_table[:n],
            slot_mapping=slots,
            block_size=self.block_size,
            query_start_loc_cpu=torch.arange(n + 1, dtype=torch.int32),
            seq_lens_cpu=torch.full((n,), self.max_model_len, dtype=torch.int32),
            max_query_len=mixed_capture_query_len(n) if mixed else 1,
            max_seq_len=self.max_model_len,
        )

    def _run(self, n: int, mixed: bool = False) -> torch.Tensor:
        ids, positions = self._inputs(n, mixed)[:2]
        return self.model.forward(ids, positions, self._meta(n, mixed), self.kv_caches, body=self.body)

    def _shapes(self) -> list[tuple[int, bool]]:
        """Every (rows, mixed) graph, largest first so the smaller ones reuse its memory pool."""
        shapes = [(b, False) for b in self.buckets] + [(n, True) for n in self.mixed_buckets]
        return sorted(shapes, reverse=True)

    def _variants(self) -> list[tuple[int, bool, bool]]:
        """Every (rows, mixed, balanced) graph: _shapes', then the balanced decode buckets'."""
        return [(n, mixed, False) for n, mixed in self._shapes()] + [
            (n, False, True) for n in sorted(self.balanced_buckets, reverse=True)
        ]

    @torch.inference_mode()
    def capture(self) -> "DecodeGraphs":
        """Capture every bucket. All rows are padding rows while capturing (seq_len 0, slot -1),
        so the pools' real blocks are never written."""
        self.precompile()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.model.device)
        stream.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(stream):
            # Warm-up: Triton and torch.compile compile, cuBLAS picks algorithms. Every bucket
            # runs, because a compiled body may hold several graphs by row count (one for one
            # row; with skinny_gemm, one up to its fused rows) and none may compile mid-capture.
            for _ in range(2):
                for n, mixed, balanced in self._variants():
                    self._pad(n, mixed)
                    with self._launches(n, balanced):
                        hidden = self._run(n, mixed)
                    if self._with_head(n, mixed):  # cuBLAS picks the head's algorithm here
                        self.model.compute_logits(hidden)
        torch.cuda.current_stream(self.model.device).wait_stream(stream)
        for n, mixed, balanced in self._variants():
            graph = torch.cuda.CUDAGraph()
            self._pad(n, mixed)
            with torch.cuda.graph(graph, pool=pool), self._launches(n, balanced):
                hidden = self._run(n, mixed)
                if self._with_head(n, mixed):
                    (self.balanced_logits if balanced else self.logits)[n] = self.model.compute_logits(hidden)
            if balanced:
                self.balanced_hidden[n], self.balanced_graphs[n] = hidden, graph
                continue
            (self.mixed_hidden if mixed else self.hidden)[n] = hidden
            (self.mixed_graphs if mixed else self.graphs)[n] = graph
        torch.cuda.synchronize(self.model.device)
        return self

    def precompile(self) -> int:
        """Compile the Triton variants every bucket's forward meets side by side, before the
        warm-up runs meet them one after another (kernels/compile_pool.py): one forward a
        bucket over its padding rows with our kernels' launches compile-only, through the
        model's own body (a compiled body's graphs compile in the warm-up as before). What is
        not compiled here compiles when first launched; returns how many passes raised."""
        from enginespec.kernels.compile_pool import compile_only_launches, precompile

        def compile_pass(n: int, mixed: bool, balanced: bool) -> None:
            with compile_only_launches(), self._launches(n, balanced):
                self._pad(n, mixed)
                ids, positions = self._inputs(n, mixed)[:2]
                self.model.forward(ids, positions, self._meta(n, mixed), self.kv_caches)

        with torch.inference_mode():
            return precompile([functools.partial(compile_pass, *variant) for variant in self._variants()])

    def can_run(self, batch: Batch) -> bool:
        """A batch built with pad_to = a captured bucket and no prompt logprobs: one row per
        request for a decode bucket, any rows per request for a mixed one."""
        if batch.prompt_logprob_rows:
            return False
        graphs = self.mixed_graphs if _is_mixed(batch.meta) else self.graphs
        return batch.meta.num_tokens in graphs

    def forward(self, batch: Batch) -> torch.Tensor:
        """Replay the batch's graph; returns hidden [n, hidden] (padding rows too). Only a decode
        batch may take its bucket's balanced twin: a mixed batch's inputs go to the mixed
        buffers, which no decode graph reads (8, 16, 32 and 64 are buckets of both kinds)."""
        n, mixed = batch.meta.num_tokens, _is_mixed(batch.meta)
        self._load(batch, mixed)
        if not mixed and n in self.balanced_graphs and lengths_spread(batch.meta.seq_lens_cpu):
            self.last_graph = self.balanced_graphs[n]
            self.last_graph.replay()
            self._replayed_logits = self.balanced_logits.get(n)
            return self.balanced_hidden[n]
        self.last_graph = (self.mixed_graphs if mixed else self.graphs)[n]
        self.last_graph.replay()
        self._replayed_logits = None if mixed else self.logits.get(n)
        return (self.mixed_hidden if mixed else self.hidden)[n]

    def _launches(self, n: int, balanced: bool):
        """The context a graph variant runs its forward in: balanced decode launches for a
        balanced graph, none balanced for the plain graph of a bucket that has a balanced one
        (the default rule balances 8-16-row launches), else the default rule."""
        from enginespec.kernels.decode_attention import balanced_launches, unbalanced_launches

        if balanced:
            return balanced_launches()
        return unbalanced_launches() if n in self.balanced_buckets else contextlib.nullcontext()

    def _with_head(self, n: int, mixed: bool) -> bool:
        return not mixed and n <= self.logits_max_rows

    def decode_logits(self, batch: Batch) -> Optional[torch.Tensor]:
        """After forward(batch): the replayed head's logits of rows 0..num_reqs-1 [num_reqs, vocab]
        (a view), or None when this batch's graph ran no head (mixed, or over logits_max_rows). The
        caller asks only when every row is a real request that samples, in order."""
        if _is_mixed(batch.meta):
            return None
        logits = self._replayed_logits
        return None if logits is None else logits[: batch.num_reqs]

    def _load(self, batch: Batch, mixed: bool) -> None:
        """Copy the batch into the static buffers. A mixed batch of B requests marks request
        slots B..n-1 empty (query_start_loc n: no rows; the attention kernel leaves a request
        without rows before it reads its seq_len, so those slots keep stale lengths); a decode
        batch's query_start_loc is the constant arange."""
        n, meta = batch.meta.num_tokens, batch.meta
        num_reqs = meta.num_reqs
        width = meta.block_table.shape[1]
        self.block_table[:num_reqs, :width].copy_(meta.block_table, non_blocking=True)
        span = None if mixed else packed_span(batch)
        if span is not None:  # a decode batch packed as spec.packed_offsets says: one copy
            self.packed[: span.shape[0]].copy_(span, non_blocking=True)
            return
        ids, positions, slots, qsl, seq_lens = self._inputs(n, mixed)
        ids.copy_(batch.input_ids, non_blocking=True)
        positions.copy_(batch.positions, non_blocking=True)
        slots.copy_(meta.slot_mapping, non_blocking=True)
        seq_lens[:num_reqs].copy_(meta.seq_lens, non_blocking=True)
        qsl[: num_reqs + 1].copy_(meta.query_start_loc, non_blocking=True)
        if mixed:
            qsl[num_reqs + 1 : n + 1].fill_(n)


def _packed_views(buffer: torch.Tensor, n: int) -> tuple:
    """(input_ids, positions, slot_mapping, query_start_loc, seq_lens) of a decode bucket of n
    rows (n requests) as views of the packed byte buffer, at spec.packed_offsets(n, n)."""
    at = packed_offsets(n, n)
    kinds = ((torch.int64, n), (torch.int64, n), (torch.int64, n), (torch.int32, n + 1), (torch.int32, n))
    return tuple(
        buffer[start : start + count * dtype.itemsize].view(dtype) for start, (dtype, count) in zip(at, kinds)
    )


def packed_span(batch: Batch) -> Optional[torch.Tensor]:
    """The bytes from batch.input_ids to the end of its seq_lens as one uint8 view, when the
    five arrays sit at spec.packed_offsets in one allocation (the fast builder's staging
    copy); else None. ids and seq_lens in one storage put every byte between them in it."""
    meta, ids = batch.meta, batch.input_ids
    n, num_reqs = ids.shape[0], meta.seq_lens.shape[0]
    at = packed_offsets(n, num_reqs)
    parts = (batch.positions, meta.slot_mapping, meta.query_start_loc, meta.seq_lens)
    base = ids.data_ptr()
    if ids.dtype != torch.int64 or any(t.data_ptr() - base != off for t, off in zip(parts, at[1:])):
        return None
    if meta.seq_lens.untyped_storage().data_ptr() != ids.untyped_storage().data_ptr():
        return None
    return ids.view(torch.uint8).as_strided((at[5],), (1,))


def static_token_inputs(size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The graphs' input_ids and positions [size] int64, laid out as an eager step's staging
    copy lays them out (impls/fast/batch.py _Layout): input_ids at storage offset 0, positions
    at an offset of at least 2. dynamo guards on a tensor's storage offset (0 and 1 are
    specialised), so positions at offset 0 here would fail the guard of the graph the eager
    steps compiled and compile the decoder once more at capture (18.7 s of a cold H200 start)."""
    both = torch.zeros(2 * size + 2, dtype=torch.int64, device=device)
    return both[:size], both[size + 2 :]


BALANCED_GRAPHS_ENV = "ENGINESPEC_BALANCED_GRAPHS"
# The balanced graphs' buckets end where the one-launch decode attention does (FastAttention's
# fused_decode_max_rows); a batch's lengths spread when the longest is at least SPREAD times the
# mean (one context: 1.0, lost 5-13% balanced; contexts uniform in 100-2,048: about 1.9, gained
# 7-17%; benchmarks/RESULTS.md, twenty-eighth session). Through the engine's decode steps
# (twenty-ninth session): mixed contexts 6.5-17% faster at 24-64 rows, one context unchanged
# (plain graphs replayed), so it is on by default; the 1.5 threshold itself is not swept. At
# 8-16 rows the default rule balances every split launch (mixed contexts 5-10% faster, one
# context 1-2% slower on the H200, 4.4% at 8 rows on an H100: forty-fourth session), so there
# the plain graph is the one captured unbalanced.
BALANCED_GRAPHS_MAX_ROWS = 64
BALANCED_GRAPHS_SPREAD = 1.5


def balanced_graph_buckets(buckets: list[int]) -> list[int]:
    """The decode buckets captured twice, balanced and not, when ENGINESPEC_BALANCED_GRAPHS=1
    (the default; 0: none): those from BALANCED_MIN_ROWS (kernels/decode_attention.py; fewer
    rows lost balanced at every context) up to BALANCED_GRAPHS_MAX_ROWS. ValueError for a value
    other than 0 or 1."""
    from enginespec.kernels.decode_attention import BALANCED_MIN_ROWS

    if env_switch(BALANCED_GRAPHS_ENV) is False:
        return []
    return [b for b in buckets if BALANCED_MIN_ROWS <= b <= BALANCED_GRAPHS_MAX_ROWS]


def lengths_spread(seq_lens_cpu: torch.Tensor) -> bool:
    """Whether a decode batch's live rows (seq_len > 0) spread: the longest is at least
    BALANCED_GRAPHS_SPREAD times their mean (host ints: no device sync; over a Python list,
    1.2 us at 16 rows on the CPU box against 8.8 for the same in torch ops, at every 8-64-row
    decode step)."""
    live = [n for n in seq_lens_cpu.tolist() if n > 0]
    if len(live) < 2:
        return False
    return max(live) * len(live) >= BALANCED_GRAPHS_SPREAD * sum(live)


def _is_mixed(meta: BatchMeta) -> bool:
    """Whether a batch is for a mixed graph: not exactly one row per request."""
    return not (meta.num_reqs == meta.num_tokens and meta.max_query_len <= 1)


def _smallest_at_least(sizes: list[int], n: int) -> Optional[int]:
    for size in sizes:
        if size >= n:
            return size
    return None


def try_capture(model, kv_caches, **kwargs) -> Optional[DecodeGraphs]:
    """Capture decode graphs, or log why not and return None (the runner then stays eager:
    graphs are an optimisation, never a requirement)."""
    try:
        return DecodeGraphs(model, kv_caches, **kwargs).capture()
    except Exception as e:  # noqa: BLE001 - any capture failure means "run eagerly"
        log.warning("CUDA graph capture failed, running eagerly: %s", e)
        torch.cuda.synchronize()
        return None
