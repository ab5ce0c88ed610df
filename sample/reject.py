"""Top-p by rejection: the draw of a row whose only cut is a top-p, without finding the cut.

A loose top-p (top_p < 1, no top-k, no min-p) over a flat row keeps tens of thousands of
tokens, and its exact threshold takes several reads of the row (bisection over the float
order: `kernels/cut_draw.py`'s wide path, 3.8 ms for 256 flat rows on the H200). Sampling
needs the threshold only to decide whether a token is in the nucleus, and that test has a
closed form for one token: with A(v) the tempered mass of the tokens whose logit is strictly
above v, token t is kept by the cut iff A(x_t) < top_p * total (sample/truncation.py's rule: a
token stays iff the mass strictly before it is < top_p; ties stay together). So (FlashInfer's
rejection-based top-p, in our draw's terms):

    round 0: t_0 = the uncut draw (`sample.draw`'s chunked inverse CDF, uniforms 0 and 1)
    round r >= 1: if A(x_{t_(r-1)}) < top_p * total, keep t_(r-1); else pivot = x_{t_(r-1)} and
        t_r = the same draw over the tokens with x > pivot, with uniforms 2r and 2r + 1.

Why it is exact: every pivot is the logit of a rejected token, which lies below the whole
nucleus, so the kept set {x > pivot} always holds the nucleus, and a draw from it that lands in
the nucleus is distributed as the nucleus's renormalised softmax; each rejection removes the
rejected token and everything at or below it, so the rounds end (at the latest when only the
top tie group is left: its A is 0). A round accepts with probability at least top_p over the
current kept mass, so a top-p of 0.95 accepts in round 1 about 95% of the time.

The accepted token differs from the threshold-then-draw token for the same uniforms (another
sampler of the same distribution), so every path draws loose rows this way: `refine_top_p`
here (CPU, and the oracle), `kernels/reject_top_p.py` on CUDA (two full-grid launches a round
for a few rounds, then one program per unfinished row). Seeded rows get the same tokens on
both (up to float rounding at the acceptance boundary, as for any top-p) and never depend on
the batch: a row's rounds read only its own logits and keys.
"""

from __future__ import annotations

from typing import Sequence

import torch

from enginespec.sample.draw import chunk_size, chunk_weights, pick_tokens
from enginespec.sample.rng import round_uniforms

MAX_ROUNDS = 4096  # a bound the rounds never reach in practice (each removes a tie group or more)


def above_and_total(x: torch.Tensor, x_scale: torch.Tensor, pivot: torch.Tensor, chunk: int):
    """(A [R], total [R]) of rows x [R, V]: the tempered mass (weights exp2((x - chunk max) *
    x_scale), rescaled to the row max) of the tokens with x > pivot [R], and of every token."""
    chunk = chunk_size(chunk, x.shape[1])
    tops, weights = chunk_weights(x, x_scale, None, chunk)
    row_max = tops.amax(dim=1, keepdim=True)
    shift = torch.where(row_max > float("-inf"), row_max, torch.zeros_like(row_max))
    scale = torch.exp2((tops - shift) * x_scale.view(-1, 1))  # [R, C]
    num_chunks = tops.shape[1]
    xs = torch.nn.functional.pad(x, (0, num_chunks * chunk - x.shape[1]), value=float("-inf"))
    above = (xs.view(x.shape[0], num_chunks, chunk) > pivot.view(-1, 1, 1)) & (weights > 0)
    a = (weights * above).sum(dim=2)
    return (a * scale).sum(dim=1), (weights.sum(dim=2) * scale).sum(dim=1)


def refine_top_p(
    x: torch.Tensor,
    x_scale: torch.Tensor,
    top_p: torch.Tensor,
    keys: Sequence[int],
    tokens: torch.Tensor,
    chunk: int = 0,
) -> torch.Tensor:
    """Rounds 1.. of the module's rejection for rows x [R, V] float32 (the logits the draw read,
    edits applied), x_scale [R], top_p [R] float32, their resolved keys (non-negative ints) and
    round 0's tokens [R] int64 (the uncut draw). Returns the accepted tokens, int64 [R]."""
    chunk = chunk_size(chunk, x.shape[1])
    rows = torch.arange(x.shape[0], device=x.device)
    tokens = tokens.clone()
    done = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    tops, weights = chunk_weights(x, x_scale, None, chunk)
    num_chunks = tops.shape[1]
    xs = torch.nn.functional.pad(x, (0, num_chunks * chunk - x.shape[1]), value=float("-inf"))
    xs = xs.view(x.shape[0], num_chunks, chunk)
    for r in range(1, MAX_ROUNDS):
        pivot = x[rows, tokens]
        above, total = above_and_total(x, x_scale, pivot, chunk)
        done |= above < top_p * total
        if bool(done.all()):
            break
        kept = weights.masked_fill(xs <= pivot.view(-1, 1, 1), 0.0)
        picked = pick_tokens(tops, kept, x_scale, round_uniforms(keys, r, x.device), chunk)
        tokens = torch.where(done, tokens, picked)
    return tokens
