"""The draw: one token per row from cut, tempered logits, by inverse-CDF sampling over chunks.

Row r keeps the tokens with x >= thr[r] and weights them w = exp2((x - m) * x_scale[r]),
x_scale = log2(e) / T, so w is proportional to softmax(x / T) on the kept tokens. The vocabulary
is split into chunks of CHUNK tokens (the last one shorter); m is the chunk's max logit (a
stable shift). With chunk masses a_j = sum of w over chunk j and c_j = a_j * exp2((m_j - M) *
x_scale) (M the row max) the draw is two steps, each with its own uniform from the row key
(`sampling_rng.draw_uniforms`): chunk j with probability c_j / sum(c), the first j whose
running sum of c exceeds u1 * sum(c); then token t of chunk j with probability w_t / a_j, the
first t whose running sum of w exceeds u2 * a_j. So P(t) = c_j / sum(c) * w_t / a_j, exactly
the cut softmax. If rounding leaves no running sum above its target, the last index of
positive mass is taken (probability ~1e-7, a bias of that order).

Greedy rows (noisy False) take torch.argmax's token (the first max). The same quantities are
computed by the Triton kernels (`sampling_triton`); sums run in a different order there, so the
two paths agree except when a uniform lands within float rounding (~1e-7 relative) of a boundary.
CHUNK is fixed, never derived from the batch, so a row's token does not depend on other rows.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from enginespec.sample.rng import draw_uniforms

CHUNK = 8192  # tokens per chunk (a multiple of sampling_triton.BLOCK)
NEG_INF = float("-inf")


def _first_true(mask: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Per row of bool [R, n], the first True column, else `fallback` [R]."""
    cols = torch.arange(mask.shape[1], device=mask.device)
    big = mask.shape[1]
    first = torch.where(mask, cols, big).amin(dim=1)
    return torch.where(first < big, first, fallback)


def _last_true(mask: torch.Tensor) -> torch.Tensor:
    """Per row of bool [R, n], the last True column, else 0."""
    cols = torch.arange(mask.shape[1], device=mask.device)
    return torch.where(mask, cols, 0).amax(dim=1)


def chunk_size(chunk: int, vocab: int) -> int:
    """The chunk a row of `vocab` tokens is split by: `chunk` (CHUNK when 0), or the whole row
    when it is shorter. A shorter row is one chunk either way, so the same tokens are drawn;
    padding the tests' 96-token vocabulary to 8192 columns made every CPU draw (and every
    rejection round of a top-p row) ~85x the work it is."""
    return min(chunk or CHUNK, vocab)


def chunk_weights(x: torch.Tensor, x_scale: torch.Tensor, thr: Optional[torch.Tensor], chunk: int):
    """(tops [R, C], weights [R, C, chunk']) for x [R, V], chunk' = chunk_size(chunk, V): each
    chunk's max logit and the kept tokens' weights exp2((x - chunk max) * x_scale) (0 where
    x < thr or past the vocabulary)."""
    rows, vocab = x.shape
    chunk = chunk_size(chunk, vocab)
    num_chunks = -(-vocab // chunk)
    xs = torch.nn.functional.pad(x, (0, num_chunks * chunk - vocab), value=NEG_INF)
    xs = xs.view(rows, num_chunks, chunk)
    tops = xs.amax(dim=2)
    shift = torch.where(tops > NEG_INF, tops, torch.zeros_like(tops))
    weights = torch.exp2((xs - shift.unsqueeze(2)) * x_scale.view(-1, 1, 1))
    if thr is not None:
        weights = weights.masked_fill(xs < thr.view(-1, 1, 1), 0.0)
    return tops, weights


def pick_tokens(tops, weights, x_scale, uniforms, chunk: int) -> torch.Tensor:
    """Token per row from chunk_weights' output and uniforms [R, 2] (see the module docstring)."""
    masses = weights.sum(dim=2)
    row_max = tops.amax(dim=1, keepdim=True)
    shift = torch.where(row_max > NEG_INF, row_max, torch.zeros_like(row_max))
    part = masses * torch.exp2((tops - shift) * x_scale.view(-1, 1))
    prefix = torch.cumsum(part, dim=1)
    hit = (prefix > uniforms[:, :1] * prefix[:, -1:]) & (part > 0)
    chosen = _first_true(hit, _last_true(part > 0))
    rows = torch.arange(weights.shape[0], device=weights.device)
    w = weights[rows, chosen]
    target = uniforms[:, 1:] * masses[rows, chosen].unsqueeze(1)
    inner = _first_true((torch.cumsum(w, dim=1) > target) & (w > 0), _last_true(w > 0))
    return chosen * chunk + inner


def draw_torch(
    x: torch.Tensor,
    x_scale: torch.Tensor,
    thr: Optional[torch.Tensor],
    keys: Sequence[int],
    noisy: Sequence[bool],
    chunk: int = 0,
) -> torch.Tensor:
    """Plain-torch draw (CPU, and the oracle of the Triton kernels). x [S, V] float32;
    x_scale [S] (> 0); thr [S] or None (no cut); keys: S non-negative ints (ignored on greedy
    rows); noisy: S bools. Returns int64 [S]."""
    chunk = chunk_size(chunk, x.shape[1])
    tokens = x.argmax(dim=1)
    rows = [i for i, n in enumerate(noisy) if n]
    if not rows:
        return tokens
    index = torch.tensor(rows, dtype=torch.long, device=x.device)
    every = len(rows) == x.shape[0]
    sub = x if every else x.index_select(0, index)
    scale = x_scale if every else x_scale.index_select(0, index)
    cut = None if thr is None else (thr if every else thr.index_select(0, index))
    tops, weights = chunk_weights(sub, scale, cut, chunk)
    picked = pick_tokens(tops, weights, scale, draw_uniforms([keys[i] for i in rows], x.device), chunk)
    return picked if every else tokens.index_copy(0, index, picked)
