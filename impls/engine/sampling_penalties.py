"""Logit edits that depend on a request's history or its explicit token lists.

Applied to the raw float32 logits before temperature, in this order (vLLM's):
allowed_token_ids -> min_tokens -> logit_bias -> repetition / frequency / presence penalties.
Every function edits the rows it is given in place and is a no-op for rows that ask for nothing.
Row work is vectorised: per-row Python only builds small index tensors once per call.
"""
from __future__ import annotations

from typing import Sequence

import torch

NEG_INF = float("-inf")


def apply_allowed_tokens(logits: torch.Tensor, requests: Sequence) -> None:
    """Rows with `allowed_token_ids` keep only those tokens (others become -inf)."""
    rows, cols = [], []
    for i, r in enumerate(requests):
        allowed = r.params.allowed_token_ids
        if allowed is not None:
            rows.extend([i] * len(allowed))
            cols.extend(allowed)
    if not rows:
        return
    dev = logits.device
    keep = torch.ones((logits.shape[0], logits.shape[1]), dtype=torch.bool, device=dev)
    keep[torch.tensor(sorted(set(rows)), dtype=torch.long, device=dev)] = False
    keep[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)] = True
    logits.masked_fill_(~keep, NEG_INF)


def stop_ids_to_mask(request) -> list[int]:
    """Token ids that would stop `request`: its stop_token_ids, plus EOS unless ignore_eos."""
    ids = list(request.params.stop_token_ids)
    if request.eos_token_id is not None and not request.params.ignore_eos:
        ids.append(request.eos_token_id)
    return ids


def apply_min_tokens(logits: torch.Tensor, requests: Sequence) -> None:
    """While num_output_tokens < min_tokens, stop tokens (and EOS unless ignore_eos) are -inf."""
    rows, cols = [], []
    vocab = logits.shape[1]
    for i, r in enumerate(requests):
        if r.num_output_tokens < r.params.min_tokens:
            ids = [t for t in stop_ids_to_mask(r) if t < vocab]
            rows.extend([i] * len(ids))
            cols.extend(ids)
    if rows:
        dev = logits.device
        logits[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)] = NEG_INF


def apply_logit_bias(logits: torch.Tensor, requests: Sequence) -> None:
    """Add each row's `logit_bias[token]` to that token's logit."""
    rows, cols, vals = [], [], []
    for i, r in enumerate(requests):
        bias = r.params.logit_bias
        if bias:
            for tok, val in bias.items():
                rows.append(i)
                cols.append(tok)
                vals.append(float(val))
    if rows:
        dev = logits.device
        index = (torch.tensor(rows, device=dev), torch.tensor(cols, device=dev))
        logits.index_put_(index, torch.tensor(vals, dtype=logits.dtype, device=dev), accumulate=True)


def _needs_penalty(params) -> bool:
    return (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0)


def _counts(id_lists: list[Sequence[int]], vocab: int, device) -> torch.Tensor:
    """[R, vocab] int32 occurrence counts of each row's ids, by one scatter_add.

    Rows are padded with the id `vocab`, counted in a spare column that is then dropped.
    """
    width = max((len(ids) for ids in id_lists), default=0)
    padded = torch.full((len(id_lists), max(width, 1)), vocab, dtype=torch.long)
    for r, ids in enumerate(id_lists):
        if ids:
            padded[r, :len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
    padded = padded.to(device)
    counts = torch.zeros((len(id_lists), vocab + 1), dtype=torch.int32, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.int32))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, requests: Sequence) -> None:
    """vLLM semantics. Repetition (prompt + output tokens): positive logits are divided by the
    penalty, negative ones multiplied. Frequency (output count) and presence (output seen) are
    subtracted: logit -= frequency * count + presence * (count > 0)."""
    rows = [i for i, r in enumerate(requests) if _needs_penalty(r.params)]
    if not rows:
        return
    dev, vocab = logits.device, logits.shape[1]
    reqs = [requests[i] for i in rows]
    out_counts = _counts([r.output_token_ids for r in reqs], vocab, dev)
    prompt_seen = _counts([r.prompt_token_ids for r in reqs], vocab, dev) > 0
    out_seen = out_counts > 0
    rep = torch.tensor([r.params.repetition_penalty for r in reqs], dtype=logits.dtype, device=dev)[:, None]
    freq = torch.tensor([r.params.frequency_penalty for r in reqs], dtype=logits.dtype, device=dev)[:, None]
    pres = torch.tensor([r.params.presence_penalty for r in reqs], dtype=logits.dtype, device=dev)[:, None]
    index = torch.tensor(rows, dtype=torch.long, device=dev)
    sub = logits.index_select(0, index)
    seen = prompt_seen | out_seen
    scaled = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(seen, scaled, sub)
    sub = sub - freq * out_counts.to(sub.dtype) - pres * out_seen.to(sub.dtype)
    logits.index_copy_(0, index, sub)
