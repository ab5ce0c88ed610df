"""Async scheduling: schedule and launch step n + 1 while the GPU still runs step n.

Without it every step is serial: the host waits for step n's sampled tokens, then updates,
schedules and builds step n + 1 while the GPU idles. With it (EngineArgs.async_scheduling, on
by default), a step whose rows the sampler can draw on the device without host data
(Sampler.sample_on_device: greedy or temperature sampling without logit edits, top-k/top-p/
min-p cuts or logprobs) does not wait: update_from_output receives a placeholder token per
sampled request (the id `vocab_size`, which no prompt or sampled token can be), the next step
is scheduled and built from that state, its placeholder input rows are filled on the device
from the previous step's sampled ids (`input_patch`), and only then does the host read step
n's ids and put the real token in place of the placeholder (`Request.replace_last_token`).

The scheduler and the impls are unchanged: update_from_output runs exactly as in a serial
step, with the placeholder as the sampled token. What the placeholder cannot decide is settled
when the real token arrives:
- length stops (max_tokens, max_model_len) depend only on counts, so update_from_output
  already decided them correctly;
- a stop token or EOS (`spec.token_stop`, the stop rules of spec/SCHEDULING.md) or a stop string
  (the detokenizer) is found one step late: the request is finished then (its row in the step
  already launched is wasted and its token dropped; update_from_output skips finished
  requests), and a request already finished for length becomes FINISHED_STOPPED, as the
  serial order of checks (stop token, EOS, then length) says.

Invariants: a request has at most one placeholder, always its newest token; no output, text or
stop string ever sees a placeholder (an output built while a sample awaits its token leaves the
placeholder out, and a sample finishes only once its last token is real); greedy and seeded
outputs equal the serial engine's. Unseeded rows draw from the same distribution but not the
same numbers once a stop has left a wasted row in a step (an unseeded key derives from the row
index). And a block that fills while holding a placeholder is published under the
placeholder's hash, which no prompt can produce, so that block is never shared by prefix
caching (its contents are the real token's K/V, so the request's own reuse after a recompute
stays correct).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from enginespec.spec import SupportsAsyncScheduling


@dataclass
class InFlight:
    """A launched step whose sampled ids the host has not read yet."""

    ids: torch.Tensor  # int64 [S] on the device, in sample_request_ids order
    host: torch.Tensor  # int64 [S] host copy (pinned on CUDA), valid after `ready`
    ready: Optional[torch.cuda.Event]  # None on CPU (the copy is synchronous there)
    rows: dict[str, int] = field(default_factory=dict)  # request id -> index into ids
    awaiting: dict[str, object] = field(default_factory=dict)  # request id -> request with a placeholder
    finished: list = field(default_factory=list)  # finished for length by the placeholder update
    wait_s: float = 0.0  # how long token_ids() blocked on `ready` (the host waiting for the GPU)
    resolved: bool = False  # the engine has taken (or tried to take) its tokens

    def token_ids(self) -> list[int]:
        if self.ready is not None:
            start = time.perf_counter()
            self.ready.synchronize()
            self.wait_s = time.perf_counter() - start
        return self.host.tolist()


def deferrable(requests: Sequence) -> bool:
    """Whether the impl's requests can take a placeholder: they satisfy the spec's optional
    SupportsAsyncScheduling Protocol (replace_last_token). All requests of one engine come from
    one impl, so the first one answers for all; the sampler decides the rest
    (Sampler.sample_on_device), and a step with prompt logprobs is never deferred (its
    host-side rows are read at once)."""
    return not requests or isinstance(requests[0], SupportsAsyncScheduling)


def start_copy(ids: torch.Tensor, request_ids: list[str]) -> InFlight:
    """An InFlight for device ids [S]: an asynchronous copy to the host (pinned on CUDA) and
    an event that says when it has landed."""
    cuda = ids.device.type == "cuda"
    host = torch.empty(ids.shape, dtype=torch.int64, pin_memory=cuda)
    host.copy_(ids, non_blocking=cuda)
    ready = None
    if cuda:
        ready = torch.cuda.Event()
        ready.record()
    return InFlight(ids, host, ready, {rid: i for i, rid in enumerate(request_ids)})


def input_patch(
    scheduled, query_start_loc_cpu: torch.Tensor, inflight: InFlight
) -> tuple[list[int], list[int]]:
    """(rows of the new batch, indices into inflight.ids) for requests whose newest token is a
    placeholder: each is scheduled for that one token, so its only row takes the real id."""
    starts = query_start_loc_cpu.tolist()
    rows, src = [], []
    for i, (request, num_tokens) in enumerate(scheduled):
        rid = request.request_id
        if rid in inflight.awaiting:
            if num_tokens != 1 or request.num_computed_tokens != request.num_tokens - 1:
                raise RuntimeError(
                    f"async scheduling: {rid!r} scheduled {num_tokens} tokens over a placeholder (a bug)"
                )
            rows.append(starts[i])
            src.append(inflight.rows[rid])
    return rows, src


def apply_patch(input_ids: torch.Tensor, rows: list[int], src: list[int], ids: torch.Tensor) -> None:
    """input_ids[rows] = ids[src], on the device without a host sync."""
    if not rows:
        return
    cuda = input_ids.device.type == "cuda"
    index = torch.tensor([rows, src], dtype=torch.int64, pin_memory=cuda).to(
        input_ids.device, non_blocking=cuda
    )
    input_ids.index_copy_(0, index[0], ids.index_select(0, index[1]).to(input_ids.dtype))
