"""The processes of one tensor-parallel engine: rank 0 is the engine's own process; ranks 1..T-1
are worker processes it spawns (tp_worker.py), each running the same ModelRunner on its shard.

Two channels per worker:
- control: a multiprocessing Pipe from rank 0 (pickled messages: build the runner, run a step,
  stop). A worker blocks on it between steps with no timeout, so an idle engine costs nothing,
  and it sees EOF if rank 0 dies, so a worker never outlives its engine;
- data: a torch.distributed process group (gloo on the CPU, NCCL on CUDA) over a TCPStore on
  127.0.0.1, for the model's all-reduces, the logits gather and the step's batch tensors. Its
  collectives time out after TIMEOUT_S.

Failure (a worker killed, crashed, or a collective that failed): rank 0 checks the workers'
exit codes before every step, and a collective that raises is re-raised as EngineDeadError
naming the dead rank and its exit code (gloo fails at once when a peer's socket closes; NCCL
would wait, so on CUDA a monitor thread aborts the group as soon as a worker exits). After that
the engine cannot serve (the ranks no longer agree on where they are): EngineCore shuts it
down and raises. So does a Ctrl-C that interrupts rank 0 amid a step (or the startup's
collectives): the workers wait in a collective rank 0 will not join. shutdown() (LLM.close, the
collection of an engine dropped unclosed, or at interpreter exit) asks the workers to stop,
waits STOP_WAIT_S (a dead engine's not at all: its workers may be blocked), kills any left (a
worker ignores SIGTERM: a SIGTERM to the process group is rank 0's to act on, tp_worker.py), and
destroys the process group; the workers are daemon processes besides, so none survives its
engine.
"""

from __future__ import annotations

import atexit
import datetime
import multiprocessing.connection
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

# A collective that takes longer means a rank is stuck (alive but not answering; a dead one is
# found at once). Generous: the first collectives wait for the slowest rank's load and compile.
TIMEOUT_S = 300.0
START_TIMEOUT_S = 300.0  # spawning a worker: importing torch and transformers, on a busy host
STOP_WAIT_S = 10.0
# After a step failed midway, how long rank 0 waits for a worker to finish dying, so the error
# names the worker and its traceback rather than the broken connection it left. A worker that
# raised sends its traceback and exits, but its interpreter's teardown (torch, the process group)
# took over 0.5 s on a loaded 16-core host. The wait ends as soon as one worker has exited; it is
# spent in full only where no worker dies (the engine is dead either way).
DYING_WAIT_S = 5.0


class EngineDeadError(RuntimeError):
    """A tensor-parallel rank died or the ranks fell out of step: the engine cannot go on."""


@dataclass
class RankInfo:
    """What a worker needs to join: its rank, the world, the store port, its device and dtype."""

    rank: int
    world_size: int
    port: int
    device: str
    dtype: torch.dtype
    num_threads: int
    args: Any  # EngineArgs


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: cuda:(base + r) on CUDA (base = the engine's device index), else the CPU."""
    if device.type != "cuda":
        return device
    index = (device.index or 0) + rank
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"tensor_parallel_size needs GPU {index} for rank {rank}, but only "
            f"{torch.cuda.device_count()} are visible"
        )
    return torch.device("cuda", index)


def init_group(info: RankInfo, device: torch.device, store=None) -> None:
    """Join the process group (every rank calls it; rank 0 passes the store it created).

    init_process_group also replaces sys.excepthook with one that prefixes every line of every
    uncaught traceback with "[rank<r>]: ", and never puts the old one back. Rank 0 is the user's
    own process (their script, or the server's engine process), so its hook is restored: their
    tracebacks, also those long after close(), are their own (one more prefix per engine built,
    "[rank0]: [rank0]: ..." after two). A worker keeps the prefix: its stderr is shared."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if store is None:
        store = dist.TCPStore("127.0.0.1", info.port, None, False, timeout)
    kwargs = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
        # On a failed or timed-out collective, abort the communicator and raise in the waiting
        # thread (2) rather than NCCL's default of ending the process: rank 0 is the engine's
        # (or the server's) own process, and it reports the failure as EngineDeadError.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    hook = sys.excepthook
    dist.init_process_group(
        backend_for(device),
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
        **kwargs,
    )
    if info.rank == 0:
        sys.excepthook = hook


@dataclass
class TensorParallel:
    """Rank 0's handle on its workers: the control pipes, the processes, the loaded shard."""

    world_size: int
    device: torch.device
    processes: list = field(default_factory=list)
    conns: list = field(default_factory=list)
    model: Any = None
    rank: int = 0
    dead: Optional[str] = None  # why the engine cannot go on, once it cannot
    closed: bool = False

    # ---- control channel ----------------------------------------------------------------------

    def send(self, message) -> None:
        """Send one control message to every worker (after checking they are all alive)."""
        self._to_each(lambda conn: conn.send(message))

    def send_pickled(self, message) -> None:
        """`send` for a message holding host tensors (a weight update's): pickled once, by value,
        for every worker. Pipe.send would move each tensor's storage into shared memory (torch's
        pickler for multiprocessing), the caller's tensors included, and /dev/shm may be small."""
        import pickle

        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._to_each(lambda conn: conn.send_bytes(payload))

    def _to_each(self, write) -> None:
        """write(conn) for every worker's pipe, once all are alive; a pipe that fails is the
        engine's death (EngineDeadError naming it)."""
        self.check_alive()
        try:
            for conn in self.conns:
                write(conn)
        except (OSError, EOFError) as e:
            raise self.dead_error(e) from e

    def check_alive(self) -> None:
        if self.closed:
            self.dead = self.dead or "the tensor-parallel engine is shut down"
            raise EngineDeadError(self.dead)
        reason = self.dead or self._exited()
        if reason:
            self.dead = reason
            raise EngineDeadError(reason)

    @property
    def sentinels(self) -> list:
        """The workers' process sentinels, each ready once its worker has exited: an engine loop
        idle on its input waits on these too (poll_dead), as vLLM's worker monitor does. None once
        closed: its workers' exits are no news then, and would wake the wait forever."""
        return [] if self.closed else [proc.sentinel for proc in self.processes]

    def poll_dead(self) -> Optional[str]:
        """Why the engine is dead, also when a worker died between steps (no step noticed yet),
        or None. Does not raise; a closed engine's workers exited on request: not a death."""
        if self.dead is None and not self.closed:
            self.dead = self._exited()
        return self.dead

    def _exited(self) -> Optional[str]:
        """A message naming the workers that have exited (with their errors), or None."""
        gone = []
        for rank, (proc, conn) in enumerate(zip(self.processes, self.conns), start=1):
            if proc.exitcode is None:
                continue
            gone.append(f"worker rank {rank} (pid {proc.pid}) exited with code {proc.exitcode}")
            error = _pending_error(conn)
            if error:
                gone[-1] += f":\n{error}"
        return "tensor-parallel " + "; ".join(gone) if gone else None

    def dead_error(self, cause: BaseException) -> EngineDeadError:
        """The error to raise when a step failed midway under TP: the ranks are out of step."""
        deadline = time.monotonic() + DYING_WAIT_S  # let a dying worker finish dying
        while (
            self.processes and all(p.exitcode is None for p in self.processes) and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        reason = self._exited() or f"a tensor-parallel step failed midway ({type(cause).__name__}: {cause})"
        self.dead = self.dead or reason
        return EngineDeadError(self.dead)

    def interrupted(self, exc: BaseException) -> None:
        """Rank 0 was interrupted (Ctrl-C: a BaseException that is not an Exception) while the
        workers may be in a collective it will never join, or between the control messages of
        one step: the ranks are out of step, so the engine is dead. Nothing is waited for (no
        worker is dying, unlike dead_error's case), and shutdown() then ends the workers at once."""
        self.dead = self.dead or (
            f"a tensor-parallel step was interrupted midway ({type(exc).__name__}): the ranks are out of step"
        )

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's `value` (so every rank sizes its KV pool alike)."""
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    # ---- shutdown -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the workers and destroy the process group. Idempotent. A live engine's workers
        are idle between steps: each is asked to stop and given STOP_WAIT_S to exit 0. A dead
        engine's may sit in a collective that rank 0 will never join (a step interrupted
        midway) and cannot read the request: they are killed at once. Either way a worker still
        running after the polite wait is killed, also when an interrupt (a second Ctrl-C) cuts
        that wait short."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.shutdown)
        for conn in self.conns:
            try:
                conn.send(("stop",))
            except (OSError, EOFError, ValueError):
                pass
        try:
            if self.dead is None:
                for proc in self.processes:
                    proc.join(timeout=STOP_WAIT_S)
        finally:  # a second Ctrl-C during the polite wait: closed is set, so end them now
            self._end_processes()

    def _end_processes(self) -> None:
        """Kill every worker still running (a worker ignores SIGTERM, tp_worker.py; it would
        have died of one at once, running no cleanup, as of SIGKILL); close the pipes; destroy
        the group."""
        for proc in self.processes:
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        _destroy_group(abort=self.dead is not None)


def _pending_error(conn) -> Optional[str]:
    """A worker's last words: the traceback it sent before exiting, if any."""
    try:
        while conn.poll(0):
            message = conn.recv()
            if message and message[0] == "error":
                return str(message[1])
    except (OSError, EOFError):
        pass
    return None


def _destroy_group(abort: bool) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        if abort and dist.get_backend() == "nccl":
            dist.distributed_c10d._abort_process_group()
        else:
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - shutting down after a failure: nothing more to do
        pass


def _watch(tp: TensorParallel) -> None:
    """CUDA only: abort the NCCL group as soon as a worker exits, so a collective waiting on it
    raises instead of waiting out the timeout (gloo fails on its own when a socket closes).
    A reason already set stays: the step that found the death may have read the worker's
    traceback off its pipe first, and a second reading has none."""
    multiprocessing.connection.wait([p.sentinel for p in tp.processes])
    if not tp.closed:
        tp.dead = tp.dead or tp._exited() or "a tensor-parallel worker exited"
        _destroy_group(abort=True)


def start_tensor_parallel(args, impl, device: torch.device, dtype: torch.dtype) -> TensorParallel:
    """Spawn ranks 1..T-1, join the process group as rank 0 and load rank 0's shard. Any failure
    stops whatever was started and raises (EngineDeadError if a worker died)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from enginespec.worker.tp_worker import load_shard, worker_main

    if dist.is_initialized():
        raise ValueError(
            "tensor_parallel_size > 1: this process already has a torch.distributed process group "
            "(one tensor-parallel engine per process; close the other LLM first)"
        )
    size = args.tensor_parallel_size
    check_plan(args, size)  # a split the model does not allow is a ValueError before any spawn
    devices = [rank_device(device, rank) for rank in range(size)]  # and so are too few GPUs
    tp = TensorParallel(world_size=size, device=devices[0])
    store = dist.TCPStore(
        "127.0.0.1", 0, None, True, datetime.timedelta(seconds=TIMEOUT_S), wait_for_workers=False
    )
    ctx = mp.get_context("spawn")
    atexit.register(tp.shutdown)
    try:
        for rank in range(1, size):
            info = RankInfo(rank, size, store.port, str(devices[rank]), dtype, torch.get_num_threads(), args)
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=worker_main, args=(info, child), daemon=True, name=f"enginespec-tp{rank}"
            )
            proc.start()
            child.close()
            tp.processes.append(proc)
            tp.conns.append(parent)
        _wait_ready(tp)
        init_group(RankInfo(0, size, store.port, str(tp.device), dtype, 0, args), tp.device, store=store)
        tp.model = load_shard(args, impl, 0, size, tp.device, dtype)
    except BaseException as exc:
        if not isinstance(exc, ValueError):
            tp.dead = tp._exited() or tp.dead
        if not isinstance(exc, Exception):  # Ctrl-C: the workers may be in the rendezvous
            tp.interrupted(exc)
        tp.shutdown()
        if tp.dead and not isinstance(exc, (EngineDeadError, ValueError)):
            raise EngineDeadError(tp.dead) from exc
        raise
    if tp.device.type == "cuda":
        threading.Thread(target=_watch, args=(tp,), daemon=True, name="enginespec-tp-watch").start()
    return tp


def check_plan(args, world_size: int) -> None:
    """ValueError naming the field when the model cannot be split over world_size ranks, or
    when the engine would refuse its arguments once the model is loaded (max_model_len, the
    scheduler config): decided here, before any worker exists to be cleaned up."""
    from enginespec.worker.flat_model import _text_config
    from enginespec.worker.loader import load_config
    from enginespec.worker.merged_decoder import max_positions
    from enginespec.worker.tp_shard import ShardPlan

    config = load_config(
        args.model_dir(), trust_remote_code=args.trust_remote_code, hf_overrides=args.hf_overrides
    )
    text = _text_config(config)
    ShardPlan.from_config(text, 0, world_size)
    args.scheduler_config(args.resolve_max_model_len(max_positions(text)))


def _wait_ready(tp: TensorParallel) -> None:
    """Wait for every worker's ("ready",) (sent once imported, before it joins the group), so a
    worker that dies while starting is an error now, not a rendezvous timeout later."""
    waiting = dict(zip(tp.conns, tp.processes))
    deadline = START_TIMEOUT_S
    while waiting:
        ready = multiprocessing.connection.wait(
            list(waiting) + [p.sentinel for p in waiting.values()], deadline
        )
        if not ready:
            raise EngineDeadError(f"tensor-parallel workers did not start within {START_TIMEOUT_S:.0f} s")
        silent = [p for p in waiting.values() if p.sentinel in ready]
        for conn in [c for c in waiting if c in ready]:
            try:
                message = conn.recv()
            except EOFError:  # it exited without a word
                silent.append(waiting[conn])
                continue
            if message[0] != "ready":
                raise EngineDeadError(f"tensor-parallel worker failed to start:\n{message[1]}")
            del waiting[conn]
        silent = [p for p in silent if p in waiting.values()]  # not one that said ready first
        if silent:
            raise EngineDeadError(_exited_while_starting(tp, silent))


def _exited_while_starting(tp: TensorParallel, silent: list) -> str:
    """Why workers that exited before saying ("ready",) or sending an error died. One that
    raised never reached worker_main (which reports any error): it failed in multiprocessing's
    own start-up, which imports the user's main module again, and a script that builds the LLM
    at its top level so starts workers from each worker, which Python refuses (on the worker's
    stderr, far above the caller's traceback). Waits for their exit codes first: a sentinel
    fires a moment before the exit can be reaped (the error named no exit code then)."""
    for proc in silent:
        proc.join(timeout=DYING_WAIT_S)
    reason = tp._exited() or "a tensor-parallel worker exited while starting"
    if any(proc.exitcode is not None and proc.exitcode > 0 for proc in silent):
        reason += (
            " before it started; if this script builds the LLM at its top level, put that under "
            "`if __name__ == '__main__':`, since each tensor-parallel worker is spawned and "
            "imports the script again"
        )
    return reason


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).rstrip()
