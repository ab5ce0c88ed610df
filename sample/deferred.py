"""What a device-path draw leaves on the device for one host copy: the ids, and the logprobs.

Async scheduling reads a step's results a step late, in ONE device-to-host copy: `pack` puts
the int64 ids and the requested logprobs in one float64 buffer (ids below 2**53 are exact in
float64), `DeviceLogprobs.unpack` rebuilds the per-row entries from the host copy. Logprobs
follow the Sampler's definition (raw log_softmax; [(sampled id, its logprob)] then the top-k, as
`Logprob`s with their ranks: the chosen token's from `logprob_ranks.token_ranks`, a torch pass
beside the Triton kernels on CUDA, whose layout stays as it is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import torch

from enginespec.kernels import logprobs as logprob_kernels
from enginespec.outputs import Logprob
from enginespec.sample.logprob_ranks import token_ranks
from enginespec.sample.penalties import upload


@dataclass
class DeviceLogprobs:
    """rows: the batch rows asking for logprobs; counts: their k; packed: float64 [R, 1 + 2K]
    on the device (chosen logprob, the top-K values, the top-K ids; K = max(counts)); ranks:
    float64 [R] on the device, per row the chosen token's rank (`logprob_ranks.token_ranks`),
    packed after `packed`."""

    rows: list
    counts: list
    packed: torch.Tensor
    ranks: torch.Tensor

    @property
    def numel(self) -> int:
        """How many floats of the packed buffer are these logprobs'."""
        return self.packed.numel() + self.ranks.numel()

    def unpack(self, flat: Sequence[float], token_ids: Sequence[int]) -> list:
        """Per batch row: None, or [(sampled id, Logprob)] + its top k (id, Logprob of rank 1..k),
        best first. flat: the host copy of `packed` then `ranks`, flattened."""
        out: list = [None] * len(token_ids)
        width = self.packed.shape[1]
        top = (width - 1) // 2
        ranks = flat[self.packed.numel() :]
        for j, (i, n) in enumerate(zip(self.rows, self.counts)):
            row = flat[j * width : (j + 1) * width]
            ids = [int(t) for t in row[1 + top : 1 + top + n]]
            values = [Logprob(v, r) for r, v in enumerate(row[1 : 1 + n], 1)]
            out[i] = [(token_ids[i], Logprob(row[0], int(ranks[j])))] + list(zip(ids, values))
        return out


@dataclass
class DevicePromptLogprobs:
    """Prompt logprobs of one step, on the device: per request (request id, positions, target
    ids, k) in `requests`, and packed: float64, each request's [P, 1 + 2k] rows (the target's
    logprob, the top-k values, the top-k ids) then, per target, its rank, one request after the
    other."""

    requests: list
    packed: torch.Tensor

    def unpack(self, flat: Sequence[float]) -> dict:
        """request id -> (positions, entries): entry p is {target: Logprob} then the top-k
        (id, Logprob) pairs, a top-k entry replacing the target's, as
        `sampler.prompt_logprobs` returns them."""
        out, offset = {}, 0
        for rid, positions, targets, k in self.requests:
            entries = []
            ranks = flat[offset + len(targets) * (1 + 2 * k) : offset + len(targets) * (2 + 2 * k)]
            for target, rank in zip(targets, ranks):
                row = flat[offset : offset + 1 + 2 * k]
                offset += 1 + 2 * k
                entry = {int(target): Logprob(row[0], int(rank))}
                for r, (i, v) in enumerate(zip(row[1 + k :], row[1 : 1 + k]), 1):
                    entry[int(i)] = Logprob(v, r)
                entries.append(entry)
            offset += len(targets)
            out[rid] = (positions, entries)
        return out


def device_prompt_logprobs(prompt_logits: dict, ks: dict, vocab: int) -> Optional[DevicePromptLogprobs]:
    """The prompt logprobs of the requests in `ks` (request id -> k) from the runner's
    prompt_logits (request id -> (positions, logits [P, V'], target ids)), left on the device;
    None when ks is empty. Raw log_softmax over the first `vocab` columns, as the serial path."""
    requests, parts = [], []
    for rid, k in ks.items():
        positions, logits, targets = prompt_logits[rid]
        index = upload(torch.tensor(list(targets), dtype=torch.int64), logits.device)
        raw = logits[:, :vocab]
        requests.append((rid, list(positions), list(targets), min(k, vocab)))
        if (
            logprob_kernels.available(raw.device)
            and raw.stride(1) == 1
            and min(k, vocab) <= logprob_kernels.MAX_K
        ):
            rows = torch.arange(raw.shape[0], dtype=torch.int64, device=raw.device)
            parts.append(logprob_kernels.logprobs(raw, rows, index, min(k, vocab)).flatten())
            parts.append(token_ranks(raw, index, torch.float64))
            continue
        lp = torch.log_softmax(raw.float(), dim=1)
        chosen = lp.gather(1, index.view(-1, 1))
        values, ids = torch.topk(lp, min(k, vocab), dim=1) if k > 0 else (lp[:, :0], lp[:, :0].long())
        parts.append(torch.cat([chosen.double(), values.double(), ids.double()], dim=1).flatten())
        parts.append(token_ranks(raw, index, torch.float64))
    if not requests:
        return None
    return DevicePromptLogprobs(requests, torch.cat(parts))


class DeviceSample(NamedTuple):
    """One device-path draw: int64 [S] ids on the device, the logprobs (None unless a row asks
    for them) and the step's prompt logprobs (None unless a request asks for them)."""

    token_ids: torch.Tensor
    logprobs: Optional[DeviceLogprobs]
    prompt: Optional[DevicePromptLogprobs] = None


def device_logprobs(
    raw: torch.Tensor, tokens: torch.Tensor, rows: list, counts: list, index
) -> DeviceLogprobs:
    """Logprobs of the rows `index` (int64 device tensor of `rows`) of raw logits [S, V]. On
    CUDA two launches (`kernels.logprobs`: no log_softmax written out, no full-row topk), plus
    the chosen tokens' ranks in torch over those rows (`token_ranks`)."""
    k = min(max(counts), raw.shape[1])
    selected, chosen_ids = raw.index_select(0, index), tokens.index_select(0, index)
    ranks = token_ranks(selected, chosen_ids, torch.float64)
    if logprob_kernels.available(raw.device) and raw.stride(1) == 1 and k <= logprob_kernels.MAX_K:
        return DeviceLogprobs(
            list(rows), list(counts), logprob_kernels.logprobs(raw, index, tokens, k), ranks
        )
    lp = torch.log_softmax(selected.float(), dim=1)
    chosen = lp.gather(1, chosen_ids.view(-1, 1))
    values, ids = torch.topk(lp, k, dim=1) if k > 0 else (lp[:, :0], lp[:, :0].long())
    packed = torch.cat([chosen.double(), values.double(), ids.double()], dim=1)
    return DeviceLogprobs(list(rows), list(counts), packed, ranks)


def pack(sample: DeviceSample) -> torch.Tensor:
    """The one buffer to copy: the ids alone (int64), or as float64 the ids, then the logprobs,
    then the prompt logprobs (each part present only when asked for)."""
    if sample.logprobs is None and sample.prompt is None:
        return sample.token_ids
    parts = [sample.token_ids.double()]
    if sample.logprobs is not None:
        parts.extend((sample.logprobs.packed.flatten(), sample.logprobs.ranks))
    if sample.prompt is not None:
        parts.append(sample.prompt.packed)
    return torch.cat(parts)
