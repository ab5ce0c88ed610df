"""ModelRunner: owns the paged KV pools of one model, moves blocks to and from host memory, and
runs one flat batch through the model.

Compilation and graph capture happen here, at the call site: on CUDA (unless enforce_eager or
compile_model=False) the decoder body is torch.compile'd (compiled.py) for every step, and
decode steps replay CUDA graphs captured over that compiled body (cuda_graphs.py).

Sizing the pool:
- Either device: `num_gpu_blocks_override` (vLLM's name, so on the CPU too: tests force
  preemption with it) or `num_blocks`, if given, in that order.
- CPU: else `kv_cache_bytes` (default DEFAULT_CPU_KV_BYTES) divided by
  the bytes of one block over all layers, capped at what max_num_seqs requests of
  max_model_len tokens could ever hold (a bigger pool would only waste host memory).
- CUDA: else a profile run of the largest step
  (max_num_batched_tokens tokens over min(max_num_seqs, tokens) requests, logits and the
  sampler included) measures the activation peak; the pool gets
  total * gpu_memory_utilization - (memory in use before the run) - (activation peak).
- A size the user set (the first two, or kv_cache_bytes) must fit the memory free on the
  device, scratch block included (on the CPU under tensor parallelism, every rank's pool at
  once: they share the host): else a ValueError naming it (_check_pool_memory).

Swaps: `swap_out(request_id, blocks)` copies the listed device blocks (every layer, K and V)
to host memory under the request id, before the step's forward reuses them; `swap_in` copies
them back into the newly allocated blocks and forgets the host copy. `drop(request_id)` forgets
the copy of a request that finished while swapped, so host memory never outlives a request.

Sleep mode (worker/sleep.py): `sleep(tags)` drops the CUDA graphs (they hold the pool's and the
weights' pointers) and releases the tags' storages; `wake_up(tags)` restores them and, once no
tag sleeps, captures the graphs again. `execute` raises EngineAsleepError while any tag sleeps,
or while weights a level-2 sleep discarded are not all filled again by `load_weights`
(worker/weight_update.py: in place, so captured graphs stay valid).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import torch

from enginespec.spec import Batch, SamplingParams, SchedulerOutput
from enginespec.spec import build_batch as spec_build_batch
from enginespec.worker.compiled import CompiledBody, eager_fused, should_compile
from enginespec.worker.sleep import Asleep, EngineAsleepError, check_filled, model_tensors
from enginespec.worker.weight_update import (
    WeightUpdate,
    apply_update,
    drop_pending,
    finish_update,
    parameter_ids,
    plan_update,
    read_checkpoint,
    unfilled_names,
)

log = logging.getLogger(__name__)

DEFAULT_CPU_KV_BYTES = 1 << 28  # 256 MiB: a modest default for the host pool
# Finished ids apply_swaps carries to the next build at most (oldest dropped first): requests
# aborted before any schedule finish on steps that build nothing, and an engine that never builds
# must not keep one id per request. A dropped id's row, if any, goes at TableRows.bound.
UNBUILT_IDS = 4096


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_bytes_per_block(model, block_size: int) -> int:
    """Bytes one block takes over all layers: K and V of block_size tokens."""
    itemsize = torch.empty((), dtype=model.dtype).element_size()
    return 2 * model.num_layers * block_size * model.num_kv_heads * model.head_dim * itemsize


@dataclass
class ExecuteOutput:
    """Logits of one step: `logits` [S, V] (the model's dtype) for batch.logits_indices (in
    batch.sample_request_ids order); `prompt_logits[request_id] = (positions, logits [P, V],
    target ids)` for prompt positions whose next-token logprobs were asked for."""

    logits: torch.Tensor
    prompt_logits: dict[str, tuple[list[int], torch.Tensor, list[int]]] = field(default_factory=dict)


class ModelRunner:
    """Runs a FlatModel over the paged pool. Invariant: `kv_caches` has one tensor per layer,
    each [2, num_blocks + 1, block_size, kv_heads, head_dim] (the last block is scratch), and the
    block ids the scheduler hands out are < num_blocks."""

    # Decode graphs of up to this many rows run the logits head too (cuda_graphs.py: "The logits
    # head"): the sweep's steps of 1-8 rows are host-bound, from 16 rows the host waits.
    GRAPH_LOGITS_MAX_ROWS = 16

    def __init__(
        self,
        model,
        impl,
        *,
        block_size: int,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        num_blocks: Optional[int] = None,
        kv_cache_bytes: Optional[int] = None,
        gpu_memory_utilization: float = 0.9,
        num_gpu_blocks_override: Optional[int] = None,
        sample_fn: Optional[Callable] = None,
        enforce_eager: bool = False,
        compile_model: Optional[bool] = None,
        compile_backend: str = "inductor",
        kv_bytes_reserved_per_block: int = 0,
        skinny_gemm: Optional[bool] = None,
        mixed_graph_tokens: int = 0,
    ):
        """kv_bytes_reserved_per_block: bytes of another pool that grows with this one (a draft
        model's KV, block for block): the sizing divides the memory by the sum, so both fit.
        mixed_graph_tokens: mixed steps of up to this many tokens replay graphs (0: none)."""
        self.model = model
        self.impl = impl
        self.block_size = block_size
        self.device = torch.device(model.device)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.build_batch = getattr(impl, "build_batch", None) or spec_build_batch
        self.bytes_per_block = kv_bytes_per_block(model, block_size)
        self._sizing_bytes = self.bytes_per_block + kv_bytes_reserved_per_block
        # Seconds of each construction phase (EngineStats.startup_phases): "gemm_tuning",
        # "profile_run" (its first forward compiles the body), "graph_capture".
        self.startup_phases: dict[str, float] = {}
        # CUDA sizing's figures: the profile run's activation peak and the KV budget, bytes
        self.profile_bytes: dict[str, int] = {}
        started = time.perf_counter()
        self.linear_table = self._install_skinny_gemm(skinny_gemm)
        if self.linear_table is not None:
            self.startup_phases["gemm_tuning"] = time.perf_counter() - started
        self.body = None  # None: the model's own eager body
        folded = bool(getattr(model, "folded_norms", False))
        if should_compile(compile_model, self.device, enforce_eager, folded):
            self.body = CompiledBody(model, compile_backend)
            if self.linear_table is not None and eager_fused():
                self.body.eager_max_rows = model.merged.fused_max_rows  # compiled.py says why
        self.num_blocks = self._size_pool(
            gpu_memory_utilization, num_gpu_blocks_override, num_blocks, kv_cache_bytes, sample_fn
        )
        sized_by, value = _sizing_setting(self.device, num_gpu_blocks_override, num_blocks, kv_cache_bytes)
        if value is not None:  # the user's size: checked against free memory first
            self._check_pool_memory(sized_by, value)
        self.kv_caches = self._allocate_pool(sized_by)
        self._host: dict[str, list[torch.Tensor]] = {}
        # apply_swaps' finished-id lists not yet handed to a build (prepare): the builder releases
        # a request's rows only when a batch it builds reports the request finished
        self._unbuilt: list[list[str]] = []
        self._num_unbuilt = 0  # ids in _unbuilt, at most UNBUILT_IDS past the newest list
        self.graphs = None
        self._asleep: dict[str, Asleep] = {}  # sleep mode: tag -> its released storages
        self._unfilled: set[str] = set()  # checkpoint names a level-2 sleep discarded, not yet loaded
        self._mixed_graph_tokens = mixed_graph_tokens
        self._wants_graphs = (
            self.device.type == "cuda"
            and not enforce_eager
            and "cuda_graphs" in getattr(impl, "capabilities", ())
        )
        if self._wants_graphs:
            started = time.perf_counter()
            self._capture_graphs()
            self.startup_phases["graph_capture"] = time.perf_counter() - started

    def _capture_graphs(self) -> None:
        """Capture the decode and mixed graphs over the current pools and weights (at
        construction, and again after a wake_up: a sleep dropped them)."""
        from enginespec.worker.cuda_graphs import default_mixed_buckets, try_capture

        finish_update(self.model)
        self.graphs = try_capture(
            self.model,
            self.kv_caches,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            mixed_buckets=default_mixed_buckets(self._mixed_graph_tokens),
            body=self.body,
            logits_max_rows=self.GRAPH_LOGITS_MAX_ROWS,
        )

    def _install_skinny_gemm(self, setting: Optional[bool]):
        """EngineArgs.skinny_gemm (skinny_linear.py): tune the projection GEMMs on this model's
        weights and route the merged decoder's through the measured choice. Only for the
        merged decoder in bf16/fp16 on CUDA; otherwise says why and changes nothing."""
        from enginespec.worker.skinny_linear import engine_max_rows, resolve_switch
        from enginespec.worker.skinny_ops import install

        if not resolve_switch(setting):
            return None
        max_rows = engine_max_rows()  # a bad ENGINESPEC_SKINNY_MAX_ROWS is the user's error: raised
        merged = getattr(self.model, "merged", None)
        if (
            self.device.type != "cuda"
            or merged is None
            or self.model.dtype not in (torch.bfloat16, torch.float16)
        ):
            if setting:  # asked for by name: say why not (the default just stays on cuBLAS)
                log.warning("skinny_gemm needs the merged decoder in bf16/fp16 on CUDA; using cuBLAS")
            return None
        try:
            return install(merged, self.device, max_rows=min(self.max_num_seqs, max_rows))
        except Exception as e:  # noqa: BLE001 - an optimisation, never a requirement (as graphs are)
            log.warning("skinny_gemm tuning failed (%s: %s); using cuBLAS", type(e).__name__, e)
            return None

    # ---- sizing -------------------------------------------------------------------------------

    def _size_pool(
        self,
        utilization: float,
        override: Optional[int],
        num_blocks: Optional[int],
        kv_cache_bytes: Optional[int],
        sample_fn: Optional[Callable],
    ) -> int:
        """The pool's num_blocks (module doc: "Sizing the pool")."""
        if self.device.type == "cuda":
            return self._cuda_num_blocks(utilization, override, num_blocks, sample_fn)
        return self._cpu_num_blocks(override, num_blocks, kv_cache_bytes)

    def _check_pool_memory(self, sized_by: str, value: int) -> None:
        """A pool the user sized (`sized_by` = value: num_gpu_blocks_override, num_blocks, or
        kv_cache_bytes on the CPU) must fit the device's free memory, scratch block included:
        else a ValueError naming the setting, the bytes it needs and the bytes free, where the
        allocation would have failed (after the ranks agreed on the size, under tensor
        parallelism). (The allocator's own refusal names no field, and a size it grants on an
        overcommitting host is zero-filled page by page until the kernel kills the process.) A
        size the engine chose itself is never refused here; no check where the free memory
        cannot be read."""
        free = cuda_bytes_available(self.device) if self.device.type == "cuda" else host_bytes_available()
        pools = self._pools_sharing_memory()
        need = (self.num_blocks + 1) * self._sizing_bytes * pools
        if free is None or need <= free:
            return
        where = "GPU memory free" if self.device.type == "cuda" else "host memory available"
        ranks = f", times the {pools} tensor-parallel ranks sharing this host" if pools > 1 else ""
        raise ValueError(
            f"{sized_by} ({value}) needs {need} bytes of KV cache ({self._sizing_bytes} per block "
            f"of {self.block_size} tokens over all layers, plus one scratch block{ranks}), more than "
            f"the {free} bytes of {where}; lower {sized_by}"
        )

    def _pools_sharing_memory(self) -> int:
        """How many pools of this one's size draw on the memory _check_pool_memory reads: 1
        here (a tensor-parallel runner on the CPU says more: its ranks share one host)."""
        return 1

    def _allocate_pool(self, sized_by: str) -> list[torch.Tensor]:
        """The pool's tensors. An allocator's refusal (the host's or the GPU's memory cannot hold
        num_blocks blocks: a pool size of a few zeros too many) is a ValueError naming the
        setting that sized it and the bytes asked, not the allocator's RuntimeError."""
        try:
            return self.model.allocate_kv(self.num_blocks, self.block_size)
        except RuntimeError as e:  # torch.OutOfMemoryError is one
            if not _is_allocation_failure(e):
                raise
            asked = self.num_blocks * self.bytes_per_block
            raise ValueError(
                f"the KV cache of {self.num_blocks} blocks ({asked} bytes on {self.device}), as {sized_by} "
                f"sized it, could not be allocated ({str(e).strip().splitlines()[0]}); lower {sized_by}"
            ) from None

    def _cpu_num_blocks(
        self, override: Optional[int], num_blocks: Optional[int], kv_cache_bytes: Optional[int]
    ) -> int:
        for name, value in (("num_gpu_blocks_override", override), ("num_blocks", num_blocks)):
            if value is not None:
                _check_positive(name, value)
                return value
        if kv_cache_bytes is not None:
            _check_positive("kv_cache_bytes", kv_cache_bytes)
        budget = DEFAULT_CPU_KV_BYTES if kv_cache_bytes is None else kv_cache_bytes
        found = budget // self._sizing_bytes
        if found < 1:
            raise ValueError(
                f"kv_cache_bytes must hold at least one block ({self._sizing_bytes} bytes "
                f"at block_size {self.block_size}), got {budget}"
            )
        if kv_cache_bytes is not None:
            return found
        useful = self.max_num_seqs * _cdiv(self.max_model_len, self.block_size)
        return max(1, min(found, useful))

    def _cuda_num_blocks(
        self,
        utilization: float,
        override: Optional[int],
        num_blocks: Optional[int],
        sample_fn: Optional[Callable],
    ) -> int:
        if not 0.0 < utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization!r}")
        for name, value in (("num_gpu_blocks_override", override), ("num_blocks", num_blocks)):
            if value is not None:
                _check_positive(name, value)
                return value
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        allocated_before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        started = time.perf_counter()
        self.profile_run(sample_fn)
        torch.cuda.synchronize(self.device)
        self.startup_phases["profile_run"] = time.perf_counter() - started
        activation_peak = torch.cuda.max_memory_allocated(self.device) - allocated_before
        torch.cuda.empty_cache()
        available = int(total * utilization) - (total - free) - activation_peak
        self.profile_bytes = {"activation_peak": activation_peak, "kv_budget": available}
        found = available // self._sizing_bytes
        if found < 1:
            raise ValueError(
                f"gpu_memory_utilization={utilization} leaves no room for the KV cache: {total - free} bytes "
                f"in use before profiling, {activation_peak} bytes of activations for a "
                f"{self.max_num_batched_tokens}-token step, of {total} total; raise gpu_memory_utilization "
                f"or lower max_num_batched_tokens"
            )
        return found

    def profile_run(self, sample_fn: Optional[Callable] = None) -> None:
        """Run the largest step this engine will ever see on a throwaway pool: N =
        max_num_batched_tokens tokens split over min(max_num_seqs, N) requests, each sampling.
        The batch is built outside inference mode, as every real step's is: dynamo guards on its
        inputs' dispatch keys, so the graph this forward compiles is the one later eager steps
        reuse (an inference-tensor batch here made a cold start compile the decoder once more)."""
        num_tokens = self.max_num_batched_tokens
        num_reqs = min(self.max_num_seqs, num_tokens)
        lengths = [num_tokens // num_reqs + (1 if i < num_tokens % num_reqs else 0) for i in range(num_reqs)]
        tmp_blocks = sum(_cdiv(n, self.block_size) for n in lengths)
        block_manager = self.impl.new_block_manager(tmp_blocks, self.block_size, False)
        params = SamplingParams(max_tokens=1, temperature=0.0)
        requests = [self.impl.new_request(f"profile-{i}", [0] * n, params) for i, n in enumerate(lengths)]
        for request, n in zip(requests, lengths):
            if not block_manager.allocate_slots(request, n):
                raise RuntimeError("profile run: the throwaway pool is too small (a bug)")
        output = SchedulerOutput(scheduled=list(zip(requests, lengths)))
        batch = self.build_batch(output, block_manager, self.device)
        with torch.inference_mode():
            kv = self.model.allocate_kv(tmp_blocks, self.block_size)
            self._precompile_forward(batch, kv)
            hidden = self.model.forward(batch.input_ids, batch.positions, batch.meta, kv, body=self.body)
            logits = self.model.compute_logits(hidden[batch.logits_indices])
            if sample_fn is not None:
                sample_fn(logits, requests)
            del kv, hidden, logits

    def _precompile_forward(self, batch, kv: list[torch.Tensor]) -> None:
        """The profile batch's forward once with our kernels' launches compile-only, on the
        compile pool (kernels/compile_pool.py), so its Triton variants compile side by side
        rather than one after another in the real forward. Through the model's own body (a
        compiled body compiles in the real forward, as before); never raises."""
        from enginespec.kernels.compile_pool import compile_only_launches, precompile

        def compile_pass() -> None:
            with compile_only_launches():
                self.model.forward(batch.input_ids, batch.positions, batch.meta, kv)

        precompile([compile_pass])

    # ---- swaps --------------------------------------------------------------------------------

    def swap_out(self, request_id: str, block_ids: list[int]) -> None:
        """Copy `block_ids` of every layer to host memory under `request_id` (pinned on CUDA,
        waited for before returning)."""
        if request_id in self._host:
            raise ValueError(f"request {request_id!r} is already swapped out")
        index = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        pin = self.device.type == "cuda"
        copies = []
        for cache in self.kv_caches:
            host = torch.empty((2, len(block_ids), *cache.shape[2:]), dtype=cache.dtype, pin_memory=pin)
            host.copy_(cache.index_select(1, index), non_blocking=pin)
            copies.append(host)
        if pin:
            torch.cuda.synchronize(self.device)
        self._host[request_id] = copies

    def swap_in(self, request_id: str, block_ids: list[int]) -> None:
        """Fill `block_ids` (the request's first blocks, covering its computed tokens) from its
        host copy, then forget the copy."""
        copies = self._host.pop(request_id, None)
        if copies is None:
            raise ValueError(f"request {request_id!r} has no swapped-out blocks")
        num = len(block_ids)
        if num > copies[0].shape[1]:
            raise ValueError(
                f"request {request_id!r}: swap_in of {num} blocks but only "
                f"{copies[0].shape[1]} were swapped out"
            )
        index = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        for cache, host in zip(self.kv_caches, copies):
            cache.index_copy_(1, index, host[:, :num].to(self.device, non_blocking=True))

    def drop(self, request_id: str) -> None:
        """Forget any host copy of a request (it finished or was aborted)."""
        self._host.pop(request_id, None)

    @property
    def num_swapped(self) -> int:
        """Requests whose KV currently sits in host memory."""
        return len(self._host)

    def apply_swaps(self, output: SchedulerOutput) -> None:
        """Drop finished requests' copies, then swap out before swap in (the scheduler never
        does both in one step, but out-before-in is the safe order if it did). The finished ids
        are also kept for the next prepare(): a step that builds no batch (an empty schedule,
        which is where an async step's last finishes are reported; a step that failed first)
        must not lose them, or the impl's batch builder keeps those requests' rows."""
        if output.finished:  # carried first: a drop that raises must not lose them
            self._carry(output.finished)
        for request_id in output.finished:
            self.drop(request_id)
        for request_id, blocks in output.swap_out:
            self.swap_out(request_id, blocks)
        for request_id, blocks in output.swap_in:
            self.swap_in(request_id, blocks)

    # ---- sleep mode (worker/sleep.py) ---------------------------------------------------------

    def sleep(self, tags: tuple[str, ...], discard_weights: bool = False) -> None:
        """Release the device memory of `tags` (SLEEP_TAGS' names, checked by the caller): the
        weights to host memory (with discard_weights, a level-2 sleep, the parameters are
        dropped instead and must be filled by load_weights after wake_up), the KV pool
        forgotten. The CUDA graphs go first (they point into both). A tag already asleep is left
        as it is. RuntimeError, with nothing changed, while a request's blocks sit in host
        memory (swapped out: the engine sleeps only when idle)."""
        if self._host:
            raise RuntimeError(
                f"sleep: {len(self._host)} swapped-out requests hold KV copies; finish them first"
            )
        self.graphs = None
        for tag in tags:
            if tag not in self._asleep:
                self._asleep[tag] = self._release(tag, discard_weights)
        if self.device.type == "cuda":
            gc.collect()  # the dropped graphs' pools, should a cycle hold them
            torch.cuda.empty_cache()  # the freed blocks back to the driver, for another process

    def _release(self, tag: str, discard_weights: bool) -> Asleep:
        """One tag's storages released: the weights kept in host memory unless discard_weights
        (then the parameters are not, and every checkpoint name must be loaded again)."""
        if tag != "weights":
            return Asleep.release(self._tag_tensors(tag), keep=False)
        discard = frozenset(parameter_ids(self.model)) if discard_weights else frozenset()
        asleep = Asleep.release(self._tag_tensors(tag), keep=True, discard=discard)
        if discard_weights:
            self._unfilled = unfilled_names(self.model)
            drop_pending(self.model)
        return asleep

    def wake_up(self, tags: tuple[str, ...]) -> None:
        """Restore `tags` (any not asleep is skipped): the weights exactly as they were, the KV
        pool zeroed. Once nothing sleeps, the CUDA graphs are captured again."""
        for tag in tags:
            asleep = self._asleep.pop(tag, None)
            if asleep is not None:
                asleep.restore()
        if not self._asleep and self._wants_graphs and self.graphs is None:
            from enginespec.kernels import compile_procs

            with compile_procs.lease():  # any compile worker the capture starts ends with it
                self._capture_graphs()

    # ---- weight updates (worker/weight_update.py) --------------------------------------------

    def load_weights(self, weights) -> int:
        """Copy (checkpoint name, tensor) pairs into the model in place and re-derive what the
        load derived (weight_update.py); returns how many tensors were copied. Every pair is
        checked first (ValueError, nothing changed). RuntimeError while the weights sleep. The
        caller resets the prefix cache (its blocks were computed by the old weights)."""
        return self.commit_weights(self.plan_weights("load", weights))

    def reload_weights(self, path) -> int:
        """load_weights of every tensor of the checkpoint directory `path` (read into host
        memory; a tensor-parallel rank reads only its part of each)."""
        return self.commit_weights(self.plan_weights("reload", path))

    def plan_weights(self, kind: str, source) -> WeightUpdate:
        """The checked update (nothing written) of load_weights(source) (kind "load") or
        reload_weights(source) ("reload"): ValueError naming a fault; RuntimeError while the
        weights sleep."""
        if "weights" in self._asleep:
            raise RuntimeError(
                f"{kind}_weights: the weights are asleep (their storages are 0 bytes): call "
                f"wake_up(tags=['weights']) first"
            )
        if kind == "reload":
            return plan_update(self.model, read_checkpoint(self.model, source), sharded=True)
        return plan_update(self.model, source)

    def commit_weights(self, update: WeightUpdate) -> int:
        """Apply a checked update (plan_weights); returns how many tensors were copied."""
        apply_update(self.model, update)
        self._unfilled -= set(update.given)
        return len(update.given)

    @property
    def unfilled_weights(self) -> set[str]:
        """Checkpoint names a level-2 sleep discarded that no load_weights has filled since."""
        return set(self._unfilled)

    @property
    def sleeping_tags(self) -> tuple[str, ...]:
        """The tags asleep now (empty: awake)."""
        return tuple(self._asleep)

    def _tag_tensors(self, tag: str) -> list[torch.Tensor]:
        if tag == "kv_cache":
            return list(self.kv_caches)
        return model_tensors(self.model)

    def _check_awake(self) -> None:
        if self._asleep:
            raise EngineAsleepError(
                f"the engine is asleep ({', '.join(self._asleep)} released by sleep()): call wake_up() first"
            )
        check_filled(self._unfilled)

    # ---- one step -----------------------------------------------------------------------------

    def prepare(self, output: SchedulerOutput, block_manager) -> Batch:
        """The flat batch of one step (built before update_from_output). With graphs on, a step
        of one-token requests is padded to a decode bucket, any other step to the smallest mixed
        bucket its tokens fit (none fits: it runs eagerly, unpadded)."""
        pad_to = None
        if self.graphs is not None:
            num_tokens = output.num_scheduled_tokens
            if num_tokens == len(output.scheduled):
                pad_to = self.graphs.bucket_for(num_tokens)
            else:
                pad_to = self.graphs.mixed_bucket_for(num_tokens)
        batch = self.build_batch(self._with_unbuilt(output), block_manager, self.device, pad_to=pad_to)
        self._unbuilt.clear()
        self._num_unbuilt = 0
        return batch

    def _carry(self, finished: list[str]) -> None:
        """Keep one step's finished ids for the next build, dropping the oldest lists once more
        than UNBUILT_IDS are held (the newest is always kept: it is this step's own)."""
        self._unbuilt.append(finished)
        self._num_unbuilt += len(finished)
        while self._num_unbuilt > UNBUILT_IDS and len(self._unbuilt) > 1:
            self._num_unbuilt -= len(self._unbuilt.pop(0))

    def _with_unbuilt(self, output: SchedulerOutput) -> SchedulerOutput:
        """`output` whose finished ids also hold those of the steps since the last build that
        built none (apply_swaps kept them), so the builder releases every finished request's
        per-request state (fast impl: its block-table row, which holds the table itself).
        Without any such step, `output` itself: the usual step pays no copy."""
        earlier = [ids for ids in self._unbuilt if ids is not output.finished]
        if not earlier:
            return output
        finished = [rid for ids in earlier for rid in ids]
        return replace(output, finished=[*finished, *output.finished])

    @torch.inference_mode()
    def execute(self, batch: Batch) -> ExecuteOutput:
        """Forward the batch (writing its K/V into the pool) and return the logits of the rows
        that sample, plus those of prompt positions asked for by prompt_logprobs."""
        self._check_awake()  # a released storage is 0 bytes: no kernel may read it
        if getattr(self.model, "unfolded_rows", None):  # a weight update's folds, still pending
            finish_update(self.model)
        logits = None
        if self.graphs is not None and self.graphs.can_run(batch):
            hidden = self.graphs.forward(batch)
            if every_row_samples(batch):
                logits = self.graphs.decode_logits(batch)
        else:
            hidden = self.model.forward(
                batch.input_ids, batch.positions, batch.meta, self.kv_caches, body=self.body
            )
        if logits is None:
            logits = self.model.compute_logits(sampled_rows(hidden, batch))
        prompt_logits = {}
        if batch.prompt_logprob_rows:
            positions = batch.positions.tolist()
            for request_id, (rows, targets) in batch.prompt_logprob_rows.items():
                index = torch.tensor(rows, dtype=torch.int64, device=hidden.device)
                prompt_logits[request_id] = (
                    [positions[r] for r in rows],
                    self.model.compute_logits(hidden[index]),
                    list(targets),
                )
        return ExecuteOutput(logits=logits, prompt_logits=prompt_logits)


def sampled_rows(hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
    """hidden's rows at batch.logits_indices. A steady decode step (one row per request, every
    request sampling) samples rows 0..num_reqs-1 in order, since the flat layout puts request
    i's only row at i: a view then, instead of an index kernel and its launch on the host at
    every step. Any other batch (prefill chunks, draft rows, rows that do not sample) indexes."""
    if every_row_samples(batch):
        return hidden[: batch.num_reqs]
    return hidden[batch.logits_indices]


def every_row_samples(batch: Batch) -> bool:
    """One row per request and every request samples: request i's only row is row i, and the
    rows that sample are 0..num_reqs-1 in order (padding rows follow them)."""
    n = batch.num_reqs
    return batch.num_scheduled_tokens == n == len(batch.sample_request_ids) == batch.logits_indices.shape[0]


def host_bytes_available() -> Optional[int]:
    """Bytes of host memory available to a new allocation without swapping (Linux's
    MemAvailable), or None where that cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def cuda_bytes_available(device: torch.device) -> Optional[int]:
    """Free bytes on a CUDA device (torch.cuda.mem_get_info) plus what torch's caching allocator
    holds reserved but unused (the pool's allocation can take that too), or None where it cannot
    be read."""
    try:
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + max(cached, 0)
    except (RuntimeError, AssertionError):
        return None


def _sizing_setting(
    device: torch.device, override: Optional[int], num_blocks: Optional[int], kv_cache_bytes: Optional[int]
) -> tuple[str, Optional[int]]:
    """(the engine argument that decided the pool's size, its value where the user set it, else
    None) (module doc: "Sizing the pool")."""
    if override is not None:
        return "num_gpu_blocks_override", override
    if num_blocks is not None:
        return "num_blocks", num_blocks
    if device.type == "cuda":
        return "gpu_memory_utilization", None
    return "kv_cache_bytes", kv_cache_bytes


def _is_allocation_failure(e: RuntimeError) -> bool:
    """Whether a RuntimeError is an allocator's refusal (CUDA's OutOfMemoryError, or the CPU
    allocator's "can't allocate memory"), not some other failure to pass on as it is."""
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(e, oom) or "can't allocate memory" in str(e) or "out of memory" in str(e).lower()


def _check_positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
