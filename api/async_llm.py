"""AsyncLLM: the asyncio API for services, shaped like vLLM's (`vllm.v1.engine.async_llm`).

    llm = AsyncLLM("/path/to/checkpoint", max_num_seqs=64)   # the engine core starts here
    async for out in llm.generate("Hello", SamplingParams(max_tokens=32), request_id="r1"):
        print(out.outputs[0].text)                            # cumulative, as vLLM's default
    llm.shutdown()

The engine core runs in a process of its own (in_process=True: on a thread of this one, over
the same pipes), stepping for every caller at once; this side is the OpenAI server's engine
client (entrypoints/openai/engine_client.py) without HTTP: prompts are tokenized here, outputs
are built here from the engine's per-step deltas (text decoded as the engine would, logprobs,
cumulative_logprob, num_cached_tokens), and every `generate` is one engine request of n samples.

Invariants:
- `generate` yields the request's output after each step that changed it, as its params'
  output_kind asks (outputs.OutputView: CUMULATIVE by default, DELTA, FINAL_ONLY), and only its
  last yield has `finished` True. Each yield is a new RequestOutput with new CompletionOutputs;
  CUMULATIVE ones share their token_ids and logprobs lists with later yields (they keep
  growing, as vLLM's do: copy them to keep a step's view). A consumer that fell behind gets the
  news of several steps at once, never loses the final output.
- Leaving `generate` early (break, aclose, a cancelled task) aborts the request: the engine
  frees its blocks before its next step. `abort(request_id)` ends a live `generate` with one last
  output whose unfinished samples have finish_reason "abort" and their whole text (the tail
  the engine held back for a stop string included, as a finished sample shows it).
- Errors: a bad prompt or params is a ValueError raised by `generate` before anything is
  queued; a request id still in use is a ValueError; a step that fails (the forward or the
  sampler raised) ends its requests as LLM.generate does, with a last output whose samples have
  finish_reason "error" and the fault in `error`; a request the engine refused or dropped
  outside a step's outputs (its add failed there, its ids could not be decoded) raises
  EngineRequestError; after `shutdown` (or the engine's death) every live and new `generate`
  raises EngineDead.
- The reader of the engine's messages runs on the event loop that first calls `generate`; a
  later loop may take over once nothing is pending (asyncio.run per call works), or once that
  loop is closed: its pending requests, which nothing can read any more, are then aborted.
  `generate` or `abort` on another loop while that one runs (or is stopped, not closed, with
  requests pending: it may run again) is a RuntimeError.
- A process that never calls `shutdown` still exits: the engine is stopped at interpreter exit.
  An AsyncLLM that is garbage collected without `shutdown` stops its engine then (as vLLM's),
  so dropping one never leaves its engine, and the model it holds, running.
- Sleep mode (enable_sleep_mode=True): `sleep(level=1)`, `wake_up(tags=None)`, `is_sleeping()`
  and `reload_weights()` are LLM's calls, taken by the engine process between two steps; while
  it sleeps a new `generate` raises EngineAsleep (an EngineRequestError) and nothing is queued.
- `beam_search` (vLLM's EngineClient.beam_search) yields once, the search's finished output;
  its steps are engine requests "{request_id}-step{k}-{i}" (one a live beam), so abort() does not
  reach them by request_id: leaving the generator aborts the step in flight.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import weakref
from typing import AsyncIterator, Iterable, Optional, Union

from enginespec.beam_search import (
    BeamSearchInstance,
    BeamSearchParams,
    check_beam_width,
    run_beam_search_async,
)
from enginespec.engine.core_messages import NewRequest
from enginespec.engine.engine_core import load_engine_tokenizer, truncate_prompt
from enginespec.engine.generation_config import GenerationDefaults
from enginespec.engine_args import EngineArgs
from enginespec.entrypoints.openai import serving_beam
from enginespec.entrypoints.openai.engine_client import (
    EngineAsleep,
    EngineClient,
    EngineDead,
    EngineRequestError,
    fresh_error,
)
from enginespec.llm import PromptType, _cache_key, check_lora_request, check_reset_running, prompt_to_ids
from enginespec.outputs import OutputView, RequestOutput
from enginespec.spec import SamplingParams

__all__ = ["AsyncLLM", "EngineAsleep", "EngineDead", "EngineRequestError"]

# Samples pending at once beyond max_num_seqs before generate() refuses more (QueueFull): none
# in practice, as vLLM's AsyncLLM has no such bound; the server sets its own.
UNBOUNDED_WAITING = 1 << 40


class AsyncLLM:
    """An engine core in its own process, and an asyncio front end to it (module doc)."""

    def __init__(
        self,
        model,
        impl="fast",
        *,
        in_process: bool = False,
        start_timeout: Optional[float] = None,
        **engine_args,
    ):
        self._start(EngineArgs.from_kwargs(model, impl=impl, **engine_args), in_process, start_timeout)

    @classmethod
    def from_engine_args(
        cls, engine_args: EngineArgs, *, in_process: bool = False, start_timeout: Optional[float] = None
    ) -> "AsyncLLM":
        """vLLM's constructor of choice: an AsyncLLM over already built EngineArgs."""
        self = cls.__new__(cls)
        self._start(engine_args, in_process, start_timeout)
        return self

    def _start(self, args: EngineArgs, in_process: bool, start_timeout: Optional[float]) -> None:
        self.engine_args = args
        self.tokenizer = load_engine_tokenizer(args)
        self._beam_ids: set[str] = set()  # request ids of the beam searches under way
        self._defaults = GenerationDefaults.load(
            args.model_dir(), args.generation_config, args.override_generation_config
        )
        self._client = EngineClient(
            args, self.tokenizer, max_waiting=UNBOUNDED_WAITING, in_process=in_process
        )
        self.info = self._client.launch(start_timeout)  # a ValueError for a bad checkpoint
        # A script that never calls shutdown() must still exit: multiprocessing joins the engine
        # process at exit, and it only ends once told (atexit runs this hook before that join).
        atexit.register(self._client.stop)
        # Dropped without shutdown(): the exit hook alone held the client, so the engine ran on
        # until exit. The finalizer holds the client, never self (self would never be collected).
        self._finalizer = weakref.finalize(self, _stop_client, self._client)
        self._finalizer.atexit = False  # the exit hook above stops it there, before mp's join

    # ---- requests -------------------------------------------------------------------------------

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: Optional[SamplingParams] = None,
        request_id: Optional[str] = None,
        *,
        priority: int = 0,
        lora_request=None,
    ) -> AsyncIterator[RequestOutput]:
        """Run one request; yields its cumulative RequestOutput after each step that changed
        it, the last one finished (module doc). sampling_params None: the checkpoint's
        generation_config.json defaults, as LLM.generate. request_id: a non-empty str not in
        use by a live request (vLLM requires it; pass your own to abort() by it).
        lora_request: vLLM's keyword, None only (llm.check_lora_request)."""
        check_lora_request(lora_request, 1)
        request = self._new_request(prompt, sampling_params, request_id, priority)
        if not self.is_running:
            raise self.dead_error
        self._bind_loop()
        gen = await self._client.submit([request])
        view = OutputView(request.params.output_kind)
        try:
            while not gen.done:
                for kind, payload in await gen.next():
                    if kind == "error":
                        raise payload
                    shown = view.view(payload)
                    if shown is not None:
                        yield shown
        finally:
            gen.abort()  # a no-op once finished; frees the engine's blocks when left early

    async def beam_search(
        self, prompt: PromptType, request_id: str, params: BeamSearchParams, lora_request=None
    ) -> AsyncIterator[RequestOutput]:
        """Beam search of one prompt by vLLM's rules (beam_search.py's module doc), shaped as
        vLLM's EngineClient.beam_search: one yield, the finished RequestOutput whose samples are
        the best params.beam_width beams, best first. Each sample's token_ids and text are its
        generated part (an ending EOS in token_ids only with include_stop_str_in_output, never in
        the text), logprobs each step's candidates, finish_reason "stop" (stop_reason the EOS)
        or "length"; the best beams equal LLM.beam_search's. Every step submits each live beam
        as a one-token engine request, so shared prefixes come from the prefix cache.
        ValueError before any step: a request_id or params generate() would refuse (an id in
        use by another beam search too: their step requests would collide), a
        beam_width over half the engine's max_logprobs or vocabulary (check_beam_width), or a
        lora_request other than None (vLLM's keyword, llm.check_lora_request); a bad prompt
        fails the first step as it fails generate(). A step the engine failed raises
        EngineRequestError."""
        check_lora_request(lora_request, 1)
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        check_beam_width(params, self.engine_args.max_logprobs, self.info.vocab_size)
        first = self._new_request(prompt, SamplingParams(max_tokens=1), request_id, 0)
        if not self.is_running:
            raise self.dead_error
        self._bind_loop()
        if request_id in self._beam_ids:
            raise ValueError(f"request_id {request_id!r} is already in use by a pending beam search")
        room = max(self.info.max_model_len - len(first.prompt_token_ids), 1)
        instance = BeamSearchInstance(first.prompt_token_ids, min(params.max_tokens, room), first.cache_salt)
        eos = serving_beam.eos_token_id(self.tokenizer, self.info.eos_token_id)
        cached: list[int] = []
        self._beam_ids.add(request_id)
        try:
            await run_beam_search_async([instance], self._beam_step(request_id, params, cached), params, eos)
        finally:
            self._beam_ids.discard(request_id)
        decode = self.tokenizer.decode if self.tokenizer is not None else (lambda ids: "")
        prompt_of = (first.prompt, first.prompt_token_ids)
        k = 2 * params.beam_width + 1  # every candidate of a step: its 2 * beam_width and the drawn one
        yield serving_beam.request_output(request_id, prompt_of, instance, params, eos, decode, k, cached[0])

    def _beam_step(self, request_id: str, params: BeamSearchParams, cached: list[int]):
        """beam_search.AsyncStepFn over the engine: a step's beams as one-token requests,
        submitted together and awaited together (aborted if the caller leaves); the first
        step's num_cached_tokens go to `cached`."""
        sampling = serving_beam.step_params(params, seed=None)
        steps = itertools.count()

        async def step(batch):
            base = f"{request_id}-step{next(steps)}"
            subs = [
                NewRequest(f"{base}-{i}", None, list(ids), sampling, 0, salt)
                for i, (ids, salt) in enumerate(batch)
            ]
            gen = await self._client.submit(subs)
            finals: dict = {}
            try:
                while not gen.done:
                    for kind, payload in await gen.next():
                        if kind == "error":
                            raise payload
                        if payload.finished:
                            finals[payload.request_id] = payload
            finally:
                gen.abort()
            samples = [finals[sub.request_id].outputs[0] for sub in subs]
            for sample in samples:
                if sample.finish_reason == "error":
                    raise EngineRequestError(sample.error or "the engine failed a beam search step")
            if not cached:
                cached.append(finals[subs[0].request_id].num_cached_tokens)
            return [sample.logprobs[0] if sample.logprobs else None for sample in samples]

        return step

    def _new_request(self, prompt, params, request_id, priority: int) -> NewRequest:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if params is None:
            params = self._defaults.params()
        elif not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams or None, got {type(params).__name__}")
        text, ids = prompt_to_ids(prompt, self.tokenizer)
        # truncated here, as the engine would: the output's prompt_token_ids (and the prompt the
        # detokenizer continues) are the ids the engine runs, as LLM.generate's
        ids = truncate_prompt(ids, params.truncate_prompt_tokens, self.info.max_model_len)
        salt = _cache_key(prompt)
        return NewRequest(request_id, text, ids, params, priority, salt[1] if salt else None)

    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        """Abort live requests by id (unknown or finished ids are ignored): the engine frees
        their blocks before its next step, and each one's `generate` yields a last output
        with finish_reason "abort" on its unfinished samples, then ends. Called from a loop
        other than the one reading the engine while that one runs: a RuntimeError, as
        generate (their inboxes and futures belong to that loop). After shutdown or the engine's
        death nothing is pending, and abort does nothing."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self._bind_loop()
        self._client.abort(ids, notify=True)

    def _bind_loop(self) -> None:
        """Read the engine's messages on the running loop: the first caller's, or a new one
        once the old loop is stopped with nothing pending, or closed (its pending requests are
        aborted: their consumers and futures went with it, and they would hold their blocks)."""
        loop, old = asyncio.get_running_loop(), self._client.loop
        if loop is old:
            return
        if old is not None and old.is_running() and not old.is_closed():
            raise RuntimeError("AsyncLLM is bound to another running event loop; call it from that loop")
        if old is not None and old.is_closed():
            self._client.abandon_pending()
        elif old is not None and self._client.num_pending_requests:
            raise RuntimeError(
                "AsyncLLM has requests pending on a stopped event loop; run that loop until they "
                "end, or close it (its pending requests are then aborted)"
            )
        self._client.start(loop)

    # ---- state ----------------------------------------------------------------------------------

    async def get_tokenizer(self):
        return self.tokenizer

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget the engine's cached prefix blocks (vLLM's name and return; LLM.reset_prefix_cache
        is the same in-process): the engine takes it between two steps, in its own process. True
        when done; False, with nothing changed, while a request holds blocks (one still
        generating: finish or abort it first). EngineDead when the engine is not running.
        reset_running_requests: vLLM's keyword, False only (llm.check_reset_running)."""
        check_reset_running(reset_running_requests)
        if not self.is_running:
            raise self.dead_error
        self._bind_loop()
        return await self._client.reset_prefix_cache()

    async def start_profile(self, profile_prefix: Optional[str] = None) -> None:
        """vLLM's: trace what the engine runs from now until stop_profile() with torch.profiler,
        in the engine's own process (where the model runs; this one is not traced), into
        profiler_config's torch_profiler_dir, else the directory VLLM_TORCH_PROFILER_DIR names
        there (api/profiler.py states the rules; set it before the AsyncLLM starts its engine).
        Taken between two steps. RuntimeError (its ProfilerStateError) while a profile runs;
        EngineRequestError when neither is set; EngineDead when the engine is not running."""
        if not self.is_running:
            raise self.dead_error
        self._bind_loop()
        await self._client.start_profile(profile_prefix)

    async def stop_profile(self) -> None:
        """vLLM's: stop the engine's trace and write it (written when this returns); a
        RuntimeError (ProfilerStateError) while none runs."""
        if not self.is_running:
            raise self.dead_error
        self._bind_loop()
        await self._client.stop_profile()

    async def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (enable_sleep_mode=True), taken by the engine process between two
        steps: LLM.sleep's rules (level 1: weights to host memory; level 2: discarded, for
        reload_weights to fill; KV cache freed, prefix cache emptied). Its refusals raise here:
        a ValueError (a bad level), an EngineRequestError naming the engine's RuntimeError
        (sleep mode off, requests unfinished). While asleep a new request fails with
        EngineAsleep. EngineDead when the engine is not running."""
        if not self.is_running:
            raise self.dead_error
        self._bind_loop()
        await self._client.sleep(level)

    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """vLLM's: restore the tags sleep() released ("weights", "kv_cache"; None: both)."""
        if not self.is_running:
            raise self.dead_error
        self._bind_loop()
        await self._client.wake_up(tags)

    async def reload_weights(self, weights_path: Optional[str] = None) -> int:
        """vLLM's reload_weights, taken by the engine process between two steps: LLM.reload_
        weights' rules (the checkpoint directory, default the model's, read from disk again and
        copied in; the prefix cache emptied). Returns how many tensors were copied. Refusals:
        ValueError (unknown name, shape; under tensor parallelism any rank's), EngineRequestError
        naming the engine's RuntimeError (requests unfinished, weights asleep). Tensors given from this
        process (LLM.load_weights) do not cross to the engine process yet."""
        if not self.is_running:
            raise self.dead_error
        self._bind_loop()
        return await self._client.reload_weights(weights_path)

    async def is_sleeping(self) -> bool:
        """vLLM's: whether some tag sleeps (asked of the engine process)."""
        if not self.is_running:
            raise self.dead_error
        self._bind_loop()
        return await self._client.is_sleeping()

    @property
    def is_running(self) -> bool:
        """The engine is up and taking requests."""
        return self._client.alive

    @property
    def errored(self) -> bool:
        """The engine died (every pending and new request raises EngineDead)."""
        return self._client.fatal is not None

    @property
    def dead_error(self) -> BaseException:
        """A new EngineDead for each caller to raise (engine_client.fresh_error: one shared
        instance would gather every raise's frames)."""
        fatal = self._client.fatal
        return fresh_error(fatal) if fatal is not None else EngineDead("the engine is stopped")

    async def check_health(self) -> None:
        """Raise EngineDead when the engine is not running, else nothing (vLLM's name)."""
        if not self.is_running:
            raise self.dead_error

    @property
    def num_unfinished_requests(self) -> int:
        """Requests submitted here and not yet finished, failed or aborted."""
        return self._client.num_pending_requests

    def shutdown(self, timeout: float = 10.0) -> None:
        """End every live `generate` with EngineDead, stop the engine and reap its process.
        Idempotent."""
        self._finalizer.detach()
        _stop_client(self._client, timeout)

    def __enter__(self) -> "AsyncLLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _stop_client(client: EngineClient, timeout: float = 10.0) -> None:
    """Stop the engine and drop its exit hook: shutdown(), or the finalizer of an AsyncLLM that
    was collected without it. Idempotent (EngineClient.stop is)."""
    client.stop(timeout)
    atexit.unregister(client.stop)
