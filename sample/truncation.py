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

from typing import Optional, Sequence

import torch

from enginespec.kernels import top_p as top_p_kernel
from enginespec.sample.penalties import to_device

NEG_INF = float("-inf")
NUM_CANDIDATES = 512  # top-p candidates per row before the full-sort fallback
# The least top_p the cuts and draws read: float32's smallest normal number. Every path reads
# top_p as float32, where a valid top_p below ~7e-46 rounds to 0 (and a GPU may flush a
# subnormal one to 0), and a top_p of 0 keeps nothing: even the top token's mass before it (0)
# is not below it, so a rejection draw (sample/reject.py) never accepts. Any top_p up to this
# one keeps the top tie group alone (every other token has the top token's mass, >= 1 / V of
# the total, before it), so the floor changes no cut.
MIN_TOP_P = 1.1754943508222875e-38


def effective_top_p(top_p: float) -> float:
    """top_p as the cuts and draws read it: at least MIN_TOP_P (see there)."""
    return max(top_p, MIN_TOP_P)


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


class CutPlan:
    """The cut rows' parameters, built once per batch of params (kept by the Sampler's BatchPlan):
    device columns inv_t, min_p, top_p ([R, 1] float32) and top_k ([R, 1] int64), the number of
    top-p candidates, and the rows whose nucleus may lie beyond the candidates ("open" rows).
    Every row is a random row (temperature > 0); top_k 0 = off (k >= V, and vLLM's other "off",
    -1, are mapped to 0: a negative k left as it was asked for no candidates, so top-p was
    dropped)."""

    def __init__(
        self,
        temperature: Sequence[float],
        top_k: Sequence[int],
        top_p: Sequence[float],
        min_p: Sequence[float],
        vocab: int,
        device,
    ):
        top_k = [k if 0 < k < vocab else 0 for k in top_k]
        top_p = [effective_top_p(p) for p in top_p]
        self.inv_t, self.min_p, self.top_p, self.top_k = (
            v.unsqueeze(1)
            for v in to_device([[1.0 / t for t in temperature], min_p, top_p, top_k], torch.float64, device)
        )
        self.inv_t, self.min_p, self.top_p = self.inv_t.float(), self.min_p.float(), self.top_p.float()
        self.top_k = self.top_k.long()
        self.any_min_p = any(m > 0.0 for m in min_p)
        self.use_p = any(p < 1.0 for p in top_p)
        # Candidates: the largest k asked for, and NUM_CANDIDATES when a top-p row has no top-k
        # (a top-p row with a top-k finds its nucleus among its k survivors).
        loose_p = any(p < 1.0 and k == 0 for p, k in zip(top_p, top_k))
        self.num_cand = min(vocab, max(max(top_k), NUM_CANDIDATES if loose_p else 0))
        self.open_rows = [
            i
            for i, (pp, kk) in enumerate(zip(top_p, top_k))
            if pp < 1.0 and not 0 < kk <= self.num_cand and self.num_cand < vocab
        ]
        self.open_index = _tensor(self.open_rows, torch.long, device) if self.open_rows else None


def cut_thresholds(x: torch.Tensor, plan: CutPlan) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(thr, unsure) for x [R, V]: the raw-space threshold per row (-inf = no cut), and for the
    open rows a bool [len(plan.open_rows)] device tensor, True where the top-p mass was not
    reached within the candidates, so thr may be too high there: the caller must then replace
    those rows by `full_sort_thresholds` (read after the draw, so no sync mid-pipeline). unsure
    is None when the plan has no open rows."""
    dev = x.device
    thr = torch.full((x.shape[0], 1), NEG_INF, device=dev)
    if plan.any_min_p:
        thr = x.amax(dim=1, keepdim=True) + torch.log(plan.min_p) / plan.inv_t
    if plan.num_cand == 0:
        return thr.squeeze(1), None
    ranked = torch.topk(x, plan.num_cand, dim=1).values
    k = plan.top_k
    kth = ranked.gather(1, (k - 1).clamp(min=0, max=plan.num_cand - 1))
    thr = torch.maximum(thr, torch.where(k > 0, kth, torch.full_like(kth, NEG_INF)))
    if not plan.use_p:
        return thr.squeeze(1), None
    ranked = ranked.masked_fill(ranked < thr, NEG_INF)
    total = torch.exp((ranked - ranked[:, :1]) * plan.inv_t).sum(dim=1, keepdim=True)
    rows = plan.open_index
    if rows is not None:
        total = total.index_copy(0, rows, _open_total(x[rows], ranked[rows], thr[rows], plan.inv_t[rows]))
    p_thr, reached = _top_p_cut(ranked, total, plan.inv_t, plan.top_p)
    p_thr = torch.where(plan.top_p.squeeze(1) < 1.0, p_thr, torch.full_like(p_thr, NEG_INF))
    out = torch.maximum(thr.squeeze(1), p_thr)
    return out, (None if rows is None else ~reached[rows])


def exact_thresholds(x: torch.Tensor, plan: CutPlan) -> torch.Tensor:
    """`cut_thresholds` with its unsure rows settled on the device, no host sync. On CUDA one
    launch (`kernels.top_p`) bisects the exact cut of the unsure rows and leaves the others at
    once; elsewhere the open rows are sorted whether or not they turn out unsure
    (`torch.where` picks). Same cuts as cut_thresholds followed by full_sort_thresholds on
    the unsure rows (the serial path); the kernel's sums may round a near-boundary token
    differently (see kernels.top_p)."""
    thr, unsure = cut_thresholds(x, plan)
    if unsure is None:
        return thr
    rows = plan.open_index
    inv_t, top_p = plan.inv_t[rows], plan.top_p[rows]
    if top_p_kernel.available(x.device) and x.stride(1) == 1:
        base_off = (torch.log(plan.min_p[rows]) / inv_t).squeeze(1)
        fixed = top_p_kernel.top_p_bisect(
            x, rows, unsure, base_off, inv_t.squeeze(1), top_p.squeeze(1), thr.index_select(0, rows)
        )
        return thr.index_copy(0, rows, fixed)
    sub = x.index_select(0, rows)
    base = _base_thresholds(sub, plan, rows)
    exact = torch.maximum(base, _top_p_full_sort(sub, base.unsqueeze(1), inv_t, top_p))
    return thr.index_copy(0, rows, torch.where(unsure, exact, thr.index_select(0, rows)))


def full_sort_thresholds(
    x: torch.Tensor, thr: torch.Tensor, plan: CutPlan, rows: Sequence[int]
) -> torch.Tensor:
    """thr with `rows` (indices into x's rows) recomputed exactly by sorting them whole (the
    rare fallback: flat rows whose top_p mass lies beyond the candidates)."""
    dev = x.device
    idx = _tensor(list(rows), torch.long, dev)
    base = _base_thresholds(x[idx], plan, idx)
    full = _top_p_full_sort(x[idx], base.unsqueeze(1), plan.inv_t[idx], plan.top_p[idx])
    return thr.index_copy(0, idx, torch.maximum(base, full))


def _base_thresholds(x: torch.Tensor, plan: CutPlan, idx: torch.Tensor) -> torch.Tensor:
    """The cut before top-p of open rows idx (x = those rows): only min-p, since an open row
    has no top-k (num_cand >= every k, so a row with 0 < k is never open)."""
    if not plan.any_min_p:
        return torch.full((x.shape[0],), NEG_INF, device=x.device)
    return x.amax(dim=1) + (torch.log(plan.min_p[idx]) / plan.inv_t[idx]).squeeze(1)


def _open_total(x, ranked, thr, inv_t) -> torch.Tensor:
    """Survivor mass of whole rows, unless the last candidate is already cut (then the
    candidates are all the survivors and their own mass is the total)."""
    cand_total = torch.exp((ranked - ranked[:, :1]) * inv_t).sum(dim=1, keepdim=True)
    row_total = torch.exp((x - ranked[:, :1]) * inv_t).masked_fill(x < thr, 0.0).sum(dim=1, keepdim=True)
    return torch.where(ranked[:, -1:] == NEG_INF, cand_total, row_total)
