"""LLM: the offline API, shaped like vLLM's so its users feel at home.

    llm = LLM("/path/to/checkpoint", max_num_seqs=8)  # impl="fast" by default
    outs = llm.generate(["Hello", {"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=8))
    outs[0].outputs[0].text

Engine arguments are vLLM's EngineArgs names plus ours (see engine_args.EngineArgs); vLLM's
everyday ones we do not implement are accepted at vLLM's defaults and any other value is a
ValueError naming them; an unknown name is a TypeError naming it. generate() adds every prompt first (all or nothing: a bad prompt
aborts the ones this call already added and re-raises), then steps the engine until they are
all finished, and returns them in prompt order.

A dict prompt may carry "cache_salt" (a str, vLLM's name): it becomes the request's cache key
(("cache_salt", salt)), so requests of different salts never share prefix-cache blocks.

vLLM's other offline calls: beam_search(prompts, BeamSearchParams(...)) runs vLLM's beam search
as a loop of one-token generate() calls (beam_search.py states the rules), and
reset_prefix_cache() empties the prefix cache between benchmark runs (False, changing nothing,
while a request holds blocks).

Threads and interleaving: one lock serialises every call into the engine (adding, one step,
aborting), and outputs a step produces for another call's requests go to that call's mailbox
(`_mail`), to be delivered when it next asks. So several threads may call generate() and
stream() on one LLM, and a half-read stream() may be followed by generate() in the same thread:
each call sees all of its own outputs (intermediate cumulative outputs of a stream may be
skipped while another call steps the engine with final_only, never the final one). Any
BaseException (KeyboardInterrupt included) while adding or stepping aborts this call's requests.
A Ctrl-C never lands inside an engine call (interrupts.py): one arriving meanwhile is raised as
KeyboardInterrupt when the call (a step, an add, an abort) has ended and its outputs are routed,
so the scheduler and block pool are always whole when the interrupted call releases its
requests; a second Ctrl-C inside the same engine call stops it at once and retires the LLM.
A release that re-enters from inside a step on the stepping thread (a half-read stream() in a
reference cycle, finalized by the cyclic garbage collector mid-step) is deferred to the step's
end: aborting requests of the batch being stepped would fail the whole step.

close() (or the end of `with LLM(...) as llm:`) ends the LLM: it takes the lock, so it waits for
a step under way, and every later call, and the next step of a call already under way (another
thread's generate(), a half-read stream()), is a RuntimeError naming close(), with that call's
requests aborted: the same on one rank as under tensor parallelism, whose workers are gone.
"""

from __future__ import annotations

import itertools
import numbers
import threading
import time
import weakref
from collections.abc import Container, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, Sequence, Union

from tqdm.auto import tqdm

from enginespec.beam_search import (
    BeamSearchInstance,
    BeamSearchOutput,
    BeamSearchParams,
    NoProgressBar,
    StepFn,
    check_beam_width,
    finish,
    run_beam_search,
)
from enginespec.chat_utils import render_chat
from enginespec.engine.engine_core import EngineCore
from enginespec.engine_args import EngineArgs
from enginespec.inputs import PromptType
from enginespec.interrupts import Critical, hold_interrupts
from enginespec.outputs import OutputView, RequestOutput
from enginespec.profiler import Profiler
from enginespec.spec import RequestOutputKind, SamplingParams

if TYPE_CHECKING:
    from enginespec.llm_engine import LLMEngine

__all__ = ["LLM", "PromptType", "check_lora_request", "check_reset_running", "prompt_to_ids"]


@dataclass
class _Front:
    """What every LLM over one EngineCore shares (LLM.from_engine may wrap an engine again):
    the lock around every call into the engine, the request-id counter (ids unique among the
    engine's live requests), the mailbox (newest undelivered output per request id), the ids of
    live requests of live calls, and whether close() was called. Per LLM instead, a second
    wrapper's ids collided with the first's and its steps dropped the first's outputs.
    `stepping` is True only inside engine.step() (under the lock, so only that thread sees
    it); `deferred` holds the ids released meanwhile, released when the step ends. `direct`:
    the live requests added through an LLMEngine (llm_engine.py), each with its OutputView
    (None: cumulative, handed over as built); they are in `owned` too, so a call's step mails
    their outputs, until LLMEngine.step hands over their final one. `critical`: the section
    every call into the engine runs in (interrupts.py: a Ctrl-C is held until it ends);
    `broken`: why the engine can no longer be trusted (a second Ctrl-C was forced through a
    section), refused by every later call."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    ids: Iterator[int] = field(default_factory=itertools.count)
    mail: dict[str, RequestOutput] = field(default_factory=dict)
    owned: set[str] = field(default_factory=set)
    closed: bool = False
    stepping: bool = False
    deferred: set[str] = field(default_factory=set)
    direct: dict[str, Optional[OutputView]] = field(default_factory=dict)
    broken: Optional[str] = None
    critical: Critical = field(init=False)

    def __post_init__(self) -> None:
        self.critical = Critical(self._forced)

    def _forced(self, exc: Optional[BaseException]) -> None:
        self.broken = (
            "this LLM was interrupted twice inside one engine call (the second Ctrl-C stopped it "
            "midway), so its engine's state is unknown: build a new LLM to generate again"
        )
        if exc is not None and hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(f"enginespec: {self.broken}")


_FRONTS: "weakref.WeakKeyDictionary[EngineCore, _Front]" = weakref.WeakKeyDictionary()
_FRONTS_LOCK = threading.Lock()


def _front_of(engine: EngineCore) -> _Front:
    """The engine's _Front, made on first use (it holds no reference to the engine, so an
    engine nobody else holds is still collected)."""
    with _FRONTS_LOCK:
        front = _FRONTS.get(engine)
        if front is None:
            front = _FRONTS[engine] = _Front()
        return front


class LLM:
    """An engine plus a tokenizer, driven to completion per call."""

    def __init__(self, model, impl="fast", **engine_args):
        args = EngineArgs.from_kwargs(model, impl=impl, **engine_args)
        self._setup(EngineCore(args))

    def _setup(self, engine: EngineCore) -> None:
        self.engine = engine
        self._front = front = _front_of(engine)  # shared with every other LLM over this engine
        self._ids, self._lock, self._mail, self._owned = front.ids, front.lock, front.mail, front.owned
        self._profiler = Profiler(engine.args.profiler_config)

    @classmethod
    def from_engine(cls, engine: EngineCore) -> "LLM":
        """Wrap an existing EngineCore (for example one built over an already loaded model).
        Every LLM over one engine shares its lock, request ids and mailbox (_Front), so their
        calls interleave as one LLM's do; closing any of them closes them all."""
        llm = cls.__new__(cls)
        llm._setup(engine)
        return llm

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() uses when given no sampling_params: SamplingParams() with the
        checkpoint's generation_config.json sampling defaults (temperature, top_p, top_k, min_p,
        repetition_penalty, max_new_tokens as max_tokens), as vLLM's LLM does."""
        return self.engine.default_sampling_params()

    def close(self) -> None:
        """Release the engine's processes (tensor-parallel workers, grammar threads) and end
        this LLM and every other over the same engine: every later call raises RuntimeError
        (_check_open), on one rank as under TP.
        Under the engine lock, so a step under way in another thread ends first (the workers
        never stop mid-step). Idempotent. Also `with LLM(...) as llm:`."""
        with self._lock:
            self._front.closed = True
            self.engine.shutdown()

    def _check_open(self) -> None:
        """RuntimeError once close() was called. Checked on entry and again under the lock
        before each add and each step, so a call racing close() fails there instead."""
        if self._front.closed:
            raise RuntimeError(
                "this LLM is closed (LLM.close() was called, or its `with` block ended): "
                "build a new LLM to generate again"
            )
        if self._front.broken:
            raise RuntimeError(self._front.broken)

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def startup_seconds(self) -> float:
        """Seconds LLM(...) took to build the engine: loading, sizing, compilation, graph
        capture and the warm-up (engine/warmup.py; EngineStats.warmup_seconds is its share)."""
        return self.engine.stats.startup_seconds

    def get_tokenizer(self):
        return self.engine.tokenizer

    @property
    def llm_engine(self) -> "LLMEngine":
        """vLLM's `llm.llm_engine`: an LLMEngine (llm_engine.py) over this LLM's engine, to add
        requests and step it one step at a time. It shares this LLM's lock, ids and mailbox, so
        its requests and this LLM's calls interleave; close() ends both."""
        from enginespec.llm_engine import LLMEngine

        return LLMEngine(self)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix block, so the next prompts are prefilled in full (vLLM's
        name and return): call it between benchmark runs to time cold prefills. True when the
        cache was emptied. False, with the cache and every block unchanged, while some request
        holds blocks (another thread's generate(), a stream() not yet read to its end): finish
        or close those first. Under the engine lock, so never in the middle of a step.
        reset_running_requests: vLLM's keyword, False only (check_reset_running)."""
        check_reset_running(reset_running_requests)
        with self._lock, self._front.critical:
            self._check_open()
            return self.engine.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (enable_sleep_mode=True): give the device memory back, between
        RLHF rollouts say. Level 1 copies the weights to host memory and frees the KV cache
        (the prefix cache is emptied: its blocks are gone); generate() raises until wake_up().
        Level 2 discards the weights instead: after wake_up, generate() raises until
        load_weights / reload_weights filled them (worker/sleep.py). A RuntimeError, changing
        nothing, without enable_sleep_mode or while a request is unfinished (another thread's
        generate(), a stream() not read to its end). Under the engine lock, so never in the
        middle of a step."""
        with self._lock, self._front.critical:
            self._check_open()
            self.engine.sleep(level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """vLLM's: restore what sleep() released: tags "weights" (their exact values) and
        "kv_cache" (an empty pool), None for both; a tag that is not asleep is left alone.
        generate() works again once every tag is awake."""
        with self._lock, self._front.critical:
            self._check_open()
            self.engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        """Whether some tag is asleep (sleep() ran and wake_up() has not restored everything)."""
        return self.engine.is_sleeping

    def load_weights(self, weights) -> int:
        """vLLM's load_weights (what RLHF frameworks call between rollouts): copy an iterable of
        (checkpoint name, tensor) pairs, names as in the checkpoint's safetensors files ("model.
        layers.0.self_attn.q_proj.weight"), any subset, into the running model, re-deriving
        everything the load derived (worker/weight_update.py); the prefix cache is emptied.
        Returns how many tensors were copied. The draft model is not updated. Under tensor
        parallelism each rank keeps its part of every tensor given whole (vLLM's rule).
        ValueError, nothing changed on any rank, for an unknown name, a wrong shape or dtype, a
        value beyond a float16 model's range; RuntimeError, nothing changed, while a request is
        unfinished or the weights sleep.
        Under the engine lock, so never in the middle of a step."""
        with self._lock, self._front.critical:
            self._check_open()
            return self.engine.load_weights(weights)

    def reload_weights(self, weights_path: Optional[str] = None) -> int:
        """vLLM's reload_weights: read the checkpoint directory (default: this LLM's model) from
        disk again and load_weights every tensor of it (its rules)."""
        with self._lock, self._front.critical:
            self._check_open()
            return self.engine.reload_weights(weights_path)

    def collective_rpc(self, method, timeout=None, args: tuple = (), kwargs: Optional[dict] = None) -> list:
        """vLLM's collective_rpc for the worker methods enginespec has: "reload_weights" (what
        RLHF code calls as llm.collective_rpc("reload_weights")) and "load_weights"; a list of
        one result per worker, as vLLM's: one, or one per tensor-parallel rank (each rank's
        count of tensors copied, the same on every rank: all take an update or none does).
        ValueError naming any other method (or a callable: no worker extensions here).
        `timeout` is accepted and unused (rank 0 runs the call in this process)."""
        calls = {"reload_weights": self.reload_weights, "load_weights": self.load_weights}
        if not isinstance(method, str) or method not in calls:
            raise ValueError(f"collective_rpc: method must be one of {sorted(calls)}, got {method!r}")
        return [calls[method](*args, **(kwargs or {}))] * self.engine.args.tensor_parallel_size

    def get_metrics(self) -> list:
        """vLLM's: a snapshot of the engine's metrics under vLLM's names and types
        (enginespec.metrics_reader, vLLM's vllm.v1.metrics.reader): request and KV gauges,
        preemption, prompt- and generated-token, prefix-cache and request_success (by finished
        reason) counters, and with a speculative_config the
        spec-decode counters and per-position Vector vLLM's spec_decode example reads. Under
        the engine lock, so never in the middle of a step."""
        from enginespec.metrics_reader import metrics_snapshot

        with self._lock:
            self._check_open()
            return metrics_snapshot(self.engine, str(self.engine.args.model))

    def start_profile(self, profile_prefix: Optional[str] = None) -> None:
        """vLLM's: trace what the engine runs from now until stop_profile() with torch.profiler,
        into profiler_config's torch_profiler_dir, else the directory VLLM_TORCH_PROFILER_DIR
        names (a RuntimeError when neither is set; profiler.py states the rules). Under the
        engine lock, so a trace starts between steps."""
        with self._lock:
            self._check_open()
            self._profiler.start(self.engine.model.device, profile_prefix)

    def stop_profile(self) -> None:
        """vLLM's: stop the trace start_profile() began and write it (a RuntimeError when none
        runs)."""
        with self._lock:
            self._profiler.stop()

    # ---- adding -------------------------------------------------------------------------------

    def _to_ids(self, prompt: PromptType) -> tuple[Optional[str], list[int]]:
        """(prompt text or None, token ids) of one prompt."""
        return prompt_to_ids(prompt, self.engine.tokenizer)

    def _add(self, prompts, sampling_params, priority, lora_request, added: list[str]) -> None:
        """Add every prompt, each id onto `added` as it goes; the caller releases `added` in
        a `finally` begun before this call, so that an error here, or a KeyboardInterrupt
        anywhere after, never leaves one of them in the engine."""
        self._check_open()
        prompts = _prompt_list(prompts)
        check_lora_request(lora_request, len(prompts))
        params = _per_prompt(sampling_params, len(prompts), "sampling_params")
        priorities = _per_prompt(priority if priority is not None else 0, len(prompts), "priority")
        for prompt, p, prio in zip(prompts, params, priorities):
            self._add_one(prompt, p, prio, added)

    def _add_one(self, prompt, params, priority, added: list, request_id=None, arrival_time=None) -> str:
        """Convert one prompt and add it to the engine as `request_id` (None: the counter's
        next free id), in `owned`. The id goes on `added` before the engine's add, so the
        caller's release rolls back an interrupt inside it; a given id that a live request
        holds is a ValueError raised before that (so the release cannot abort the holder)."""
        text, ids = self._to_ids(prompt)
        salt = _cache_key(prompt)
        with self._lock, self._front.critical:
            self._check_open()
            if request_id is None:
                request_id = self._fresh_id()
            elif request_id in self._owned or request_id in self.engine.parents:
                raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request")
            added.append(request_id)
            self._owned.add(request_id)
            self.engine.add_request(
                request_id,
                ids,
                params,
                prompt=text,
                priority=priority,
                arrival_time=arrival_time,
                cache_key=salt,
            )
        return request_id

    def _fresh_id(self) -> str:
        """The counter's next id that no live request holds (an LLMEngine's caller chooses its
        own ids, "0" as likely as any) and no undelivered output is mailed under."""
        while True:
            request_id = str(next(self._ids))
            if request_id not in self._owned and request_id not in self.engine.parents:
                return request_id

    def _release(self, ids) -> None:
        """Abort (without a report) whichever of `ids` are live, and forget their mail. Inside
        a step (re-entered on the stepping thread: a stream finalized by the garbage collector)
        only noted, and done when the step ends (_step). An id an LLMEngine holds (`direct`) is
        never touched: a finished call's late release (generate's and stream's on the way out,
        after their step loop freed the ids) may find one of its ids taken by another thread's
        LLMEngine.add_request by then; LLMEngine takes its own ids out of `direct` first."""
        with self._lock, self._front.critical:
            ids = [request_id for request_id in ids if request_id not in self._front.direct]
            if self._front.stepping:
                self._front.deferred.update(ids)
                return
            self.engine.abort(sorted(ids), report=False)
            for request_id in ids:
                self._owned.discard(request_id)
                self._mail.pop(request_id, None)

    # ---- running ------------------------------------------------------------------------------

    def generate(
        self,
        prompts,
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: Union[bool, Callable[..., tqdm]] = True,
        priority: Union[int, Sequence[int], None] = None,
        *,
        lora_request=None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; returns the final RequestOutputs in prompt order. A
        `priority` other than 0 needs scheduling_policy="priority" (a ValueError otherwise).
        use_tqdm: the progress bar over finished prompts; a callable is called in tqdm's place
        with vLLM's keyword arguments (_progress_bar; e.g. functools.partial(tqdm, file=f)).
        lora_request: vLLM's keyword, None only (check_lora_request). A Ctrl-C during an
        engine step raises KeyboardInterrupt once the step has ended (interrupts.py), and any
        exception aborts this call's requests."""
        with hold_interrupts():  # one handler for the whole call: its steps' sections only count
            ids: list[str] = []
            try:
                self._add(prompts, sampling_params, priority, lora_request, ids)
                return self._generate(ids, use_tqdm)
            finally:
                self._release(ids)  # a no-op unless interrupted: every request finished

    def _generate(self, ids: list[str], use_tqdm) -> list[RequestOutput]:
        """generate()'s loop over its added requests `ids` (generate() releases them)."""
        finals: dict[str, RequestOutput] = {}
        start, num_out = time.perf_counter(), 0
        bar = None
        try:
            bar = _progress_bar(use_tqdm, len(ids))
            for step_outputs in self._run(ids, final_only=True):
                for out in step_outputs:
                    if out.finished:
                        finals[out.request_id] = out
                        num_out += out.num_output_tokens
                        bar.update(1)
                elapsed = max(time.perf_counter() - start, 1e-9)
                bar.set_postfix_str(f"output {num_out / elapsed:.1f} tok/s", refresh=False)
        finally:
            if bar is not None:
                bar.close()
        return [finals[i] for i in ids]

    def stream(
        self, prompts, sampling_params=None, priority: Union[int, Sequence[int], None] = None
    ) -> Iterator[list[RequestOutput]]:
        """Yield, after every engine step, the outputs of this call's requests that changed in
        it, as each request's params' output_kind asks (outputs.OutputView: cumulative by
        default, DELTA, FINAL_ONLY; a step none of them shows yields nothing). Closing the
        generator early aborts the requests still running."""
        ids: list[str] = []
        try:
            self._add(prompts, sampling_params, priority, None, ids)
            params = _per_prompt(sampling_params, len(ids), "sampling_params")
            # the engine builds new outputs every step: a cumulative one goes out as it is
            views = {
                rid: OutputView(p.output_kind)
                for rid, p in zip(ids, params)
                if p is not None and p.output_kind != RequestOutputKind.CUMULATIVE
            }
            for outs in self._run(ids):
                shown = [o if o.request_id not in views else views[o.request_id].view(o) for o in outs]
                shown = [o for o in shown if o is not None]
                if shown:
                    yield shown
        finally:
            self._release(ids)

    def _run(self, ids: list[str], final_only: bool = False) -> Iterator[list[RequestOutput]]:
        live = set(ids)
        try:
            while live:
                outs = self._next(live, final_only)
                live -= {o.request_id for o in outs if o.finished}
                if outs:
                    yield outs
        finally:
            if live:
                self._release(live)
            with self._lock:
                self._owned.difference_update(ids)

    def _next(self, live: set[str], final_only: bool) -> list[RequestOutput]:
        """This call's outputs: its mail if any, else one engine step (under the lock; the
        step's outputs for other calls' requests go to their mail). A Ctrl-C during it is
        raised once they are routed (interrupts.py)."""
        with self._lock, self._front.critical:
            self._check_open()
            outs = [self._mail.pop(rid) for rid in sorted(live) if rid in self._mail]
            if outs:
                return outs
            if not self.engine.has_unfinished:
                raise RuntimeError(f"engine went idle with requests {sorted(live)} unfinished (a bug)")
            return self._step_routed(live, final_only)

    def _step_routed(self, mine: Container[str], final_only: bool) -> list[RequestOutput]:
        """One engine step (the caller holds the lock): the outputs of `mine` are returned,
        those of other owned requests go to their mail, the rest are dropped (released
        requests); the releases deferred during the step are done after it."""
        outs = []
        for out in self._step(final_only):
            if out.request_id in mine:
                outs.append(out)
            elif out.request_id in self._owned:
                self._mail[out.request_id] = out
        self._release_deferred()
        return outs

    def _step(self, final_only: bool) -> list[RequestOutput]:
        """engine.step() with `stepping` set, so a release re-entering meanwhile is deferred."""
        front = self._front
        front.stepping = True
        try:
            return self.engine.step(final_only)
        except BaseException as exc:
            front.stepping = False
            try:
                self._release_deferred()  # no outputs to hand out: release them now
            except Exception as release_error:  # the step's own error is the one to raise
                if hasattr(exc, "add_note"):  # Python 3.11+
                    exc.add_note(
                        f"releasing the requests deferred during the step also failed: {release_error!r}"
                    )
            raise
        finally:
            front.stepping = False

    def _release_deferred(self) -> None:
        """Release the ids whose release came in during the last step (after its outputs were
        handed out, so a released request's output goes to nobody's mail)."""
        front = self._front
        if front.deferred:
            ids, front.deferred = front.deferred, set()
            self._release(ids)

    def beam_search(
        self,
        prompts,
        params: BeamSearchParams,
        lora_request=None,
        use_tqdm: bool = False,
        concurrency_limit: Optional[int] = None,
    ) -> list[BeamSearchOutput]:
        """Beam search of every prompt (a list of prompts as generate() takes them, or one),
        by vLLM's rules (beam_search.py's module doc): one BeamSearchOutput per prompt, in
        prompt order, each with its best params.beam_width sequences, best first. Each step is
        one generate() of every live beam for one token with 2 * beam_width logprobs, so the
        beams' shared prefixes come from the prefix cache. A dict prompt's cache_salt carries to
        every step. use_tqdm shows token steps (vLLM's default: off); concurrency_limit searches
        that many prompts at a time (None: all). The parameters are vLLM's, in its order
        (lora_request third). A ValueError, before any step, for params that are not BeamSearchParams,
        a beam_width over half the engine's max_logprobs or vocabulary, a bad concurrency_limit, or a
        lora_request other than None (check_lora_request); a bad prompt fails the first step's
        generate() as it would fail generate(). A closed LLM is a RuntimeError (close())."""
        self._check_open()
        prompts = _prompt_list(prompts)
        check_lora_request(lora_request, len(prompts))
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        check_beam_width(params, self.engine.max_logprobs, self.engine.vocab_size)
        instances = [self._beam_instance(p, params.max_tokens) for p in prompts]
        eos = self._beam_eos_id()
        step = self._beam_step_fn(params)
        run_beam_search(instances, step, params, eos, use_tqdm=use_tqdm, concurrency_limit=concurrency_limit)
        tokenizer = self.engine.tokenizer
        decode = tokenizer.decode if tokenizer is not None else None
        return [finish(instance, params, eos, decode) for instance in instances]

    def _beam_instance(self, prompt: PromptType, max_tokens: int) -> BeamSearchInstance:
        """A prompt's search: its ids, its cache salt, and at most max_tokens steps, fewer where
        max_model_len leaves less room (a prompt that leaves none fails the first step's
        generate() with the engine's own error)."""
        _, ids = self._to_ids(prompt)
        salt = _cache_key(prompt)
        room = max(self.engine.max_model_len - len(ids), 1)
        return BeamSearchInstance(ids, min(max_tokens, room), salt[1] if salt else None)

    def _beam_eos_id(self) -> Optional[int]:
        """The id that ends a beam: the tokenizer's eos_token_id (vLLM's choice: the further EOS
        ids of generation_config.json do not end a beam), or the model's without a tokenizer."""
        eos = getattr(self.engine.tokenizer, "eos_token_id", None)
        return eos if eos is not None else getattr(self.engine.model, "eos_token_id", None)

    def _beam_step_fn(self, params: BeamSearchParams) -> StepFn:
        """beam_search.StepFn over generate(): one token of every beam, its logprob dict the
        candidates. A step the engine failed (finish_reason "error") is a RuntimeError."""
        sampling = SamplingParams(
            max_tokens=1, logprobs=2 * params.beam_width, temperature=params.temperature
        )

        def step(batch):
            prompts = [
                {"prompt_token_ids": ids, **({"cache_salt": salt} if salt is not None else {})}
                for ids, salt in batch
            ]
            results = []
            for out in self.generate(prompts, sampling, use_tqdm=False):
                sample = out.outputs[0]
                if sample.finish_reason == "error":
                    raise RuntimeError(f"beam search: the engine failed a step: {sample.error}")
                results.append(sample.logprobs[0] if sample.logprobs else None)
            return results

        return step

    def chat(
        self,
        messages,
        sampling_params=None,
        use_tqdm: Union[bool, Callable[..., tqdm]] = True,
        *,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Optional[dict] = None,
        tools: Optional[list] = None,
        lora_request=None,
        chat_template_content_format: str = "auto",
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"} dicts) or to a
        list of conversations, each rendered by chat_utils.render_chat (vLLM's names and rules):
        content parts are flattened to text, or kept as text parts for a template that loops over
        them (a non-text part is a ValueError); chat_template, a
        Jinja string, replaces the tokenizer's; continue_final_message=True (with
        add_generation_prompt=False) ends the prompt inside the last, assistant, message so the
        reply continues it; chat_template_kwargs are extra template variables; tools (OpenAI's
        function tools) go to the template, the reply comes back as text (vLLM's LLM.chat parses
        no tool calls either); chat_template_content_format ("auto", "string", "openai") is how
        the content reaches the template ("auto": as parts for a template that loops over them).
        These six are keyword-only (vLLM's fourth positional is
        lora_request, taken here as a keyword: None only, check_lora_request). Every
        conversation is rendered before any is generated, so a bad one fails the call."""
        if not isinstance(messages, (list, tuple)):
            raise ValueError(
                f"messages must be a conversation (a list of message dicts) or a list of conversations, "
                f"got {type(messages).__name__}"
            )
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        options = dict(
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
            tools=tools,
            chat_template_content_format=chat_template_content_format,
        )
        tokenizer = self.engine.tokenizer
        prompts = []
        for conversation in conversations:
            text = render_chat(tokenizer, conversation, **options)
            prompts.append(
                {"prompt": text, "prompt_token_ids": list(tokenizer.encode(text, add_special_tokens=False))}
            )
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)


_PROMPT_KEYS = {"prompt", "prompt_token_ids", "cache_salt"}


def prompt_to_ids(prompt: PromptType, tokenizer) -> tuple[Optional[str], list[int]]:
    """(prompt text or None, token ids) of one prompt as vLLM takes it: a str (encoded with
    `tokenizer`, which must exist), a list of token ids, or a dict with "prompt_token_ids" or
    "prompt" (and optionally "cache_salt"). Anything else is a ValueError naming what it got."""
    if isinstance(prompt, dict):
        return _dict_prompt_to_ids(prompt, tokenizer)
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(
                "text prompts need a tokenizer; this checkpoint has none (pass {'prompt_token_ids': [...]})"
            )
        ids = list(tokenizer.encode(prompt))
        if not ids:  # the engine's refusal would name prompt_token_ids, which the caller never gave
            raise ValueError(f"the prompt {prompt!r} encodes to no tokens; a prompt needs at least one")
        return prompt, ids
    if isinstance(prompt, (list, tuple)) and all(_is_token(t) for t in prompt):
        return None, list(prompt)
    raise ValueError(
        f"a prompt must be a str, a list of token ids or a dict with 'prompt_token_ids', "
        f"got {type(prompt).__name__}"
    )


def _dict_prompt_to_ids(prompt: dict, tokenizer) -> tuple[Optional[str], list[int]]:
    """prompt_to_ids of a TextPrompt or TokensPrompt: "prompt_token_ids" (any sequence of ids:
    a list, a tuple, a numpy array) wins, with "prompt" as its text where given; else "prompt",
    the text to encode. "prompt" must be a str (None too beside ids) and "prompt_token_ids" no
    str, mapping, set or scalar: a ValueError naming the key, where list() would fail with a
    bare TypeError or read a dict's keys as the prompt."""
    unknown = set(prompt) - _PROMPT_KEYS
    if unknown:
        raise ValueError(f"unknown prompt keys {sorted(unknown)}; allowed: {sorted(_PROMPT_KEYS)}")
    text = prompt.get("prompt")
    if "prompt_token_ids" in prompt:
        ids = prompt["prompt_token_ids"]
        if isinstance(ids, (str, bytes, Mapping, AbstractSet)) or not isinstance(ids, Iterable):
            raise ValueError(f"prompt_token_ids must be a list of token ids, got {type(ids).__name__}")
        if text is not None and not isinstance(text, str):
            raise _prompt_text_error(text)
        return text, list(ids)
    if "prompt" in prompt:
        if not isinstance(text, str):
            raise _prompt_text_error(text)
        return prompt_to_ids(text, tokenizer)
    raise ValueError(f"a dict prompt needs 'prompt_token_ids' or 'prompt', got keys {sorted(prompt)}")


def _prompt_text_error(text) -> ValueError:
    return ValueError(f"a dict prompt's 'prompt' must be a str (its text), got {type(text).__name__}")


def _prompt_list(prompts) -> list:
    """The prompts of a call: one prompt (a str, a dict, a list of token ids) as a list of one,
    any other iterable as a list. Anything else (None, a number) is a ValueError naming
    `prompts`, not the bare "not iterable" TypeError of list()."""
    if isinstance(prompts, (str, dict)) or (
        isinstance(prompts, (list, tuple)) and prompts and all(_is_token(t) for t in prompts)
    ):
        return [prompts]
    if not isinstance(prompts, Iterable):
        raise ValueError(
            f"prompts must be one prompt (a str, a dict, a list of token ids) or a list of prompts, "
            f"got {type(prompts).__name__}"
        )
    return list(prompts)


def _is_token(t) -> bool:
    return isinstance(t, numbers.Integral) and not isinstance(t, bool)


def _cache_key(prompt) -> tuple:
    """The request's cache key: ("cache_salt", salt) for a dict prompt with a str cache_salt,
    else () (shared with every unsalted request)."""
    if not isinstance(prompt, dict) or prompt.get("cache_salt") is None:
        return ()
    salt = prompt["cache_salt"]
    if not isinstance(salt, str) or not salt:
        raise ValueError(f"cache_salt must be a non-empty str, got {salt!r}")
    return ("cache_salt", salt)


def check_lora_request(lora_request, count: int) -> None:
    """vLLM's lora_request as this engine takes it: None, or one None per prompt (a list of
    `count`), which is what programs pass that load no adapter. An adapter is a ValueError
    naming lora_request: no LoRA adapters are loaded here (EngineArgs takes enable_lora=False
    only), and running the base model instead would answer with other weights than asked."""
    for lora in _per_prompt(lora_request, count, "lora_request"):
        if lora is not None:
            raise ValueError(
                f"lora_request is not supported by enginespec (no LoRA adapters; enable_lora is False "
                f"only): pass None, got {lora!r}"
            )


def _progress_bar(use_tqdm, total: int):
    """generate()'s bar over `total` prompts. A callable use_tqdm is called as vLLM calls it,
    with total, desc, dynamic_ncols and postfix and nothing more: keywords a
    functools.partial bound (disable, unit, file) stay the caller's, and a bar function written
    for vLLM's four takes ours. True: tqdm's own bar; False: no bar at all (NoProgressBar: not
    even a disabled tqdm, whose monitor thread would outlive the call), as vLLM makes none."""
    postfix = f"output {0.0:.1f} tok/s"
    if not use_tqdm:
        return NoProgressBar()
    if callable(use_tqdm):
        return use_tqdm(total=total, desc="Processed prompts", dynamic_ncols=True, postfix=postfix)
    return tqdm(
        total=total,
        desc="Processed prompts",
        unit="req",
        dynamic_ncols=True,
        postfix=postfix,
    )


def check_reset_running(reset_running_requests) -> None:
    """vLLM's reset_prefix_cache(reset_running_requests=...) as this engine takes it: False.
    True asks to preempt every running request so that the cache empties at once; no impl's
    Scheduler offers that preemption (spec/scheduler.py preempts only to make room), so it is a
    ValueError naming the keyword, where ignoring it would leave the cache full while the
    caller believes it emptied."""
    if reset_running_requests is not False:
        raise ValueError(
            "reset_running_requests is not supported by enginespec (it cannot preempt the running "
            "requests to empty the cache): pass False, and reset once no request holds blocks "
            f"(reset_prefix_cache returns False until then), got {reset_running_requests!r}"
        )


def _per_prompt(value, count: int, name: str) -> list:
    """One value per prompt: a single value is repeated, a list must have one per prompt."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{name}: got {len(value)} values for {count} prompts")
        return list(value)
    return [value] * count
