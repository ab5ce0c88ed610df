"""What a device-path draw leaves on the device for one host copy: the ids, and the logprobs.

Async scheduling reads a step's results a step late, in ONE device-to-host copy: `pack` puts
the int64 ids and the requested logprobs in one float64 buffer (ids below 2**53 are exact in
float64), `DeviceLogprobs.unpack` rebuilds the per-row entries from the host copy. Logprobs
follow the Sampler's definition (raw log_softmax; [(sampled id, its logprob)] then the top-k).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import torch


@dataclass
class DeviceLogprobs:
    """rows: the batch rows asking for logprobs; counts: their k; packed: float64 [R, 1 + 2K]
    on the device (chosen logprob, the top-K values, the top-K ids; K = max(counts))."""

    rows: list
    counts: list
    packed: torch.Tensor

    def unpack(self, flat: Sequence[float], token_ids: Sequence[int]) -> list:
        """Per batch row: None, or [(sampled id, logprob)] + its top k (id, logprob), best first.
        flat: the host copy of `packed`, flattened."""
        out: list = [None] * len(token_ids)
        width = self.packed.shape[1]
        top = (width - 1) // 2
        for j, (i, n) in enumerate(zip(self.rows, self.counts)):
            row = flat[j * width : (j + 1) * width]
            ids = [int(t) for t in row[1 + top : 1 + top + n]]
            out[i] = [(token_ids[i], row[0])] + list(zip(ids, row[1 : 1 + n]))
        return out


class DeviceSample(NamedTuple):
    """One device-path draw: int64 [S] ids on the device, and the logprobs (None unless a row
    asks for them)."""

    token_ids: torch.Tensor
    logprobs: Optional[DeviceLogprobs]


def device_logprobs(
    raw: torch.Tensor, tokens: torch.Tensor, rows: list, counts: list, index
) -> DeviceLogprobs:
    """Logprobs of the rows `index` (int64 device tensor of `rows`) of raw logits [S, V]."""
    lp = torch.log_softmax(raw.index_select(0, index).float(), dim=1)
    chosen = lp.gather(1, tokens.index_select(0, index).view(-1, 1))
    k = min(max(counts), lp.shape[1])
    values, ids = torch.topk(lp, k, dim=1) if k > 0 else (lp[:, :0], lp[:, :0].long())
    packed = torch.cat([chosen.double(), values.double(), ids.double()], dim=1)
    return DeviceLogprobs(list(rows), list(counts), packed)


def pack(sample: DeviceSample) -> torch.Tensor:
    """The one buffer to copy: the ids alone (int64), or ids then logprobs as float64."""
    if sample.logprobs is None:
        return sample.token_ids
    return torch.cat([sample.token_ids.double(), sample.logprobs.packed.flatten()])
