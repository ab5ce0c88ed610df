"""FastAttention: spec.AttentionBackend over the paged pool with Triton kernels on CUDA.

On CUDA, `write` is one KV-write launch (`write_qkv`: one launch that also norms and rotates
q|k from a layer's q|k|v rows) and `forward` one paged-attention launch (plus a merge
launch when split-KV pays) for the whole flat batch, prefill chunks and decodes together
(`attend_qkv` does both; for a decode-only batch in one launch, plus the merge); no
host sync, so both can be captured in a CUDA graph. A decode-only batch launches its requests
longest first: one device argsort of seq_lens per step (made at the step's first layer and
reused by the others; remade inside a CUDA-graph capture so replays sort their own lengths). Elsewhere (CPU), and for dtypes the kernel
does not take (float64), both run the plain-torch references that sit beside the kernels in
`kernels/` (never impls.reference: shared code would hide shared bugs from the differential
tests).
"""

from __future__ import annotations

from typing import Optional

import torch

from enginespec.kernels import reference
from enginespec.kernels.switches import env_switch
from enginespec.spec import BatchMeta

_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FUSED_DECODE_ENV = "ENGINESPEC_FUSED_DECODE"  # "0": decode batches take write_qkv + forward (A/B runs)


class FastAttention:
    """Paged attention backend; `use_triton` defaults to True exactly on CUDA devices."""

    name = "fast"
    # Decode batches of more rows take write_qkv + forward. The one launch was measured faster
    # at 1-64 rows (benchmarks/RESULTS.md, tenth and eleventh sessions); at 128 and 256 rows,
    # where the step reads mostly KV, the decode graph was 5-9% slower than the two launches
    # had measured before it, and the one launch was not measured there on its own.
    fused_decode_max_rows = 64
    # write_qkv and attend_qkv take row_source (a folded input norm): the merged decoder may fold
    # the layers' norms into their projections (MergedDecoder.fold_norms).
    folds_norms = True

    def __init__(self, device="cpu", use_triton: Optional[bool] = None) -> None:
        self.device = torch.device(device)
        self.use_triton = self.device.type == "cuda" if use_triton is None else use_triton
        # read once: every step (eager or a captured graph) of this backend takes the same route
        self.fuse_decode = env_switch(FUSED_DECODE_ENV) is not False
        self._order_for: tuple = (None, False)  # (the BatchMeta, capturing) the order belongs to
        self._order: Optional[torch.Tensor] = None

    def allocate(self, shape, dtype: torch.dtype, device) -> torch.Tensor:
        """Zeroed pool [2, *shape] for shape (num_blocks + 1, block_size, kv_heads, head_dim)."""
        if len(shape) != 4 or min(shape) < 1:
            raise ValueError(
                f"allocate: shape must be (num_blocks + 1, block_size, kv_heads, "
                f"head_dim) with every entry >= 1, got {tuple(shape)}"
            )
        return torch.zeros((2, *shape), dtype=dtype, device=device)

    def _triton_for(self, cache: torch.Tensor) -> bool:
        return self.use_triton and cache.dtype in _TRITON_DTYPES

    def write(self, cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: BatchMeta) -> None:
        """Store k, v [N, kv_heads, head_dim] at meta.slot_mapping (slot -1: scratch block)."""
        if k.shape != v.shape or k.shape[0] != meta.slot_mapping.shape[0]:
            raise ValueError(
                f"write: k {tuple(k.shape)}, v {tuple(v.shape)} and slot_mapping "
                f"{tuple(meta.slot_mapping.shape)} must agree on N rows"
            )
        if self._triton_for(cache):
            from enginespec.kernels.kv_write import write_kv

            write_kv(cache, k, v, meta.slot_mapping.to(torch.int64))
        else:
            reference.write_kv_ref(cache, k, v, meta.slot_mapping)

    def write_qkv(
        self,
        cache: torch.Tensor,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        norm_weight: Optional[torch.Tensor],
        eps: float,
        meta: BatchMeta,
        num_q_heads: int,
        row_source: Optional[torch.Tensor] = None,
        row_eps: float = 0.0,
    ) -> torch.Tensor:
        """A layer's q|k|v rows [N, (Hq + 2 Hkv) * D] -> q [N, Hq, D], normed per head (when
        norm_weight [Hq + Hkv, D] is given) and rotated with cos/sin [N, D]; k (normed and
        rotated alike) and v go into `cache` at meta.slot_mapping. One Triton launch on CUDA
        (kernels/qkv_rope.py) where write() + the compiler's norm and rotary took three.
        row_source [N, H]: a folded input norm's rows; every row is first scaled by its norm
        scale (kernels/row_scale.py)."""
        if qkv.shape[0] != meta.slot_mapping.shape[0]:
            raise ValueError(
                f"write_qkv: qkv has {qkv.shape[0]} rows but the batch has {meta.slot_mapping.shape[0]}"
            )
        if self._triton_for(cache):
            from enginespec.kernels import qkv_rope as kernel

            if kernel.supported(cache.shape[4]):
                slots = meta.slot_mapping.to(torch.int64)
                return kernel.qkv_rope(
                    qkv, cos, sin, norm_weight, eps, cache, slots, num_q_heads, row_source, row_eps
                )
        return reference.qkv_rope_ref(
            qkv, cos, sin, norm_weight, eps, cache, meta.slot_mapping, num_q_heads, row_source, row_eps
        )

    def attend_qkv(
        self,
        cache: torch.Tensor,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        norm_weight: Optional[torch.Tensor],
        eps: float,
        meta: BatchMeta,
        num_q_heads: int,
        scale: Optional[float] = None,
        window: int = 0,
        row_source: Optional[torch.Tensor] = None,
        row_eps: float = 0.0,
    ) -> torch.Tensor:
        """write_qkv then forward: a layer's q|k|v rows in, attention output [N, Hq, D] out.
        A decode-only batch on CUDA (one row per request) takes one launch for both
        (kernels/decode_attention.py: the new key comes from registers, the pool gives the
        rest); any other batch takes write_qkv's launch, then forward's."""
        if self._decode_fusable(cache, qkv, meta):
            from enginespec.kernels.decode_attention import decode_attention

            seq_lens = _i32(meta.seq_lens)
            return decode_attention(
                qkv,
                cos if cos.stride(1) == 1 else cos.contiguous(),
                sin if sin.stride(1) == 1 else sin.contiguous(),
                norm_weight,
                eps,
                cache,
                meta.slot_mapping.to(torch.int64),
                seq_lens,
                _i32(meta.block_table),
                num_q_heads,
                max_seq_len=meta.max_seq_len,
                scale=scale,
                window=window,
                order=self._launch_order(meta, seq_lens),
                row_source=row_source,
                row_eps=row_eps,
            )
        q = self.write_qkv(cache, qkv, cos, sin, norm_weight, eps, meta, num_q_heads, row_source, row_eps)
        return self.forward(q, cache, meta, scale=scale, window=window)

    def _decode_fusable(self, cache: torch.Tensor, qkv: torch.Tensor, meta: BatchMeta) -> bool:
        """Whether this step's attention takes the one-launch decode kernel: Triton on, a
        decode-only batch of one row per request and at most fused_decode_max_rows rows, and a
        head_dim the kernel takes."""
        if not (self.fuse_decode and self._triton_for(cache)):
            return False
        from enginespec.kernels import decode_attention

        return (
            meta.max_query_len == 1
            and qkv.shape[0] <= self.fused_decode_max_rows
            and qkv.shape[0] == meta.seq_lens.shape[0]
            and qkv.stride(1) == 1
            and meta.block_size == cache.shape[2]
            and decode_attention.supported(cache.shape[4])
        )

    def forward(
        self,
        q: torch.Tensor,
        cache: torch.Tensor,
        meta: BatchMeta,
        scale: Optional[float] = None,
        window: int = 0,
    ) -> torch.Tensor:
        """q [N, Hq, D] -> [N, Hq, D]; request r's t rows are the last t of its seq_len."""
        if meta.block_size != cache.shape[2]:
            raise ValueError(
                f"forward: meta.block_size {meta.block_size} != pool block_size {cache.shape[2]}"
            )
        if q.shape[0] != meta.slot_mapping.shape[0]:
            raise ValueError(
                f"forward: q has {q.shape[0]} rows but the batch has {meta.slot_mapping.shape[0]}"
            )
        if not self._triton_for(cache):
            return reference.paged_attention_ref(
                q,
                cache,
                meta.query_start_loc_cpu,
                meta.seq_lens_cpu,
                meta.block_table,
                scale=scale,
                window=window,
            )
        from enginespec.kernels.paged_attention import paged_attention

        q = q if q.stride(2) == 1 else q.contiguous()  # the kernel takes row and head strides
        seq_lens = _i32(meta.seq_lens)
        return paged_attention(
            q,
            cache,
            _i32(meta.query_start_loc),
            seq_lens,
            _i32(meta.block_table),
            max_query_len=meta.max_query_len,
            max_seq_len=meta.max_seq_len,
            scale=scale,
            window=window,
            order=self._launch_order(meta, seq_lens),
        )

    def _launch_order(self, meta: BatchMeta, seq_lens: torch.Tensor) -> Optional[torch.Tensor]:
        """Requests by decreasing seq_len (int32 [B]) for a decode-only batch of several requests,
        else None (at one request the argsort's five small launches were ~6 us of a 0.63 ms
        H200 step). Any permutation gives the same output, so a stale order could only cost speed."""
        if meta.max_query_len != 1 or seq_lens.shape[0] == 1:  # one request: nothing to order
            return None
        capturing = seq_lens.is_cuda and torch.cuda.is_current_stream_capturing()
        if self._order_for[0] is not meta or self._order_for[1] != capturing:
            self._order = torch.argsort(seq_lens, descending=True).to(torch.int32)
            self._order_for = (meta, capturing)
        return self._order


def _i32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 else t.to(torch.int32)
