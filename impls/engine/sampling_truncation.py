"""min-p, top-k and top-p cuts, as one threshold per row in RAW logit space.

Temperature T > 0 does not change the order of a row, so a cut on softmax(x / T) is a cut
x >= thr on the raw (edited) logits; keeping thresholds in raw space lets the final draw compare
each logit with its row's threshold without recomputing x / T identically. Tokens tied with the
threshold stay (a cut can keep a few more than k tokens when logits tie; no tie-break by id).

Order (vLLM's): min-p on the full scaled distribution (p >= min_p * p_max, i.e.
x >= x_max + T * log(min_p)); then top-k; then top-p over the renormalised survivors: keep the
smallest prefix (by descending logit) whose mass reaches top_p, i.e. a token stays iff the mass
strictly before it is < top_p, so the token that crosses top_p is kept.

Top-p without a full sort: the `num_candidates` largest logits of a row (one `topk`) hold the
answer whenever the survivors of min-p / top-k all fit among them, or the candidates' mass
already reaches top_p of the row's total survivor mass (one extra pass over the row). Only rows
where neither holds (flat distributions with a loose top-p) fall back to sorting the full row.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .sampling_penalties import to_device

NEG_INF = float("-inf")
NUM_CANDIDATES = 512  # top-p candidates per row before the full-sort fallback


def _tensor(values, dtype, device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def _top_p_cut(ranked: torch.Tensor, total: torch.Tensor, inv_t: torch.Tensor, top_p: torch.Tensor):
    """(threshold, reached) from descending candidates `ranked` (cut tokens already -inf) and
    the survivors' total mass `total` (weights exp((x - x_max) / T), x_max = ranked[:, 0])."""
    weights = torch.exp((ranked - ranked[:, :1]) * inv_t)
    before = torch.cumsum(weights, dim=1) - weights
    keep = (before < top_p * total) & (ranked > NEG_INF)
    num_kept = keep.sum(dim=1, keepdim=True).clamp(min=1)
    reached = (before[:, -1:] + weights[:, -1:]) >= top_p * total
    return ranked.gather(1, num_kept - 1).squeeze(1), reached.squeeze(1)


def _top_p_full_sort(x: torch.Tensor, thr: torch.Tensor, inv_t: torch.Tensor, top_p: torch.Tensor):
    """The exact top-p threshold by sorting whole rows (the fallback)."""
    ranked = torch.sort(x, dim=1, descending=True).values
    ranked = ranked.masked_fill(ranked < thr, NEG_INF)
    total = torch.exp((ranked - ranked[:, :1]) * inv_t).sum(dim=1, keepdim=True)
    return _top_p_cut(ranked, total, inv_t, top_p)[0]


def cut_thresholds(x: torch.Tensor, temperature: Sequence[float], top_k: Sequence[int],
                   top_p: Sequence[float], min_p: Sequence[float]) -> torch.Tensor:
    """Raw-space threshold per row of x [R, V] (-inf = no cut). Every row is a random row
    (temperature > 0); top_k 0 = off (callers map k >= V to 0)."""
    dev, vocab = x.device, x.shape[1]
    inv_t, min_p_t, p, k = (v.unsqueeze(1) for v in to_device(
        [[1.0 / t for t in temperature], min_p, top_p, top_k], torch.float64, dev))
    inv_t, min_p_t, p, k = inv_t.float(), min_p_t.float(), p.float(), k.long()
    thr = torch.full((x.shape[0], 1), NEG_INF, device=dev)
    if any(m > 0.0 for m in min_p):
        thr = x.amax(dim=1, keepdim=True) + torch.log(min_p_t) / inv_t
    use_p = any(p < 1.0 for p in top_p)
    num_cand = min(vocab, max(max(top_k), NUM_CANDIDATES if use_p else 0))
    if num_cand == 0:
        return thr.squeeze(1)
    ranked = torch.topk(x, num_cand, dim=1).values
    kth = ranked.gather(1, (k - 1).clamp(min=0, max=num_cand - 1))
    thr = torch.maximum(thr, torch.where(k > 0, kth, torch.full_like(kth, NEG_INF)))
    if not use_p:
        return thr.squeeze(1)
    ranked = ranked.masked_fill(ranked < thr, NEG_INF)
    total = torch.exp((ranked - ranked[:, :1]) * inv_t).sum(dim=1, keepdim=True)
    # Rows whose survivors may lie beyond the candidates: no k <= num_cand to bound them.
    open_rows = [i for i, (pp, kk) in enumerate(zip(top_p, top_k))
                 if pp < 1.0 and not 0 < kk <= num_cand and num_cand < vocab]
    if open_rows:
        rows = _tensor(open_rows, torch.long, dev)
        total = total.index_copy(0, rows, _open_total(x[rows], ranked[rows], thr[rows], inv_t[rows]))
    p_thr, reached = _top_p_cut(ranked, total, inv_t, p)
    p_thr = torch.where(p.squeeze(1) < 1.0, p_thr, torch.full_like(p_thr, NEG_INF))
    base = thr.squeeze(1)  # the min-p / top-k cut, before top-p
    thr = torch.maximum(base, p_thr)
    if open_rows:
        missing = rows[~reached[rows]].tolist()  # a host sync, only when open rows exist
        if missing:  # rare: flat rows whose top_p mass lies beyond the candidates
            idx = _tensor(missing, torch.long, dev)
            full = _top_p_full_sort(x[idx], base[idx].unsqueeze(1), inv_t[idx], p[idx])
            thr[idx] = torch.maximum(base[idx], full)
    return thr


def _open_total(x, ranked, thr, inv_t) -> torch.Tensor:
    """Survivor mass of whole rows, unless the last candidate is already cut (then the
    candidates are all the survivors and their own mass is the total)."""
    cand_total = torch.exp((ranked - ranked[:, :1]) * inv_t).sum(dim=1, keepdim=True)
    row_total = torch.exp((x - ranked[:, :1]) * inv_t).masked_fill(x < thr, 0.0).sum(dim=1, keepdim=True)
    return torch.where(ranked[:, -1:] == NEG_INF, cand_total, row_total)
