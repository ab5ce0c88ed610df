"""The rank of a chosen token in its row of logits: how many entries are at or above it.

vLLM V1's `Logprob.rank` of the sampled token (and, for prompt logprobs, of the actual prompt
token): `batched_count_greater_than` counts the row's entries >= the chosen one, itself
included, so a token tied with others ranks after all of them (two tokens tied at the top both
rank 2); the top-k entries simply take ranks 1..k. Counted on the raw logits, not the logprobs:
log_softmax shifts a row by one constant, so the order and the ties are the same, and no path's
rounding of that shift (torch's log_softmax on the host path, the Triton merge's normaliser on
CUDA's device path) can make two neighbours equal, so every path and device reports the same
rank. One comparison pass over the rows that asked for logprobs only (the caller selects them).
"""

from __future__ import annotations

import torch


def token_ranks(rows: torch.Tensor, tokens: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """[R] of `dtype`: row r's rank of tokens[r], the number of entries of rows[r] that are
    >= rows[r, tokens[r]] (itself included, so >= 1). rows: [R, V] any float dtype; tokens:
    int64 [R] on the same device."""
    chosen = rows.gather(1, tokens.view(-1, 1))
    return (rows >= chosen).sum(dim=1, dtype=dtype)
