"""A tensor-parallel worker process (ranks 1..T-1) and the shard loading every rank shares.

A worker imports, says ("ready",) on its control pipe, joins the process group, loads its shard
of the checkpoint, then obeys rank 0's control messages in order:
- ("runner", kwargs): build its TPModelRunner with rank 0's arguments (the pool sizing, profile
  run and graph capture then run in step with rank 0's, collective for collective);
- ("step", ops, layout): apply the swap ops rank 0 recorded since the last step, receive the
  batch tensors and run the forward (tp_runner.py);
- ("sleep", tags, discard_weights) / ("wake_up", tags): sleep mode on this rank's shard and pool;
- ("plan_weights", "load" | "reload", tensors | path): check this rank's part of a weight update
  and answer ("weights_planned", None | (error type, message)); ("commit_weights", bool): apply
  it (every rank agreed) or drop it (tp_runner.py);
- ("stop",): leave the group and exit 0.
Any exception is sent back as ("error", traceback) before the worker exits 1, so rank 0 can
name it. Either way the worker ends with os._exit once its group is destroyed (_exit_now: the
interpreter's teardown with gloo's threads alive aborted it now and then). A worker never
outlives rank 0 (its parent): a thread waits on the parent's sentinel and ends the process at
once when rank 0 is gone, whatever the worker is doing (joining the group, loading its shard,
building its runner: no pipe is read then); EOF on the pipe between steps says the same. The
worker never samples: only rank 0 holds the full logits. SIGINT and SIGTERM are ignored: the
terminal's Ctrl-C, and a SIGTERM to the whole process group (systemd's control-group kill,
`kill -TERM -- -PGID`), reach every process, but the worker's life is rank 0's to end (it ends
the workers, with SIGKILL where a stop is not obeyed, or goes on with them: a server drains its
requests first), as the engine process's is the front end's (engine/core_proc.py). A worker
that died of the group's SIGTERM killed the engine under every request still running.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading

import torch


def load_shard(args, impl, rank: int, world_size: int, device: torch.device, dtype: torch.dtype):
    """Rank `rank`'s FlatModel: its shard of every weight read from the checkpoint (and only
    that), the cross-rank modules swapped in, the pool shape set to the rank's KV heads."""
    from enginespec.worker.flat_model import FlatModel, _text_config
    from enginespec.worker.loader import build_model, load_config
    from enginespec.worker.tp_layers import parallelize
    from enginespec.worker.tp_shard import ShardPlan

    trust, overrides = args.trust_remote_code, args.hf_overrides  # every rank's config is rank 0's
    plan = ShardPlan.from_config(
        _text_config(load_config(args.model_dir(), trust_remote_code=trust, hf_overrides=overrides)),
        rank,
        world_size,
    )
    hf_model = build_model(
        args.model_dir(),
        device=device,
        dtype=dtype,
        slicer=plan.slice_for,
        trust_remote_code=trust,
        hf_overrides=overrides,
    )
    parallelize(hf_model, plan)
    model = FlatModel(hf_model, impl.attention_backend(device), args.model_impl)
    model.num_q_heads, model.num_kv_heads = plan.local_q_heads, plan.local_kv_heads
    model.shard_plan = plan  # a weight update keeps this rank's part of each tensor (weight_update.py)
    model.cover_positions(args.resolve_max_model_len(model.max_positions))  # every rank's rope
    return model


def worker_main(info, conn) -> None:
    """Entry point of a spawned worker (tp_group.start_tensor_parallel)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 owns Ctrl-C and SIGTERM (module doc)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()
    code = 1
    try:
        _serve(info, conn)
        code = 0
    except EOFError:  # rank 0 closed the pipe or died: nothing to report to
        pass
    except BaseException as exc:  # noqa: BLE001 - report anything, then exit non-zero
        from enginespec.worker.tp_group import format_exception

        try:
            conn.send(("error", f"rank {info.rank}: {format_exception(exc)}"))
        except (OSError, EOFError):
            pass
    finally:
        _leave_group()
        _exit_now(code)


def _exit_now(code: int) -> None:
    """End the worker with `code`, its output flushed, without the interpreter's teardown.

    Teardown (atexit, the collection of every module, then C++'s static destructors in exit())
    ran with gloo's threads alive in this process, and under load it now and then ended in
    std::terminate ("terminate called without an active exception", a joinable std::thread
    destroyed), printed after the user's own Ctrl-C traceback: to the user a crash. A worker is
    the one process of the group that can abort so unnoticed (rank 0 ignores a stopped worker's
    status; rank 0's own abort would be its status, -6). Nothing a worker holds needs the
    teardown: its compile workers end with their lease (_serve; closed again here should one be
    left), it makes no temp dirs, and logging and stdio are flushed here. Its parent watch ends
    it with os._exit too."""
    import logging

    from enginespec.kernels.compile_procs import close_workers

    try:
        close_workers()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    finally:
        os._exit(code)


def _exit_with_parent() -> None:
    """End this process as soon as its parent, rank 0, is gone. Between steps EOF on the control
    pipe says so; joining the group, loading its shard (minutes for a large checkpoint) or
    building its runner, a worker reads no pipe, and outlived a rank 0 that was killed or exited
    at once (the server's engine process on SIGTERM) by as long as that took, holding its
    memory. vLLM's workers watch their parent likewise. Nothing is left to report to, so the
    exit is immediate."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns once the parent's end of the spawn pipe is closed: it exited
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="enginespec-tp-parent-watch").start()


def _serve(info, conn) -> None:
    from enginespec.kernels.compile_procs import lease as compile_lease
    from enginespec.spec import load_impl
    from enginespec.worker.tp_group import init_group
    from enginespec.worker.tp_runner import TPModelRunner, WorkerLink

    device = torch.device(info.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif info.num_threads > 0:  # the engine's threads shared out: T ranks on one host's cores
        torch.set_num_threads(max(1, info.num_threads // info.world_size))
    conn.send(("ready",))
    init_group(info, device)
    impl = load_impl(info.args.impl)
    model = load_shard(info.args, impl, info.rank, info.world_size, device, info.dtype)
    link = WorkerLink(rank=info.rank, world_size=info.world_size, device=device)
    runner = None
    while True:
        message = conn.recv()
        kind = message[0]
        if kind == "stop":
            return
        if kind == "runner":
            with compile_lease():  # the compile workers its construction starts end with it
                runner = TPModelRunner(model, impl, tp=link, **message[1])
        elif kind == "step":
            runner.run_step(message[1], message[2])
        elif kind == "sleep":  # sleep mode: rank 0's tags (and level), applied to this rank's shard and pool
            runner.sleep(message[1], message[2])
        elif kind == "plan_weights":  # a weight update: this rank's part checked, answered, kept
            conn.send(("weights_planned", runner.answer_plan(message[1], message[2])))
        elif kind == "commit_weights":  # every rank said yes (True), or one refused (False)
            runner.commit_plan(message[1])
        elif kind == "wake_up":
            runner.wake_up(message[1])
        else:
            raise RuntimeError(f"unknown control message {kind!r}")


def _leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
