"""EngineCore: one loop over any Implementation.

step() = schedule -> swaps -> build batch -> execute -> sample -> update_from_output ->
process outputs (engine/output_processor.py: detokenize, stop strings, RequestOutputs).

A failed step fails only its own requests and poisons nothing (spec/SCHEDULING.md, "A failed
step"): an exception in any phase (schedule, prepare, execute, sample, update, detokenize,
async or serial) finishes the step's requests with finish_reason "error" and the message, after
unpublishing the blocks their forward may not have written; every other request, and the
engine, serve on. A BaseException that is not an Exception (KeyboardInterrupt) gets the same
clean-up, then propagates; the failed requests' outputs come from the next step().

A user request with n > 1 becomes n sibling requests (internal ids: engine/request_ids.py) with
the same prompt; with prefix caching on, the siblings admitted after the first find its prompt
blocks published (publish-before-compute) and share them instead of computing them again. A
seeded request with n > 1 gives sibling i the seed `seed + i`, so the samples differ but each is
reproducible. A sample that ends "error" (any per-request fault) fails its user request: its
unfinished siblings end "error" in the same step (_fail_siblings), scheduled or not.

Invariants: every request the scheduler knows belongs to exactly one live parent here; a
parent's final RequestOutput (finished=True) is returned by exactly one step(), after which the
engine forgets it; any exception from add_request (ValueError, KeyboardInterrupt) leaves nothing
behind. EngineCore is not thread-safe: the LLM front end serialises calls into it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import numbers
import os
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Union

import torch

from enginespec.engine.async_scheduling import (
    InFlight,
    apply_patch,
    deferrable,
    input_patch,
    start_copy,
)
from enginespec.engine.generation_config import GenerationDefaults, further_eos_ids
from enginespec.engine.output_processor import ERROR, OutputProcessor, Parent, Sample, store_prompt_logprobs
from enginespec.engine.request_ids import internal_id
from enginespec.engine.spec_decode import DraftModelDrafter, SpecDecoder, SpecDecodeStats, SpeculativeConfig
from enginespec.engine.spec_decode.draft_model import (
    check_draft_checkpoint,
    check_draft_model,
    check_draft_reach,
    draft_pool_blocks,
)
from enginespec.engine_args import EngineArgs, resolve_device, resolve_dtype
from enginespec.outputs import RequestOutput
from enginespec.sample.deferred import device_prompt_logprobs
from enginespec.sample.grammar_mask import apply_token_bitmask
from enginespec.sample.penalties import bans_read_outputs, first_breach, holds_draws, stop_ids_to_mask
from enginespec.spec import SamplingParams, Status, UpdateOutput, check_token_ids, load_impl, token_stop
from enginespec.spec.params import SEED_RANGE, UNSEEDED
from enginespec.worker.runner import ModelRunner, kv_bytes_per_block
from enginespec.worker.sleep import EngineAsleepError, check_filled, check_level, check_tags

log = logging.getLogger(__name__)

# Empty schedules in a row, with requests unfinished and no step in flight, that fail them (a
# correct scheduler needs at most one: a step that only preempted)
MAX_EMPTY_STEPS = 3
# the sampler keys a seeded row by its seed modulo 2**64 (sample/sampler.py)
_SEED_MASK = (1 << 64) - 1


@dataclass
class EngineStats:
    """Counters since construction (from zero after the warm-up; startup figures aside): steps
    with work, scheduled tokens (prompt and recompute included), sampled tokens, preemptions,
    steps that left their ids on the device (async scheduling), and wall seconds spent in
    step()."""

    num_steps: int = 0
    num_scheduled_tokens: int = 0
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    num_async_steps: int = 0  # steps whose ids stayed on the device (async scheduling)
    num_failed_steps: int = 0  # steps that raised and were rolled back (their requests: "error")
    # async steps that read the step before's tokens before sampling (a grammar's mask, bad words
    # of several tokens): the host waited for the device there
    num_resolved_first: int = 0
    step_seconds: float = 0.0
    startup_seconds: float = 0.0  # EngineCore construction, warm-up included (kept by resets)
    warmup_seconds: float = 0.0  # of which the warm-up (engine/warmup.py)
    # startup_seconds by phase (kept by resets): "load" (weights, tokenizer, draft model),
    # the runner's ("gemm_tuning", "profile_run": sizing, whose first forward compiles the
    # decoder, "graph_capture"), "warm_up"; what is left of startup_seconds is "other".
    startup_phases: dict = field(default_factory=dict)
    num_recomputed_tokens: int = 0  # tokens computed again after a preemption by recompute
    # vLLM's prefix_cache_queries / _hits: each request's tokens and the tokens its cached blocks
    # covered, once, at its first admission (_record_admission)
    num_prefix_queries: int = 0
    num_prefix_hits: int = 0
    # vLLM's prompt_tokens / request_success, per sample as V1 counts child requests: a sample's
    # prompt tokens once its first tokens come (never a request ended before one), and each
    # sample's final reason when its request is forgotten (finished, or aborted unreported)
    num_prompt_tokens: int = 0
    # of which the prefix cache served (the samples' num_cached_tokens, counted with their prompt):
    # vLLM's prompt_tokens_cached, and prompt_tokens_by_source's local_cache_hit
    num_prompt_cached_tokens: int = 0
    finish_reasons: dict = field(default_factory=dict)
    num_swapped_bytes: int = 0  # KV bytes copied out to and back in from host memory (swap)
    swap_seconds: float = 0.0  # host wall seconds in runner.apply_swaps (a swap-out waits for its copies)
    # None, or a list each step with work appends (num_reqs, num_tokens, kv_tokens, end time,
    # wait seconds) to: scheduled requests and tokens, the sum of their context lengths,
    # time.perf_counter() when the step's work was done, and how long the host blocked on the
    # GPU in it (waiting for the previous step's ids; near 0 means the GPU waited on the host).
    # The benchmark's per-batch-size breakdown reads it.
    step_trace: Optional[list] = None
    # Speculative decoding's counters (engine/spec_decode/stats.py), None without a drafter.
    spec_decode: Optional[SpecDecodeStats] = None


def load_engine_tokenizer(args: EngineArgs):
    """The engine's tokenizer (the server's too): None with skip_tokenizer (or vLLM's
    skip_tokenizer_init) or no model; else
    the one in args.tokenizer_dir() (tokenizer / tokenizer_revision: a directory or a cached
    repo, which must hold one) or the model's (None if it has none), through AutoTokenizer with
    args.trust_remote_code, use_fast=False for tokenizer_mode "slow"."""
    if args.model is None or args.skip_tokenizer or args.skip_tokenizer_init:
        return None
    from enginespec.worker.loader import load_tokenizer, load_tokenizer_dir

    options = {"trust_remote_code": args.trust_remote_code, "use_fast": args.tokenizer_mode != "slow"}
    tokenizer_dir = args.tokenizer_dir()
    if tokenizer_dir is not None:
        return load_tokenizer_dir(tokenizer_dir, **options)
    return load_tokenizer(args.model_dir(), **options)


def startup_line(stats: EngineStats) -> str:
    """One line: how long construction took and where it went (EngineStats.startup_phases)."""
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in stats.startup_phases.items())
    return f"engine ready in {stats.startup_seconds:.1f} s ({parts})"


def truncate_prompt(ids: list[int], keep: Optional[int], max_model_len: int) -> list[int]:
    """The last `keep` prompt tokens (vLLM's truncate_prompt_tokens: None keeps all, -1 up to
    max_model_len); a keep above max_model_len is a ValueError naming it, as in vLLM.
    Idempotent, so a front end that applies it before the engine does changes nothing there."""
    if keep is None:
        return ids
    if keep > max_model_len:
        raise ValueError(
            f"SamplingParams.truncate_prompt_tokens must be <= max_model_len ({max_model_len}), got {keep}"
        )
    keep = max_model_len if keep == -1 else keep
    return ids[-keep:]


class EngineCore:
    """Composes an Implementation with a FlatModel, a ModelRunner and the Sampler."""

    def __init__(self, args: EngineArgs, *, model=None, tokenizer=None, draft_model=None):
        """model / tokenizer / draft_model: already loaded ones instead of EngineArgs.model's
        and speculative_config's "model" (tests share them between engines)."""
        from enginespec.kernels import compile_procs

        with compile_procs.lease():  # the startup's compile workers end with it (the last lease)
            try:
                self._build(args, model, tokenizer, draft_model)
            except BaseException:
                self._release_tensor_parallel()
                raise

    def _release_tensor_parallel(self) -> None:
        """A build that failed once the tensor-parallel workers started stops them and leaves
        the process group: no engine is returned that the caller could close, and the group
        left behind would refuse the process's next tensor-parallel engine."""
        tp = getattr(self, "tensor_parallel", None)
        if tp is not None:
            tp.shutdown()

    def _build(self, args: EngineArgs, model, tokenizer, draft_model) -> None:
        """__init__'s body: load, tune, profile, capture, warm up (startup_phases times each)."""
        started = time.perf_counter()
        self.args = args
        self.impl = load_impl(args.impl)
        if args.preemption_mode == "swap" and "swap" not in getattr(self.impl, "capabilities", ()):
            raise ValueError(
                f"preemption_mode='swap' needs an impl with the 'swap' capability; "
                f"{self.impl.name!r} has {sorted(getattr(self.impl, 'capabilities', ()))}"
            )
        self.speculative_config = SpeculativeConfig.of(args.speculative_config)
        self._draft_path: Optional[str] = None  # the draft's directory, once resolved (_draft_dir)
        self._check_draft_early(model, draft_model)
        if args.tensor_parallel_size > 1 and model is not None:
            raise ValueError(
                "tensor_parallel_size > 1 loads each rank's shard itself: pass EngineArgs.model, not model="
            )
        self.tensor_parallel = None  # rank 0's handle on the TP workers (tensor_parallel_size > 1)
        self.model = model if model is not None else self._load_model()
        self.tokenizer = tokenizer if tokenizer is not None else self._load_tokenizer()
        self.generation = GenerationDefaults.load(
            args.model_dir(), args.generation_config, args.override_generation_config
        )  # generation_config.json
        self.max_model_len = args.resolve_max_model_len(self.model.max_positions)
        self.model.cover_positions(self.max_model_len)  # past max_positions only where allowed
        self.draft_model = self._draft_model(draft_model)  # before the pool takes the memory
        loaded = time.perf_counter()
        self.scheduler_config = args.scheduler_config(self.max_model_len)
        self.sampler = self._make_sampler()
        self.runner = self._make_runner(args)
        self._fit_max_model_len()
        if self.draft_model is not None:
            check_draft_reach(self.draft_model, self.max_model_len)
        self.block_manager = self.impl.new_block_manager(
            self.runner.num_blocks, args.block_size, args.enable_prefix_caching
        )
        self.scheduler = self.impl.new_scheduler(self.scheduler_config, self.block_manager)
        self.stats = EngineStats()
        self.spec = self._make_spec_decoder()
        # every unfinished request id -> its Parent (read by the engine process, core_proc.py;
        # written only here)
        self.parents: dict[str, Parent] = {}
        self._samples: dict[str, tuple[Parent, Sample]] = {}
        self._pending: dict[str, Parent] = {}  # parents to report next step (aborts)
        self._inflight: Optional[InFlight] = None  # async scheduling: the step awaiting its tokens
        self._structured = None  # StructuredOutputManager, built on the first constrained request
        self._grammar_pool: Optional[ThreadPoolExecutor] = None  # prepare_grammar's threads
        self._constrained: set[str] = set()  # internal ids of the samples with a grammar
        # internal ids of the samples with bad words of several tokens: like a grammar, their
        # bans read the newest tokens, so a step with one resolves the previous step before it
        # samples (one-token words ban whatever came before: penalties.bans_read_outputs)
        self._banning: set[str] = set()
        # internal ids of the samples whose draws are checked against their hard constraints
        # (sample.penalties.holds_draws), to their allowed ids as a set (None: every id): a row
        # they empty ends "error", a stop id that min_tokens yielded to ends "stop"
        # (_hold_constraints)
        self._holding: dict[str, Optional[frozenset]] = {}
        self.outputs = OutputProcessor(self.scheduler.finish, placeholder_id=self.vocab_size)
        # Fault injection (tests, benchmarks/soak.py): called with each phase's name as it
        # starts ("schedule" right after Scheduler.schedule() returned, "prepare", "execute",
        # "sample", "update", "detokenize"); whatever it raises is handled like a real fault.
        self.fault_hook: Optional[Callable[[str], None]] = None
        self._high_water: dict[str, int] = {}  # request id -> most tokens ever computed
        self._empty_steps = 0  # empty schedules in a row with nothing in flight (_check_progress)
        self._unscheduled_failures = 0  # steps in a row that failed before schedule() returned
        self.warmup_report = self._warm_up()
        self.stats.startup_seconds = time.perf_counter() - started
        self.stats.startup_phases = self._startup_phases(loaded - started)
        log.info(startup_line(self.stats))

    def _startup_phases(self, load_seconds: float) -> dict:
        """EngineStats.startup_phases (see there), in the order they ran."""
        phases = {"load": load_seconds, **getattr(self.runner, "startup_phases", {})}
        phases["warm_up"] = self.stats.warmup_seconds
        phases["other"] = max(0.0, self.stats.startup_seconds - sum(phases.values()))
        return phases

    def _make_runner(self, args: EngineArgs):
        """The model runner (worker/runner.py, or the tensor-parallel one): its construction
        tunes the GEMMs, sizes the pool by a profile run and captures the decode graphs."""
        return self._runner_class()(
            self.model,
            self.impl,
            block_size=args.block_size,
            max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
            max_num_seqs=self.scheduler_config.max_num_seqs,
            max_model_len=self.max_model_len,
            num_blocks=args.num_blocks,
            kv_cache_bytes=args.kv_cache_bytes,
            gpu_memory_utilization=args.gpu_memory_utilization,
            num_gpu_blocks_override=args.num_gpu_blocks_override,
            sample_fn=self.sampler,
            enforce_eager=args.enforce_eager,
            compile_model=args.compile_model,
            compile_backend=args.compile_backend,
            kv_bytes_reserved_per_block=self._draft_bytes_per_block(),
            skinny_gemm=args.skinny_gemm,
            mixed_graph_tokens=args.mixed_graph_tokens(self.scheduler_config.max_num_batched_tokens),
        )

    def _fit_max_model_len(self) -> None:
        """A max_model_len the user did not choose (the model's) is lowered to the most tokens
        the KV pool holds and, with chunked prefill off, to the most one request may have
        (max_num_batched_tokens + 1: add() wants prompt + max_tokens - 1 within one step), with
        a warning: otherwise every request of that length is refused on add, and the server
        advertises, and defaults chat max_tokens to, a length no request can reach. A chosen one
        stays (requests over the pool are refused on add, naming it; one over the budget was
        refused in EngineArgs.scheduler_config), with a warning where the pool cannot hold it
        (vLLM refuses to start there)."""
        config = self.scheduler_config
        capacity = self.runner.num_blocks * self.args.block_size
        _check_pool_holds_a_request(self.runner.num_blocks, self.args.block_size)
        one_step = None if config.enable_chunked_prefill else config.max_num_batched_tokens + 1
        reach = capacity if one_step is None else min(capacity, one_step)
        if reach >= self.max_model_len:
            return
        if self.args.chosen_max_model_len:  # kept, but said at startup, not at the first refusal
            if capacity < self.max_model_len:
                log.warning(
                    "max_model_len %d (chosen) is more than the KV pool holds (%d blocks of %d: %d "
                    "tokens): a request longer than that, and one with max_tokens unset, is refused; "
                    "a larger pool (num_blocks, kv_cache_bytes, gpu_memory_utilization) or a smaller "
                    "max_model_len fits it",
                    self.max_model_len,
                    self.runner.num_blocks,
                    self.args.block_size,
                    capacity,
                )
            return
        if reach == capacity:
            why = (
                f"the most tokens the KV pool holds ({self.runner.num_blocks} blocks of "
                f"{self.args.block_size}); a larger pool (num_blocks, kv_cache_bytes, "
                f"gpu_memory_utilization) raises it"
            )
        else:
            why = (
                f"the most one request may have with enable_chunked_prefill=False (max_num_batched_tokens "
                f"{config.max_num_batched_tokens} + 1: its prompt prefills in one step); a larger "
                f"budget or chunked prefill raises it"
            )
        log.warning(
            "max_model_len lowered from the model's %d to %d, %s, and max_model_len= sets it",
            self.max_model_len,
            reach,
            why,
        )
        self.max_model_len = reach
        self.scheduler_config = dataclasses.replace(config, max_model_len=reach)

    def _warm_up(self):
        """engine/warmup.py, when EngineArgs.warmup says so (None: on for CUDA)."""
        from enginespec.engine.warmup import warm_up

        setting = self.args.warmup
        if setting is False or (setting is None and self.model.device.type != "cuda"):
            return None
        report = warm_up(self, tiny=self.model.device.type != "cuda")
        self.stats.warmup_seconds = report.seconds
        return report

    # ---- construction helpers -----------------------------------------------------------------

    def _load_model(self):
        from enginespec.worker.flat_model import FlatModel

        if self.args.model is None:
            raise ValueError("EngineArgs.model must name a checkpoint directory (or pass model=)")
        device = resolve_device(self.args.device)
        dtype = resolve_dtype(self.args.dtype, self.args.model_dir(), device, self.args.hf_overrides)
        if self.args.tensor_parallel_size > 1:
            return self._load_tensor_parallel(device, dtype)
        return FlatModel.from_pretrained(
            self.args.model_dir(),
            dtype=dtype,
            device=device,
            attention=self.impl.attention_backend(device),
            model_impl=self.args.model_impl,
            trust_remote_code=self.args.trust_remote_code,
            hf_overrides=self.args.hf_overrides,
        )

    def _load_tensor_parallel(self, device, dtype):
        """Spawn the TP workers and load rank 0's shard (worker/tp_group.py). The workers and
        the process group end with this engine: shutdown(), or its collection when it is dropped
        unclosed (`del llm`, as vLLM users free an engine before building the next one)."""
        from enginespec.worker.tp_group import start_tensor_parallel

        tp = self.tensor_parallel = start_tensor_parallel(self.args, self.impl, device, dtype)
        weakref.finalize(self, tp.shutdown)  # tp holds no reference back to the engine
        return tp.model

    def _runner_class(self):
        if self.tensor_parallel is None:
            return ModelRunner
        import functools

        from enginespec.worker.tp_runner import TPModelRunner

        return functools.partial(TPModelRunner, tp=self.tensor_parallel)

    def shutdown(self) -> None:
        """Release what outlives a Python reference: the tensor-parallel workers and process
        group (a no-op for one rank), and the grammar threads (a compile under way is not waited for).
        Idempotent; the engine cannot step afterwards under TP."""
        if self._grammar_pool is not None:
            self._grammar_pool.shutdown(wait=False, cancel_futures=True)
        if self.tensor_parallel is not None:
            self.tensor_parallel.shutdown()

    def _load_tokenizer(self):
        return load_engine_tokenizer(self.args)

    def _make_sampler(self):
        from enginespec.sample.sampler import Sampler

        return Sampler(self.model.vocab_size, self.model.device, seed=self.args.seed)

    def _draft_model(self, given):
        """The draft model of speculative_config method "draft_model" (None otherwise), loaded
        like the target (same dtype, device, attention), its vocabulary checked against the
        target's (its reach is checked in _build, once the pool has settled max_model_len).
        Under tensor parallelism it is whole, on rank 0 alone (vLLM's draft_tensor_parallel_size
        1): only rank 0 schedules and drafts, its runner a plain ModelRunner that no collective
        touches; the workers see the drafts as the widened target batch rank 0 sends them."""
        config = self.speculative_config
        if config is None or config.method != "draft_model":
            if given is not None:
                raise ValueError("draft_model= needs speculative_config method 'draft_model'")
            return None
        draft = given if given is not None else self._load_draft(self._draft_dir())
        check_draft_model(draft, self.model)
        return draft

    def _check_draft_early(self, model, draft_model) -> None:
        """A draft_model config's checks that need no weights, before the target loads (or its
        tensor-parallel workers spawn): the draft's config.json (check_draft_checkpoint) where
        both checkpoints come from paths. _draft_model checks the loaded models again.
        hf_overrides apply to the target's config only, as vLLM's: the draft loads as saved."""
        config = self.speculative_config
        if config is None or config.method != "draft_model":
            return
        if model is None and draft_model is None and self.args.model is not None:
            check_draft_checkpoint(
                self._draft_dir(), self.args.model_dir(), self.args.trust_remote_code, self.args.hf_overrides
            )

    def _draft_dir(self) -> str:
        """speculative_config's draft "model" as a local directory, resolved once as
        EngineArgs.model is (worker/hub_cache.py: a directory, or a repo id in the local hub
        cache, download_dir's when given, at speculative_config.revision); a miss is CheckpointNotFound prefixed
        speculative_config.model, as the draft loader's errors are."""
        from enginespec.worker.hub_cache import resolve_checkpoint
        from enginespec.worker.loader import CheckpointError

        if self._draft_path is None:
            model = self.speculative_config.model
            try:
                self._draft_path = resolve_checkpoint(
                    model,
                    field="draft model",
                    revision=self.speculative_config.revision,
                    cache_dir=self.args.download_dir,
                )
            except CheckpointError as e:
                raise type(e)(f"speculative_config.model: {e}") from e
        return self._draft_path

    def _load_draft(self, path: str):
        """The draft checkpoint at speculative_config.model; a checkpoint error names that field
        (the same exception type, so callers catching CheckpointNotFound still do)."""
        from enginespec.worker.flat_model import FlatModel
        from enginespec.worker.loader import CheckpointError

        try:
            return FlatModel.from_pretrained(
                path,
                dtype=self.model.dtype,
                device=self.model.device,
                attention=self.impl.attention_backend(self.model.device),
                model_impl=self.args.model_impl,
                trust_remote_code=self.args.trust_remote_code,
            )
        except CheckpointError as e:
            raise type(e)(f"speculative_config.model: {e}") from e

    @property
    def num_draft_positions(self) -> int:
        """The draft positions a request can use: num_speculative_tokens up to max_model_len - 1
        (one position is the request's last token), 0 without speculative decoding. A larger k
        is accepted, as vLLM accepts it, and the draft pool is sized as for max_model_len; the
        metrics show this many per-position series, not k."""
        config = self.speculative_config
        return 0 if config is None else min(config.num_speculative_tokens, self.max_model_len - 1)

    def _draft_bytes_per_block(self) -> int:
        if self.draft_model is None:
            return 0
        return kv_bytes_per_block(self.draft_model, self.args.block_size)

    def _make_drafter(self, config: SpeculativeConfig) -> Optional[DraftModelDrafter]:
        """The draft model's drafter: its own ModelRunner and a pool of draft_pool_blocks blocks
        managed by this impl's BlockManager (prefix caching off)."""
        if self.draft_model is None:
            return None
        args, k = self.args, config.num_speculative_tokens
        num_blocks = draft_pool_blocks(
            self.runner.num_blocks, self.scheduler_config.max_num_seqs, k, args.block_size, self.max_model_len
        )
        runner = ModelRunner(
            self.draft_model,
            self.impl,
            block_size=args.block_size,
            max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
            max_num_seqs=self.scheduler_config.max_num_seqs,
            max_model_len=self.max_model_len,
            num_blocks=num_blocks,
            enforce_eager=args.enforce_eager,
            compile_model=args.compile_model,
            compile_backend=args.compile_backend,
            mixed_graph_tokens=args.mixed_graph_tokens(self.scheduler_config.max_num_batched_tokens),
        )
        manager = self.impl.new_block_manager(num_blocks, args.block_size, False)
        return DraftModelDrafter(runner, self.impl, manager, k, self.scheduler_config.max_num_batched_tokens)

    def _make_spec_decoder(self) -> Optional[SpecDecoder]:
        config = self.speculative_config
        if config is None:
            return None
        spec = SpecDecoder(
            config,
            self.sampler,
            self.model.device,
            self.max_model_len,
            self.args.seed,
            drafter=self._make_drafter(config),
        )
        self.stats.spec_decode = spec.stats
        return spec

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
        """Validate and queue one user request (n samples). Any exception (a ValueError for a
        bad id, prompt or params; a KeyboardInterrupt midway) leaves nothing queued.
        EngineAsleepError while the engine sleeps (sleep mode)."""
        self._check_awake()
        params = self.default_sampling_params() if params is None else params
        prompt_token_ids, params = self._validate(request_id, prompt_token_ids, params, priority)
        asked = params.max_tokens
        params = self._fit_max_tokens(params.with_vocab(self.vocab_size), len(prompt_token_ids))
        self._check_fits(len(prompt_token_ids), params.max_tokens, asked)
        grammar = self._compile_grammar(params)
        eos, extra_stops = self._eos_ids()
        _check_allowed_leave_a_token(params, eos, extra_stops, self.vocab_size)
        requests = []
        for index in range(params.n):  # build every sibling first: construction changes nothing
            child_params = _child_params(params, index, extra_stops)
            requests.append(
                self.impl.new_request(
                    internal_id(request_id, index, params.n),
                    prompt_token_ids,
                    child_params,
                    eos_token_id=eos,
                    priority=priority,
                    arrival_time=arrival_time,
                    cache_key=cache_key,
                )
            )
        parent = Parent(
            request_id, prompt, prompt_token_ids, [], {} if params.prompt_logprobs is not None else None
        )
        try:
            for index, request in enumerate(requests):
                parent.samples.append(self._new_sample(index, request, prompt_token_ids, grammar))
                self.scheduler.add(request)
            self.parents[request_id] = parent
            for sample in parent.samples:
                self._samples[sample.request.request_id] = (parent, sample)
                if sample.grammar is not None:
                    self._constrained.add(sample.request.request_id)
                if bans_read_outputs(params.bad_words_token_ids):
                    self._banning.add(sample.request.request_id)
                if holds_draws(params):
                    allowed = params.allowed_token_ids
                    self._holding[sample.request.request_id] = None if allowed is None else frozenset(allowed)
        except BaseException:  # an interrupt may land inside add(): abort every sibling's id
            self._unadd(request_id, requests)
            raise

    def _unadd(self, request_id: str, requests: list) -> None:
        """Undo a failed add_request: every sibling leaves the scheduler and every map of the
        engine, its speculative counters too (_new_sample made them, SpecDecoder.track), so a
        refused add leaves nothing behind for the life of the engine."""
        for request in requests:
            self.scheduler.abort(request.request_id)
        self.parents.pop(request_id, None)
        for request in requests:
            self._samples.pop(request.request_id, None)
            self._constrained.discard(request.request_id)
            self._banning.discard(request.request_id)
            self._holding.pop(request.request_id, None)
            if self.spec is not None:
                self.spec.forget(request.request_id)

    def _compile_grammar(self, params: SamplingParams):
        """The compiled grammar of params.structured_outputs (None when it has none): a
        ValueError when the engine has no tokenizer, xgrammar is not installed, or the
        constraint does not compile (engine/structured_output.py)."""
        if params.structured_outputs is None:
            return None
        if self.tokenizer is None:
            raise ValueError("SamplingParams.structured_outputs needs a tokenizer; this engine has none")
        return self._grammar_manager().compile(params.structured_outputs)

    def _grammar_manager(self):
        """The engine's StructuredOutputManager, built on first use (on the caller's thread: it
        reads the tokenizer, which the engine's own thread also uses)."""
        if self._structured is None:
            from enginespec.engine.structured_output import StructuredOutputManager

            eos, extra_stops = self._eos_ids()
            stops = ([] if eos is None else [eos]) + list(extra_stops)
            self._structured = StructuredOutputManager(self.tokenizer, self.vocab_size, stops)
        return self._structured

    def prepare_grammar(self, params: SamplingParams) -> Optional[Future]:
        """Start compiling params' constraint on one of the engine's grammar threads (side by
        side with the other requests' compiles: a long one does not hold up the next), and return its
        Future (None when params has no constraint or the engine no tokenizer). An engine loop
        that parks the request's add until the Future is done (engine/core_proc.py) keeps
        stepping the other requests meanwhile, where a compile inside add_request would stall
        them all (vLLM compiles off its step loop too); add_request then finds the grammar in
        xgrammar's cache. The Future raises what add_request would (a ValueError naming the
        field). A ValueError here: xgrammar is not installed."""
        if params.structured_outputs is None or self.tokenizer is None:
            return None
        manager = self._grammar_manager()
        if self._grammar_pool is None:
            self._grammar_pool = ThreadPoolExecutor(
                grammar_workers(), thread_name_prefix="enginespec-grammar"
            )
        return self._grammar_pool.submit(manager.compile, params.structured_outputs)

    def _new_sample(self, index, request, prompt_token_ids, grammar=None) -> Sample:
        detok = None
        if self.tokenizer is not None and request.params.detokenize:
            from enginespec.engine.detokenizer import IncrementalDetokenizer

            detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, request.params)
        with_logprobs = request.params.logprobs is not None
        sample = Sample(
            index,
            request,
            detok,
            logprobs=[] if with_logprobs else None,
            cumulative_logprob=0.0 if with_logprobs else None,
        )
        if self.spec is not None:
            sample.spec_decode = self.spec.track(request.request_id)
        if grammar is not None:  # its own matcher per sample (n > 1), its own watch for the marker
            marker = request.params.structured_outputs.start_after_token_ids or ()
            sample.grammar = self._structured.new_state(grammar, stop_ids_to_mask(request), marker)
        return sample

    def _validate(self, request_id, prompt_token_ids, params, priority) -> tuple[list[int], SamplingParams]:
        """(the prompt's ids, cut to truncate_prompt_tokens; the params, bad_words tokenized),
        or a ValueError naming what is wrong."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if request_id in self.parents or request_id in self._pending:
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a spec.SamplingParams, got {type(params).__name__}")
        if not isinstance(priority, numbers.Integral) or isinstance(priority, bool):  # numpy ints too
            raise ValueError(f"priority must be an int, got {priority!r}")
        priority = int(priority)  # a numpy int goes on as a plain one (to the scheduler, the wire)
        policy = self.scheduler_config.policy
        if priority != 0 and policy != "priority":
            raise ValueError(
                f"priority must be 0 unless scheduling_policy='priority' (priority scheduling is not "
                f"enabled: this engine runs {policy!r}, which would ignore it), got {priority}"
            )
        ids = check_token_ids("prompt_token_ids", prompt_token_ids, self.vocab_size)
        if not ids:
            raise ValueError("prompt_token_ids must not be empty")
        ids = self._truncate(ids, params.truncate_prompt_tokens)
        if params.stop and self.tokenizer is None:
            raise ValueError("SamplingParams.stop (stop strings) needs a tokenizer; this engine has none")
        if params.bad_words and self.tokenizer is None:
            raise ValueError(
                "SamplingParams.bad_words needs a tokenizer; this engine has none (give "
                "bad_words_token_ids instead)"
            )
        params = params.with_bad_words_tokens(self.tokenizer)
        params.validate_vocab(self.vocab_size)
        params.with_vocab(self.vocab_size).validate_logprobs_cap(self.max_logprobs)
        return ids, params

    def _truncate(self, ids: list[int], keep: Optional[int]) -> list[int]:
        return truncate_prompt(ids, keep, self.max_model_len)

    def _fit_max_tokens(self, params: SamplingParams, num_prompt: int) -> SamplingParams:
        """max_tokens (and min_tokens) within the room the prompt leaves under max_model_len, as
        vLLM's engine ends a request at max_model_len (finish_reason "length") instead of
        refusing it; None means all of that room. So the impl's request always satisfies
        Scheduler.add's `prompt + max_tokens <= max_model_len`, or its one exception: a prompt
        of exactly max_model_len gets max_tokens 1 (and min_tokens at most 1), as vLLM's engine
        samples one token at its last position (lm-evaluation-harness's log-likelihood requests
        are such prompts). Only a prompt over max_model_len is refused. (The OpenAI server
        refuses a prompt that leaves no room and an explicit max_tokens that does not fit, as
        vLLM's and OpenAI's do: entrypoints/openai/serving.py.)"""
        if num_prompt > self.max_model_len:
            raise ValueError(f"prompt length ({num_prompt}) must be <= max_model_len ({self.max_model_len})")
        room = max(self.max_model_len - num_prompt, 1)
        if params.max_tokens is not None and params.max_tokens <= room:
            return params
        return dataclasses.replace(params, max_tokens=room, min_tokens=min(params.min_tokens, room))

    def _check_fits(self, num_prompt: int, max_tokens: int, asked: Optional[int] = None) -> None:
        """Prompt + max_tokens (already fitted to max_model_len) within the KV pool, or a
        ValueError naming num_blocks. The count is capped at max_model_len, as Scheduler.add's:
        the token a prompt of exactly max_model_len samples needs no KV slot. `asked` is the
        request's own max_tokens: where it was None (or over the room) the message says the
        count came from max_model_len, so a user who set no max_tokens is not told about one."""
        bs, num_blocks = self.args.block_size, self.runner.num_blocks
        need = -(-min(num_prompt + max_tokens, self.max_model_len) // bs)
        if need > num_blocks:
            room = f"{max_tokens} tokens max_model_len ({self.max_model_len}) leaves"
            shown = f"None: all {room}" if asked is None else f"{asked}, cut to the {room}"
            if asked == max_tokens:
                shown = str(max_tokens)
            raise ValueError(
                f"prompt length ({num_prompt}) + max_tokens ({shown}) needs {need} KV "
                f"blocks of {bs} tokens, more than the pool's num_blocks ({num_blocks})"
            )

    @property
    def max_logprobs(self) -> int:
        """EngineArgs.max_logprobs, with -1 (no cap) as the vocabulary size (vLLM's rule)."""
        cap = self.args.max_logprobs
        return self.vocab_size if cap == -1 else cap

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the checkpoint's generation_config.json sampling defaults
        (engine/generation_config.py): what a request added without params gets."""
        return self.generation.params()

    def _eos_ids(self) -> tuple[Optional[int], tuple[int, ...]]:
        """The request's EOS id, and the further EOS ids, which stop requests as stop tokens.
        The EOS is the tokenizer's eos_token_id, the one vLLM gives every request (a fine-tune's
        tokenizer may set it apart from both files: Llama 3 Instruct's <|eot_id|>), else the
        model's; the further ids are the model's, config.json's (a list) and
        generation_config.json's other than it. So a sample the EOS ended has stop_reason None
        and one a further id ended has that id, as vLLM's (its further ids are stop_token_ids)."""
        model_eos = getattr(self.model, "eos_token_id", None)
        tokenizer_eos = getattr(self.tokenizer, "eos_token_id", None)
        eos = tokenizer_eos if tokenizer_eos is not None else model_eos
        config_eos = getattr(getattr(self.model, "config", None), "eos_token_id", None)
        return eos, further_eos_ids(eos, model_eos, config_eos, self.generation.eos_token_ids)

    def abort(self, request_ids: Union[str, Iterable[str]], report: bool = True) -> bool:
        """Abort user requests (all their samples). Their final outputs (finish_reason "abort")
        come from the next step(), or never with report=False (the engine forgets them at once).
        Returns True if any id was live. A token still in flight (async scheduling) goes to
        nobody either way: the final output shows what the serial engine's would, the ids and
        text shown so far, and a stop string that token would complete cannot turn "abort"
        into "stop"."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        found = False
        for request_id in ids:
            parent = self.parents.get(request_id)
            if parent is None:
                continue
            found = True
            for sample in parent.samples:
                if sample.finish_reason is None:
                    self.scheduler.abort(sample.request.request_id)
                    self.runner.drop(sample.request.request_id)  # a swapped copy goes now
                    if self._inflight is not None:
                        self._inflight.drop_token(sample.request.request_id)
                    self.outputs.settle(sample, Status.FINISHED_ABORTED.finish_reason)
            if report:
                self._pending[request_id] = parent
            else:
                self._pending.pop(request_id, None)
                self._forget(request_id)
        self._drop_unpending()
        return found

    @property
    def has_unfinished(self) -> bool:
        """True while some request has not had its final output returned."""
        return bool(self.parents)

    @property
    def num_unfinished(self) -> int:
        return len(self.parents)

    @property
    def dead(self) -> Optional[str]:
        """Why this engine can never step again (a tensor-parallel rank died: step() shut it
        down and raised EngineDeadError), or None. Once set, it stays set."""
        return self.tensor_parallel.dead if self.tensor_parallel is not None else None

    @property
    def worker_sentinels(self) -> list:
        """What an idle engine loop waits on beside its input: one handle per tensor-parallel
        worker, ready once it exits ([] for one rank). See poll_dead."""
        return self.tensor_parallel.sentinels if self.tensor_parallel is not None else []

    def poll_dead(self) -> Optional[str]:
        """`dead`, also noticing a tensor-parallel worker that died between steps (then the
        engine is shut down, as a step that found it dead shuts it down)."""
        if self.tensor_parallel is None or self.tensor_parallel.poll_dead() is None:
            return None
        self.shutdown()
        return self.dead

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block (vLLM's name and return), so that later prompts are
        computed in full: what a benchmark calls between runs to time cold prefills. True once
        done (also with prefix caching off: nothing to forget); False, with nothing changed,
        while any block is in use (a request running, or preempted but still holding blocks):
        the block manager's rule (spec/block_manager.py). The draft model's pool caches no
        prefixes, so it has nothing to forget."""
        return bool(self.block_manager.reset_prefix_cache())

    # ---- sleep mode (worker/sleep.py) ---------------------------------------------------------

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep: give the device memory back between rollouts. Level 1 copies the
        weights to host memory, level 2 discards the target's (worker/sleep.py: load_weights or
        reload_weights fills them after wake_up; under tensor parallelism every rank's shard);
        both free the KV pool, forgetting every cached prefix block first (they are gone with
        it). Until
        wake_up() restores both (and, after level 2, the weights are filled), add_request raises
        EngineAsleepError. RuntimeError, with nothing changed, without enable_sleep_mode or
        while any request is unfinished (sleep waits for none: finish or abort them first);
        ValueError for a bad level."""
        self._check_sleep_mode("sleep")
        tags = check_level(level)
        self._check_idle("sleep", "sleep frees their KV cache")
        self._forget_prefixes("sleep")
        self.runner.sleep(tags, discard_weights=level == 2)
        for runner in self._runners()[1:]:  # the draft's weights are kept: updates reach the target only
            runner.sleep(tags)

    def _check_idle(self, call: str, why: str) -> None:
        """RuntimeError, nothing changed, while any request is unfinished (or a step in flight)."""
        if self.has_unfinished or self._inflight is not None:
            raise RuntimeError(
                f"{call}: {self.num_unfinished} unfinished request(s); finish or abort them first ({why})"
            )

    def _forget_prefixes(self, call: str) -> None:
        """Empty the prefix cache of an idle engine (_check_idle first: an idle pool holds no
        block, so the reset cannot be refused; a refusal here is a bug, raised as one)."""
        if not self.block_manager.reset_prefix_cache():
            raise RuntimeError(f"{call}: the prefix cache could not be reset on an idle engine (a bug)")

    def wake_up(self, tags: Optional[list] = None) -> None:
        """vLLM's wake_up: restore the named tags ("weights", "kv_cache"; None: both) of a
        sleep; one not asleep is left alone. The engine takes requests again once no tag
        sleeps. RuntimeError without enable_sleep_mode; ValueError for an unknown tag."""
        self._check_sleep_mode("wake_up")
        tags = check_tags(tags)
        for runner in self._runners():
            runner.wake_up(tags)

    @property
    def is_sleeping(self) -> bool:
        """Whether any tag sleeps (vLLM's is_sleeping: true until every tag is woken)."""
        return bool(self.runner.sleeping_tags)

    # ---- weight updates (worker/weight_update.py) ----------------------------------------------

    def load_weights(self, weights) -> int:
        """vLLM's load_weights (SGLang's update_weights_from_tensor): copy (checkpoint name,
        tensor) pairs, any subset of the checkpoint's tensors, into the target model in place,
        re-deriving what the load derived (merged and folded projections, a tied head, Qwen3's
        stacked q/k norms), then forget the prefix cache (its KV came from the old weights).
        Returns how many tensors were copied. The draft model is not updated. Under tensor
        parallelism every rank gets the whole tensors and keeps its part (tp_runner.py).
        ValueError, nothing changed on any rank, for an unknown name, a shape or a dtype the
        parameter cannot take; RuntimeError, nothing changed, while a request is unfinished or
        the weights sleep (wake_up(tags=["weights"]) first)."""
        self._check_idle("load_weights", "their KV cache came from the old weights")
        count = self.runner.load_weights(weights)
        self._forget_prefixes("load_weights")
        return count

    def reload_weights(self, weights_path: Optional[str] = None) -> int:
        """vLLM's reload_weights (SGLang's update_weights_from_disk): read every tensor of the
        checkpoint directory `weights_path` (default: the engine's model) with our safetensors
        loader, into host memory (each tensor-parallel rank its own part), and load them
        (load_weights' rules). A checkpoint of another shape or with other names is refused,
        nothing changed."""
        if weights_path is None and self.args.model is None:
            raise ValueError("reload_weights: the engine was built from a model object; pass weights_path")
        self._check_idle("reload_weights", "their KV cache came from the old weights")
        path = self.args.model_dir() if weights_path is None else weights_path
        count = self.runner.reload_weights(path)
        self._forget_prefixes("reload_weights")
        return count

    def _check_sleep_mode(self, call: str) -> None:
        if not self.args.enable_sleep_mode:
            raise RuntimeError(
                f"{call}() needs sleep mode: build the engine with enable_sleep_mode=True "
                f"(serve --enable-sleep-mode)"
            )

    def _runners(self) -> list:
        """The target's runner, then the draft model's (speculative_config "draft_model")."""
        drafter = getattr(self.spec, "drafter", None)
        runner = getattr(drafter, "runner", None)
        return [self.runner] + ([runner] if runner is not None else [])

    def _check_awake(self) -> None:
        """EngineAsleepError while any tag sleeps: no request is taken (and so none steps)."""
        tags = self.runner.sleeping_tags
        if tags:
            raise EngineAsleepError(
                f"the engine is asleep ({', '.join(tags)} released by sleep()): call wake_up() "
                f"before generating"
            )
        check_filled(self.runner.unfilled_weights)

    # ---- one step -----------------------------------------------------------------------------

    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """Run one scheduling step and return the outputs of the requests it changed (with
        final_only, of those that finished: generate() needs nothing else, and building
        cumulative outputs of every running request each step is most of the host cost).

        Text is decoded incrementally only for samples with stop strings (which must be
        matched as tokens arrive); the others decode their new ids when an output is built.
        With async_scheduling, a step the sampler can draw on the device leaves its tokens there
        and the next step() fills them in (async_scheduling.py); outputs then lag one step.
        A step that raises is rolled back (_recover) and returns its requests' error outputs."""
        start = time.perf_counter()
        changed: dict[str, Parent] = dict(self._pending)
        self._pending.clear()
        state = _StepState(previous=self._inflight)
        self._inflight = None
        try:
            outputs = self._step(state, changed, final_only)
        except BaseException as exc:
            outputs = self._recover(state, exc, changed, final_only)
            if self.tensor_parallel is not None and self.tensor_parallel.dead:
                self.shutdown()  # a TP rank died: the engine cannot serve on (tp_group.py)
                raise
        self.stats.step_seconds += time.perf_counter() - start
        return outputs

    def _step(self, state: "_StepState", changed: dict, final_only: bool) -> list[RequestOutput]:
        with _span("schedule"):
            if self.spec is not None:
                self._propose(state, changed)
            state.scheduling = True
            output = self.scheduler.schedule()
            state.output = output
            state.computed = {r.request_id: r.num_computed_tokens for r, _ in output.scheduled}
            self._fault("schedule")
            started = time.perf_counter()
            self.runner.apply_swaps(output)
            self.stats.swap_seconds += time.perf_counter() - started
            state.swapped = True
        self.stats.num_preemptions += len(output.preempted)
        self.stats.num_swapped_bytes += self.runner.bytes_per_block * sum(
            len(blocks) for _, blocks in (*output.swap_out, *output.swap_in)
        )
        self._unscheduled_failures = 0
        if not output.is_empty:
            self._empty_steps = 0
            self._run_step(state, changed)
        else:
            self._resolve(state.previous, changed)
            self._check_progress(state.previous is None, changed)
        with self._phase("detokenize"):
            outputs = self._build_outputs(changed, final_only)
        return outputs

    def _propose(self, state: "_StepState", changed: dict) -> None:
        """Drafts for this step (spec_decode/decoder.py); waits for the step in flight only
        when a request waiting for its real token would get some."""
        spec = self.spec
        assert spec is not None
        if state.previous is not None and spec.wants_real_tokens(self.scheduler.running, self.vocab_size):
            self._resolve(state.previous, changed)
        spec.propose(self.scheduler.running, self.vocab_size)

    def _build_outputs(self, changed: dict, final_only: bool) -> list[RequestOutput]:
        """The outputs of the changed parents (with final_only, of the finished ones); a parent
        one of whose samples failed is failed whole first (_fail_siblings), also where building
        its output is what failed that sample (an id its tokenizer cannot decode). With
        final_only a text is decoded only once its parent has finished, so such an id fails its
        sample alone, when its siblings have ended already."""
        outputs = []
        for parent in changed.values():
            several = len(parent.samples) > 1  # n = 1 makes no call: 256 a step show on the host
            if several:
                self._fail_siblings(parent)
            if final_only and not parent.finished:
                continue
            out = self.outputs.make_output(parent)
            if several and not out.finished and self._fail_siblings(parent):
                out = self.outputs.make_output(parent)
            outputs.append(out)
        for out in outputs:
            if out.finished:
                self._forget(out.request_id)
        return outputs

    def _fail_siblings(self, parent: Parent) -> bool:
        """Once a sample of a parent has finished "error", the user's request has failed:
        every sibling still unfinished ends "error" too, now, with an error naming the failed
        sample (whether or not it was in the failing step, or scheduled yet). So the
        parent finishes at once, every front end reports the request as failed (never one
        sibling "error" and the others "abort", as the server's abort of the failed request
        made them), and no sibling runs on for an answer that cannot be given. Each is finished
        through the Scheduler API (its blocks freed; its KV is sound, so nothing is
        unpublished), and a token of its still in flight goes to nobody, as for an abort.
        Returns whether any sibling was failed."""
        samples = parent.samples
        failed = next((s for s in samples if s.finish_reason == ERROR), None)
        if failed is None or parent.finished:
            return False
        message = f"sample {failed.index} of this request failed: {failed.error}"
        for sample in samples:
            if sample.finish_reason is None:
                request = sample.request
                if not request.status.is_finished:
                    self.scheduler.finish(request, Status.FINISHED_ABORTED)
                self.runner.drop(request.request_id)
                if self._inflight is not None:
                    self._inflight.drop_token(request.request_id)
                self.outputs.settle(sample, ERROR, None, message)
        return True

    def _phase(self, name: str):
        """`with self._phase(name):` fires the fault hook for `name` (tests and the soak inject
        failures there), then opens the phase's span. A plain call, not a generator: a step opens
        several and the host's time per step counts at small batches."""
        self._fault(name)
        return _span(name)

    def _fault(self, phase: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(phase)

    def _run_step(self, state: "_StepState", changed: dict) -> None:
        """Build, execute, sample and update one non-empty step (resolving the previous step's
        placeholders once this step is launched)."""
        output, previous = state.output, state.previous
        self._record_admissions(output)
        drafts = self.spec.scheduled_drafts(output) if self.spec is not None else None
        with self._phase("prepare"):
            batch = self.runner.prepare(output, self.block_manager)
            if previous is not None and not previous.resolved:  # resolved: the batch has real ids
                rows, src = input_patch(output.scheduled, batch.meta.query_start_loc_cpu, previous)
                apply_patch(batch.input_ids, rows, src, previous.ids)
            if drafts:
                batch = self.spec.widen(batch, output, drafts)
        with self._phase("execute"):
            result = self.runner.execute(batch)
        if drafts:
            self._verify_step(state, batch, result, drafts, changed)
            return
        requests = [self._samples[rid][1].request for rid in batch.sample_request_ids]
        logits, wait = self._masked_logits(result.logits, batch.sample_request_ids, previous, changed)
        drawn = None
        if self.args.async_scheduling and deferrable(requests):
            with self._phase("sample"):
                resolved = wait is not None or previous is None or previous.resolved
                drawn = self.sampler.sample_deferred(logits, requests, resolved=resolved)
                if drawn is not None and result.prompt_logits:
                    ks = self._prompt_logprob_ks(result.prompt_logits)
                    drawn = drawn._replace(
                        prompt=device_prompt_logprobs(result.prompt_logits, ks, self.vocab_size)
                    )
        if drawn is not None:
            self.stats.num_async_steps += 1
            launched = start_copy(drawn, batch.sample_request_ids)
            wait = self._resolve(previous, changed) if wait is None else wait
            with self._phase("update"):
                self._update_with_placeholders(output, launched)
        else:
            wait = self._resolve(previous, changed) if wait is None else wait
            with self._phase("sample"):
                sampled = self.sampler(logits, requests)
                self._record_prompt_logprobs(result.prompt_logits, changed)
            with self._phase("update"):
                token_map = {rid: [tok] for rid, tok in zip(batch.sample_request_ids, sampled.token_ids)}
                update = self.scheduler.update_from_output(output, token_map)
                self._apply_update(update, dict(zip(batch.sample_request_ids, sampled.logprobs)), changed)
        self._count_step(output, batch, wait, state.computed)

    def _verify_step(self, state, batch, result, drafts: dict, changed: dict) -> None:
        """The serial tail of a step with scheduled drafts: verify, update with the step cut
        back to the accepted tokens, trim the rejected drafts' blocks (spec_decode/decoder.py)."""
        output, previous, spec = state.output, state.previous, self.spec
        assert spec is not None
        wait = self._resolve(previous, changed)
        with self._phase("sample"):
            logits = self._mask_grammars(result.logits, batch.sample_request_ids, changed, drafts)
            cut, tokens, logprobs = spec.sample(
                output,
                batch.sample_request_ids,
                logits,
                lambda rid: self._samples[rid][1].request,
                drafts,
            )
            self._record_prompt_logprobs(result.prompt_logits, changed)
        with self._phase("update"):
            update = self.scheduler.update_from_output(cut, tokens)
            spec.trim(output, cut, self.block_manager)
            self._apply_update(update, logprobs, changed)
        self._count_step(output, batch, wait, state.computed, kept=cut)

    def _record_admissions(self, output) -> None:
        """Each scheduled request without a high-water mark is at its first admission (a
        preemption and re-admission, which sets request.num_cached_tokens again, records
        nothing): _record_admission, and a mark of 0 (nothing computed yet). Before the step
        samples, so the sample's num_cached_tokens is known when its first token is applied
        (OutputProcessor counts its prompt then, vllm:prompt_tokens_cached): recorded after
        the update, as it was, a serial step counted a prompt the cache served as computed."""
        for request, _ in output.scheduled:
            if request.request_id not in self._high_water:
                self._record_admission(request)
                self._high_water[request.request_id] = 0

    def _record_admission(self, request) -> None:
        """A request's first admission (its first scheduled step): the prefix-cache hit goes on
        its sample (RequestOutput.num_cached_tokens) and into the prefix-cache counters, as vLLM
        records them: once a request, at admission, when it looked the cache up (prefix caching
        on, no prompt_logprobs). A lookup the pool could not admit yet, and a preempted request's
        re-admission (which finds its own blocks again), count nothing, so that a pool under
        pressure does not show queries many times the prompts' tokens and hits they never had."""
        found = self._samples.get(request.request_id)
        if found is not None:
            found[1].num_cached_tokens = request.num_cached_tokens
        if self.args.enable_prefix_caching and request.params.prompt_logprobs is None:
            self.stats.num_prefix_queries += request.num_prompt_tokens  # its tokens at admission
            self.stats.num_prefix_hits += request.num_cached_tokens

    def _count_step(self, output, batch, wait: float, computed: dict, kept=None) -> None:
        """Step counters. `kept` (a speculative step's output cut back to its accepted tokens)
        sets the high-water mark, so re-running a rejected draft's position is not a recompute.
        The step's first admissions were recorded before it sampled (_record_admissions)."""
        self.stats.num_steps += 1
        self.stats.num_scheduled_tokens += output.num_scheduled_tokens
        for request, num in (kept or output).scheduled:  # recompute: positions below the high-water mark
            rid, start = request.request_id, computed[request.request_id]
            seen = self._high_water.get(rid, 0)
            self.stats.num_recomputed_tokens += max(0, min(start + num, seen) - start)
            self._high_water[rid] = max(seen, start + num)
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
        appended one wait in `launched` for their real token (length stops are already right).
        The step stays pending while a placeholder awaits its id or the step carries prompt
        logprobs: a step whose sampling rows all belong to requests that stopped meanwhile (a
        stop the previous step's real id revealed) appends nothing, yet its prompt chunks'
        logprobs are read only when it is resolved."""
        placeholder = [self.vocab_size]
        update = self.scheduler.update_from_output(output, {rid: placeholder for rid in launched.rows})
        for rid, tokens in update.new_token_ids.items():
            if tokens:
                launched.awaiting[rid] = self._samples[rid][1].request
        launched.finished = list(update.finished)
        self._inflight = launched if launched.pending else None

    def _resolve(self, inflight: Optional[InFlight], changed: dict) -> float:
        """Put the real tokens of a launched step in place of its placeholders, apply the stops
        the placeholders could not decide, then attach tokens and finishes as a serial step does.
        Returns the seconds the host blocked waiting for those tokens."""
        if inflight is None or inflight.resolved:
            return 0.0
        inflight.resolved = True
        with _span("resolve"):
            ids = inflight.token_ids()
            new_tokens, late_stops = {}, {}
            block_size = self.args.block_size
            finished = [r for r in inflight.finished if r.request_id in self._samples]
            for rid, request in inflight.awaiting.items():
                if rid not in self._samples:
                    continue  # aborted without a report: forgotten
                token = ids[inflight.rows[rid]]
                request.replace_last_token(token)
                if request.num_tokens % block_size == 0:  # the placeholder filled a block
                    self._rehash_last_block(request)
                new_tokens[rid] = [token]
                stop = token_stop(request, token)
                if stop is None or request.status not in _STOPPABLE:
                    continue  # no stop, or finished otherwise (aborted) meanwhile
                if not request.status.is_finished:  # running, or preempted by this step's schedule
                    self.scheduler.finish(request, stop[0])
                    finished.append(request)
                late_stops[rid] = stop  # a length finish yields to the stop
            for rid, (positions, entries) in inflight.prompt_map().items():
                self._store_prompt_logprobs(rid, positions, entries, changed)
            self._apply_update(
                UpdateOutput(new_tokens, finished), inflight.logprob_map(), changed, late_stops
            )
        return inflight.wait_s

    def _rehash_last_block(self, request) -> None:
        """After replace_last_token, when the placeholder was the last slot of a block: if that
        block was hashed while it held the placeholder, withdraw the hash (unpublish; the
        request's publish cursor drops back to it) and drop it from request.block_hashes, so the
        block is hashed again over its real tokens and published under that hash at the next
        schedule(). A placeholder hash is not unique: requests with the same history up to the
        placeholder (n > 1 siblings, a repeated prompt) hash to the same value, and a request
        recomputed after preemption would adopt another's block, whose KV holds another token.
        While the placeholder is the newest token the hash cannot be matched (find_cached_prefix
        never matches the block holding a request's last token), so this closes the window."""
        index = request.num_tokens // self.args.block_size - 1
        if len(request.block_hashes) > index:
            self.block_manager.unpublish(request, index * self.args.block_size)
            del request.block_hashes[index:]

    def _prompt_logprob_ks(self, prompt_logits) -> dict:
        """request id -> k for the prompt logprobs to record (the first sample of a parent
        that asked for them)."""
        ks = {}
        for request_id in prompt_logits:
            parent, sample = self._samples[request_id]
            if parent.prompt_logprobs is not None and sample.index == 0:
                ks[request_id] = sample.request.params.prompt_logprobs
        return ks

    def _record_prompt_logprobs(self, prompt_logits, changed: dict) -> None:
        for request_id, k in self._prompt_logprob_ks(prompt_logits).items():
            positions, logits, targets = prompt_logits[request_id]
            self._store_prompt_logprobs(
                request_id, positions, self.sampler.prompt_logprobs(logits, targets, k), changed
            )

    def _store_prompt_logprobs(self, request_id: str, positions, entries, changed: dict) -> None:
        """Store a step's prompt logprobs on the request's parent (a PromptLogprobsError, which
        fails the step, when they would leave a gap: output_processor.store_prompt_logprobs).
        A tokenizer that raises naming their tokens fails this parent alone (every sample: the
        prompt logprobs are each one's), as an undecodable output id does; the entries are
        stored all the same, so the parent's list keeps no gap."""
        found = self._samples.get(request_id)
        if found is not None and found[0].prompt_logprobs is not None:
            parent, detokenizer = found[0], found[1].detokenizer  # sample 0's: the request detokenizes
            if detokenizer is not None:
                try:
                    for entry in entries:
                        self.outputs.name_tokens(entry, detokenizer.tokenizer)
                except Exception as exc:
                    self.outputs.fail_undecodable(parent, exc, "the prompt logprobs")
                    changed[parent.request_id] = parent
            store_prompt_logprobs(parent, positions, entries)

    def _masked_logits(self, logits: torch.Tensor, sample_ids, previous, changed: dict):
        """(logits, None) for a step without a constrained row or a row of bad words. With
        one, the grammars' masks need the previous step's tokens accepted and the bans need
        them real, so that step is resolved first (its tokens are read: the host waits for the
        device, while this step's forward, already launched, keeps it busy) and the constrained
        rows are masked: (masked logits, the seconds waited). The draw itself may then stay on
        the device (async scheduling, Sampler.sample_deferred, told the tokens are resolved),
        so the step after is launched before this one's tokens are read, as for any other step."""
        if not self._needs_real_tokens(sample_ids):
            return logits, None
        if previous is not None and not previous.resolved:
            self.stats.num_resolved_first += 1
        wait = self._resolve(previous, changed)
        if not self._constrained:
            return logits, wait
        with _span("grammar"):
            return self._mask_grammars(logits, sample_ids, changed), wait

    def _needs_real_tokens(self, sample_ids) -> bool:
        """Whether a row of this step has a grammar or bad words (free when none is live)."""
        constrained, banning = self._constrained, self._banning
        if not constrained and not banning:
            return False
        return any(rid in constrained or rid in banning for rid in sample_ids)

    def _mask_grammars(self, logits: torch.Tensor, sample_ids, changed: dict, drafts=None) -> torch.Tensor:
        """logits with the row of each constrained sample masked by its grammar's next tokens
        (structured_output.py; before the sampler, as vLLM's model runner does; logits itself
        when no row is constrained). Row of
        sample_ids[i]: i, or with drafts the first of each request's d + 1 rows (a constrained
        request has no drafts). A grammar still waiting for its start marker (not `active`:
        a reasoning model's thinking) masks nothing. Call only once the previous step's tokens
        are accepted (whether the marker has appeared depends on them too). A sample whose
        matcher raises filling its mask fails alone (_fail_grammar): its row is left unmasked
        and its token dropped, as for any request finished since it was scheduled; the other
        rows, constrained or not, are the fault-free step's."""
        if not self._constrained:
            return logits
        from enginespec.engine.structured_output import fill_bitmask

        rows, samples, row = [], [], 0
        for rid in sample_ids:
            sample = self._samples[rid][1] if rid in self._constrained else None
            # a request finished since it was scheduled (its grammar may have terminated at the
            # resolve just before) draws a token nobody keeps: it is not masked
            if sample is not None and not sample.request.status.is_finished and sample.grammar.active:
                rows.append(row)
                samples.append(sample)
            row += 1 + (len(drafts.get(rid, ())) if drafts else 0)
        if not samples:
            return logits
        bitmask, faults = fill_bitmask([sample.grammar for sample in samples])
        if faults:
            for i, exc in faults.items():
                self._fail_grammar(samples[i], exc, changed)
            keep = [i for i in range(len(rows)) if i not in faults]
            rows, bitmask = [rows[i] for i in keep], bitmask[keep]
        return apply_token_bitmask(logits, rows, bitmask) if rows else logits

    def _fail_grammar(self, sample: Sample, exc: Exception, changed: dict) -> None:
        """One sample's matcher raised `exc` filling its mask (an xgrammar fault): that sample
        ends with finish_reason "error" and its request is finished through the Scheduler API,
        which frees its blocks (their KV is sound: the forward that wrote them succeeded, so
        nothing is unpublished). Its matcher is never asked again (a finished request's row is
        neither masked nor advanced). Its siblings fail with it here, before the draw, so that
        none keeps this step's token: the async engine's would still be in flight, and dropped.
        Every other request runs on."""
        request = sample.request
        log.error("structured outputs: a grammar matcher failed filling its mask", exc_info=exc)
        if not request.status.is_finished:
            self.scheduler.finish(request, Status.FINISHED_ABORTED)
        parent = self._samples[request.request_id][0]
        message = f"structured outputs: the grammar matcher failed filling its mask: {_named(exc)}"
        self.outputs.settle(sample, ERROR, None, message)
        self._fail_siblings(parent)
        changed[parent.request_id] = parent

    def _advance_grammars(self, update: UpdateOutput) -> tuple[UpdateOutput, dict]:
        """Each constrained sample's grammar accepts its new real tokens; one that has
        terminated (it took a stop token where it may end) finishes its request ("stop") if
        nothing else did, so no mask is asked of it again. A sample whose grammar refused a
        token (its row had no token left that the grammar allows, see GrammarState.accept),
        or whose matcher raised (an xgrammar fault: that sample's alone), is finished too, as
        an error: its output could not follow the grammar any more, and running on would only
        draw from all -inf rows up to max_tokens. Also when the scheduler finished it on that
        very token (its max_tokens-th, or a stop id): it leaves the update's finishes, so its
        reason is "error", never "length" on an output the grammar refused. Returns the update
        with the "stop" finishes added and the refused ones taken out, and {request id:
        message} of the refused."""
        ended, refused = [], {}
        for rid, tokens in update.new_token_ids.items():
            if rid not in self._constrained:
                continue
            state, request = self._samples[rid][1].grammar, self._samples[rid][1].request
            message, terminated = _advance(state, [t for t in tokens if t != self.vocab_size])
            if message is not None:
                if not request.status.is_finished:
                    self.scheduler.finish(request, Status.FINISHED_ABORTED)
                refused[rid] = message
            elif terminated and not request.status.is_finished:
                self.scheduler.finish(request, Status.FINISHED_STOPPED)
                ended.append(request)
        if ended or refused:
            kept = [r for r in update.finished if r.request_id not in refused]
            update = UpdateOutput(update.new_token_ids, [*kept, *ended])
        return update, refused

    def _hold_constraints(self, update: UpdateOutput, late_stops) -> tuple[UpdateOutput, dict, dict]:
        """Each held sample's new real tokens against its hard constraints (`first_breach`):
        allowed_token_ids and bad words, which the user states as never to emit, outrank
        min_tokens. A token they refuse (its row had no token left: bad words of several
        tokens banned every allowed id, and no stop id was allowed for min_tokens to yield to)
        is never shown: the request ends there, "error", naming both fields and the output
        token (it leaves the update's finishes, so never "length" on it). A stop id drawn below
        min_tokens (the ban yielded to them, sample.penalties.apply_min_tokens) ends the
        request "stop" with its stop_reason, as a late stop that wins over a length finish.
        Returns (the update with those applied, late stops, {request id: error message})."""
        new_ids, finished = dict(update.new_token_ids), list(update.finished)
        stops, refused = dict(late_stops or {}), {}
        for rid, tokens in update.new_token_ids.items():
            if rid not in self._holding or not tokens or self.vocab_size in tokens:
                continue
            sample = self._samples[rid][1]
            request = sample.request
            breach = first_breach(request, len(tokens), self._holding[rid])
            if breach is None or sample.finished or request.status is Status.FINISHED_ABORTED:
                continue  # as drawn, or ended otherwise meanwhile (an abort)
            start, end = request.num_output_tokens - len(tokens), breach.index + (not breach.refused)
            new_ids[rid] = tokens[:end]
            if not end:  # nothing to attach (no logprobs entry for a token never shown)
                del new_ids[rid]
            if end < len(tokens):
                sample.num_visible = start + end
            if breach.refused:
                refused[rid] = _refusal(request.params, start + breach.index)
                stops.pop(rid, None)
                finished = [r for r in finished if r is not request]
                status = Status.FINISHED_ABORTED
            else:
                stops[rid] = (Status.FINISHED_STOPPED, breach.stop_reason)
                if request not in finished:
                    finished.append(request)
                status = Status.FINISHED_STOPPED
            if not request.status.is_finished:
                self.scheduler.finish(request, status)
        return UpdateOutput(new_ids, finished), stops, refused

    def _apply_update(self, update, logprob_map, changed: dict, late_stops=None) -> None:
        refused: dict = {}
        if self._holding:
            update, late_stops, refused = self._hold_constraints(update, late_stops)
        if self._constrained:
            update, more = self._advance_grammars(update)
            refused.update(more)
        out, stats = self.outputs, self.stats
        before = out.num_generated_tokens, out.num_prompt_tokens, out.num_prompt_cached_tokens
        out.apply_update(update, self._samples.get, logprob_map, changed, late_stops)
        stats.num_generated_tokens += out.num_generated_tokens - before[0]
        stats.num_prompt_tokens += out.num_prompt_tokens - before[1]
        stats.num_prompt_cached_tokens += out.num_prompt_cached_tokens - before[2]
        for rid, message in refused.items():
            parent, sample = self._samples[rid]
            self.outputs.settle(sample, ERROR, None, message)
            changed[parent.request_id] = parent

    # ---- a failed step ------------------------------------------------------------------------

    def _recover(self, state: "_StepState", exc: BaseException, changed: dict, final_only: bool):
        """Roll back a step that raised (spec/SCHEDULING.md, "A failed step"): settle the
        previous async step if its tokens can still be read, then unpublish and finish every
        request of this step with finish_reason "error". Returns the outputs of the changed
        requests; a BaseException that is not an Exception is re-raised after the clean-up
        (its outputs come from the next step)."""
        self.stats.num_failed_steps += 1
        message = f"{type(exc).__name__}: {exc}"
        failed: dict[str, object] = {}
        launched, self._inflight = self._inflight, None
        for inflight in (state.previous, launched):  # forwards that completed: take their tokens
            if inflight is not None and not inflight.resolved:
                try:
                    self._resolve(inflight, changed)
                except BaseException:  # its tokens are lost: its requests fail too
                    failed.update(inflight.awaiting)
        if state.output is not None:
            failed.update((r.request_id, r) for r, _ in state.output.scheduled)
            if not state.swapped:  # swaps that may not have happened: no KV on either side
                state.computed.update((rid, 0) for rid, _ in state.output.swap_in)
                failed.update(
                    (rid, self._samples[rid][1].request)
                    for rid, _ in state.output.swap_out
                    if rid in self._samples
                )
        if state.output is None and isinstance(exc, Exception):
            self._unscheduled_failures += 1
            if state.scheduling or self._unscheduled_failures >= MAX_EMPTY_STEPS:
                message = f"the step failed before it was scheduled: {message}"
                failed.update(self._unscheduled_victims())
        for rid, request in failed.items():
            self._fail_request(rid, request, state.computed.get(rid), message, changed)
        if not isinstance(exc, Exception):
            self._pending.update(changed)
            raise exc
        try:
            return self._build_outputs(changed, final_only)
        except Exception:  # output processing itself failed again: report without text
            for parent in changed.values():
                for sample in parent.samples:
                    sample.detokenizer = None
            return self._build_outputs(changed, final_only)

    def _unscheduled_victims(self) -> dict:
        """The requests a step that failed before schedule() returned fails: every unfinished
        one. Such a step touched no request the engine can name, so one drafting fault fails
        nothing (the next step drafts again); but schedule() itself raising is an impl bug, and
        drafting that fails MAX_EMPTY_STEPS steps in a row a persistent fault: either would
        raise again at every step, and the engine must not loop on it."""
        self._unscheduled_failures = 0
        return {r.request_id: r for r in [*self.scheduler.running, *self.scheduler.waiting]}

    def _check_progress(self, idle: bool, changed: dict) -> None:
        """After an empty schedule. A correct scheduler schedules something whenever a request
        is unfinished and no step is in flight (spec/scheduler.py's liveness: every request that
        fits the pool alone finishes, and add() refused any that does not); one step may only
        preempt (its victims are admitted next step). MAX_EMPTY_STEPS such steps in a row are a
        liveness bug of the impl, most often blocks its block manager lost: stepping on would
        change nothing, so every unfinished request fails now with the pool's state in its
        error, instead of the engine spinning on empty steps forever."""
        if not idle or not self.scheduler.has_unfinished:
            self._empty_steps = 0
            return
        self._empty_steps += 1
        if self._empty_steps < MAX_EMPTY_STEPS:
            return
        stuck = [*self.scheduler.running, *self.scheduler.waiting]
        message = (
            f"impl {self.impl.name!r} scheduled nothing in {self._empty_steps} steps in a row with "
            f"{len(self.scheduler.running)} request(s) running and {len(self.scheduler.waiting)} waiting "
            f"(a liveness bug: a request that fits the pool alone must be scheduled); its block manager "
            f"has {self.block_manager.num_free} of {self.runner.num_blocks} blocks free"
        )
        log.error(message)
        self._empty_steps = 0
        for request in stuck:
            self._fail_request(request.request_id, request, None, message, changed)

    def _fail_request(self, rid: str, request, computed: Optional[int], message: str, changed: dict) -> None:
        """Unpublish what the failed forward may not have written, finish through the
        Scheduler API (which frees the blocks), and give the sample its error. A sample whose
        finish was decided before the fault (a stop, a length) keeps it: its tokens are right."""
        found = self._samples.get(rid)
        if found is None or found[1].finish_reason is not None:
            return
        parent, sample = found
        if not request.status.is_finished:
            start = request.num_computed_tokens if computed is None else computed
            self.block_manager.unpublish(request, min(start, request.num_computed_tokens))
            self.scheduler.finish(request, Status.FINISHED_ABORTED)
        self.runner.drop(rid)
        sample.unread = [t for t in sample.unread if t != self.vocab_size]
        try:
            self.outputs.settle(sample, ERROR, None, message)
        except Exception:  # the detokenizer is what failed: keep the tokens, drop the text
            sample.detokenizer = None
            sample.finish_reason, sample.error = ERROR, message
        changed[parent.request_id] = parent

    def _forget(self, request_id: str) -> None:
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return
        reasons = self.stats.finish_reasons
        for sample in parent.samples:
            reason = sample.finish_reason or Status.FINISHED_ABORTED.finish_reason
            reasons[reason] = reasons.get(reason, 0) + 1
            self._samples.pop(sample.request.request_id, None)
            self._constrained.discard(sample.request.request_id)
            self._banning.discard(sample.request.request_id)
            self._holding.pop(sample.request.request_id, None)
            self._high_water.pop(sample.request.request_id, None)
            if self.spec is not None:
                self.spec.forget(sample.request.request_id)
            if self._inflight is not None:  # its id may be reused before the next step
                self._inflight.forget(sample.request.request_id)
        self._drop_unpending()

    def _drop_unpending(self) -> None:
        """Drop the step in flight once nothing it carries can reach a request (every request
        it sampled for was forgotten: the last live one aborted without a report): an idle
        engine otherwise held that step's device tensors and ids until its next step."""
        if self._inflight is not None and not self._inflight.pending:
            self._inflight = None


@dataclass
class _StepState:
    """What one step() has done so far, for the rollback of a failed step."""

    previous: Optional[InFlight]  # the async step launched by the previous step()
    output: object = None  # this step's SchedulerOutput once schedule() returned
    computed: dict = None  # request id -> num_computed_tokens at schedule time
    swapped: bool = False  # runner.apply_swaps completed
    scheduling: bool = False  # drafting is done and Scheduler.schedule() was called

    def __post_init__(self):
        self.computed = {} if self.computed is None else self.computed


# A real token's stop applies to a request in these states (FINISHED_LENGTH: decided by the
# placeholder's count, but a stop token or EOS comes first in the serial order of checks).
_STOPPABLE = (Status.RUNNING, Status.WAITING, Status.PREEMPTED, Status.SWAPPED, Status.FINISHED_LENGTH)


def _span(name: str):
    """A named range in torch.profiler traces (enginespec.<phase>) while a profiler runs; else a
    no-op context (record_function costs ~6 us even with no profiler, and a step opens 7-10)."""
    if _profiling():
        return torch.profiler.record_function(f"enginespec.{name}")
    return _NO_SPAN


_NO_SPAN = contextlib.nullcontext()
_profiling = getattr(torch.autograd, "_profiler_enabled", lambda: True)  # private; absent: always record


def _advance(state, tokens: list) -> tuple[Optional[str], bool]:
    """(why the sample fails or None, whether its grammar has terminated) once its matcher has
    accepted `tokens` (GrammarState.accept). A matcher that raises is a fault of that sample
    alone: a message, never an exception that would fail the whole step."""
    try:
        bad = state.accept(tokens)
        terminated = bad is None and state.terminated
    except Exception as exc:
        log.error("structured outputs: a grammar matcher failed accepting %s", tokens, exc_info=exc)
        return f"structured outputs: the grammar matcher failed accepting {tokens}: {_named(exc)}", False
    if bad is None:
        return None, terminated
    return (
        f"structured outputs: no token the grammar allows was left to sample (sampled {bad}); "
        "allowed_token_ids, bad_words or the vocabulary excluded them all"
    ), False


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def grammar_workers(cpu_count: Optional[int] = None) -> int:
    """How many grammars compile at once (prepare_grammar's threads): half the CPUs, as vLLM
    sizes its compile pool, capped at 8 and at least 2, so that one long compile (a tenant's
    huge schema or choice list) does not hold up the next request's, whatever the host. xgrammar
    releases the GIL while it compiles: the engine loop keeps stepping meanwhile."""
    cpus = os.cpu_count() if cpu_count is None else cpu_count
    return max(2, min(8, (cpus or 1) // 2))


def _child_params(params: SamplingParams, index: int, extra_stops: tuple[int, ...]) -> SamplingParams:
    """Sibling i's params: n = 1, seed + i when seeded (_sibling_seed); the further EOS ids
    (the checkpoint's, `extra_stops`, after the params' own) as further_eos_token_ids, which
    min_tokens bans under ignore_eos too, and as stop tokens unless ignore_eos."""
    changes = {}
    if params.n > 1:
        changes["n"] = 1
        if params.seed is not None:
            changes["seed"] = _sibling_seed(params.seed, index)
    own = params.further_eos_token_ids
    further = own + tuple(t for t in extra_stops if t not in own)
    if further != own:
        changes["further_eos_token_ids"] = further
    if further and not params.ignore_eos:
        changes["stop_token_ids"] = tuple(params.stop_token_ids) + tuple(
            t for t in further if t not in params.stop_token_ids
        )
    return dataclasses.replace(params, **changes) if changes else params


def _check_pool_holds_a_request(num_blocks: int, block_size: int) -> None:
    """The KV pool must hold the smallest request, a prompt token and an output token (2
    tokens), or no request can ever run: a ValueError at startup naming the pool's settings.
    Only block_size 1 with one block is that small. Without this check a fitted max_model_len
    of 1 reached SchedulerConfig, whose error named max_model_len, a setting the user never
    gave; a chosen one started an engine that refused every request."""
    if num_blocks * block_size < 2:
        raise ValueError(
            f"the KV pool holds {num_blocks * block_size} token ({num_blocks} block of block_size "
            f"{block_size}: num_blocks, kv_cache_bytes, num_gpu_blocks_override or "
            f"gpu_memory_utilization sized it), and a request needs at least 2 (a prompt token and "
            f"an output token); a larger pool or block_size holds one"
        )


def _check_allowed_leave_a_token(
    params: SamplingParams, eos: Optional[int], extra_stops, vocab_size: int
) -> None:
    """A ValueError where allowed_token_ids (None: the vocabulary's vocab_size ids) leave the
    sampler no id to draw (it then drew token 0, an id the request never allowed). A one-token
    bad word bans its id at every step (sample.penalties.bans_read_outputs), so allowed ids all
    among those leave nothing ever. While fewer than min_tokens are out, the stop ids
    (stop_token_ids, the checkpoint's further EOS ids) and the EOS, under ignore_eos too, are
    -inf as well (sample.penalties.min_tokens_ids), so allowed ids all among those and the bans
    leave nothing until then. (Structured outputs keep their own rule for min_tokens: the
    grammar wins and the request ends "stop"; not before a start marker, where no grammar
    masks the row.) Without allowed_token_ids only a vocabulary of at most MAX_NUM_BAD_WORDS
    ids (plus the stop ids) can be banned whole: a larger one returns at the size check."""
    allowed, so = params.allowed_token_ids, params.structured_outputs
    banned = {word[0] for word in params.bad_words_token_ids if len(word) == 1}
    stops = {*params.stop_token_ids, *params.further_eos_token_ids, *extra_stops}
    if eos is not None:
        stops.add(eos)
    if allowed is None and len(banned | stops) < vocab_size:
        return
    ids = set(range(vocab_size) if allowed is None else allowed)
    named = f"the vocabulary's {vocab_size} ids (no allowed_token_ids)"
    if allowed is not None:
        named = f"allowed_token_ids {list(allowed)}"
    if ids <= banned:
        raise ValueError(
            f"{named} are all banned by one-token bad_words: no token could be sampled; allow a "
            f"token no bad word bans"
        )
    if params.min_tokens < 1 or (so is not None and so.start_after_token_ids is None):
        return
    if ids <= stops | banned:
        what = "stop ids or the EOS" if ids <= stops else "stop ids, the EOS or banned by bad_words"
        raise ValueError(
            f"{named} are all {what}, and min_tokens ({params.min_tokens}) bans the stop ids and "
            f"the EOS until that many tokens are out: no token could be sampled; allow a token "
            f"that neither stops the request nor is banned, or lower min_tokens"
        )


def _refusal(params: SamplingParams, position: int) -> str:
    """The error of a request whose allowed ids its bad words all banned at output token
    `position` (EngineCore._hold_constraints)."""
    allowed = "None (every id)" if params.allowed_token_ids is None else list(params.allowed_token_ids)
    words = [list(w) for w in params.bad_words_token_ids]
    return (
        f"no token was left to sample at output token {position} (0-based): allowed_token_ids "
        f"{allowed} are all banned there by bad_words_token_ids {words} after the output so far, "
        f"and no stop id is allowed for min_tokens to yield to; the request ends here instead of "
        f"emitting an id it does not allow"
    )


def _sibling_seed(seed: int, index: int) -> int:
    """seed + index, always a seed SamplingParams takes: where the sum is -1, which it reads as
    "no seed" (UNSEEDED), or above SEED_RANGE (a seed near 2**64 - 1), the sum modulo 2**64,
    which the sampler draws from alike (it keys a row by its seed modulo 2**64), so that sibling
    repeats its sample as vLLM's child of seed -1 does."""
    child = seed + index
    return child & _SEED_MASK if child == UNSEEDED or child > SEED_RANGE[1] else child
