"""TPModelRunner: the ModelRunner of one tensor-parallel rank, kept in step with the others.

Every rank runs the same ModelRunner code on its shard (its KV pool holds its heads), so every
rank makes the same collective calls in the same order: the pool sizing, the profile run and
the graph capture at construction, then one forward per step. Only rank 0 (the engine's process)
schedules, builds batches and samples. Per step it sends the workers, over their control pipes,
the swap ops it applied since the last step and the batch's layout (its sizes and host-side
ints, a few hundred bytes pickled), then broadcasts the batch's device tensors (input ids,
positions, slots, logits rows, query starts, lengths, block table) as one int64 buffer over the
process group. The ids go as a device tensor because async scheduling patches them on the
device from the previous step's samples (engine/async_scheduling.py): no rank reads them back.

Swaps: each rank swaps its own heads. Rank 0 records every swap_out / swap_in / drop it applies
and the workers replay them, in order, before the next forward (which is the first thing that
could overwrite a swapped-out block). Prefix caching needs nothing: rank 0's block manager
decides, and a block id means the same slots on every rank.

Sleep mode (worker/sleep.py): rank 0 sends ("sleep", tags, discard_weights) / ("wake_up", tags)
to the workers, which apply them to their own runner between steps, then applies them itself;
the engine has checked the call (flag, level, tags, idle) first, so every rank gets the same one.

Weight updates (worker/weight_update.py), all-or-nothing across ranks: rank 0 checks its own
part first (a refusal there reaches no worker), sends ("plan_weights", "load", the whole host
tensors) or ("plan_weights", "reload", path), each worker checks its part and answers; then
rank 0 sends ("commit_weights", True) and every rank applies, or, where any worker refused,
("commit_weights", False) and rank 0 raises that refusal (ValueError naming the tensor and the
rank) with no rank changed.

Invariant: a TP step is all-or-nothing across ranks. A failure after the step's message was
sent leaves the ranks out of step, so it is raised as EngineDeadError (tp_group.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from enginespec.spec import Batch, BatchMeta
from enginespec.worker.runner import ExecuteOutput, ModelRunner


@dataclass
class WorkerLink:
    """A worker's side of the group (rank 0's is tp_group.TensorParallel)."""

    rank: int
    world_size: int
    device: torch.device

    def min_over_ranks(self, value: int) -> int:
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())


@dataclass
class BatchLayout:
    """What a worker needs besides the broadcast buffer to rebuild rank 0's Batch."""

    num_tokens: int  # N' rows (padding included)
    num_samples: int  # S logits rows
    table_shape: tuple  # block_table [B', W]
    dtypes: tuple  # query_start_loc, seq_lens, block_table dtypes
    block_size: int
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: np.ndarray
    seq_lens_cpu: np.ndarray
    num_scheduled_tokens: int
    num_reqs: int
    prompt_logprob_rows: dict

    @classmethod
    def of(cls, batch: Batch) -> "BatchLayout":
        meta = batch.meta
        return cls(
            num_tokens=int(batch.input_ids.shape[0]),
            num_samples=int(batch.logits_indices.shape[0]),
            table_shape=tuple(meta.block_table.shape),
            dtypes=(meta.query_start_loc.dtype, meta.seq_lens.dtype, meta.block_table.dtype),
            block_size=meta.block_size,
            max_query_len=meta.max_query_len,
            max_seq_len=meta.max_seq_len,
            query_start_loc_cpu=meta.query_start_loc_cpu.numpy(),
            seq_lens_cpu=meta.seq_lens_cpu.numpy(),
            num_scheduled_tokens=batch.num_scheduled_tokens,
            num_reqs=batch.num_reqs,
            prompt_logprob_rows=dict(batch.prompt_logprob_rows),
        )

    @property
    def sizes(self) -> list[int]:
        """Lengths of the broadcast buffer's parts, in pack() order."""
        n, b = self.num_tokens, self.table_shape[0]
        return [n, n, n, self.num_samples, b + 1, b, b * self.table_shape[1]]


def pack(batch: Batch) -> torch.Tensor:
    """The batch's device tensors as one int64 buffer (rank 0 broadcasts it)."""
    meta = batch.meta
    parts = [batch.input_ids, batch.positions, meta.slot_mapping, batch.logits_indices]
    parts += [meta.query_start_loc, meta.seq_lens, meta.block_table.reshape(-1)]
    return torch.cat([p.to(torch.int64) for p in parts])


def unpack(flat: torch.Tensor, layout: BatchLayout) -> Batch:
    """Rebuild rank 0's Batch from the broadcast buffer and the layout."""
    ids, pos, slots, logits_rows, qsl, seq_lens, table = flat.split(layout.sizes)
    qsl_dtype, seq_dtype, table_dtype = layout.dtypes
    meta = BatchMeta(
        query_start_loc=qsl.to(qsl_dtype),
        seq_lens=seq_lens.to(seq_dtype),
        block_table=table.to(table_dtype).view(layout.table_shape),
        slot_mapping=slots,
        block_size=layout.block_size,
        query_start_loc_cpu=torch.from_numpy(layout.query_start_loc_cpu),
        seq_lens_cpu=torch.from_numpy(layout.seq_lens_cpu),
        max_query_len=layout.max_query_len,
        max_seq_len=layout.max_seq_len,
    )
    return Batch(
        input_ids=ids,
        positions=pos,
        meta=meta,
        logits_indices=logits_rows,
        sample_request_ids=[""] * layout.num_samples,
        num_scheduled_tokens=layout.num_scheduled_tokens,
        num_reqs=layout.num_reqs,
        prompt_logprob_rows=layout.prompt_logprob_rows,
    )


class TPModelRunner(ModelRunner):
    """A ModelRunner that keeps the ranks in step (module doc). `tp` is rank 0's TensorParallel
    or a worker's WorkerLink. On rank 0, construction first tells the workers to build theirs
    with the same arguments; a failure there stops the workers."""

    # The head stays outside the decode graphs here: a sharded head's gather inside a captured
    # graph has not been run on a multi-GPU machine (cuda_graphs.py: "The logits head").
    GRAPH_LOGITS_MAX_ROWS = 0

    def __init__(self, model, impl, *, tp, **kwargs):
        self.tp = tp
        self._ops: list[tuple] = []  # rank 0: swap ops applied since the last step
        self._planned = None  # a worker: the weight update planned, awaiting rank 0's commit
        try:
            if tp.rank == 0:
                tp.send(("runner", {k: v for k, v in kwargs.items() if k != "sample_fn"}))
            super().__init__(model, impl, **kwargs)
        except BaseException as exc:
            error = _abandon_construction(tp, exc) if tp.rank == 0 else None
            if error is not None:
                raise error from exc
            raise

    def _size_pool(self, *args) -> int:
        """Every rank's own sizing, then the smallest: the block ids must mean the same on all."""
        return self.tp.min_over_ranks(super()._size_pool(*args))

    def _pools_sharing_memory(self) -> int:
        """On the CPU every rank's pool (the same size on each) comes out of one host's memory:
        a user-sized pool must fit it world_size times over, or the ranks, each checking alone,
        zero-fill past it together. On CUDA each rank's pool is on its own GPU."""
        return self.tp.world_size if self.device.type == "cpu" else 1

    # ---- swaps: applied here, replayed by the workers before the next forward -----------------

    def swap_out(self, request_id: str, block_ids: list[int]) -> None:
        super().swap_out(request_id, block_ids)
        self._record(("out", request_id, list(block_ids)))

    def swap_in(self, request_id: str, block_ids: list[int]) -> None:
        super().swap_in(request_id, block_ids)
        self._record(("in", request_id, list(block_ids)))

    def drop(self, request_id: str) -> None:
        if request_id in self._host:  # a rank holds a copy exactly when rank 0 does
            super().drop(request_id)
            self._record(("drop", request_id))

    def _record(self, op: tuple) -> None:
        if self.tp.rank == 0:
            self._ops.append(op)

    def _replay(self, ops: list[tuple]) -> None:
        for op in ops:
            if op[0] == "out":
                ModelRunner.swap_out(self, op[1], op[2])
            elif op[0] == "in":
                ModelRunner.swap_in(self, op[1], op[2])
            else:
                ModelRunner.drop(self, op[1])

    # ---- sleep mode: every rank releases and restores its own shard and pool -----------------

    def sleep(self, tags: tuple[str, ...], discard_weights: bool = False) -> None:
        """Rank 0: the workers sleep the same tags (their next control message), then this rank.
        A level-2 sleep (discard_weights) discards every rank's shard: a weight update fills
        them all again."""
        if self.tp.rank == 0:
            self._check_no_swaps()
            self.tp.send(("sleep", tuple(tags), discard_weights))
        super().sleep(tags, discard_weights)

    def wake_up(self, tags: tuple[str, ...]) -> None:
        """Rank 0: the workers wake the same tags, then this rank. On CUDA each rank captures its
        graphs again once awake, in the same order as at construction (their collectives pair)."""
        if self.tp.rank == 0:
            self.tp.send(("wake_up", tuple(tags)))
        super().wake_up(tags)

    def _check_no_swaps(self) -> None:
        """The refusal ModelRunner.sleep makes, before the workers are told anything."""
        if self._host:
            raise RuntimeError(
                f"sleep: {len(self._host)} swapped-out requests hold KV copies; finish them first"
            )

    # ---- weight updates: checked on every rank, then applied on all or none -------------------

    def load_weights(self, weights) -> int:
        """Rank 0 (module doc): the whole tensors checked here first (a refusal reaches no
        worker), then sent to the workers, each of which keeps and checks its part."""
        pairs = list(weights.items() if isinstance(weights, Mapping) else weights)
        update = self.plan_weights("load", pairs)
        self._agree(("plan_weights", "load", [(n, t.detach().to("cpu")) for n, t in pairs]))
        return self.commit_weights(update)

    def reload_weights(self, path) -> int:
        """Rank 0: every rank reads its own part of the checkpoint at `path` and checks it."""
        update = self.plan_weights("reload", path)
        self._agree(("plan_weights", "reload", path))
        return self.commit_weights(update)

    def _agree(self, message: tuple) -> None:
        """Send a weight update's plan to the workers and gather their answers; then tell them
        all to apply it, or (one refused) to drop it, raising its refusal (ValueError, or
        RuntimeError for any other error: planning wrote nothing, so the engine serves on).
        A worker that dies meanwhile is EngineDeadError."""
        refusals = []
        try:
            self.tp.send_pickled(message)
            for rank, conn in enumerate(self.tp.conns, start=1):
                answer = conn.recv()
                if answer[0] != "weights_planned":  # ("error", traceback): the worker is dying
                    raise RuntimeError(f"worker rank {rank} answered {answer[0]!r}:\n{answer[1]}")
                if answer[1] is not None:
                    refusals.append((rank, *answer[1]))
            self.tp.send(("commit_weights", not refusals))
        except BaseException as exc:
            if not isinstance(exc, Exception):  # Ctrl-C between the messages: out of step
                self.tp.interrupted(exc)
                raise
            raise self.tp.dead_error(exc) from exc
        if refusals:
            rank, error_type, text = refusals[0]
            if error_type == "ValueError":
                raise ValueError(f"tensor-parallel rank {rank}: {text}")
            raise RuntimeError(f"tensor-parallel rank {rank}: {error_type}: {text}; nothing was loaded")

    def answer_plan(self, kind: str, source) -> Optional[tuple[str, str]]:
        """A worker's side of _agree: plan the update (kept for commit_plan); None, or the
        refusal's (type name, message). Planning writes nothing, so any error is reported."""
        self._planned = None
        try:
            self._planned = self.plan_weights(kind, source)
        except Exception as exc:  # noqa: BLE001 - rank 0 raises it; this rank is unchanged
            error_type = "ValueError" if isinstance(exc, ValueError) else type(exc).__name__
            return error_type, str(exc)
        return None

    def commit_plan(self, commit: bool) -> None:
        """A worker applies the update it planned (rank 0 got every rank's yes), or drops it."""
        planned, self._planned = self._planned, None
        if commit and planned is not None:
            self.commit_weights(planned)

    # ---- one step -----------------------------------------------------------------------------

    def execute(self, batch: Batch) -> ExecuteOutput:
        """Rank 0: send the step to the workers, then run it here."""
        if self.tp.rank != 0:
            return super().execute(batch)
        try:
            self.tp.send(("step", self._ops, BatchLayout.of(batch)))
        except BaseException as exc:  # an interrupt between two workers' messages
            if not isinstance(exc, Exception):
                self.tp.interrupted(exc)
            raise
        self._ops = []
        try:
            _broadcast(pack(batch))
            return super().execute(batch)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # Ctrl-C: the workers wait in a collective
                self.tp.interrupted(exc)
                raise
            raise self.tp.dead_error(exc) from exc

    def run_step(self, ops: list[tuple], layout: BatchLayout) -> None:
        """A worker's step: replay rank 0's swap ops, receive the batch, run the forward."""
        self._replay(ops)
        flat = torch.empty(sum(layout.sizes), dtype=torch.int64, device=self.device)
        _broadcast(flat)
        self.execute(unpack(flat, layout))

    def shutdown(self) -> None:
        if self.tp.rank == 0:
            self.tp.shutdown()

    @property
    def dead(self) -> Optional[str]:
        return getattr(self.tp, "dead", None)


def _abandon_construction(tp, exc: BaseException):
    """Rank 0's runner construction raised `exc`: stop the workers; the EngineDeadError to raise
    instead where a worker died (it names the worker), else None (raise exc itself).
    A ValueError (a bad argument) is every rank's: the workers raise it too and exit, so they are
    asked to stop. Anything else may be rank 0's alone (an out-of-memory in its profile run, a
    Ctrl-C), while the workers wait in a collective rank 0 left (the pool sizing, the profile
    run, the graph capture) and cannot read a stop: the engine is marked dead, so shutdown()
    terminates them at once. It waited STOP_WAIT_S (10 s) for a stop they never read."""
    error = None
    if not isinstance(exc, Exception):  # Ctrl-C amid the collectives
        tp.interrupted(exc)
    elif not isinstance(exc, ValueError):
        if tp.dead or tp._exited():
            error = tp.dead_error(exc)
        tp.dead = tp.dead or f"rank 0 failed building its runner ({type(exc).__name__}: {exc})"
    tp.shutdown()
    return error


def _broadcast(flat: torch.Tensor) -> None:
    import torch.distributed as dist

    dist.broadcast(flat, src=0)
