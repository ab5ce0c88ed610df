"""LLMEngine: vLLM's step-by-step engine API, for programs that drive the loop themselves.

    engine = LLMEngine.from_engine_args(EngineArgs(model="/path/to/checkpoint"))
    engine.add_request("0", "Hello", SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                print(out.request_id, out.outputs[0].text)

A facade over an LLM (api/llm.py), not a second front end: prompts are converted, checked and
added by LLM's own code (_add_one), steps run through LLM's (_step_routed), and every LLMEngine
over one EngineCore shares that engine's _Front with its LLMs (lock, mailbox, closed flag).

Invariants:
- `add_request(request_id, prompt, params)` takes what LLM.generate takes for one prompt (a str,
  token ids, a TextPrompt / TokensPrompt dict with cache_salt); params None means the
  checkpoint's generation-config defaults, as generate(). Any error (a ValueError for a bad
  prompt or params, or for a request_id an unfinished request holds) leaves nothing queued.
- `step()` runs one engine step and returns the outputs of this engine's requests that changed,
  one RequestOutput per request (its n completions inside), as each request's output_kind asks
  (outputs.OutputView): CUMULATIVE (the default) everything so far, DELTA only what is new
  (concatenating a request's deltas gives its cumulative output), FINAL_ONLY only the finished
  output. A request's last output has `finished` True; after it the request is forgotten.
- Outputs a concurrent LLM.generate / stream step produced for this engine's requests wait in
  the mailbox and come with the next step() (only the finished ones, when that call stepped
  with final_only: cumulative and DELTA outputs still add up); ids of those calls' requests are
  theirs: step() never returns them, abort_request() never touches them.
- `abort_request(ids)` (a str or an iterable) frees the requests at once, blocks included, and
  they produce no further output (vLLM's); unknown ids are ignored.
- `reset_prefix_cache()`, `start_profile()`, `stop_profile()`, `get_metrics()`, `sleep()`,
  `wake_up()`, `is_sleeping()`, `load_weights()`, `reload_weights()`: the LLM's calls, under
  its lock (between two steps).
"""

from __future__ import annotations

import numbers
import time
from typing import Iterable, Optional, Union

from enginespec.engine.engine_core import EngineCore
from enginespec.engine_args import EngineArgs
from enginespec.inputs import PromptType
from enginespec.llm import LLM, check_lora_request
from enginespec.outputs import OutputView, RequestOutput
from enginespec.spec import RequestOutputKind, SamplingParams

__all__ = ["LLMEngine"]


class LLMEngine:
    """An EngineCore stepped by its caller, through an LLM's machinery (module doc)."""

    def __init__(self, llm: LLM):
        self._llm = llm

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLMEngine":
        """vLLM's constructor: build the engine of `engine_args` (impl="fast" by default)."""
        if not isinstance(engine_args, EngineArgs):
            raise ValueError(f"engine_args must be an EngineArgs, got {type(engine_args).__name__}")
        return cls(LLM.from_engine(EngineCore(engine_args)))

    @property
    def engine(self) -> EngineCore:
        return self._llm.engine

    def get_tokenizer(self):
        return self._llm.get_tokenizer()

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: Optional[SamplingParams] = None,
        arrival_time: Optional[float] = None,
        lora_request=None,
        *,
        priority: int = 0,
    ) -> None:
        """Queue one request under `request_id` (a non-empty str no unfinished request holds).
        vLLM's parameters in its order up to lora_request (None only: check_lora_request);
        priority (vLLM's keyword) other than 0 needs scheduling_policy="priority".
        arrival_time is vLLM's, a time.time() timestamp (None: now), put on the engine's own
        clock (_engine_clock) so it orders against requests added without one."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        check_lora_request(lora_request, 1)
        llm = self._llm
        view = _view_of(params)
        arrival = _engine_clock(arrival_time)
        with llm._lock:  # reentrant: _add_one takes it again; `direct` is set in the same hold
            added: list[str] = []
            try:
                with llm._front.critical:  # a Ctrl-C meanwhile comes after `direct` is set
                    llm._add_one(prompt, params, priority, added, request_id, arrival)
                    llm._front.direct[request_id] = view
            except BaseException:  # nothing stays queued, a KeyboardInterrupt's add included
                if added:  # (else the id may be another request's, in use)
                    llm._front.direct.pop(request_id, None)
                llm._release(added)
                raise

    def step(self) -> list[RequestOutput]:
        """One engine step (none while the engine is idle); the outputs of this engine's
        requests that changed in it or were mailed to them meanwhile (module doc)."""
        llm, front = self._llm, self._llm._front
        with llm._lock:
            llm._check_open()
            if llm.engine.has_unfinished:
                # every output goes to the mail first, this engine's too, and is taken after: a
                # step that raises, or a Ctrl-C held until its end (interrupts.py), leaves them
                # there for the next step() (returned from the step, they were lost with it)
                with front.critical:
                    llm._step_routed((), final_only=False)
            # taking them is a section too: a Ctrl-C here loses what this call would return,
            # as one right after it would, but never leaves a request half delivered (its
            # final output gone, its id still unfinished: the caller's loop spun forever)
            with front.critical:
                found = [front.mail.pop(rid) for rid in list(front.direct) if rid in front.mail]
                return [shown for out in found if (shown := self._deliver(out)) is not None]

    def _deliver(self, out: RequestOutput) -> Optional[RequestOutput]:
        """`out` as its request's output_kind shows it (None: nothing to show); a finished
        request leaves `direct` and `owned`, so its id is free again."""
        front = self._llm._front
        view = front.direct.get(out.request_id)
        if out.finished:
            front.direct.pop(out.request_id, None)
            front.owned.discard(out.request_id)
        return out if view is None else view.view(out)

    def abort_request(self, request_ids: Union[str, Iterable[str]]) -> None:
        """Abort this engine's requests among `request_ids` (a str or an iterable): their
        blocks are freed and they produce no more outputs. Unknown ids are ignored."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        llm = self._llm
        with llm._lock:
            mine = [rid for rid in ids if rid in llm._front.direct]
            for rid in mine:
                del llm._front.direct[rid]
            llm._release(mine)

    def has_unfinished_requests(self) -> bool:
        """True while a request added here has not had its final output returned by step()."""
        return bool(self._llm._front.direct)

    def get_num_unfinished_requests(self) -> int:
        return len(self._llm._front.direct)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM's: LLM.reset_prefix_cache on this engine (False, changing nothing, while a
        request holds blocks; reset_running_requests False only, llm.check_reset_running)."""
        return self._llm.reset_prefix_cache(reset_running_requests)

    def sleep(self, level: int = 1) -> None:
        """vLLM's: LLM.sleep on this engine."""
        self._llm.sleep(level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """vLLM's: LLM.wake_up on this engine."""
        self._llm.wake_up(tags)

    def is_sleeping(self) -> bool:
        """vLLM's: whether the engine sleeps (LLM.is_sleeping)."""
        return self._llm.is_sleeping()

    def load_weights(self, weights) -> int:
        """LLM.load_weights on this engine."""
        return self._llm.load_weights(weights)

    def reload_weights(self, weights_path: Optional[str] = None) -> int:
        """vLLM's reload_weights: LLM.reload_weights on this engine."""
        return self._llm.reload_weights(weights_path)

    def start_profile(self, profile_prefix: Optional[str] = None) -> None:
        """vLLM's: LLM.start_profile on this engine (api/profiler.py states the rules)."""
        self._llm.start_profile(profile_prefix)

    def stop_profile(self) -> None:
        """vLLM's: LLM.stop_profile, writing the trace start_profile began."""
        self._llm.stop_profile()

    def get_metrics(self) -> list:
        """vLLM's: the engine's metrics snapshot (LLM.get_metrics, enginespec.metrics_reader)."""
        return self._llm.get_metrics()


def _engine_clock(arrival_time):
    """A time.time() arrival_time (vLLM's clock) on the engine's, time.monotonic() (the default
    every Request takes, spec.request.check_request_args): passed on unconverted, a wall-clock
    arrival (about 1.7e9) sorted after every request added without one (the seconds since boot),
    so FCFS ran those first whatever came first. None, and anything not a real number (the
    engine's ValueError names it), pass unchanged."""
    if arrival_time is None or isinstance(arrival_time, bool) or not isinstance(arrival_time, numbers.Real):
        return arrival_time
    return float(arrival_time) - time.time() + time.monotonic()


def _view_of(params: Optional[SamplingParams]) -> Optional[OutputView]:
    """The OutputView a request's output_kind needs; None for cumulative (handed over as the
    engine built it: a new RequestOutput every step)."""
    kind = getattr(params, "output_kind", RequestOutputKind.CUMULATIVE)
    return None if kind == RequestOutputKind.CUMULATIVE else OutputView(kind)
