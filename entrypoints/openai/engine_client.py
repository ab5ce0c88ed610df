"""The server's side of the engine: a client of the engine-core loop (engine/core_proc.py).

By default the EngineCore runs in a spawned process of its own (it owns the device and the
model), so the step loop never shares a GIL with uvicorn, JSON and SSE. With in_process=True the
same loop runs on a thread of this process over the same pipes (tests, debugging).

On the event loop: one reader (loop.add_reader on the engine's output pipe) takes each message
of deltas, folds them into per-request cumulative RequestOutputs (decoding the ids of samples
the engine does not detokenize), records the metrics, and wakes each request's Inbox.
HTTP handlers send commands with Connection.send; no thread is made per request and no lock is
held across a step.

Invariants:
- Admission is bounded: at most max_num_seqs + max_waiting samples are pending (submitted and
  not yet finished, failed or aborted) at once; one more is refused with QueueFull (503). A
  request of more samples than that bound could never be admitted: RequestTooLarge (400).
- Every pending request gets exactly one terminal item on its queue: its finished output or an
  error (stop() too ends the pending ones with EngineDead); an aborted one gets nothing (nobody
  listens) but is released all the same. Likewise every call between two steps (pause,
  reset_prefix_cache, start_profile, ...) gets its reply or an error: the error the call raised
  in the engine (_call_error: a ProfilerStateError stays one), and stop() and the engine's death
  fail the ones awaiting a reply, and a call after stop() is EngineDead at once.
- A request id names one pending request: submitting an id that is pending (or twice in one
  batch) is a ValueError that changes nothing, as the engine refuses an id in use. An id may
  be reused once its request finished or was aborted; a stream takes deltas and failures only
  after the engine's reply to its own add (the engine takes commands in order, and replies
  ride with the deltas of the step after them), so the messages of an aborted request of the
  same id still on their way reach nobody.
- If the engine dies (EOF on its pipe), every pending request gets an EngineDead error (500, or
  an error frame in a stream that started), new ones are refused, /health fails, and on_death
  runs (the server then shuts down); stop() reaps the process, so nothing is orphaned.
  Each stream, call and later caller gets an EngineDead of its own (fresh_error).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import multiprocessing
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional

from enginespec.engine.core_messages import EngineInfo, EngineState, ErrorInfo, NewRequest
from enginespec.engine.output_processor import ERROR
from enginespec.entrypoints.openai.request_stream import DecodeError, RequestStream
from enginespec.profiler import ProfilerStateError
from enginespec.spec import check_token_ids

# Messages taken per reader callback at most (then other tasks run; the reader fires again).
_MAX_MESSAGES_PER_WAKE = 16


class QueueFull(Exception):
    """The bounded waiting queue is full (answered 503 with Retry-After)."""


class RequestTooLarge(ValueError):
    """One request asks for more samples than the admission capacity (answered 400: it would
    never fit, even on an idle server, so a 503 would only be retried forever)."""

    def __init__(self, num_samples: int, capacity: int):
        super().__init__(
            f"the request asks for {num_samples} samples at once; at most {capacity} are admitted"
        )
        self.num_samples = num_samples
        self.capacity = capacity


class EngineDead(RuntimeError):
    """The engine process is gone (answered 500; /health fails)."""


class ServerShuttingDown(RuntimeError):
    """The server's shutdown grace (--shutdown-timeout) ran out before the request finished
    (answered 503, or an error frame in a stream that started: shed_pending)."""


class EngineRequestError(RuntimeError):
    """The engine dropped a request with an error (a failed step): answered 500."""


class EngineAsleep(EngineRequestError):
    """The engine sleeps (sleep mode: POST /sleep, AsyncLLM.sleep): a request is refused until
    wake_up (answered 503)."""


class Inbox:
    """One request's mailbox: the engine client puts, the request's handler (one task) takes.

    put_nowait never blocks; take_all waits for the next item, then returns every queued one at
    once, in order. Cheaper than asyncio.Queue per item (no size bound, no task accounting, a
    future only when the consumer actually has to wait), which counts at 256 streams x one item
    per engine step. A cancelled wait loses nothing: items stay queued.

    Items are (kind, payload). An ("output", out) whose `out` is already queued is not queued
    again: a request's output is one cumulative object that grows in place (RequestStream), so
    a second entry would carry nothing the first does not, and the taker reads it as it is when
    taken. So the queue holds at most one output per request however long its taker is away (a
    handler whose client stopped reading waits on the socket while the engine runs on), where
    it grew by one entry a step until the request ended."""

    __slots__ = ("_items", "_waiter", "_outputs")

    def __init__(self) -> None:
        self._items: list = []
        self._waiter: Optional[asyncio.Future] = None
        self._outputs: set[int] = set()  # id() of the output payloads queued (they are alive)

    def put_nowait(self, item) -> None:
        if item[0] == "output":
            if id(item[1]) in self._outputs:
                return  # queued already: the taker has not woken since (its waiter is set)
            self._outputs.add(id(item[1]))
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        while not self._items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None

    async def get(self):
        """The oldest item (waiting for one)."""
        await self._wait()
        item = self._items.pop(0)
        if item[0] == "output":
            self._outputs.discard(id(item[1]))
        return item

    def put_back(self, item) -> None:
        """Return an item just taken to the front (the next get or take_all has it first)."""
        self._items.insert(0, item)
        if item[0] == "output":
            self._outputs.add(id(item[1]))

    async def take_all(self) -> list:
        """Every queued item, oldest first (waiting for at least one)."""
        await self._wait()
        items, self._items = self._items, []
        self._outputs.clear()
        return items

    def __len__(self) -> int:
        """How many items are queued."""
        return len(self._items)


@dataclass
class Generation:
    """Event-loop handle of one HTTP request's engine requests (a batch of prompts)."""

    owner: "EngineClient"
    request_ids: list[str]
    queue: Inbox
    live: set = field(default_factory=set)

    async def next(self) -> list:
        """Wait for news, then take everything queued: [("error", exception)] or a list of
        ("output", RequestOutput) with only the latest output of each request. Outputs are
        cumulative, so a consumer that fell behind loses nothing by skipping the older ones,
        and a busy event loop sends fewer, larger deltas instead of falling further behind."""
        items = await self.queue.take_all()
        if len(items) == 1:  # the usual case: one item per engine step
            kind, payload = items[0]
            if kind == "error":
                self.live.clear()
            elif payload.finished:
                self.live.discard(payload.request_id)
            return items
        errors = [item for item in items if item[0] == "error"]
        if errors:
            self.live.clear()
            return errors[:1]
        latest = {payload.request_id: (kind, payload) for kind, payload in items}
        for _, payload in latest.values():
            if payload.finished:
                self.live.discard(payload.request_id)
        return list(latest.values())

    @property
    def done(self) -> bool:
        return not self.live

    def abort(self) -> None:
        """Abort what is still running (the client left). Safe to call more than once."""
        if self.live:
            self.owner.abort(sorted(self.live))
            self.live.clear()


def fresh_error(error: BaseException) -> BaseException:
    """A new exception of `error`'s type, args and cause, with no traceback yet: what to raise
    where one error (the engine's death) reaches many callers. Raising one instance again and
    again appends each raise's frames to its one __traceback__: every stream's traceback would
    show the others' frames, and the stored error would keep all of them alive."""
    clone = copy.copy(error)
    clone.__cause__ = error.__cause__
    return clone


def _as_exception(error: ErrorInfo) -> Exception:
    if error.is_value_error:
        return ValueError(error.message)
    if error.is_a("EngineAsleepError"):
        return EngineAsleep(error.message)
    return EngineRequestError(f"{error.type_name}: {error.message}")


def _call_error(error: ErrorInfo) -> Exception:
    """What a call the engine ran and that raised raises here: a ProfilerStateError stays one (a
    start while a profile runs, a stop while none does: the server's 409), else _as_exception's."""
    if error.is_a("ProfilerStateError"):
        return ProfilerStateError(error.message)
    return _as_exception(error)


class EngineClient:
    """Starts the engine (launch), then serves submit/abort/pause on the event loop (start)."""

    def __init__(self, args, tokenizer, metrics=None, *, max_waiting: int = 1024, in_process: bool = False):
        self.args = args
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.capacity = args.max_num_seqs + max_waiting
        self.in_process = in_process
        self.info: Optional[EngineInfo] = None
        self.state = EngineState()
        self.fatal: Optional[BaseException] = None
        self.on_death: Optional[Callable[[], None]] = None
        self._num_pending = 0
        self._accepting = True
        self._stopping = False
        self._streams: dict[str, RequestStream] = {}
        # token -> the streams awaiting that add's "added" reply (the objects, not their ids: an
        # id freed by a cancelled submit may be pending again, for another stream, by then)
        self._adds: dict[int, list[RequestStream]] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._tokens = itertools.count()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._worker = None  # the engine's Process or Thread
        self._stop_now = None  # the engine process's TermSignal.stop_now
        self._to_engine = self._from_engine = None
        self._last_counts = (0, 0, 0, 0, 0)
        self._token_texts: dict[int, str] = {}  # token id -> decode([id]), for the streams' Logprobs

    # ---- life cycle -----------------------------------------------------------------------------

    def launch(self, timeout: Optional[float] = None) -> EngineInfo:
        """Start the engine (blocking until it is built); its construction error is re-raised
        here (a ValueError stays one, so the CLI reports a bad checkpoint in one line)."""
        from enginespec.engine.core_proc import PipeSender, run_engine_core, serve_engine

        self.args.model_dir()  # resolved here, once: the engine process loads this snapshot
        ctx = multiprocessing.get_context("spawn")
        cmd_recv, cmd_send = ctx.Pipe(duplex=False)
        out_recv, out_send = ctx.Pipe(duplex=False)
        if self.in_process:
            from enginespec.engine.engine_core import EngineCore

            engine = EngineCore(self.args, tokenizer=self.tokenizer)
            self._worker = threading.Thread(
                target=_serve_then_close,
                args=(serve_engine, engine, cmd_recv, out_send),
                name="enginespec-engine-core",
                daemon=True,
            )
            self._worker.start()
        else:
            self._stop_now = ctx.Value("b", 0, lock=False)  # set before our SIGTERM (TermSignal)
            self._worker = ctx.Process(
                target=run_engine_core,
                args=(self.args, cmd_recv, out_send, self._stop_now),
                name="enginespec-engine-core",
            )
            self._worker.start()
            cmd_recv.close()  # the child holds these ends; ours would hide its EOF
            out_send.close()
        self._to_engine, self._from_engine = PipeSender(cmd_send), out_recv
        return self._await_ready(timeout)

    def _await_ready(self, timeout: Optional[float]) -> EngineInfo:
        if not self._from_engine.poll(timeout):
            self.stop(5.0)
            raise RuntimeError(f"the engine was not ready within {timeout} s")
        try:
            msg = self._from_engine.recv()
        except EOFError:
            self._reap(5.0)
            raise RuntimeError(
                f"the engine process exited while starting ({self._exitcode()}); if this script "
                "builds the engine (AsyncLLM, the server) at its top level, put that under "
                "`if __name__ == '__main__':`, since the engine process is spawned and imports "
                "the script again"
            ) from None
        if msg[0] == "failed":
            self._reap(5.0)
            err = msg[1]
            if err.is_a("ValueError", "FileNotFoundError", "TypeError"):  # the CLI's usage errors
                raise ValueError(err.message)
            raise RuntimeError(f"the engine failed to start: {err.type_name}: {err.message}")
        _, self.info, self.state = msg
        if self.metrics is not None:  # a server's: metrics.py needs prometheus_client (the serve extra)
            from enginespec.entrypoints.openai.metrics import cache_config_info

            self.metrics.engine_ready(
                self.info.max_model_len,
                cache_config_info(self.info, self.args),
                self.info.num_speculative_tokens,
            )
        return self.info

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin reading the engine's messages on this event loop (taking the reader off the
        loop that had it, if that one is still open: AsyncLLM moves to a caller's new loop).
        Once stopped or dead, nothing is read: the pipe, closed, would be readable forever (EOF)
        and the loop would spin on it."""
        old = self._loop
        if old is not None and old is not loop and not old.is_closed():
            old.remove_reader(self._from_engine.fileno())
        self._loop = loop
        if not self._stopping and self.fatal is None:
            loop.add_reader(self._from_engine.fileno(), self._on_readable)

    @property
    def loop(self) -> Optional[asyncio.AbstractEventLoop]:
        """The event loop that reads the engine's messages (None before start)."""
        return self._loop

    @property
    def num_pending_requests(self) -> int:
        """Requests submitted and not yet finished, failed or aborted."""
        return len(self._streams)

    @property
    def alive(self) -> bool:
        return self.info is not None and self.fatal is None and not self._stopping

    @property
    def priority_scheduling(self) -> bool:
        """Whether the scheduler orders by request priority (--scheduling-policy priority);
        under fcfs, the default, a request's priority is ignored."""
        return self.args.scheduling_policy == "priority"

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    @property
    def engine_pid(self) -> Optional[int]:
        return self.info.pid if self.info is not None else None

    def close_admission(self) -> None:
        """Refuse every new request from now on (503); the pending ones run on."""
        self._accepting = False

    def shed_pending(self, reason: str) -> int:
        """End every pending request with ServerShuttingDown(reason) as its terminal item (a
        503 to its client) and abort it in the engine; returns how many were ended. For the
        server's shutdown once its grace has run out: each handler then answers at once, in
        vLLM's error shape, where uvicorn's cancellation of a handler still waiting sent a
        plain-text 500 (or cut its stream) and logged a traceback. Counted as aborted
        (request_success "abort"). Calls awaiting a reply are left: the engine still answers
        them. Nothing to do once the engine is dead or stopped (their requests have ended).
        On the reader's event loop."""
        if self.fatal is not None or self._stopping:
            return 0
        self._accepting = False
        ids = list(self._streams)
        error = ServerShuttingDown(reason)
        for rid in ids:
            stream = self._release(rid)
            self._count_samples(stream)
            stream.sink.put_nowait(("error", fresh_error(error)))
        if ids:
            try:
                self._send(("abort", ids))
            except EngineDead:
                pass
        return len(ids)

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new requests, end the pending ones and the calls awaiting a reply with
        EngineDead (nothing more comes for them), ask the engine to exit, and reap it (SIGTERM,
        marked ours so that the engine does not defer it to us, then SIGKILL, if it does not go
        in time; at once if it never announced itself ready: it reads no command while it
        builds, and a large checkpoint loads for minutes). Pending
        requests of a reader's loop that was closed are released telling no one (waking a wait
        of a closed loop raises, and the engine would then never be told). Idempotent."""
        self._accepting = False
        self._stopping = True
        if self._loop is not None and self._loop.is_closed():
            self.abandon_pending()  # their waits went with their loop: nobody can be told
        elif self._streams or self._calls:
            self._on_loop(self._fail_pending, EngineDead("the engine was stopped"))
        if self._loop is not None and self._from_engine is not None:
            try:
                self._loop.remove_reader(self._from_engine.fileno())
            except (ValueError, OSError):
                pass
        if self._to_engine is not None:
            if self.fatal is None:
                try:
                    self._to_engine.send(("shutdown",))
                except OSError:
                    pass
            self._to_engine.close(timeout)
        self._reap(timeout if self.info is not None else 0.0)

    def _on_loop(self, fn, *args) -> None:
        """fn(*args) on the event loop that reads the engine (the Inboxes' futures belong to
        it): at once when called on it (or with no loop running), else scheduled there."""
        loop = self._loop
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if loop is None or current is loop or loop.is_closed() or not loop.is_running():
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    def _fail_pending(self, error: BaseException) -> None:
        """Release every pending request with `error` as its terminal item, and fail every
        pending call (_call) with it: once the reader is gone no reply can reach them."""
        for rid in list(self._streams):
            self._release(rid).sink.put_nowait(("error", fresh_error(error)))
        calls, self._calls = self._calls, {}
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(fresh_error(error))

    def _reap(self, timeout: float) -> None:
        worker = self._worker
        if worker is None:
            return
        worker.join(timeout)
        if isinstance(worker, multiprocessing.process.BaseProcess) and worker.is_alive():
            if self._stop_now is not None:  # this SIGTERM is the front end's: not deferred
                self._stop_now.value = 1
            worker.terminate()
            worker.join(5.0)
            if worker.is_alive():
                worker.kill()
                worker.join()

    def _exitcode(self) -> str:
        code = getattr(self._worker, "exitcode", None)
        return f"exit code {code}" if code is not None else "no exit code"

    # ---- requests -------------------------------------------------------------------------------

    async def submit(self, requests: list[NewRequest], prompt_only: bool = False) -> Generation:
        """Queue the requests (all or none); returns once the engine accepted them. ValueError
        (the engine's validation; a request id that is pending or repeated; RequestTooLarge,
        more samples than the capacity), QueueFull (bounded queue, or shutting down),
        EngineDead. prompt_only: the client is answered the prompts alone (echo with max_tokens
        0), so the metrics count no generated token and finish each sample as "length", as the
        client's usage and finish_reason read (RequestStream.prompt_only)."""
        if self.fatal is not None:
            raise fresh_error(self.fatal)
        self._check_ids([r.request_id for r in requests])
        self._check_prompts(requests)
        self._check_params(requests)
        num = sum(r.params.n for r in requests)
        if num > self.capacity:
            raise RequestTooLarge(num, self.capacity)
        if not self._accepting:
            raise QueueFull("the server is shutting down")
        if self._num_pending + num > self.capacity:
            raise QueueFull(
                f"the waiting queue is full ({self._num_pending} pending samples, capacity {self.capacity})"
            )
        gen = Generation(self, [r.request_id for r in requests], Inbox(), set())
        now = time.monotonic()
        streams = [
            RequestStream(req, gen.queue, self.tokenizer, now, self._token_texts, prompt_only)
            for req in requests
        ]
        for req, stream in zip(requests, streams):
            self._streams[req.request_id] = stream
        self._num_pending += num
        token = next(self._tokens)
        self._adds[token] = streams
        self._send(("add", token, requests))
        try:
            # the first item: "accepted", "error", or the last output of a request that
            # abort(notify=True) ended before the engine's reply came (the reply then brings
            # nothing for it: the abort released its stream)
            kind, payload = await gen.queue.get()
        except asyncio.CancelledError:
            self.abort(gen.request_ids)
            raise
        if kind == "error":
            raise payload
        gen.live = set(gen.request_ids)
        if kind == "output":
            gen.queue.put_back((kind, payload))  # next() hands it over, ending that request
        return gen

    def _check_prompts(self, requests: list[NewRequest]) -> None:
        """The engine's ValueError for a prompt id outside [0, vocab_size), raised before this
        side decodes the prompt (RequestStream's detokenizer), where the tokenizer would raise
        an OverflowError of its own for a negative id or one past a C long. A min/max scan
        (C speed) finds the bad prompt; check_token_ids words the refusal as the engine does."""
        vocab = self.vocab_size
        for req in requests:
            ids = req.prompt_token_ids
            try:
                ok = not ids or (min(ids) >= 0 and max(ids) < vocab)
            except TypeError:  # not all numbers: check_token_ids names the offender
                ok = False
            if not ok:
                check_token_ids("prompt_token_ids", ids, vocab)

    def _check_params(self, requests: list[NewRequest]) -> None:
        """The engine's checks of the requests' params against the model, made here before the
        queue's 503 too: token ids and logprobs within the vocabulary (validate_vocab), logprobs
        within max_logprobs (validate_logprobs_cap; -1: the vocabulary). A request that fails
        them can never run: a 400 on a busy server as on an idle one, as its prompt's ids and
        its size are. (While the queue was full, such a request got the 503, which clients
        retry, and its field was never named.)"""
        vocab = self.vocab_size
        cap = vocab if self.args.max_logprobs == -1 else self.args.max_logprobs
        for params in {id(r.params): r.params for r in requests}.values():
            params.validate_vocab(vocab)
            params.with_vocab(vocab).validate_logprobs_cap(cap)

    def _check_ids(self, request_ids: list[str]) -> None:
        """A ValueError naming the first id that is pending here or repeated in the batch: its
        stream would replace the pending one's (which would then never end) and the engine's
        refusal would release the pending one's."""
        seen: set[str] = set()
        for rid in request_ids:
            if rid in self._streams or rid in seen:
                raise ValueError(f"request_id {rid!r} is already in use by a pending request")
            seen.add(rid)

    def abort(self, request_ids: list[str], notify: bool = False) -> None:
        """Forget the requests here and have the engine free them before its next step. With
        notify, each one's consumer gets a last output (its unfinished samples ended with
        finish_reason "abort"), also while its submit awaits the engine's acceptance; without
        it, nothing more (the HTTP client that left). notify is for generations of one request
        (AsyncLLM): another request of the same batch would still get its "accepted" later, on
        the queue that next() reads."""
        live = [rid for rid in request_ids if rid in self._streams]
        for rid in live:
            stream = self._release(rid)
            self._count_samples(stream)
            if notify:
                stream.finish_aborted()
                stream.sink.put_nowait(("output", stream.output))
        if live and self.fatal is None and not self._stopping:
            try:
                self._send(("abort", live))
            except EngineDead:
                pass

    def abandon_pending(self) -> None:
        """Abort every pending request and forget every call awaiting a reply, telling no one:
        for a reader's event loop that was closed with them pending (their Inboxes and futures
        belonged to it, so nothing can take their news, and resolving a future of a closed loop
        raises). The engine frees the requests' blocks before its next step."""
        self.abort(list(self._streams))
        self._calls.clear()

    def _release(self, request_id: str) -> Optional[RequestStream]:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            self._num_pending -= stream.num_samples
        return stream

    def _send(self, command: tuple) -> None:
        try:
            self._to_engine.send(command)
        except OSError:
            self._on_death()
            raise (fresh_error(self.fatal) if self.fatal else EngineDead("the engine is stopping")) from None

    async def _call(self, name: str, *args):
        """Run core_messages.CALLS' `name(*args)` in the engine between two steps; its result,
        or the error it raised there (_call_error)."""
        if self.fatal is not None:
            raise fresh_error(self.fatal)
        if self._stopping:  # the reader is gone: no reply would ever come
            raise EngineDead("the engine was stopped")
        token = next(self._tokens)
        fut = self._loop.create_future()
        self._calls[token] = fut
        self._send(("call", token, name, *args))
        return await fut

    async def pause(self) -> None:
        """Stop stepping (commands are still taken: adds queue up, aborts free blocks)."""
        await self._call("pause")

    async def resume(self) -> None:
        await self._call("resume")

    async def fail_next_step(self) -> None:
        await self._call("fail_next")

    async def reset_prefix_cache(self) -> bool:
        """EngineCore.reset_prefix_cache between two steps: False (nothing changed) while a
        request holds blocks."""
        return bool(await self._call("reset_prefix_cache"))

    async def start_profile(self, profile_prefix: Optional[str] = None) -> None:
        """Start a torch.profiler trace in the engine's process, between two steps, on the
        thread that steps (api/profiler.py states the rules): ProfilerStateError while one runs;
        EngineRequestError when the engine has no profiler_config and its process no
        VLLM_TORCH_PROFILER_DIR."""
        await self._call("start_profile", profile_prefix)

    async def stop_profile(self) -> None:
        """Stop the engine's trace and write it (done when this returns): ProfilerStateError
        while none runs."""
        await self._call("stop_profile")

    async def sleep(self, level: int = 1) -> None:
        """EngineCore.sleep(level) between two steps (its refusals raised here)."""
        await self._call("sleep", level)

    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """EngineCore.wake_up(tags) between two steps."""
        await self._call("wake_up", None if tags is None else list(tags))

    async def is_sleeping(self) -> bool:
        return bool(await self._call("is_sleeping"))

    async def reload_weights(self, weights_path: Optional[str] = None) -> int:
        """EngineCore.reload_weights(weights_path) between two steps (its refusals raised here)."""
        return int(await self._call("reload_weights", weights_path))

    # ---- the engine's messages ------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            for _ in range(_MAX_MESSAGES_PER_WAKE):
                if not self._from_engine.poll():
                    return
                msg = self._from_engine.recv()
                self._handle(*msg[1:])
        except (EOFError, OSError):
            self._on_death()
        except Exception as exc:  # a bug here: requests would wait forever for outputs it dropped
            traceback.print_exc()
            self._on_death(
                EngineDead(f"the server failed on the engine's output ({type(exc).__name__}: {exc})")
            )

    def _handle(self, deltas, failed, replies, state: EngineState, step_start) -> None:
        now = time.monotonic()
        for reply in replies:
            self._on_reply(*reply)
        touched: dict[str, RequestStream] = {}
        streams = self._streams
        num_tokens = num_prompt_tokens = 0
        for delta in deltas:
            stream = streams.get(delta[0])
            if stream is None or not stream.accepted:
                continue  # aborted here meanwhile, or an aborted request's of a reused id
            index = delta[1]
            sample = stream.output.outputs[index]
            was_finished = sample.finish_reason is not None
            try:
                num_new = stream.apply(delta)
            except DecodeError as exc:  # this request's ids: it fails, the others run on
                touched.pop(delta[0], None)
                self._fail_stream(stream, exc)
                continue
            touched[delta[0]] = stream
            if num_new:
                num_tokens += 0 if stream.prompt_only else num_new
                if stream.first[index] is None:
                    num_prompt_tokens += stream.num_prompt_tokens
                self._observe_tokens(stream, index, now, step_start)
            if not was_finished and sample.finish_reason is not None:
                self._observe_finished_sample(stream, index, now)
        if touched and self.metrics is not None:
            self.metrics.prompt_tokens.inc(num_prompt_tokens)
            self.metrics.generation_tokens.inc(num_tokens)
            self.metrics.iteration_tokens.observe(num_prompt_tokens + num_tokens)
        for rid, stream in touched.items():
            stream.sink.put_nowait(("output", stream.output))
            if stream.output.finished:
                self._release(rid)
                self._count_samples(stream)
                self._observe_finished_request(stream)
        for rid, error in failed:
            stream = streams.get(rid)
            if stream is not None and stream.accepted:
                self._release(rid)
                self._count_samples(stream, unfinished=ERROR)
                stream.sink.put_nowait(("error", _as_exception(error)))
        self._observe_state(state)

    def _fail_stream(self, stream: RequestStream, error: DecodeError) -> None:
        """End one request here with an EngineRequestError (a 500) and abort it in the engine:
        its output could not be decoded (RequestStream.DecodeError), so it cannot be answered,
        while every other request's news is intact."""
        self._release(stream.request_id)
        self._count_samples(stream, unfinished=ERROR)
        stream.sink.put_nowait(("error", EngineRequestError(str(error))))
        if self.fatal is None and not self._stopping:
            try:
                self._send(("abort", [stream.request_id]))
            except EngineDead:
                pass

    def _on_reply(self, kind: str, token: int, error) -> None:
        """An add's answer (error: ErrorInfo or None), or a call's ("done"; error is its result,
        or the ErrorInfo of what the call raised)."""
        if kind == "done":
            fut = self._calls.pop(token, None)
            if fut is not None and not fut.done():
                if isinstance(error, ErrorInfo):
                    fut.set_exception(_call_error(error))
                else:
                    fut.set_result(error)
            return
        streams = [s for s in self._adds.pop(token, []) if self._streams.get(s.request_id) is s]
        if error is not None:
            for stream in streams:
                self._release(stream.request_id)
            if streams:
                streams[0].sink.put_nowait(("error", _as_exception(error)))
            return
        for stream in streams:
            stream.accepted = True
        if streams:
            streams[0].sink.put_nowait(("accepted", None))

    def _on_death(self, cause: Optional[EngineDead] = None) -> None:
        """The engine is gone: fail everyone, refuse everything, tell the server. With a cause,
        this side failed (handling a message raised): its state may have lost outputs, so it ends
        the same way, and asks the engine to shut down (stop() reaps it)."""
        if self.fatal is not None or self._stopping:
            return
        try:
            self._loop.remove_reader(self._from_engine.fileno())
        except (ValueError, OSError):
            pass
        if cause is not None:
            try:
                self._to_engine.send(("shutdown",))
            except OSError:
                pass
        elif isinstance(self._worker, multiprocessing.process.BaseProcess):
            self._worker.join(1.0)
        self.fatal = cause or EngineDead(f"the engine process died ({self._exitcode()})")
        self._accepting = False
        self._fail_pending(self.fatal)
        if self.on_death is not None:
            self.on_death()

    # ---- metrics --------------------------------------------------------------------------------

    def _observe_tokens(self, stream: RequestStream, index: int, now: float, step_start) -> None:
        """TTFT and queue time at a sample's first tokens, inter-token latency at its later ones:
        per sample, as vLLM observes each child request of n > 1 (e2e too, at each sample's
        finish; request_success counts samples, _count_samples). Marks the sample's scheduled
        time (the start of this step, never before its arrival: arrival <= scheduled <= first),
        first and last token times."""
        m = self.metrics
        first = stream.first[index]
        if first is None:
            start = step_start if step_start is not None else now
            stream.scheduled[index] = scheduled = min(now, max(stream.arrival, start))
            stream.first[index] = now
            if m is not None:
                m.time_to_first_token.observe(now - stream.arrival)
                m.request_queue_time.observe(scheduled - stream.arrival)
        elif m is not None:
            m.inter_token_latency.observe(now - stream.last[index])
        stream.last[index] = now

    def _observe_finished_sample(self, stream: RequestStream, index: int, now: float) -> None:
        """A sample's finish (its finish reason arrived): e2e latency, its tokens, and its
        prefill / decode / inference time when it got tokens (metrics.py)."""
        m = self.metrics
        if m is None:
            return
        num_generated = stream.answered_tokens(index)
        m.e2e_request_latency.observe(now - stream.arrival)
        m.observe_finished_sample(stream.num_prompt_tokens, num_generated, stream.max_tokens)
        first, last, scheduled = stream.first[index], stream.last[index], stream.scheduled[index]
        if first is not None and last is not None and scheduled is not None:
            m.observe_phases(scheduled, first, last, num_generated)

    def _observe_finished_request(self, stream: RequestStream) -> None:
        """A request whose every sample finished through the engine: its n and the most tokens
        one of its samples got (vLLM V1 observes these once per parent request)."""
        if self.metrics is not None:
            num_generated = max(stream.answered_tokens(i) for i in range(stream.num_samples))
            self.metrics.observe_finished_request(stream.num_samples, num_generated)

    def _count_samples(self, stream: Optional[RequestStream], unfinished: str = "abort") -> None:
        """request_success once per sample, as vLLM V1 counts the child requests of n > 1: a
        finished sample under its finish reason, one cut off under `unfinished` ("abort"; "error"
        when the engine loop dropped the request, as EngineCore's own faults finish samples with
        "error"); a finished one as its client is answered it (RequestStream.answered_reason).
        Runs once per request, when it is released (finished, aborted or failed)."""
        if self.metrics is not None and stream is not None:
            for index in range(stream.num_samples):
                self.metrics.request_success(stream.answered_reason(index) or unfinished)

    def _observe_state(self, state: EngineState) -> None:
        self.state = state
        m = self.metrics
        if m is None:
            return
        m.num_requests_running.set(state.num_running)
        m.num_requests_waiting.set(state.num_waiting)
        m.kv_cache_usage_perc.set(state.kv_cache_usage)
        counts = (
            state.num_preemptions,
            state.num_prefix_queries,
            state.num_prefix_hits,
            state.num_prompt_tokens,
            state.num_prompt_cached_tokens,
        )
        grew = [max(0, now - then) for now, then in zip(counts, self._last_counts)]
        self._last_counts = counts
        m.num_preemptions.inc(grew[0])
        m.prefix_cache_queries.inc(grew[1])
        m.prefix_cache_hits.inc(grew[2])
        m.observe_prompt_sources(grew[3], grew[4])
        if state.spec_decode is not None:
            m.observe_spec_decode(state.spec_decode)


def _serve_then_close(serve, engine, inbox, outbox) -> None:
    """The in-process engine thread: serve, then close the output pipe (the reader sees EOF,
    as it would when a process ends)."""
    try:
        serve(engine, inbox, outbox)
    except Exception:  # a bug in the loop: report it; the closed pipe tells the client
        traceback.print_exc()
    finally:
        outbox.close()
