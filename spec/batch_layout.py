"""build_batch: one SchedulerOutput -> one flat ragged Batch: the canonical layout, as contract.

The plain, impl-agnostic builder. It lives in the spec beside `hash_block` because the layout
is part of the contract: an impl's own `build_batch` must produce exactly these tensors, and the
engine falls back to this one when an impl has none.

Called BEFORE `Scheduler.update_from_output`, so request r's rows are its tokens
token_ids[c : c + n] at positions c .. c + n - 1, where c is its current num_computed_tokens
and n its scheduled count. Everything is built on the host as plain lists and moved to
`device` once, so the host copies in BatchMeta never need a device sync.

Exact layout (a faster builder must produce identical tensors):
- rows follow `output.scheduled` order; request r owns rows query_start_loc[r]:query_start_loc[r+1];
- seq_lens[r] = c + n; block_table is [B', W] int32 with W = max over real requests of
  cdiv(seq_len, block_size) (at least 1), each row the request's first cdiv(seq_len, bs) blocks,
  padded with 0;
- slot of position p = table[p // bs] * bs + p % bs;
- request r samples (one logits index, its last row) iff c + n >= r.num_tokens, i.e. the step
  reaches the end of its known tokens; a mid-prompt chunk samples nothing;
- prompt logprobs: when r.params.prompt_logprobs is set and r has no output yet (so a request
  recomputed after preemption does not report them twice), every row at a position p <
  num_prompt_tokens - 1 predicts prompt token p + 1: its row index and that target id are listed;
- pad_to: rows N..pad_to-1 are extra requests of one row each, seq_len 0, slot -1, input id 0,
  position 0, an all-zero table row. They never sample.
"""

from __future__ import annotations

from typing import Optional

import torch

from enginespec.spec.batch import Batch, BatchMeta
from enginespec.spec.scheduler import SchedulerOutput


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _request_rows(request, num_new: int, table: list[int], block_size: int):
    """Token ids, positions and slots of one request's scheduled rows."""
    start = request.num_computed_tokens
    end = start + num_new
    known = list(request.token_ids) + list(getattr(request, "spec_token_ids", None) or ())
    if num_new < 1:
        raise ValueError(f"request {request.request_id!r}: scheduled tokens must be >= 1, got {num_new}")
    if end > len(known):
        raise ValueError(
            f"request {request.request_id!r}: scheduled {num_new} tokens from position {start} "
            f"but only {len(known)} tokens are known"
        )
    if len(table) * block_size < end:
        raise ValueError(
            f"request {request.request_id!r}: block table covers {len(table) * block_size} "
            f"tokens, needs >= {end} (allocate_slots before build_batch)"
        )
    positions = list(range(start, end))
    slots = [table[p // block_size] * block_size + p % block_size for p in positions]
    return known[start:end], positions, slots


def _prompt_logprob_rows(request, first_row: int, positions: list[int]):
    """(row indices, target ids) for rows whose next token is a prompt token, or None."""
    params = request.params
    if params is None or params.prompt_logprobs is None or request.num_output_tokens > 0:
        return None
    last = request.num_prompt_tokens - 1  # the last prompt position predicts the first output
    rows = [first_row + j for j, p in enumerate(positions) if p < last]
    targets = [request.prompt_token_ids[p + 1] for p in positions if p < last]
    return rows, targets


def build_batch(output: SchedulerOutput, block_manager, device="cpu", pad_to: Optional[int] = None) -> Batch:
    """Lay out every scheduled token of `output` in one flat batch (see the module docstring)."""
    bs = block_manager.block_size
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    logits_indices: list[int] = []
    sample_ids: list[str] = []
    prompt_rows: dict[str, tuple[list[int], list[int]]] = {}
    for request, num_new in output.scheduled:
        table = block_manager.block_table(request.request_id)
        ids, pos, sl = _request_rows(request, num_new, table, bs)
        first_row = len(input_ids)
        plp = _prompt_logprob_rows(request, first_row, pos)
        if plp is not None and plp[0]:
            prompt_rows[request.request_id] = plp
        input_ids += ids
        positions += pos
        slots += sl
        qsl.append(len(input_ids))
        seq_len = pos[-1] + 1
        seq_lens.append(seq_len)
        tables.append(table[: _cdiv(seq_len, bs)])
        if seq_len >= request.num_tokens:
            logits_indices.append(len(input_ids) - 1)
            sample_ids.append(request.request_id)
    num_tokens, num_reqs = len(input_ids), len(seq_lens)
    max_query_len = max((qsl[i + 1] - qsl[i] for i in range(num_reqs)), default=0)
    if pad_to is not None:
        if pad_to < num_tokens:
            raise ValueError(f"pad_to must be >= the number of scheduled tokens ({num_tokens}), got {pad_to}")
        for _ in range(pad_to - num_tokens):
            input_ids.append(0)
            positions.append(0)
            slots.append(-1)
            qsl.append(qsl[-1] + 1)
            seq_lens.append(0)
            tables.append([])
            max_query_len = max(max_query_len, 1)
    width = max([len(t) for t in tables] + [1])
    table_rows = [t + [0] * (width - len(t)) for t in tables]
    return _to_batch(
        input_ids,
        positions,
        slots,
        qsl,
        seq_lens,
        table_rows,
        bs,
        max_query_len,
        logits_indices,
        sample_ids,
        prompt_rows,
        num_tokens,
        num_reqs,
        device,
    )


def _to_batch(
    input_ids,
    positions,
    slots,
    qsl,
    seq_lens,
    table_rows,
    block_size,
    max_query_len,
    logits_indices,
    sample_ids,
    prompt_rows,
    num_tokens,
    num_reqs,
    device,
) -> Batch:
    """Make the host tensors once, then one copy each to the device."""
    qsl_cpu = torch.tensor(qsl, dtype=torch.int32)
    seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32)
    if table_rows:
        table_cpu = torch.tensor(table_rows, dtype=torch.int32)
    else:
        table_cpu = torch.zeros((0, 1), dtype=torch.int32)
    meta = BatchMeta(
        query_start_loc=qsl_cpu.to(device),
        seq_lens=seq_lens_cpu.to(device),
        block_table=table_cpu.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device),
        block_size=block_size,
        query_start_loc_cpu=qsl_cpu,
        seq_lens_cpu=seq_lens_cpu,
        max_query_len=max_query_len,
        max_seq_len=max(seq_lens, default=0),
    )
    return Batch(
        input_ids=torch.tensor(input_ids, dtype=torch.int64).to(device),
        positions=torch.tensor(positions, dtype=torch.int64).to(device),
        meta=meta,
        logits_indices=torch.tensor(logits_indices, dtype=torch.int64).to(device),
        sample_request_ids=sample_ids,
        num_scheduled_tokens=num_tokens,
        num_reqs=num_reqs,
        prompt_logprob_rows=prompt_rows,
    )
