"""min-p, top-k and top-p cuts on temperature-scaled logits, as one threshold per row.

Each cut turns into a logit threshold: tokens strictly below it become -inf, tokens tied with it
stay (so a cut can keep a few more than k tokens when logits tie; no tie-breaking by id).
Order (vLLM's): min-p on the full scaled distribution, then top-k, then top-p over the
renormalised top-k survivors. Rows that ask for no cut get a threshold of -inf.
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


def min_p_threshold(x: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """p >= min_p * p_max  <=>  x >= x_max + log(min_p); log(0) = -inf means no cut."""
    return x.amax(dim=1) + torch.log(min_p)


def top_k_threshold(x: torch.Tensor, top_k: torch.Tensor, k_max: int) -> torch.Tensor:
    """The k-th largest logit per row (top_k 0 = no cut) from one `topk(k_max)`."""
    values = torch.topk(x, k_max, dim=1).values
    kth = values.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return torch.where(top_k > 0, kth, torch.full_like(kth, NEG_INF))


def top_k_top_p_threshold(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Threshold of the smallest prefix (by descending logit) of the top-k survivors whose
    probability mass reaches top_p. A token is kept iff the mass strictly before it is < top_p,
    so the token that crosses top_p is kept. Needs a full sort of each row."""
    ranked = torch.sort(x, dim=1, descending=True).values
    vocab = x.shape[1]
    positions = torch.arange(vocab, device=x.device).unsqueeze(0)
    k_eff = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(1)
    ranked = ranked.masked_fill(positions >= k_eff, NEG_INF)
    probs = torch.softmax(ranked, dim=1)
    mass_before = torch.cumsum(probs, dim=1) - probs
    keep = (mass_before < top_p.unsqueeze(1)) & (ranked > NEG_INF)
    num_kept = keep.sum(dim=1).clamp(min=1)
    return ranked.gather(1, (num_kept - 1).unsqueeze(1)).squeeze(1)


def apply_truncation(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     min_p: torch.Tensor, *, k_max: int, use_p: bool, use_min_p: bool) -> torch.Tensor:
    """Mask x (scaled logits [R, V]) below each row's combined threshold; returns x.

    k_max is the largest top_k among the rows (0 when no row cuts by k); it is passed in from
    the host-side parameters so that no device sync is needed to size `topk`."""
    if use_min_p:
        thr = min_p_threshold(x, min_p)
        x = x.masked_fill(x < thr.unsqueeze(1), NEG_INF)
    if use_p:
        thr = top_k_top_p_threshold(x, top_k, top_p)
    elif k_max > 0:
        thr = top_k_threshold(x, top_k, k_max)
    else:
        return x
    return x.masked_fill(x < thr.unsqueeze(1), NEG_INF)
