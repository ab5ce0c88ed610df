"""EngineCore: one loop over any Implementation.

step() = schedule -> swaps -> build batch -> execute -> sample -> update_from_output ->
detokenize (stop strings finish through scheduler.finish) -> RequestOutputs.

A user request with n > 1 becomes n sibling requests ("{i}_{id}", as vLLM names children) with
the same prompt; with prefix caching on, the siblings admitted after the first find its prompt
blocks published (publish-before-compute) and share them instead of computing them again. A
seeded request with n > 1 gives sibling i the seed `seed + i`, so the samples differ but each is
reproducible.

Invariants: every request the scheduler knows belongs to exactly one live parent here; a
parent's final RequestOutput (finished=True) is returned by exactly one step(), after which the
engine forgets it; a ValueError from add_request leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

import torch

from enginespec.engine.async_scheduling import (
    InFlight,
    apply_patch,
    deferrable,
    input_patch,
    start_copy,
    stop_after,
)
from enginespec.engine_args import EngineArgs, resolve_device, resolve_dtype
from enginespec.outputs import CompletionOutput, RequestOutput
from enginespec.spec import SamplingParams, Status, UpdateOutput, load_impl
from enginespec.worker.runner import ModelRunner


@dataclass
class _Sample:
    """One sibling: the impl's request plus what only the engine tracks (text, logprobs)."""

    index: int
    request: object
    detokenizer: object = None
    unread: list = field(default_factory=list)  # sampled ids not yet fed to the detokenizer
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    logprobs: Optional[list] = None


@dataclass
class _Parent:
    """One user request and its n samples."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    samples: list[_Sample]
    prompt_logprobs: Optional[dict[int, dict[int, float]]] = None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)


@dataclass
class EngineStats:
    """Counters since construction: steps with work, scheduled tokens (prompt and recompute
    included), sampled tokens, preemptions, steps that left their ids on the device (async
    scheduling), and wall seconds spent in step()."""

    num_steps: int = 0
    num_scheduled_tokens: int = 0
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    num_async_steps: int = 0  # steps whose ids stayed on the device (async scheduling)
    step_seconds: float = 0.0
    # None, or a list each step with work appends (num_reqs, num_tokens, kv_tokens, end time,
    # wait seconds) to: scheduled requests and tokens, the sum of their context lengths,
    # time.perf_counter() when the step's work was done, and how long the host blocked on the
    # GPU in it (waiting for the previous step's ids; near 0 means the GPU waited on the host).
    # The benchmark's per-batch-size breakdown reads it.
    step_trace: Optional[list] = None


class EngineCore:
    """Composes an Implementation with a FlatModel, a ModelRunner and the Sampler."""

    def __init__(self, args: EngineArgs, *, model=None, tokenizer=None):
        self.args = args
        self.impl = load_impl(args.impl)
        if args.preemption_mode == "swap" and "swap" not in getattr(self.impl, "capabilities", ()):
            raise ValueError(
                f"preemption_mode='swap' needs an impl with the 'swap' capability; "
                f"{self.impl.name!r} has {sorted(getattr(self.impl, 'capabilities', ()))}"
            )
        if args.seed is not None:
            torch.manual_seed(args.seed)
        self.model = model if model is not None else self._load_model()
        self.tokenizer = tokenizer if tokenizer is not None else self._load_tokenizer()
        self.max_model_len = args.resolve_max_model_len(self.model.max_position_embeddings)
        self.scheduler_config = args.scheduler_config(self.max_model_len)
        self.sampler = self._make_sampler()
        self.runner = ModelRunner(
            self.model,
            self.impl,
            block_size=args.block_size,
            max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=self.max_model_len,
            num_blocks=args.num_blocks,
            kv_cache_bytes=args.kv_cache_bytes,
            gpu_memory_utilization=args.gpu_memory_utilization,
            num_gpu_blocks_override=args.num_gpu_blocks_override,
            sample_fn=self.sampler,
            enforce_eager=args.enforce_eager,
            compile_model=args.compile_model,
            compile_backend=args.compile_backend,
        )
        self.block_manager = self.impl.new_block_manager(
            self.runner.num_blocks, args.block_size, args.enable_prefix_caching
        )
        self.scheduler = self.impl.new_scheduler(self.scheduler_config, self.block_manager)
        self.stats = EngineStats()
        self._parents: dict[str, _Parent] = {}
        self._samples: dict[str, tuple[_Parent, _Sample]] = {}
        self._pending: dict[str, _Parent] = {}  # parents to report next step (aborts)
        self._inflight: Optional[InFlight] = None  # async scheduling: the step awaiting its tokens

    # ---- construction helpers -----------------------------------------------------------------

    def _load_model(self):
        from enginespec.worker.flat_model import FlatModel

        if self.args.model is None:
            raise ValueError("EngineArgs.model must name a checkpoint directory (or pass model=)")
        device = resolve_device(self.args.device)
        dtype = resolve_dtype(self.args.dtype, self.args.model, device)
        return FlatModel.from_pretrained(
            self.args.model,
            dtype=dtype,
            device=device,
            attention=self.impl.attention_backend(device),
            model_impl=self.args.model_impl,
        )

    def _load_tokenizer(self):
        if self.args.model is None or self.args.skip_tokenizer:
            return None
        from enginespec.worker.loader import load_tokenizer

        return load_tokenizer(self.args.model)

    def _make_sampler(self):
        from enginespec.sample.sampler import Sampler

        return Sampler(self.model.vocab_size, self.model.device, seed=self.args.seed)

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    # ---- adding and aborting ------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids,
        params: Optional[SamplingParams] = None,
        *,
        prompt: Optional[str] = None,
        priority: int = 0,
        arrival_time: Optional[float] = None,
        cache_key: tuple = (),
    ) -> None:
        """Validate and queue one user request (n samples). ValueError, with nothing queued, for
        a bad id, prompt or params."""
        params = SamplingParams() if params is None else params
        prompt_token_ids = self._validate(request_id, prompt_token_ids, params, priority)
        parent = _Parent(
            request_id, prompt, prompt_token_ids, [], {} if params.prompt_logprobs is not None else None
        )
        eos, extra_stops = self._eos_ids()
        added = []
        try:
            for index in range(params.n):
                child_params = _child_params(params, index, extra_stops)
                child_id = request_id if params.n == 1 else f"{index}_{request_id}"
                request = self.impl.new_request(
                    child_id,
                    prompt_token_ids,
                    child_params,
                    eos_token_id=eos,
                    priority=priority,
                    arrival_time=arrival_time,
                    cache_key=cache_key,
                )
                self.scheduler.add(request)
                added.append(child_id)
                parent.samples.append(self._new_sample(index, request, prompt_token_ids, child_params))
        except Exception:
            for child_id in added:
                self.scheduler.abort(child_id)
            raise
        self._parents[request_id] = parent
        for sample in parent.samples:
            self._samples[sample.request.request_id] = (parent, sample)

    def _new_sample(self, index, request, prompt_token_ids, params) -> _Sample:
        detok = None
        if self.tokenizer is not None:
            from enginespec.engine.detokenizer import IncrementalDetokenizer

            detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params)
        return _Sample(index, request, detok, logprobs=[] if params.logprobs is not None else None)

    def _validate(self, request_id, prompt_token_ids, params, priority) -> list[int]:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if request_id in self._parents or request_id in self._pending:
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a spec.SamplingParams, got {type(params).__name__}")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an int, got {priority!r}")
        ids = _check_prompt_ids(prompt_token_ids, self.vocab_size)
        params.validate_vocab(self.vocab_size)
        if params.stop and self.tokenizer is None:
            raise ValueError("SamplingParams.stop (stop strings) needs a tokenizer; this engine has none")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt length ({len(ids)}) + max_tokens ({params.max_tokens}) must be <= "
                f"max_model_len ({self.max_model_len})"
            )
        bs, num_blocks = self.args.block_size, self.runner.num_blocks
        need = -(-(len(ids) + params.max_tokens) // bs)
        if need > num_blocks:
            raise ValueError(
                f"prompt length ({len(ids)}) + max_tokens ({params.max_tokens}) needs {need} KV "
                f"blocks of {bs} tokens, more than the pool's num_blocks ({num_blocks})"
            )
        return ids

    def _eos_ids(self) -> tuple[Optional[int], tuple[int, ...]]:
        """The model's EOS id, and any further EOS ids (a list in the config) as stop tokens."""
        eos = getattr(self.model, "eos_token_id", None)
        config_eos = getattr(getattr(self.model, "config", None), "eos_token_id", None)
        extra = ()
        if isinstance(config_eos, (list, tuple)):
            extra = tuple(int(t) for t in config_eos if t is not None and int(t) != eos)
        return eos, extra

    def abort(self, request_ids: Union[str, Iterable[str]], report: bool = True) -> bool:
        """Abort user requests (all their samples). Their final outputs (finish_reason "abort")
        come from the next step(), or never with report=False (the engine forgets them at once).
        Returns True if any id was live."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        found = False
        for request_id in ids:
            parent = self._parents.get(request_id)
            if parent is None:
                continue
            found = True
            for sample in parent.samples:
                if sample.finish_reason is None:
                    self.scheduler.abort(sample.request.request_id)
                    self.runner.drop(sample.request.request_id)  # a swapped copy goes now
                    sample.finish_reason = Status.FINISHED_ABORTED.finish_reason
                    _flush(sample)
            if report:
                self._pending[request_id] = parent
            else:
                self._pending.pop(request_id, None)
                self._forget(request_id)
        return found

    @property
    def has_unfinished(self) -> bool:
        """True while some request has not had its final output returned."""
        return bool(self._parents)

    @property
    def num_unfinished(self) -> int:
        return len(self._parents)

    # ---- one step -----------------------------------------------------------------------------

    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """Run one scheduling step and return the outputs of the requests it changed (with
        final_only, of those that finished: generate() needs nothing else, and building
        cumulative outputs of every running request each step is most of the host cost).

        Text is decoded incrementally only for samples with stop strings (which must be
        matched as tokens arrive); the others decode their new ids when an output is built.
        With async_scheduling, a step the sampler can draw on the device leaves its tokens there
        and the next step() fills them in (async_scheduling.py); outputs then lag one step."""
        start = time.perf_counter()
        with _span("schedule"):
            output = self.scheduler.schedule()
            self.runner.apply_swaps(output)
        self.stats.num_preemptions += len(output.preempted)
        changed: dict[str, _Parent] = dict(self._pending)
        self._pending.clear()
        previous, self._inflight = self._inflight, None
        if not output.is_empty:
            self._run_step(output, previous, changed)
        else:
            self._resolve(previous, changed)
        with _span("outputs"):
            outputs = [
                self._make_output(parent) for parent in changed.values() if not final_only or parent.finished
            ]
        for out in outputs:
            if out.finished:
                self._forget(out.request_id)
        self.stats.step_seconds += time.perf_counter() - start
        return outputs

    def _run_step(self, output, previous: Optional[InFlight], changed: dict) -> None:
        """Build, execute, sample and update one non-empty step (resolving the previous step's
        placeholders once this step is launched)."""
        with _span("prepare"):
            batch = self.runner.prepare(output, self.block_manager)
            if previous is not None:
                rows, src = input_patch(output.scheduled, batch.meta.query_start_loc_cpu, previous)
                apply_patch(batch.input_ids, rows, src, previous.ids)
        with _span("execute"):
            result = self.runner.execute(batch)
        requests = [self._samples[rid][1].request for rid in batch.sample_request_ids]
        ids = None
        if self.args.async_scheduling and not result.prompt_logits and deferrable(requests):
            with _span("sample"):
                ids = self.sampler.sample_on_device(result.logits, requests)
        if ids is not None:
            self.stats.num_async_steps += 1
            launched = start_copy(ids, batch.sample_request_ids)
            wait = self._resolve(previous, changed)
            with _span("update"):
                self._update_with_placeholders(output, launched)
        else:
            wait = self._resolve(previous, changed)
            with _span("sample"):
                sampled = self.sampler(result.logits, requests)
                self._record_prompt_logprobs(result.prompt_logits)
            with _span("update"):
                token_map = {rid: [tok] for rid, tok in zip(batch.sample_request_ids, sampled.token_ids)}
                update = self.scheduler.update_from_output(output, token_map)
                self._apply_update(update, dict(zip(batch.sample_request_ids, sampled.logprobs)), changed)
        self.stats.num_steps += 1
        self.stats.num_scheduled_tokens += output.num_scheduled_tokens
        if self.stats.step_trace is not None:
            self.stats.step_trace.append(
                (
                    len(output.scheduled),
                    output.num_scheduled_tokens,
                    int(batch.meta.seq_lens_cpu.sum()),
                    time.perf_counter(),
                    wait,
                )
            )

    def _update_with_placeholders(self, output, launched: InFlight) -> None:
        """update_from_output with the placeholder id as every sampled token; the requests that
        appended one wait in `launched` for their real token (length stops are already right)."""
        placeholder = [self.vocab_size]
        update = self.scheduler.update_from_output(output, {rid: placeholder for rid in launched.rows})
        for rid, tokens in update.new_token_ids.items():
            if tokens:
                launched.awaiting[rid] = self._samples[rid][1].request
        launched.finished = list(update.finished)
        self._inflight = launched if launched.awaiting else None

    def _resolve(self, inflight: Optional[InFlight], changed: dict) -> float:
        """Put the real tokens of a launched step in place of its placeholders, apply the stops
        the placeholders could not decide, then attach tokens and finishes as a serial step does.
        Returns the seconds the host blocked waiting for those tokens."""
        if inflight is None:
            return 0.0
        with _span("resolve"):
            ids = inflight.token_ids()
            new_tokens = {}
            finished = [r for r in inflight.finished if r.request_id in self._samples]
            for rid, request in inflight.awaiting.items():
                if rid not in self._samples:
                    continue  # aborted without a report: forgotten
                token = ids[inflight.rows[rid]]
                request.replace_last_token(token)
                new_tokens[rid] = [token]
                stop = stop_after(request, token)
                if stop is None or request.status not in _STOPPABLE:
                    continue  # no stop, or finished otherwise (aborted) meanwhile
                if not request.status.is_finished:  # running, or preempted by this step's schedule
                    self.scheduler.finish(request, stop[0])
                    finished.append(request)
                request.status, request.stop_reason = stop  # a length finish yields to the stop
            self._apply_update(UpdateOutput(new_tokens, finished), {}, changed)
        return inflight.wait_s

    def _record_prompt_logprobs(self, prompt_logits) -> None:
        for request_id, (positions, logits, targets) in prompt_logits.items():
            parent, sample = self._samples[request_id]
            if parent.prompt_logprobs is None or sample.index != 0:
                continue
            k = sample.request.params.prompt_logprobs
            for pos, entry in zip(positions, self.sampler.prompt_logprobs(logits, targets, k)):
                parent.prompt_logprobs[pos] = entry

    def _apply_update(self, update, logprob_map, changed: dict) -> None:
        """Attach new tokens (logprobs, text, stop strings), then record scheduler finishes."""
        for request_id, tokens in update.new_token_ids.items():
            parent, sample = self._samples[request_id]
            changed[parent.request_id] = parent
            self.stats.num_generated_tokens += len(tokens)
            if sample.logprobs is not None:
                sample.logprobs.append(dict(logprob_map.get(request_id) or ()))
            if sample.detokenizer is not None:
                sample.unread.extend(tokens)
                if sample.request.params.stop:
                    _, stop = _read(sample)
                    if stop is not None:
                        self._finish_on_stop_string(sample, stop)
        for request in update.finished:
            parent, sample = self._samples[request.request_id]
            changed[parent.request_id] = parent
            if sample.finish_reason is None:
                sample.finish_reason = request.status.finish_reason
                sample.stop_reason = request.stop_reason
                _flush(sample)

    def _finish_on_stop_string(self, sample: _Sample, stop: str) -> None:
        """A stop string ends the sample as "stop" even if the scheduler just finished it for
        length in the same update (the text was cut at the stop string either way)."""
        request = sample.request
        if not request.status.is_finished:
            self.scheduler.finish(request, Status.FINISHED_STOPPED)
        request.stop_reason = stop
        sample.finish_reason = Status.FINISHED_STOPPED.finish_reason
        sample.stop_reason = stop

    def _make_output(self, parent: _Parent) -> RequestOutput:
        for sample in parent.samples:
            _read(sample)
        awaiting = self._inflight.awaiting if self._inflight is not None else {}
        completions = [
            CompletionOutput(
                index=s.index,
                text=s.detokenizer.text if s.detokenizer is not None else "",
                token_ids=_resolved_ids(s.request, awaiting),
                finish_reason=s.finish_reason,
                stop_reason=s.stop_reason,
                logprobs=list(s.logprobs) if s.logprobs is not None else None,
            )
            for s in parent.samples
        ]
        prompt_lp = None
        if parent.prompt_logprobs is not None:
            found = parent.prompt_logprobs
            prompt_lp = [None] + [found[p] for p in range(len(found)) if p in found]
        return RequestOutput(
            parent.request_id,
            parent.prompt,
            list(parent.prompt_token_ids),
            completions,
            finished=parent.finished,
            prompt_logprobs=prompt_lp,
        )

    def _forget(self, request_id: str) -> None:
        parent = self._parents.pop(request_id, None)
        if parent is None:
            return
        for sample in parent.samples:
            self._samples.pop(sample.request.request_id, None)


# A real token's stop applies to a request in these states (FINISHED_LENGTH: decided by the
# placeholder's count, but a stop token or EOS comes first in the serial order of checks).
_STOPPABLE = (Status.RUNNING, Status.WAITING, Status.PREEMPTED, Status.SWAPPED, Status.FINISHED_LENGTH)


def _span(name: str):
    """A named range in torch.profiler traces (enginespec.<phase>); near free when not profiling."""
    return torch.profiler.record_function(f"enginespec.{name}")


def _resolved_ids(request, awaiting: dict) -> list[int]:
    """The request's output ids without a trailing async placeholder."""
    ids = list(request.output_token_ids)
    return ids[:-1] if request.request_id in awaiting else ids


def _flush(sample: _Sample) -> None:
    """Settle the text of a sample that ended without a stop string (pending partial
    characters, a held-back tail that can no longer become a stop string)."""
    if sample.detokenizer is not None:
        _read(sample)
        sample.detokenizer.flush()


def _read(sample: _Sample):
    """Feed the sample's unread ids to its detokenizer: (text delta, stop string or None)."""
    if sample.detokenizer is None or not sample.unread:
        return "", None
    tokens, sample.unread = sample.unread, []
    return sample.detokenizer.update(tokens)


def _check_prompt_ids(prompt_token_ids, vocab_size: int) -> list[int]:
    try:
        ids = list(prompt_token_ids)
    except TypeError:
        raise ValueError(
            f"prompt_token_ids must be a list of ints, got {type(prompt_token_ids).__name__}"
        ) from None
    if not ids:
        raise ValueError("prompt_token_ids must not be empty")
    bad_type = [t for t in ids if not isinstance(t, int) or isinstance(t, bool)]
    if bad_type:
        raise ValueError(f"prompt_token_ids must be ints, got {bad_type[:5]!r}")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt_token_ids must be in [0, vocab_size={vocab_size}), got {bad[:5]!r}")
    return ids


def _child_params(params: SamplingParams, index: int, extra_stops: tuple[int, ...]) -> SamplingParams:
    """Sibling i's params: n = 1, seed + i when seeded; extra EOS ids as stop tokens."""
    changes = {}
    if params.n > 1:
        changes["n"] = 1
        if params.seed is not None:
            changes["seed"] = params.seed + index
    if extra_stops and not params.ignore_eos:
        changes["stop_token_ids"] = tuple(params.stop_token_ids) + tuple(
            t for t in extra_stops if t not in params.stop_token_ids
        )
    return dataclasses.replace(params, **changes) if changes else params
