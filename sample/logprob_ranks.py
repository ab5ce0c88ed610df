"""The rank of a chosen token in its row of logits: 1 + how many entries are strictly larger.

vLLM's `Logprob.rank` of the sampled token (and, for prompt logprobs, of the actual prompt
token); the top-k entries simply take ranks 1..k. Counted on the raw logits, not the logprobs:
log_softmax shifts a row by one constant, so the order is the same, and no path's rounding of that
shift (torch's log_softmax on the host path, the Triton merge's normaliser on CUDA's device path)
can make two neighbours equal, so every path and device reports the same rank. One comparison
pass over the rows that asked for logprobs only (the caller selects them).
"""

from __future__ import annotations

import torch


def num_above(rows: torch.Tensor, tokens: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """[R] of `dtype`: how many entries of rows[r] are strictly greater than rows[r, tokens[r]]
    (the rank minus one; the device path adds the one on the host, a launch fewer).
    rows: [R, V] any float dtype; tokens: int64 [R] on the same device."""
    chosen = rows.gather(1, tokens.view(-1, 1))
    return (rows > chosen).sum(dim=1, dtype=dtype)


def token_ranks(rows: torch.Tensor, tokens: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """[R] of `dtype`: row r's rank of tokens[r], 1 + num_above."""
    return num_above(rows, tokens, dtype) + 1
