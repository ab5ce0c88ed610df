"""Plain-torch references for every kernel in this package.

Each function computes, slowly and obviously, what its Triton twin computes. The kernel tests
compare against these, and `impls.fast` runs them on machines without a GPU. They take raw
tensors (no spec types): `kernels` imports nothing of ours.

Arithmetic happens in float32 (float64 stays float64); results come back in the input dtype.
"""

from __future__ import annotations

from typing import Optional

import torch


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def scratch_slot(cache: torch.Tensor) -> int:
    """Slot that rows with slot -1 write to: the first slot of the last (scratch) block.

    cache: [2, num_blocks + 1, block_size, kv_heads, head_dim].
    """
    return (cache.shape[1] - 1) * cache.shape[2]


def write_kv_ref(cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store k, v [N, kv_heads, head_dim] into cache at slot_mapping [N] (in place).

    Slot s lives at block s // block_size, offset s % block_size; slot -1 (padding rows)
    goes to the scratch block, which nothing reads.
    """
    block_size = cache.shape[2]
    slots = slot_mapping.to(torch.int64)
    slots = torch.where(slots < 0, torch.full_like(slots, scratch_slot(cache)), slots)
    flat = cache.view(2, -1, cache.shape[3], cache.shape[4])
    assert flat.shape[1] == cache.shape[1] * block_size
    flat[0, slots] = k.to(cache.dtype)
    flat[1, slots] = v.to(cache.dtype)


def gather_context(cache: torch.Tensor, table_row: torch.Tensor, seq_len: int):
    """K, V [seq_len, kv_heads, head_dim] of one request, read through its block table row."""
    block_size = cache.shape[2]
    positions = torch.arange(seq_len, device=cache.device)
    blocks = table_row.to(torch.int64)[positions // block_size]
    offsets = positions % block_size
    return cache[0, blocks, offsets], cache[1, blocks, offsets]


# Most score elements paged_attention_ref holds at once (64 MiB of float32; the mask and the
# softmax each add one more piece): a prefill chunk is attended a few rows at a time, so a
# chunk of 8192 rows over a 100k context no longer builds [Hq, 8192, 100k] scores (13 GB).
SCORE_BUDGET = 1 << 24


def query_pieces(num_rows: int, num_q_heads: int, seq_len: int, budget: int) -> list[tuple[int, int]]:
    """[lo, hi) row ranges covering 0..num_rows-1 in order, each of the most rows whose scores
    [Hq, rows, seq_len] fit `budget` elements, and never fewer than one row (a single row's
    scores are O(context): that much any attention over the whole context needs)."""
    per_piece = max(1, budget // max(1, num_q_heads * seq_len))
    return [(lo, min(lo + per_piece, num_rows)) for lo in range(0, num_rows, per_piece)]


def _attend_rows(rows, k, v, first_pos: int, scale: float, window: int) -> torch.Tensor:
    """Dense masked softmax of rows [t, Hkv, G, D] at positions first_pos.. over the keys
    k, v [S, Hkv, D] they may see: only keys up to the last row's position (and, with a
    window, from the first row's window start) are read; masked keys weigh exactly 0."""
    num_rows = rows.shape[0]
    key_lo = max(0, first_pos - window + 1) if window > 0 else 0
    key_hi = first_pos + num_rows
    k, v = k[key_lo:key_hi], v[key_lo:key_hi]
    scores = torch.einsum("tkgd,skd->kgts", rows, k) * scale
    q_pos = torch.arange(first_pos, key_hi, device=rows.device)[:, None]
    k_pos = torch.arange(key_lo, key_hi, device=rows.device)[None, :]
    visible = k_pos <= q_pos
    if window > 0:
        visible &= k_pos > q_pos - window
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("kgts,skd->tkgd", scores.softmax(dim=-1), v)


def paged_attention_ref(
    q: torch.Tensor,
    cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: Optional[float] = None,
    window: int = 0,
) -> torch.Tensor:
    """Causal attention of a flat ragged batch over the paged pool.

    q [N, Hq, D]; cache [2, num_blocks + 1, block_size, Hkv, D]; query_start_loc [B + 1];
    seq_lens [B]; block_table [B, max_blocks]. Request r's t rows are the last t positions of
    its seq_len context; row at position p sees keys k <= p (and k > p - window if window > 0).
    Query head h reads kv head h // (Hq // Hkv). Rows of requests with seq_len 0 are zeros.

    Memory: rows go through in query_pieces of SCORE_BUDGET score elements, and K/V are
    read once per request at [seq_len, Hkv, D] (never repeated per query head), so the peak
    is O(budget + context), not O(chunk x context x heads).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = cache.shape[3]
    group = num_q_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    dtype = _compute_dtype(q.dtype)
    out = torch.zeros(num_tokens, num_q_heads, head_dim, dtype=dtype, device=q.device)
    starts = query_start_loc.tolist()
    for r, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = starts[r], starts[r + 1]
        if seq_len == 0 or hi == lo:
            continue
        k, v = gather_context(cache, block_table[r], seq_len)
        k, v = k.to(dtype), v.to(dtype)  # [S, Hkv, D]; query head h reads kv head h // group
        first_pos = seq_len - (hi - lo)
        for a, b in query_pieces(hi - lo, num_q_heads, seq_len, SCORE_BUDGET):
            rows = q[lo + a : lo + b].to(dtype).reshape(b - a, num_kv_heads, group, head_dim)
            part = _attend_rows(rows, k, v, first_pos + a, scale, window)
            out[lo + a : lo + b] = part.reshape(b - a, num_q_heads, head_dim)
    return out.to(q.dtype)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None):
    """RMSNorm over the last dim, optionally after adding a residual.

    Rounding follows the transformers modules: the sum x + residual is rounded to x's dtype
    (it becomes the next residual), the norm is computed in float32 and rounded to x's dtype
    before the weight multiplies it. Returns out, or (out, new_residual) when residual is given.
    """
    if residual is not None:
        x = x + residual
    dtype = _compute_dtype(x.dtype)
    h = x.to(dtype)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = (weight * h.to(x.dtype)).to(x.dtype)
    return out if residual is None else (out, x)


def rotary_cos_sin(inv_freq: torch.Tensor, max_position: int):
    """cos, sin float32 [max_position, rot_dim // 2] for positions 0..max_position-1."""
    positions = torch.arange(max_position, dtype=torch.float32, device=inv_freq.device)
    freqs = positions[:, None] * inv_freq.to(torch.float32)[None, :]
    return freqs.cos(), freqs.sin()


def rope_inv_freq(rot_dim: int, base: float, device=None) -> torch.Tensor:
    """The default (unscaled) rotary inverse frequencies base ** (-2i / rot_dim)."""
    exponents = torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim
    return 1.0 / (base**exponents)


def rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
):
    """Neox-style rotary embedding of q [N, Hq, D] and k [N, Hk, D]; returns new (q, k).

    The first rot_dim = 2 * cos.shape[1] dims rotate as two halves (x1, x2) ->
    (x1 cos - x2 sin, x2 cos + x1 sin) at each row's position; the rest pass through.
    """
    half = cos.shape[1]
    c = cos[positions.to(torch.int64)][:, None, :]
    s = sin[positions.to(torch.int64)][:, None, :]

    def rotate(x):
        dtype = _compute_dtype(x.dtype)
        x1 = x[..., :half].to(dtype)
        x2 = x[..., half : 2 * half].to(dtype)
        rotated = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
        return torch.cat([rotated, x[..., 2 * half :]], dim=-1)

    return rotate(q), rotate(k)


def scale_rows_ref(x: torch.Tensor, row_source: torch.Tensor, row_eps: float) -> torch.Tensor:
    """x [N, C] times each row's folded-RMSNorm scale r = 1 / sqrt(mean(row_source^2) + row_eps)
    (row_source [N, H], statistics in float32), rounded to x's dtype (kernels/row_scale.py)."""
    ct = _compute_dtype(row_source.dtype)
    h = row_source.to(ct)
    r = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + row_eps)
    return (x.to(ct) * r).to(x.dtype)


def qkv_rope_ref(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm_weight: Optional[torch.Tensor],
    eps: float,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_q_heads: int,
    row_source: Optional[torch.Tensor] = None,
    row_eps: float = 0.0,
) -> torch.Tensor:
    """qkv [N, (Hq + 2 Hkv) * D] -> q [N, Hq, D]; k and v go into cache at slot_mapping.

    With row_source [N, H] (a folded input norm), every row is first scale_rows_ref'd.

    q and k heads: RMSNorm per head when norm_weight [Hq + Hkv, D] is given (statistics in
    float32, the normed value rounded to qkv's dtype, then times the weight: the transformers
    modules' order), then the neox rotary x * cos + rotate_half(x) * sin with cos/sin [N, D]
    of each row, in float32; q comes back and k is stored rounded once. v is stored as is.
    """
    num_kv_heads, head_dim = cache.shape[3], cache.shape[4]
    n, num_qk = qkv.shape[0], num_q_heads + num_kv_heads
    ct = _compute_dtype(qkv.dtype)
    if row_source is not None:
        qkv = scale_rows_ref(qkv, row_source, row_eps)
    qk = qkv[:, : num_qk * head_dim].reshape(n, num_qk, head_dim)
    v = qkv[:, num_qk * head_dim :].reshape(n, num_kv_heads, head_dim)
    x = qk.to(ct)
    if norm_weight is not None:
        normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(qkv.dtype)
        x = norm_weight.to(ct) * normed.to(ct)
    half = head_dim // 2
    c, s = cos.to(ct)[:, None], sin.to(ct)[:, None]
    x = x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s
    write_kv_ref(cache, x[:, num_q_heads:], v, slot_mapping)
    return x[:, :num_q_heads].to(qkv.dtype).contiguous()


def decode_attention_ref(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm_weight: Optional[torch.Tensor],
    eps: float,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_q_heads: int,
    scale: Optional[float] = None,
    window: int = 0,
    row_source: Optional[torch.Tensor] = None,
    row_eps: float = 0.0,
) -> torch.Tensor:
    """kernels.decode_attention's semantics: a decode batch's q|k|v rows [B, (Hq + 2 Hkv) * D]
    (row r is request r's new token, counted in seq_lens[r]) through qkv_rope_ref (k and v
    written at slot_mapping), then paged_attention_ref with every query length 1 -> [B, Hq, D]."""
    q = qkv_rope_ref(qkv, cos, sin, norm_weight, eps, cache, slot_mapping, num_q_heads, row_source, row_eps)
    query_start_loc = torch.arange(qkv.shape[0] + 1, dtype=torch.int32, device=qkv.device)
    return paged_attention_ref(q, cache, query_start_loc, seq_lens, block_table, scale=scale, window=window)


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T (+ bias [N]) -> [M, N] in x's dtype: products and sums in
    float32 (float64 for float64), the bias added before the one rounding (skinny_gemm's order)."""
    ct = _compute_dtype(x.dtype)
    out = x.to(ct) @ weight.to(ct).T
    if bias is not None:
        out = out + bias.to(ct)
    return out.to(x.dtype)


def row_scaled_linear_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T times each row's folded-RMSNorm scale 1 / sqrt(mean(x_row^2) +
    eps) -> [M, N] in x's dtype: products, sums and the scale in float32 (float64 for float64),
    rounded once (skinny_gemm's row_scale). Equals linear_ref(rms_norm_ref(x, g, eps), W) for a
    weight with g folded in, up to where the roundings fall."""
    ct = _compute_dtype(x.dtype)
    xs = x.to(ct)
    r = torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps)
    return ((xs @ weight.to(ct).T) * r).to(x.dtype)


def silu_mul_ref(
    gate_up: torch.Tensor, row_source: Optional[torch.Tensor] = None, row_eps: float = 0.0
) -> torch.Tensor:
    """gate_up [M, 2 I] (gate columns, then up) -> silu(gate) * up [M, I] in gate_up's dtype,
    computed in float32 and rounded once (as the compiled decoder's fused elementwise kernel).
    With row_source [M, H] (a folded post-attention norm), gate_up is scale_rows_ref'd first."""
    if row_source is not None:
        gate_up = scale_rows_ref(gate_up, row_source, row_eps)
    ct = _compute_dtype(gate_up.dtype)
    gate, up = gate_up.to(ct).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)


def gather_two_ref(
    index_a: torch.Tensor, table_a: torch.Tensor, index_b: torch.Tensor, table_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(table_a[index_a], table_b[index_b]): rows of two tables by two [R] index vectors."""
    return torch.index_select(table_a, 0, index_a), torch.index_select(table_b, 0, index_b)
