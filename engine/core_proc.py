"""The engine-core loop: an EngineCore in a busy loop of its own, fed through a Connection.

`enginespec serve` spawns a process that builds the EngineCore (it owns the device and the
model) and runs EngineCoreProc.run: take every pending command without blocking, run one step,
send that step's news as one message of per-sample deltas (engine/core_messages.py), again;
block on the input only when there is nothing to step. The HTTP front end, its JSON and its
detokenization run in another process, so the GPU never waits for them (one GIL each).

Text: the engine detokenizes only the samples whose stop strings it must match as tokens
arrive (the rules stay in engine/detokenizer.py, applied once); it sends their text up to the
point no later token can cut. Every other sample's ids are decoded by the front end.

Invariants:
- An abort taken between two steps frees its blocks before the next step (commands are taken
  while paused or idle too).
- Every added request gets exactly one final delta per sample, or one entry in `failed`, or
  (aborted) nothing.
- An add with a structured-output request is parked until its grammars compile on the
  engine's grammar threads (EngineCore.prepare_grammar): the other requests step meanwhile,
  and other adds' grammars compile beside it. It is
  then added whole, or refused whole with the compile's error; an abort drops its requests.
- A step that raises (a bug, or a dead tensor-parallel rank: EngineCore contains its other
  faults) fails every request the front end still waits on, those the step itself finished
  included (their outputs went with the exception), and the loop goes on unless the engine is
  dead (EngineCore.dead: a tensor-parallel rank died). An idle loop also wakes when a
  tensor-parallel worker exits (EngineCore.poll_dead). The loop ends on "shutdown", when the
  front end is gone (EOF on the input, a broken output pipe), so the engine never outlives
  its server, and once the engine is dead, after that step's failures went out: the front end
  then sees the engine die (the server's /health fails and it exits) rather than an engine
  that accepts every request and fails each.
- A SIGTERM the engine process gets while it serves and its front end lives (one to the whole
  process group) is left to the front end, which drains its requests first (TermSignal).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import multiprocessing.connection
import os
import queue
import signal
import sys
import threading
import time
import traceback
from typing import Optional

from enginespec.engine.core_messages import (
    EngineInfo,
    EngineState,
    ErrorInfo,
    NewRequest,
)
from enginespec.engine.output_processor import prompt_logprob_entries
from enginespec.engine.spec_decode.stats import SpecDecodeStats
from enginespec.profiler import Profiler


class InjectedFault(RuntimeError):
    """The failure ("call", token, "fail_next") plants in the next step (tests of the 500s)."""


class DeltaTracker:
    """What has been sent of each live sample: [token ids sent, chars of engine text sent,
    engine text?] per sample, or None once its final delta went out."""

    def __init__(self, engine):
        self.engine = engine
        self.placeholder = engine.vocab_size  # async scheduling's not-yet-known token
        self._sent: dict[str, list] = {}
        self._prompt_sent: set[str] = set()  # requests whose prompt logprobs went out live

    def add(self, request_id: str) -> None:
        """Track a request the engine just accepted. Samples without stop strings lose their
        engine-side detokenizer: the front end decodes them (one decode per token, not two)."""
        parent = self.engine.parents[request_id]
        sent = []
        for sample in parent.samples:
            has_text = bool(sample.request.params.stop) and sample.detokenizer is not None
            if not has_text:
                sample.detokenizer = None
            sent.append([0, 0, has_text])
        self._sent[request_id] = sent

    def drop(self, request_id: str) -> None:
        self._sent.pop(request_id, None)
        self._prompt_sent.discard(request_id)

    def live(self) -> list[str]:
        """The tracked requests whose final delta has not gone out: every one the front end
        still waits on (the engine may have forgotten some: a step that raised after finishing
        them, as a dead tensor-parallel rank's does, took their outputs with it)."""
        return list(self._sent)

    def collect(self, finals: list) -> list[tuple]:
        """The deltas of this step: from the finished RequestOutputs step() returned (their
        parents are gone from the engine), then from every live sample with news."""
        out: list[tuple] = []
        for final in finals:
            sent = self._sent.pop(final.request_id, None)
            if final.request_id in self._prompt_sent:
                self._prompt_sent.discard(final.request_id)
                final = dataclasses.replace(final, prompt_logprobs=None)
            if sent is not None:
                self._final_deltas(final, sent, out)
        for request_id, parent in self.engine.parents.items():
            sent = self._sent.get(request_id)
            if sent is None:
                continue
            for sample in parent.samples:
                if sent[sample.index] is not None:
                    delta = self._live_delta(request_id, parent, sample, sent)
                    if delta is not None:
                        out.append(delta)
        return out

    def _final_deltas(self, final, sent: list, out: list) -> None:
        for c in final.outputs:
            s = sent[c.index]
            prompt_lp = final.prompt_logprobs if c.index == 0 else None
            if s is None and prompt_lp is None:
                continue
            cached = final.num_cached_tokens if c.index == 0 else None
            if s is None:  # finish already sent (n > 1): only the prompt logprobs are news
                out.append((final.request_id, c.index, [], None, None, None, None, None, prompt_lp, cached))
                continue
            new = c.token_ids[s[0] :]
            lps = c.logprobs[s[0] :] if c.logprobs is not None else None
            text = c.text[s[1] :] if s[2] else None
            row = (final.request_id, c.index, new, lps, text, c.finish_reason, c.stop_reason, c.error)
            out.append((*row, prompt_lp, cached))

    def _live_prompt_logprobs(self, request_id: str, parent) -> Optional[list]:
        """The request's prompt logprobs (RequestOutput.prompt_logprobs' list) the first time
        its first sample sends output ids, else None. By then its prompt was computed in full
        and every entry stored (the engine checks it), so they go out with the request's first
        output, as vLLM hands them, not with its last (a consumer that stops reading early had
        none); the final delta then does not repeat them."""
        if parent.prompt_logprobs is None or request_id in self._prompt_sent:
            return None
        self._prompt_sent.add(request_id)
        return [None] + prompt_logprob_entries(parent)

    def _live_delta(self, request_id: str, parent, sample, sent: list) -> Optional[tuple]:
        s = sent[sample.index]
        request = sample.request
        ids = request.token_ids
        start, end = request.num_prompt_tokens + s[0], len(ids)
        if sample.num_visible is not None:  # none past the id that completed a stop string
            end = max(start, min(end, request.num_prompt_tokens + sample.num_visible))
        while end > start and ids[end - 1] == self.placeholder:
            end -= 1
        finish = sample.finish_reason
        text = None
        if s[2] and sample.detokenizer is not None:
            shown = sample.detokenizer.shown_text(finish is not None)
            safe = len(shown)
            text = shown[s[1] : safe] if safe > s[1] else ""
            s[1] = max(s[1], safe)
        if end == start and not text and finish is None:
            return None
        lps = sample.logprobs[s[0] : s[0] + end - start] if sample.logprobs is not None else None
        s[0] += end - start
        stop = None
        if finish is not None:
            sent[sample.index] = None
            stop = sample.stop_reason
        cached = sample.num_cached_tokens if sample.index == 0 else None
        prompt_lp = (
            self._live_prompt_logprobs(request_id, parent) if sample.index == 0 and end > start else None
        )
        row = (request_id, sample.index, ids[start:end], lps, text, finish, stop, sample.error)
        return (*row, prompt_lp, cached)


def engine_state(engine, paused: bool, num_parked: int = 0) -> EngineState:
    """The snapshot sent with a message. num_waiting is the scheduler's waiting queue plus the
    num_parked samples of adds parked while their grammars compile (vLLM keeps such a request
    in its waiting queue, so vllm:num_requests_waiting counts it there too)."""
    bm = engine.block_manager
    return EngineState(
        num_blocks=bm.num_blocks,
        num_free_blocks=bm.num_free,
        num_running=len(engine.scheduler.running),
        num_waiting=len(engine.scheduler.waiting) + num_parked,
        num_unfinished=engine.num_unfinished,
        num_steps=engine.stats.num_steps,
        num_generated_tokens=engine.stats.num_generated_tokens,
        kv_cache_usage=float(bm.usage),
        paused=paused,
        num_preemptions=engine.stats.num_preemptions,
        num_prefix_queries=engine.stats.num_prefix_queries,
        num_prefix_hits=engine.stats.num_prefix_hits,
        num_prompt_tokens=engine.stats.num_prompt_tokens,
        num_prompt_cached_tokens=engine.stats.num_prompt_cached_tokens,
        spec_decode=_copy_spec_decode(engine.stats),
    )


def _copy_spec_decode(stats) -> Optional[SpecDecodeStats]:
    """A snapshot of the engine's cumulative spec-decode counters: the sender thread pickles
    the message later, while the engine goes on counting."""
    live = getattr(stats, "spec_decode", None)
    if live is None:
        return None
    return dataclasses.replace(
        live, drafts_per_pos=list(live.drafts_per_pos), accepted_per_pos=list(live.accepted_per_pos)
    )


def engine_info(engine) -> EngineInfo:
    args = engine.args
    return EngineInfo(
        engine.vocab_size,
        engine.max_model_len,
        engine.block_manager.num_blocks,
        args.block_size,
        args.max_num_seqs,
        os.getpid(),
        getattr(engine.model, "eos_token_id", None),
        engine.num_draft_positions,
    )


class PipeSender:
    """Sends messages on a Connection from a thread of its own, so a reader that is slow (its
    pipe full) never stalls the sender's loop: the engine's step loop, or the server's event
    loop. Pickling happens on that thread too. Messages keep their order; `broken` is set once
    the other side is gone, and send() then raises BrokenPipeError."""

    def __init__(self, outbox):
        self.outbox = outbox
        self.broken = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="enginespec-pipe-sender", daemon=True)
        self._thread.start()

    def send(self, msg: tuple) -> None:
        if self.broken:
            raise BrokenPipeError("the front end is gone")
        self._queue.put(msg)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (msg := self._queue.get()) is not None:
            try:
                self.outbox.send(msg)
            except OSError:
                self.broken = True
                return


#: How long the loop sleeps on its input, when it has nothing to step, between looks at the
#: parked adds' compiles.
PARKED_POLL_S = 0.002


@dataclasses.dataclass(eq=False)
class ParkedAdd:
    """An add command whose requests wait for their grammars (Futures of prepare_grammar)."""

    token: int
    requests: list
    futures: list

    def ready(self) -> bool:
        """Every compile is done, or no request is left (all aborted): the add can be settled."""
        return not self.requests or all(f.done() for f in self.futures)

    def error(self) -> Optional[BaseException]:
        """The first compile's exception (the add is refused with it), or None; None too once
        every request was aborted (nothing is left to refuse). Never waits: a compile still
        under way (an aborted request's) is not asked, as Future.exception() would block the
        engine loop until it ends."""
        if not self.requests:
            return None
        for future in self.futures:
            if future.done() and future.exception() is not None:
                return future.exception()
        return None


class EngineCoreProc:
    """The busy loop over one EngineCore; see the module docstring."""

    def __init__(self, engine, inbox, outbox):
        self.engine = engine
        self.inbox = inbox
        self.outbox = PipeSender(outbox)
        self.tracker = DeltaTracker(engine)
        self._salt_kw = "cache_salt" in inspect.signature(engine.add_request).parameters
        self._paused = False
        self._fail_next = False
        self._stop = False
        self._failed: list[tuple] = []
        self._replies: list[tuple] = []
        self._parked: list[ParkedAdd] = []
        self._profiler = Profiler(getattr(engine.args, "profiler_config", None))  # the model runs here

    def run(self) -> None:
        """Until ("shutdown",) or until the front end is gone (EOF, broken pipe)."""
        try:
            while not self._stop:
                if self._paused or not self.engine.has_unfinished:
                    self._wait_idle()
                    if self._died_idle():
                        break
                took = self._take_commands()
                took = self._release_parked() or took
                if self._stop:
                    break
                step_start = deltas = None
                if not self._paused and self.engine.has_unfinished:
                    step_start = time.monotonic()
                    deltas = self._step()
                if took or deltas is not None:
                    self._send(deltas or [], step_start)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass  # the front end is gone: so is the engine
        finally:
            try:
                self._profiler.close()  # a profile still running: its trace is written now
            finally:
                self.outbox.close()

    def _wait_idle(self) -> None:
        """Sleep until a command (or EOF) arrives, a tensor-parallel worker exits, or it is time
        to look at the parked compiles again."""
        handles = [self.inbox, *getattr(self.engine, "worker_sentinels", ())]
        multiprocessing.connection.wait(handles, PARKED_POLL_S if self._parked else None)

    def _died_idle(self) -> bool:
        """Whether a tensor-parallel worker died while the loop was idle: then every request the
        front end waits on (a paused engine's) fails with the death, and the loop ends, as after
        a step that found it (vLLM's worker monitor). No step would notice before a request came,
        and an idle server's /health said 200 over a dead engine until then."""
        poll = getattr(self.engine, "poll_dead", None)
        dead = poll() if poll is not None else None
        if not dead:
            return False
        from enginespec.worker.tp_group import EngineDeadError

        self._fail_all(ErrorInfo.of(EngineDeadError(dead)))
        self._send([], None)
        return True

    def _take_commands(self) -> bool:
        took = False
        while self.inbox.poll(0):
            self._apply(self.inbox.recv())
            took = True
        return took

    def _apply(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            self._add(command[1], command[2])
        elif kind == "abort":
            for parked in self._parked:
                parked.requests = [r for r in parked.requests if r.request_id not in command[1]]
            live = [rid for rid in command[1] if rid in self.engine.parents]
            self.engine.abort(live, report=False)
            for rid in live:
                self.tracker.drop(rid)
        elif kind == "call":
            self._replies.append(("done", command[1], self._call_or_error(command[2], command[3:])))
        elif kind == "shutdown":
            self._stop = True
        else:
            raise ValueError(f"unknown engine command {kind!r}")

    def _call_or_error(self, name: str, args: tuple):
        """_call's result, or the ErrorInfo of what it raised: the caller gets the error (a
        start_profile while one runs, sleep mode's refusals), and the loop, with every other
        request, goes on."""
        try:
            return self._call(name, *args)
        except Exception as exc:
            return ErrorInfo.of(exc)

    def _call(self, name: str, *args):
        """Run one of core_messages.CALLS between two steps; its result goes back in "done".
        The profile calls run here, on the thread that steps, so the trace holds the steps."""
        if name == "start_profile":
            self._profiler.start(self.engine.model.device, *args)
        elif name == "stop_profile":
            self._profiler.stop()
        elif name == "is_sleeping":
            return bool(self.engine.is_sleeping)
        elif name in ("sleep", "wake_up"):
            getattr(self.engine, name)(*args)
        elif name == "reload_weights":  # the number of tensors copied
            return self.engine.reload_weights(*args)
        elif name == "pause":
            self._paused = True
        elif name == "resume":
            self._paused = False
        elif name == "fail_next":
            self._fail_next = True
        elif name == "reset_prefix_cache":  # refused (False) while a request holds blocks
            return bool(self.engine.reset_prefix_cache())
        return None

    def _add(self, token: int, requests: list[NewRequest]) -> None:
        """Add the requests now, or park them while their grammars compile."""
        futures = self._grammar_futures(requests)
        if futures:
            self._parked.append(ParkedAdd(token, list(requests), futures))
        else:
            self._add_now(token, requests)

    def _grammar_futures(self, requests: list[NewRequest]) -> list:
        """The compiles still under way of the requests' grammars ([] when none is, or the
        engine cannot compile apart: add_request then compiles, or reports why it cannot).
        Whatever prepare_grammar raises (no xgrammar: a ValueError; a tokenizer xgrammar cannot
        read: its own error) is left for add_request to meet again and report for this add
        alone, never raised here, where it would end the engine loop and every request."""
        prepare = getattr(self.engine, "prepare_grammar", None)
        futures = []
        for req in requests if prepare is not None else ():
            try:
                future = prepare(req.params)
            except Exception:  # the add reports it (_add_now)
                return []
            if future is not None and not future.done():
                futures.append(future)
        return futures

    def _release_parked(self) -> bool:
        """Add (or refuse) every parked add whose compiles are done; whether any was."""
        ready = [p for p in self._parked if p.ready()]
        if not ready:
            return False
        self._parked = [p for p in self._parked if p not in ready]
        for parked in ready:
            error = parked.error()
            if error is not None:
                self._replies.append(("added", parked.token, ErrorInfo.of(error)))
            else:
                self._add_now(parked.token, parked.requests)
        return True

    def _add_now(self, token: int, requests: list[NewRequest]) -> None:
        added: list[str] = []
        try:
            for req in requests:
                self._add_one(req)
                added.append(req.request_id)
        except Exception as exc:  # a ValueError: a 400; anything else: a 500
            self.engine.abort(added, report=False)
            self._replies.append(("added", token, ErrorInfo.of(exc)))
            return
        for rid in added:
            self.tracker.add(rid)
        self._replies.append(("added", token, None))

    def _add_one(self, req: NewRequest) -> None:
        """engine.add_request; cache_salt goes as the engine's own keyword when it has one, else
        into the block hashes' cache_key (so tenants with different salts never share blocks)."""
        kwargs = dict(prompt=req.prompt, priority=req.priority)
        if req.cache_salt is not None:
            if self._salt_kw:
                kwargs["cache_salt"] = req.cache_salt
            else:
                kwargs["cache_key"] = ("cache_salt", req.cache_salt)
        self.engine.add_request(req.request_id, req.prompt_token_ids, req.params, **kwargs)

    def _step(self) -> list[tuple]:
        try:
            if self._fail_next:
                self._fail_next = False
                raise InjectedFault("injected engine fault (/dev/fail_next_step)")
            finals = self.engine.step(final_only=True)
        except Exception as exc:
            if not isinstance(exc, InjectedFault):
                traceback.print_exc()
            self._fail_all(ErrorInfo.of(exc))
            if getattr(self.engine, "dead", None):  # it cannot step again: end, as a dead process
                self._stop = True
            return []
        return self.tracker.collect(finals)

    def _fail_all(self, error: ErrorInfo) -> None:
        """Fail every request the front end waits on: the engine's unfinished ones, and those
        the raising step finished without its outputs reaching us (DeltaTracker.live)."""
        ids = list(dict.fromkeys([*self.engine.parents, *self.tracker.live()]))
        self.engine.abort(ids, report=False)  # ids it no longer knows are skipped
        for rid in ids:
            self.tracker.drop(rid)
            self._failed.append((rid, error))

    def _send(self, deltas: list, step_start: Optional[float]) -> None:
        failed, self._failed = self._failed, []
        replies, self._replies = self._replies, []
        num_parked = sum(r.params.n for parked in self._parked for r in parked.requests)
        state = engine_state(self.engine, self._paused, num_parked)
        self.outbox.send(("out", deltas, failed, replies, state, step_start))


def serve_engine(engine, inbox, outbox) -> None:
    """Announce the engine, then run its loop (on this thread) until shutdown or EOF.

    With ENGINESPEC_STEP_TRACE=FILE set, every step's (requests, tokens, context tokens, end
    time, host wait) as EngineStats.step_trace records it is written to FILE as JSON at exit:
    what the serving benchmark reads to tell slow steps from a slow front end."""
    trace_file = os.environ.get("ENGINESPEC_STEP_TRACE")
    if trace_file:
        engine.stats.step_trace = []
    outbox.send(("ready", engine_info(engine), engine_state(engine, False)))
    try:
        EngineCoreProc(engine, inbox, outbox).run()
    finally:
        if trace_file:
            with open(trace_file, "w") as f:
                json.dump(engine.stats.step_trace or [], f)


_DEFERRED = (
    b"enginespec engine: SIGTERM: the server ends the engine once its requests drain (a second ends it now)\n"
)


class TermSignal:
    """The engine process's SIGTERM handler. While the engine serves and its front end (the
    parent that spawned it) is alive, the first SIGTERM is noted and deferred: the front end
    drains its requests and then ends the engine (the "shutdown" command, or EOF). A SIGTERM to
    the whole process group, systemd's control-group kill or `kill -TERM -- -PGID`, reaches
    the engine with the server's own, and the engine's exit at once failed every in-flight
    request with "the engine process died" where a SIGTERM to the server alone drains them
    (vLLM's maintainers' rule too: the front end alone governs its engine's life). It exits at
    once (status 0) instead when the front end asked for it (it sets `stop_now` before its own
    SIGTERM, which follows a "shutdown" the engine did not obey in time), on a second SIGTERM,
    once the front end is gone, and while the engine loads (nothing to drain; the front end
    reaps it), so the engine never outlives its server and a stuck one can still be ended."""

    def __init__(self, stop_now=None):
        self.stop_now = stop_now  # a shared byte (multiprocessing.Value) the front end sets, or None
        self.serving = False
        self.deferred = False

    def __call__(self, signum, frame) -> None:
        forced = self.stop_now is not None and self.stop_now.value
        if self.serving and not self.deferred and not forced and _front_end_alive():
            self.deferred = True
            os.write(2, _DEFERRED)
            return
        os._exit(0)


def _front_end_alive() -> bool:
    """Whether the process that spawned this one is still running (never true for a process
    that was not spawned by multiprocessing: there is no front end to defer to)."""
    parent = multiprocessing.parent_process()
    return parent is not None and parent.is_alive()


def run_engine_core(args, inbox, outbox, stop_now=None) -> None:
    """The spawned engine process: build the EngineCore, then serve it. SIGINT is ignored (the
    front end owns Ctrl-C and asks for a clean shutdown); SIGTERM is TermSignal's (deferred to
    the front end while it lives and the engine serves; else, or when the front end sets
    `stop_now` first, an exit at once). Exits 1 when its loop ended because the engine is dead
    (a tensor-parallel rank died), so the front end's message and a supervisor see a failure;
    0 after a shutdown or once the front end is gone."""
    term = TermSignal(stop_now)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, term)
    from enginespec.engine.engine_core import EngineCore

    try:
        engine = EngineCore(args)
    except BaseException as exc:  # the front end re-raises it (a bad checkpoint: a CLI error)
        if not isinstance(exc, (ValueError, TypeError, FileNotFoundError)):
            traceback.print_exc()  # a bad setting is the CLI's one line; anything else, all of it
        outbox.send(("failed", ErrorInfo.of(exc)))
        return
    term.serving = True
    try:
        serve_engine(engine, inbox, outbox)
    finally:
        term.serving = False
    dead = getattr(engine, "dead", None)
    if dead:  # the loop ended because the engine cannot step: a failure, not a shutdown
        print(f"enginespec: the engine is dead: {dead}", file=sys.stderr, flush=True)
        raise SystemExit(1)
