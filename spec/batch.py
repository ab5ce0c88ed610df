"""The flat ragged batch: every scheduled token of every request in one sequence of N rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class BatchMeta:
    """Attention metadata of one flat batch of N token rows over B requests (B' with padding).

    - query_start_loc: int32 [B'+1]; request r's rows are query_start_loc[r]:query_start_loc[r+1].
    - seq_lens: int32 [B']; context length of request r after this step (computed + new tokens).
      Request r's q rows are the last (q_len) positions of its seq_len context.
    - block_table: int32 [B', max_blocks]; logical block -> pool block, padded with 0.
    - slot_mapping: int64 [N']; slot of row i = table[p // bs] * bs + p % bs for its position p,
      -1 for padding rows (their K/V go to the scratch block, which the pool never hands out).
    - query_start_loc_cpu, seq_lens_cpu: host copies of the first two (no device sync to read).
    - max_query_len, max_seq_len: host ints.
    Padding rows (pad_to) are requests of one query row with seq_len 0 and slot -1.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    block_size: int
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    max_query_len: int
    max_seq_len: int

    @property
    def num_reqs(self) -> int:
        return int(self.seq_lens_cpu.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])


@dataclass
class Batch:
    """Model inputs of one step, built from a SchedulerOutput.

    - input_ids, positions: int64 [N'] (N' = N + padding rows).
    - meta: BatchMeta.
    - logits_indices: int64 [S]; rows whose logits are sampled (the last row of each request
      that reaches the end of its known tokens; a mid-prompt chunk samples none).
    - sample_request_ids: the S request ids in the order of logits_indices.
    - prompt_logprob_rows: request id -> (row indices, target token ids) for prompt positions
      whose next-token logprob is asked for (prompt_logprobs).
    - num_scheduled_tokens: N before padding; num_reqs: B before padding.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: BatchMeta
    logits_indices: torch.Tensor
    sample_request_ids: list[str]
    num_scheduled_tokens: int
    num_reqs: int
    prompt_logprob_rows: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)


PACKED_ALIGN = 16  # bytes: every packed section starts on such a boundary


def packed_offsets(num_rows: int, num_reqs: int) -> tuple[int, int, int, int, int, int]:
    """The packed layout of a batch's first five arrays, in bytes: input_ids, positions and
    slot_mapping (int64 [num_rows]), query_start_loc (int32 [num_reqs + 1]) and seq_lens (int32
    [num_reqs]), back to back in that order, each on a PACKED_ALIGN boundary; the sixth number
    is where seq_lens ends. A builder that stages a step in one buffer this way (the fast
    impl's) lets a decode graph, whose static inputs sit at the same offsets
    (worker/cuda_graphs.py), load all five with one copy; any other batch loads them one by
    one, with the same result."""
    out, offset = [0], 0
    for size in (8 * num_rows, 8 * num_rows, 8 * num_rows, 4 * (num_reqs + 1), 4 * num_reqs):
        offset += -(-size // PACKED_ALIGN) * PACKED_ALIGN
        out.append(offset)
    return tuple(out)  # type: ignore[return-value]


def slot_of(block_table_row: list[int], position: int, block_size: int) -> int:
    """Slot of a token position: table[p // bs] * bs + p % bs."""
    return block_table_row[position // block_size] * block_size + position % block_size
