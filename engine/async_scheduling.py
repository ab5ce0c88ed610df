"""Async scheduling: schedule and launch step n + 1 while the GPU still runs step n.

Without it every step is serial: the host waits for step n's sampled tokens, then updates,
schedules and builds step n + 1 while the GPU idles. With it (EngineArgs.async_scheduling, on
by default), a step (any sampling settings: Sampler.sample_deferred draws every row type on the device,
penalties from device-side output counts; prompt logprobs travel in the same copy)
does not wait: update_from_output receives a placeholder token per
sampled request (the id `vocab_size`, which no prompt or sampled token can be), the next step
is scheduled and built from that state, its placeholder input rows are filled on the device
from the previous step's sampled ids (`input_patch`), and only then does the host read step
n's ids (with the rows' logprobs: one copy) and put the real token in place of the
placeholder (`Request.replace_last_token`).

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
index). And a block that fills while holding a placeholder may be hashed and published
with it before the real token is known; that hash is not unique (requests with the same
history up to the placeholder hash alike), so once the real token replaces the placeholder the
engine withdraws the hash and drops it from the request's block_hashes
(EngineCore._rehash_last_block), and the block is published again under the hash of its real
tokens. While the placeholder is a request's newest token no look-up can match that block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch

from enginespec.sample.deferred import DeviceLogprobs, DevicePromptLogprobs, DeviceSample, pack
from enginespec.spec import SupportsAsyncScheduling


@dataclass
class InFlight:
    """A launched step whose sampled ids the host has not read yet."""

    ids: torch.Tensor  # int64 [S] on the device, in sample_request_ids order
    host: torch.Tensor  # host copy (pinned on CUDA) of the packed ids (+ logprobs), valid after `ready`
    ready: Optional[torch.cuda.Event]  # None on CPU (the copy is synchronous there)
    rows: dict[str, int] = field(default_factory=dict)  # request id -> index into ids
    awaiting: dict[str, object] = field(default_factory=dict)  # request id -> request with a placeholder
    finished: list = field(default_factory=list)  # finished for length by the placeholder update
    wait_s: float = 0.0  # how long token_ids() blocked on `ready` (the host waiting for the GPU)
    resolved: bool = False  # the engine has taken (or tried to take) its tokens
    forgotten: set = field(default_factory=set)  # ids the engine forgot meanwhile (forget)
    logprobs: Optional[DeviceLogprobs] = None  # the rows' logprobs, packed after the ids in host
    prompt: Optional[DevicePromptLogprobs] = None  # the step's prompt logprobs, packed last
    _flat: Optional[list] = None

    def forget(self, request_id: str) -> None:
        """The engine forgot this request (aborted without a report) while the step was in
        flight: its placeholder, token, length finish and prompt logprobs go to nobody. Matched
        by id they would reach a new request the caller added under the same id before the next
        step (its prefill taken for a placeholder row, its first output the old one's finish)."""
        self.drop_token(request_id)
        self.forgotten.add(request_id)

    def drop_token(self, request_id: str) -> None:
        """The request was aborted while the step was in flight: its placeholder, token and
        length finish go to nobody (the serial engine never sampled that token), while the
        prompt logprobs the step computed are still stored, as the serial step stored them."""
        self.awaiting.pop(request_id, None)
        self.finished = [r for r in self.finished if r.request_id != request_id]

    @property
    def pending(self) -> bool:
        """Whether resolving this step can still reach a request: a placeholder awaits its id,
        or the step carries prompt logprobs of a request the engine has not forgotten. A step
        that is not pending is dropped unread (the engine keeps nothing for nobody)."""
        if self.awaiting or self.finished:
            return True
        return self.prompt is not None and any(r[0] not in self.forgotten for r in self.prompt.requests)

    def _read(self) -> list:
        if self._flat is None:
            if self.ready is not None:
                start = time.perf_counter()
                self.ready.synchronize()
                self.wait_s = time.perf_counter() - start
            self._flat = self.host.tolist()
        return self._flat

    def token_ids(self) -> list[int]:
        flat = self._read()
        num_rows = self.ids.shape[0]
        if self.logprobs is None and self.prompt is None:
            return flat
        return [int(t) for t in flat[:num_rows]]

    def logprob_map(self) -> dict:
        """request id -> its logprob entries (or None), as the serial sampler returns them."""
        if self.logprobs is None:
            return {}
        ids, num_rows = self.token_ids(), self.ids.shape[0]
        entries = self.logprobs.unpack(self._read()[num_rows:], ids)
        return {rid: entries[i] for rid, i in self.rows.items()}

    def prompt_map(self) -> dict:
        """request id -> (positions, prompt logprob entries) of the step's prompt logprobs."""
        if self.prompt is None:
            return {}
        start = self.ids.shape[0] + (0 if self.logprobs is None else self.logprobs.numel)
        found = self.prompt.unpack(self._read()[start:])
        return {rid: v for rid, v in found.items() if rid not in self.forgotten}


def deferrable(requests: Sequence) -> bool:
    """Whether the impl's requests can take a placeholder: they satisfy the spec's optional
    SupportsAsyncScheduling Protocol (replace_last_token). All requests of one engine come from
    one impl, so the first one answers for all; the sampler decides the rest
    (Sampler.sample_deferred). The answer is kept per request class: an isinstance check
    against a runtime Protocol inspects the class's attributes each time (~10 us a step)."""
    if not requests:
        return True
    cls = type(requests[0])
    known = _DEFERRABLE.get(cls)
    if known is None:
        known = _DEFERRABLE[cls] = isinstance(requests[0], SupportsAsyncScheduling)
    return known


_DEFERRABLE: dict[type, bool] = {}


def start_copy(sample: Union[torch.Tensor, DeviceSample], request_ids: list[str]) -> InFlight:
    """An InFlight for a device draw (ids [S], or a DeviceSample with logprobs): ONE
    asynchronous copy of the packed ids and logprobs to the host (pinned on CUDA) and an event
    that says when it has landed."""
    if isinstance(sample, torch.Tensor):
        sample = DeviceSample(sample, None)
    buffer = pack(sample)
    cuda = buffer.device.type == "cuda"
    host = torch.empty(buffer.shape, dtype=buffer.dtype, pin_memory=cuda)
    host.copy_(buffer, non_blocking=cuda)
    ready = None
    if cuda:
        ready = torch.cuda.Event()
        # on the given device's stream: no lookup of the current device
        ready.record(torch.cuda.current_stream(buffer.device))
    rows = {rid: i for i, rid in enumerate(request_ids)}
    return InFlight(sample.token_ids, host, ready, rows, logprobs=sample.logprobs, prompt=sample.prompt)


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
    """input_ids[rows] = ids[src], on the device without a host sync. In steady decode both are
    runs of consecutive indices (the same requests in the same order each step): then it is one
    slice copy, not an index upload, a gather and a scatter (four launches from the host, whose
    step time sets the pace at batch 1: benchmarks/RESULTS.md, fifth session)."""
    if not rows:
        return
    n = len(rows)
    if _is_run(rows) and _is_run(src):
        input_ids[rows[0] : rows[0] + n].copy_(ids[src[0] : src[0] + n])
        return
    cuda = input_ids.device.type == "cuda"
    index = torch.tensor([rows, src], dtype=torch.int64, pin_memory=cuda).to(
        input_ids.device, non_blocking=cuda
    )
    input_ids.index_copy_(0, index[0], ids.index_select(0, index[1]).to(input_ids.dtype))


def _is_run(values: list[int]) -> bool:
    """Whether values are first, first + 1, ..., first + len - 1."""
    return values[-1] - values[0] == len(values) - 1 and all(b - a == 1 for a, b in zip(values, values[1:]))
