"""The engine loop: one thread owns the EngineCore (and so the device); nothing else touches it.

HTTP handlers (on the asyncio event loop) talk to it only through a FIFO inbox of commands
(add, abort, pause, resume, fail-next-step, stop) and get outputs back on one asyncio.Queue
per HTTP request. The thread takes every pending command between two steps, runs one step, and
hands that step's outputs to the event loop in one call_soon_threadsafe. No lock is held across
a step; no thread is made per request.

Invariants:
- Admission is bounded: at most max_num_seqs + max_waiting samples are pending (added and not
  yet finished) at once; one more is refused with QueueFull (503), so memory stays bounded.
- An abort (client gone) reaches the engine before the next step: its blocks are free before
  any further step runs (commands are taken between steps, and also while paused or idle).
- Every pending request gets exactly one terminal item on its queue: its finished output or an
  error; an aborted one gets nothing (nobody listens) but is released all the same.
- A step that raises fails every pending request (each gets the error: 500, or an error frame
  in a stream that has started) and is dropped from the engine; the loop goes on. Only an error
  in the loop itself ends it, and /health then reports it.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional

from enginespec.spec import SamplingParams


class QueueFull(Exception):
    """The bounded waiting queue is full (answered 503 with Retry-After)."""


class InjectedFault(RuntimeError):
    """The failure /dev/fail_next_step plants in the next step (tests of the 500 paths)."""


@dataclass
class Submission:
    """One engine request: the prompt (text and ids), its params, and what rides beside them."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    cache_salt: Optional[str] = None


@dataclass(frozen=True)
class EngineState:
    """A snapshot the thread publishes after each step and command batch (read without a lock)."""

    num_blocks: int = 0
    num_free_blocks: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_unfinished: int = 0
    num_steps: int = 0
    num_generated_tokens: int = 0
    kv_cache_usage: float = 0.0
    paused: bool = False


@dataclass
class _Track:
    """Thread-side bookkeeping of one engine request (for latency metrics and release)."""

    sink: asyncio.Queue
    num_samples: int
    arrival: float
    first: Optional[float] = None
    last: Optional[float] = None
    num_tokens: int = 0


@dataclass
class Generation:
    """Event-loop handle of one HTTP request's engine requests (a batch of prompts)."""

    owner: "EngineLoop"
    request_ids: list[str]
    queue: asyncio.Queue
    live: set = field(default_factory=set)

    async def next(self) -> list:
        """Wait for news, then take everything queued: [("error", exception)] or a list of
        ("output", RequestOutput) with only the latest output of each request. Outputs are
        cumulative, so a consumer that fell behind loses nothing by skipping the older ones,
        and a busy event loop sends fewer, larger deltas instead of falling further behind."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
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


def _prefix_counters(block_manager) -> tuple[int, int]:
    """(blocks looked up, blocks found) of the prefix cache, under either impl's names."""
    for queries, hits in (("num_queries", "num_hits"), ("_queries", "_hits")):
        if hasattr(block_manager, queries):
            return int(getattr(block_manager, queries)), int(getattr(block_manager, hits))
    return 0, 0


class EngineLoop:
    """Owns the EngineCore on one thread; see the module docstring."""

    def __init__(self, engine, metrics=None, *, max_waiting: int = 1024):
        self.engine = engine
        self.metrics = metrics
        self.capacity = engine.args.max_num_seqs + max_waiting
        self.state = EngineState()
        self.fatal: Optional[BaseException] = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._num_pending = 0  # event-loop side only
        self._accepting = True
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        # thread side only
        self._tracks: dict[str, _Track] = {}
        self._out: list = []
        self._released = 0
        self._paused = False
        self._fail_next = False
        self._stop = False
        self._last_counts = (0, 0, 0)  # preemptions, prefix queries, prefix hits
        self._salt_kw = "cache_salt" in inspect.signature(engine.add_request).parameters

    # ---- event-loop side ------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._publish_state()
        self._thread = threading.Thread(target=self._run, name="enginespec-engine-loop", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.fatal is None

    async def submit(self, subs: list[Submission]) -> Generation:
        """Queue the requests (all or none); returns once the engine accepted them. ValueError
        (the engine's validation), QueueFull (bounded queue, or shutting down)."""
        num = sum(s.params.n for s in subs)
        if not self._accepting:
            raise QueueFull("the server is shutting down")
        if self._num_pending + num > self.capacity:
            raise QueueFull(
                f"the waiting queue is full ({self._num_pending} pending samples, capacity {self.capacity})"
            )
        self._num_pending += num
        gen = Generation(self, [s.request_id for s in subs], asyncio.Queue(), set())
        self._inbox.put(("add", subs, gen.queue, time.perf_counter()))
        try:
            kind, payload = await gen.queue.get()  # the first item: "accepted" or "error"
        except asyncio.CancelledError:
            self.abort(gen.request_ids)  # accepted or not: an abort of unknown ids is a no-op
            raise
        if kind == "error":
            raise payload
        gen.live = set(gen.request_ids)
        return gen

    def abort(self, request_ids: list[str]) -> None:
        self._inbox.put(("abort", list(request_ids)))

    async def _ask(self, command: str, *args) -> None:
        fut = self._loop.create_future()
        self._inbox.put((command, fut, *args))
        await fut

    async def pause(self) -> None:
        """Stop stepping (commands are still taken: adds queue up, aborts free blocks)."""
        await self._ask("pause")

    async def resume(self) -> None:
        await self._ask("resume")

    async def fail_next_step(self) -> None:
        await self._ask("fail_next")

    def close_admission(self) -> None:
        """Refuse every new request from now on (503); the pending ones run on."""
        self._accepting = False

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new requests, fail the pending ones, end the thread (idempotent)."""
        self._accepting = False
        if self._thread is not None and self._thread.is_alive():
            self._inbox.put(("stop",))
            self._thread.join(timeout)

    def _deliver(self, items: list, released: int) -> None:
        self._num_pending -= released
        for sink, item in items:
            sink.put_nowait(item)

    # ---- thread side ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop:
                idle = self._paused or not self.engine.has_unfinished
                self._take_commands(block=idle)
                if not self._stop and not self._paused and self.engine.has_unfinished:
                    self._step()
                self._publish_state()
                self._flush()
        except BaseException as exc:  # a bug in the loop itself: fail everyone, report unhealthy
            traceback.print_exc()
            self.fatal = exc
        finally:
            self._fail_all(RuntimeError("the engine loop stopped"))
            self._publish_state()
            self._flush()

    def _take_commands(self, block: bool) -> None:
        try:
            command = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _apply(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            self._add(*command[1:])
        elif kind == "abort":
            self._abort(command[1])
        elif kind == "stop":
            self._stop = True
        else:
            fut = command[1]
            if kind == "pause":
                self._paused = True
            elif kind == "resume":
                self._paused = False
            elif kind == "fail_next":
                self._fail_next = True
            self._publish_state()
            self._loop.call_soon_threadsafe(_resolve, fut)

    def _add(self, subs: list[Submission], sink: asyncio.Queue, arrival: float) -> None:
        added: list[str] = []
        try:
            for sub in subs:
                self._add_one(sub)
                added.append(sub.request_id)
        except Exception as exc:  # ValueError: a 400; anything else: a 500
            self.engine.abort(added, report=False)
            self._out.append((sink, ("error", exc)))
            self._released += sum(s.params.n for s in subs)
            return
        for sub in subs:
            self._tracks[sub.request_id] = _Track(sink, sub.params.n, arrival)
            if self.metrics is not None:
                self.metrics.prompt_tokens.inc(len(sub.prompt_token_ids) * sub.params.n)
        self._out.append((sink, ("accepted", None)))

    def _add_one(self, sub: Submission) -> None:
        """engine.add_request; cache_salt goes as the engine's own keyword when it has one, else
        into the block hashes' cache_key (so tenants with different salts never share blocks)."""
        kwargs = dict(prompt=sub.prompt, priority=sub.priority)
        if sub.cache_salt is not None:
            if self._salt_kw:
                kwargs["cache_salt"] = sub.cache_salt
            else:
                kwargs["cache_key"] = ("cache_salt", sub.cache_salt)
        self.engine.add_request(sub.request_id, sub.prompt_token_ids, sub.params, **kwargs)

    def _abort(self, request_ids: list[str]) -> None:
        live = [rid for rid in request_ids if rid in self._tracks]
        if not live:
            return
        self.engine.abort(live, report=False)
        for rid in live:
            track = self._tracks.pop(rid)
            self._released += track.num_samples
            if self.metrics is not None:
                self.metrics.request_success("abort")

    def _fail_all(self, exc: BaseException) -> None:
        """Give every pending request the error and drop it from the engine."""
        ids = list(self._tracks)
        sinks = {id(t.sink): t.sink for t in self._tracks.values()}
        for sink in sinks.values():
            self._out.append((sink, ("error", exc)))
        for rid in ids:
            self._released += self._tracks.pop(rid).num_samples
        try:
            self.engine.abort(ids, report=False)
        except Exception:
            traceback.print_exc()

    def _step(self) -> None:
        start = time.perf_counter()
        try:
            if self._fail_next:
                self._fail_next = False
                raise InjectedFault("injected engine fault (/dev/fail_next_step)")
            outputs = self.engine.step()
        except Exception as exc:
            traceback.print_exc()
            self._fail_all(exc)
            return
        now = time.perf_counter()
        for out in outputs:
            self._on_output(out, start, now)
        self._update_counters()

    def _on_output(self, out, step_start: float, now: float) -> None:
        track = self._tracks.get(out.request_id)
        if track is None:
            return
        num = out.num_output_tokens
        new, track.num_tokens = num - track.num_tokens, num
        m = self.metrics
        if new > 0 and m is not None:
            m.generation_tokens.inc(new)
            if track.first is None:
                m.time_to_first_token.observe(now - track.arrival)
                m.request_queue_time.observe(max(0.0, step_start - track.arrival))
            else:
                m.inter_token_latency.observe(now - track.last)
        if new > 0:
            track.first = now if track.first is None else track.first
            track.last = now
        self._out.append((track.sink, ("output", out)))
        if out.finished:
            del self._tracks[out.request_id]
            self._released += track.num_samples
            if m is not None:
                m.e2e_request_latency.observe(now - track.arrival)
                for completion in out.outputs:
                    m.request_success(completion.finish_reason or "abort")

    def _update_counters(self) -> None:
        if self.metrics is None:
            return
        queries, hits = _prefix_counters(self.engine.block_manager)
        counts = (self.engine.stats.num_preemptions, queries, hits)
        (p0, q0, h0), self._last_counts = self._last_counts, counts
        bs = self.engine.args.block_size
        self.metrics.num_preemptions.inc(max(0, counts[0] - p0))
        self.metrics.prefix_cache_queries.inc(max(0, counts[1] - q0) * bs)
        self.metrics.prefix_cache_hits.inc(max(0, counts[2] - h0) * bs)
        spec_decode = getattr(self.engine.stats, "spec_decode", None)  # None: no drafter
        if spec_decode is not None:
            self.metrics.observe_spec_decode(spec_decode)

    def _publish_state(self) -> None:
        engine = self.engine
        bm = engine.block_manager
        state = EngineState(
            num_blocks=bm.num_blocks,
            num_free_blocks=bm.num_free,
            num_running=len(engine.scheduler.running),
            num_waiting=len(engine.scheduler.waiting),
            num_unfinished=engine.num_unfinished,
            num_steps=engine.stats.num_steps,
            num_generated_tokens=engine.stats.num_generated_tokens,
            kv_cache_usage=float(bm.usage),
            paused=self._paused,
        )
        self.state = state
        if self.metrics is not None:
            self.metrics.num_requests_running.set(state.num_running)
            self.metrics.num_requests_waiting.set(state.num_waiting)
            self.metrics.kv_cache_usage_perc.set(state.kv_cache_usage)

    def _flush(self) -> None:
        if not self._out and not self._released:
            return
        items, released = self._out, self._released
        self._out, self._released = [], 0
        try:
            self._loop.call_soon_threadsafe(self._deliver, items, released)
        except RuntimeError:  # the event loop is closed (process exit): nobody is listening
            pass


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
