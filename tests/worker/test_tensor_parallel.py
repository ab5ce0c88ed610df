"""Tensor parallelism on the CPU (gloo, two processes), each test with engines of its own: a draft
model under TP, refusals before any spawn, workers released on every way out (a failed
construction, a dropped LLM, Ctrl-C, a rank-0 fault), a cached repo id, hf_overrides on every
rank, and the CUDA variants. The parity and worker-death tests over one shared engine per
config are in test_tensor_parallel_parity.py."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from enginespec import LLM, SamplingParams
from enginespec.interrupts import HELD_NOTE
from enginespec.testing.checkpoints import make_checkpoint
from tests.worker.tp_common import (
    PROMPTS,
    _assert_same_up_to_tie,
    _generate,
    _transformers_greedy,
)

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _noisy_copy(path, dest):
    """The checkpoint at `path` with noise on its LM head: a draft that agrees with it on some
    tokens and not others (as conformance/test_spec_draft_model.py's "noisy" draft)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(path, dest)
    weights = load_file(str(dest / "model.safetensors"))
    head = weights["lm_head.weight"]
    noise = torch.randn(head.shape, generator=torch.Generator().manual_seed(0))
    weights["lm_head.weight"] = head + 0.5 * head.std() * noise
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def test_a_draft_model_under_tp_gives_tp1s_tokens_and_counts(tmp_path):
    """speculative_config method "draft_model" with tensor_parallel_size=2: the draft runs whole
    on rank 0 and the workers verify its drafts in the widened target batch. Greedy tokens and
    the acceptance counters equal TP=1's, with drafts both accepted and rejected, under
    preemption by swap (the draft's pool mirrors it). It was refused ('needs
    tensor_parallel_size == 1')."""
    path = make_checkpoint("qwen3", tmp_path / "qwen3")
    spec = {
        "method": "draft_model",
        "model": str(_noisy_copy(path, tmp_path / "draft")),
        "num_speculative_tokens": 3,
    }
    kwargs = dict(impl="fast", dtype="float32", device="cpu", speculative_config=spec)
    kwargs.update(block_size=2, num_blocks=14, max_num_seqs=3, preemption_mode="swap")
    prompts = [{"prompt_token_ids": [5, 9, 14, 5, 9, 14, 5, 9 + i]} for i in range(4)]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    runs = []
    for tp in (2, 1):
        with LLM(str(path), tensor_parallel_size=tp, **kwargs) as llm:
            outs = llm.generate(prompts, params, use_tqdm=False)
            stats = llm.engine.stats
            runs.append(([o.outputs[0].token_ids for o in outs], stats.spec_decode, stats.num_preemptions))
    (tokens, counts, preempted), want = runs
    assert 0 < counts.num_accepted_tokens < counts.num_draft_tokens and preempted > 0, runs[0]
    assert (tokens, counts, preempted) == want


def test_impossible_split_is_a_value_error_before_any_spawn(tmp_path):
    import multiprocessing

    path = make_checkpoint("llama", tmp_path / "llama")  # 4 q heads: 3 ranks cannot split them
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="num_attention_heads"):
        LLM(str(path), impl="fast", device="cpu", tensor_parallel_size=3)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):  # found once the model is known
        LLM(
            str(path),
            impl="fast",
            device="cpu",
            tensor_parallel_size=2,
            max_num_batched_tokens=8,
            max_model_len=64,
            enable_chunked_prefill=False,  # a 64-token request could never prefill in one step
        )
    assert set(multiprocessing.active_children()) <= before


def test_more_ranks_than_gpus_is_a_value_error_before_any_spawn(tmp_path, monkeypatch):
    """tensor_parallel_size=4 on a host with 2 GPUs (faked here): the ValueError naming the field
    comes before any worker is spawned. It came at rank 2, after rank 1 was spawned and, stuck in
    the rendezvous rank 0 never joined, waited out STOP_WAIT_S and was terminated."""
    import torch.multiprocessing as mp

    from enginespec.engine_args import EngineArgs
    from enginespec.spec import load_impl
    from enginespec.worker.tp_group import start_tensor_parallel

    def no_spawn(method=None):
        raise AssertionError("a worker was spawned")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(mp, "get_context", no_spawn)
    path = make_checkpoint("llama", tmp_path / "llama")  # 4 q heads: 4 ranks can split them
    args = EngineArgs.from_kwargs(str(path), impl="fast", tensor_parallel_size=4)
    with pytest.raises(ValueError, match=r"tensor_parallel_size needs GPU 2 for rank 2, but only 2"):
        start_tensor_parallel(args, load_impl("fast"), torch.device("cuda"), torch.float32)


def test_a_construction_failure_after_the_spawn_releases_the_workers(tmp_path, monkeypatch):
    """EngineCore fails after its workers started (here its tokenizer; any later step of the
    build alike): the workers are reaped and the process group is gone, so the process can
    build the next tensor-parallel engine (no LLM is left that the user could close)."""
    import multiprocessing

    import torch.distributed as dist

    from enginespec.engine.engine_core import EngineCore

    path = str(make_checkpoint("qwen3", tmp_path / "qwen3"))
    before = set(multiprocessing.active_children())

    def fail(self):
        raise RuntimeError("planted tokenizer fault")

    monkeypatch.setattr(EngineCore, "_load_tokenizer", fail)
    with pytest.raises(RuntimeError, match="planted tokenizer fault"):
        LLM(path, impl="fast", device="cpu", tensor_parallel_size=2)
    assert set(multiprocessing.active_children()) <= before and not dist.is_initialized()


def test_a_rank0_fault_amid_the_runners_collectives_ends_the_workers_without_the_polite_wait(
    tmp_path, monkeypatch
):
    """Rank 0 alone raises while building its runner (an out-of-memory in its pool sizing, say;
    planted here in rank 0's process only: the workers are spawned), with the workers waiting in
    the sizing's all-reduce, where they cannot read a stop: the engine is dead by the time
    shutdown() runs, so it terminates them at once. It asked them politely and waited
    STOP_WAIT_S (10 s) first. The caller gets the fault itself; no worker or group is left."""
    import multiprocessing

    import torch.distributed as dist

    from enginespec.worker.runner import ModelRunner
    from enginespec.worker.tp_group import TensorParallel

    def fault(self, *args):
        raise RuntimeError("planted rank-0 fault")

    seen = []
    shutdown = TensorParallel.shutdown

    def spy(self):
        seen.append(self.closed or self.dead)
        shutdown(self)

    monkeypatch.setattr(ModelRunner, "_size_pool", fault)
    monkeypatch.setattr(TensorParallel, "shutdown", spy)
    before = set(multiprocessing.active_children())
    with pytest.raises(RuntimeError, match="planted rank-0 fault"):
        LLM(
            str(make_checkpoint("qwen3", tmp_path / "qwen3")),
            impl="fast",
            device="cpu",
            tensor_parallel_size=2,
        )
    assert seen and seen[0] and "planted rank-0 fault" in seen[0], seen
    assert set(multiprocessing.active_children()) <= before and not dist.is_initialized()


def test_sleep_mode_under_tp_and_a_closed_engines_workers_exit_0(tmp_path):
    """enable_sleep_mode with tensor_parallel_size=2: rank 0 tells the workers to sleep and wake
    the same tags (tp_runner.py), releasing its own pool and shard too; a request while asleep is
    refused with no step sent; after wake_up every rank's shard is back, so the greedy tokens
    are those before sleep. Then a worker told to stop (close()) ends with status 0, as it did
    before it ended with os._exit (tp_worker._exit_now); an error or EOF is 1, which tp_group
    names in its death (one TP engine for both: each spawn costs seconds of CI). Weight updates
    and sleep level 2 under TP: test_tp_weight_update.py."""
    from enginespec.worker.sleep import EngineAsleepError

    path = make_checkpoint("qwen3", tmp_path / "qwen3")
    with LLM(
        str(path), impl="fast", dtype="float32", device="cpu", tensor_parallel_size=2, enable_sleep_mode=True
    ) as llm:
        want = _generate(llm)
        assert not llm.is_sleeping()
        llm.sleep()
        assert {kv.untyped_storage().nbytes() for kv in llm.engine.runner.kv_caches} == {0}
        with pytest.raises(EngineAsleepError):
            _generate(llm)
        llm.wake_up(tags=["weights"])
        llm.wake_up(tags=["kv_cache"])
        assert _generate(llm) == want
        workers = list(llm.engine.tensor_parallel.processes)
    assert [p.exitcode for p in workers] == [0]


def test_an_llm_dropped_unclosed_releases_its_workers(tmp_path):
    """`del llm` without close() (vLLM's way to free an engine before building the next):
    once the engine is collected its workers are reaped and the process group is gone, so the
    process can build its next tensor-parallel engine."""
    import gc
    import weakref

    import torch.distributed as dist

    llm = LLM(
        str(make_checkpoint("qwen3", tmp_path / "qwen3")), impl="fast", device="cpu", tensor_parallel_size=2
    )
    workers, engine = list(llm.engine.tensor_parallel.processes), weakref.ref(llm.engine)
    del llm
    gc.collect()
    assert engine() is None, "the test holds the engine: it cannot show its release"
    assert all(p.exitcode is not None for p in workers), "a worker outlived its engine"
    assert not dist.is_initialized()


def test_a_cached_repo_id_loads_one_snapshot_on_every_rank(tmp_path, monkeypatch):
    """LLM("org/name", tensor_parallel_size=2): every rank loads the snapshot rank 0 resolved
    (the path travels in the pickled EngineArgs), even when a download moves refs/main to
    another commit after rank 0 looked and before the workers load: TP=2's prompt logprobs are
    TP=1's on the first snapshot (a rank that looked again would read other weights)."""
    from enginespec.testing.checkpoints import write_hub_cache
    from enginespec.worker import tp_group

    cache, repo = tmp_path / "hub", "enginespec-test/tiny-qwen3"
    first = write_hub_cache(make_checkpoint("qwen3", tmp_path / "a"), cache, repo)
    other = write_hub_cache(make_checkpoint("qwen3", tmp_path / "b", seed=1), cache, repo, ref=None)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    kwargs = dict(impl="fast", dtype="float32", device="cpu")
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    prompt = [{"prompt_token_ids": list(PROMPTS[0])}]

    def prompt_logprobs(llm) -> list[float]:
        (out,) = llm.generate(prompt, params, use_tqdm=False)
        return [lp[t].logprob for lp, t in zip(out.prompt_logprobs[1:], PROMPTS[0][1:])]

    with LLM(str(first), **kwargs) as tp1:
        expected = prompt_logprobs(tp1)
    real_check_plan = tp_group.check_plan

    def check_then_move_the_ref(args, world_size):
        real_check_plan(args, world_size)  # rank 0 resolves the model here, before the spawn
        (cache / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text(other.name)

    monkeypatch.setattr(tp_group, "check_plan", check_then_move_the_ref)
    with LLM(repo, tensor_parallel_size=2, **kwargs) as tp2:
        assert tp2.engine.args.model_dir() == str(first)
        assert prompt_logprobs(tp2) == pytest.approx(expected, abs=1e-4)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices"
)
def test_cuda_tp2_graphs_equal_eager_and_tp1(tmp_path):
    """On two GPUs (NCCL): TP=2 with CUDA graphs and torch.compile (the all-reduce captured in
    the decode graphs) gives TP=2 eager's tokens, and both follow TP=1 up to near-ties."""
    path = make_checkpoint("qwen3", tmp_path / "qwen3")
    kwargs = dict(impl="fast", dtype="float32", device="cuda", max_num_seqs=4)
    runs = {}
    for name, extra in (("tp1", {}), ("eager", dict(enforce_eager=True)), ("graphs", {})):
        tp = 1 if name == "tp1" else 2
        with LLM(str(path), tensor_parallel_size=tp, **kwargs, **extra) as llm:
            runs[name] = _generate(llm)
            if name == "graphs":
                assert llm.engine.runner.graphs is not None, "decode graphs were not captured under TP"
    for prompt, graphs, eager, tp1 in zip(PROMPTS, runs["graphs"], runs["eager"], runs["tp1"]):
        _, logits = _transformers_greedy(path, list(prompt))
        _assert_same_up_to_tie(graphs, eager, logits, f"graphs vs eager on {prompt}")
        _assert_same_up_to_tie(graphs, tp1, logits, f"TP=2 vs TP=1 on {prompt}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_all_reduce_op_compiles_and_is_captured(tmp_path):
    """One GPU, an NCCL group of one rank: a RowParallelLinear (the all-reduce op in place)
    gives the Linear's result eagerly, through torch.compile (inductor, fullgraph) and replayed
    from a CUDA graph captured over the compiled module."""
    import torch.distributed as dist
    from torch import nn

    from enginespec.worker.tp_layers import RowParallelLinear

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        linear = nn.Linear(64, 32).cuda()
        row, x = RowParallelLinear(linear), torch.randn(4, 64, device="cuda")
        compiled = torch.compile(row, fullgraph=True)
        with torch.no_grad():
            torch.testing.assert_close(row(x), linear(x))
            torch.testing.assert_close(compiled(x), linear(x))
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                compiled(x)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = compiled(x)
            x.copy_(torch.randn(4, 64, device="cuda"))
            graph.replay()
            torch.testing.assert_close(out, linear(x))
    finally:
        dist.destroy_process_group()


def test_a_step_that_fails_midway_names_a_worker_that_is_slow_to_die():
    """A collective broke because a worker raised; the worker has sent its traceback but its
    exit takes a second (interpreter teardown on a loaded host). The engine's error still names
    the worker, its exit code and its traceback, not the broken connection (the H200 suite run
    of the twenty-second session saw 'failed midway' after a 0.5 s wait)."""
    import multiprocessing
    import threading

    from enginespec.worker.tp_group import TensorParallel

    class SlowDeath:
        pid, exitcode = 4242, None

        def join(self, timeout=None):
            pass

    proc = SlowDeath()
    ours, theirs = multiprocessing.Pipe()
    theirs.send(("error", "Traceback ...\nValueError: no-such-message"))
    threading.Timer(1.0, lambda: setattr(proc, "exitcode", 1)).start()
    tp = TensorParallel(world_size=2, device=torch.device("cpu"), processes=[proc], conns=[ours])
    error = tp.dead_error(RuntimeError("Connection closed by peer"))
    assert "worker rank 1 (pid 4242) exited with code 1" in str(error)
    assert "no-such-message" in str(error)


def test_an_unguarded_script_is_told_to_guard_itself(tmp_path):
    """The workers are spawned, so each imports the user's script again: one that builds
    LLM(..., tensor_parallel_size=2) at its top level makes every worker try to spawn its own,
    and Python refuses in the worker's start-up, before enginespec's code runs there. The
    caller's error (the last line the user sees) says what to do and names the worker's exit
    code; it said only 'a tensor-parallel worker exited while starting', or, when the exit was
    not reaped yet, named the worker with no hint."""
    import subprocess
    import sys

    path = make_checkpoint("qwen3", tmp_path / "qwen3")
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from enginespec import LLM\n"
        f"LLM({str(path)!r}, device='cpu', dtype='float32', tensor_parallel_size=2)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode != 0
    last = run.stderr.splitlines()[-1]
    assert "exited with code 1" in last and "if __name__ == '__main__':" in last, last


# A script that builds a TP=2 engine, prints its workers' pids, then generates far longer than
# the test waits (16 prompts of 200 tokens, one at a time) until the test's SIGINT; with "close"
# or "del" it catches the KeyboardInterrupt, releases the engine that way and prints the time.
INTERRUPTED_SCRIPT = """
import atexit, gc, sys, time
from enginespec import LLM, SamplingParams

def main(path, ending):
    llm = LLM(path, impl="fast", dtype="float32", device="cpu", tensor_parallel_size=2, max_num_seqs=1)
    print("workers", *[p.pid for p in llm.engine.tensor_parallel.processes], flush=True)
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    try:
        llm.generate([{"prompt_token_ids": [5, 9, 14 + i]} for i in range(16)], params, use_tqdm=False)
    except KeyboardInterrupt:
        if ending == "uncaught":
            raise
        started = time.monotonic()
        if ending == "close":
            llm.close()
        else:
            del llm
            gc.collect()
        print(f"released in {time.monotonic() - started:.1f} s", flush=True)

if __name__ == "__main__":  # the workers are spawned: they import this file
    main(*sys.argv[1:])
else:  # a worker (as __mp_main__): its exit must run no interpreter teardown
    atexit.register(print, "worker finalized", flush=True)
"""


GLOO_TERMINATE = "terminate called without an active exception"


def _pid_alive(pid: int) -> bool:
    """A live process (not a zombie) by /proc (no psutil in the suite)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads worker liveness from /proc")
@pytest.mark.parametrize("ending", ["uncaught", "close", "del"])
def test_ctrl_c_during_a_tp_generate_ends_the_script_promptly_with_no_worker_left(tmp_path, ending):
    """Ctrl-C in a script generating with LLM(..., tensor_parallel_size=2) on the CPU, once
    generation is under way: uncaught, the script dies of it within seconds; caught, close() or
    `del llm` returns within seconds and the script exits 0. No worker survives either way. It
    took 16 s: rank 0 waited 5 s for a worker to die (none was), then shutdown 10 s for a polite
    stop the workers, blocked in the interrupted step's collective, could not read."""
    import subprocess
    import sys
    import time

    path = make_checkpoint("qwen3", tmp_path / "qwen3")
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path), ending],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    workers: list[int] = []
    try:
        line = proc.stdout.readline()
        assert line.startswith("workers "), f"the script failed to start: {line!r} {proc.stderr.read()}"
        workers = [int(pid) for pid in line.split()[1:]]
        time.sleep(1.0)  # generate() is under way
        assert proc.poll() is None, "the script ended before it was interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        survivors = [pid for pid in workers if _pid_alive(pid)]
        for pid in survivors:  # never leave one running, whatever the verdict
            os.kill(pid, signal.SIGKILL)
    if ending == "uncaught":  # dies of the interrupt: its traceback's last line, a failing status
        # a Ctrl-C that lands inside an engine call is raised when the call ends, with HELD_NOTE
        # after its exception line (enginespec.interrupts)
        last = err.rstrip().removesuffix(HELD_NOTE).rstrip()
        assert last.endswith("KeyboardInterrupt"), err
        # Python's own rule is to die of SIGINT, but CPython (3.11, 3.12) forgets the uncaught
        # interrupt when any exec/eval of a string runs during shutdown, and exits 1: torch
        # dynamo's atexit `dump_compile_times` imports `tabulate` where it is installed, whose
        # namedtuples are such an eval (benchmarks/RESULTS.md, forty-fourth session). Not ours.
        assert proc.returncode in (-signal.SIGINT, 1), (proc.returncode, err)
    else:
        assert proc.returncode == 0 and "released in" in out, err
    # A worker ends with os._exit once its group is destroyed: the interpreter's teardown (this
    # atexit hook's stage, then C++'s static destructors) with gloo's threads alive aborted it
    # now and then under load, printing GLOO_TERMINATE after the user's traceback (tp_worker.py)
    assert "worker finalized" not in out, out
    assert GLOO_TERMINATE not in err, err
    assert not survivors, "a worker outlived the interrupted script"


def test_a_ctrl_c_the_script_caught_leaves_the_workers_serving(tmp_path):
    """The terminal's Ctrl-C reaches every process of the foreground group, the workers too. A
    script that catches it between generates (at an input() prompt, say) goes on generating
    with TP=2 as with TP=1: SIGINT is rank 0's to handle. A worker idle on its control pipe died
    of it (KeyboardInterrupt, exit 1), so the next generate raised EngineDeadError."""
    import time

    path = make_checkpoint("qwen3", tmp_path / "qwen3")
    with LLM(str(path), impl="fast", dtype="float32", device="cpu", tensor_parallel_size=2) as llm:
        before = _generate(llm)
        for worker in llm.engine.tensor_parallel.processes:
            os.kill(worker.pid, signal.SIGINT)
        time.sleep(0.5)  # a worker that dies of it has exited by now
        assert _generate(llm) == before
        assert not llm.engine.dead


class _Worker:
    """A worker process stand-in, alive until killed (it has no terminate(): a worker ignores
    SIGTERM, so rank 0 ends one with SIGKILL); the first join of any of them is interrupted (a
    second Ctrl-C while shutdown() waits for the workers to stop)."""

    interrupt = [True]  # one Ctrl-C, shared by the stand-ins of one test

    def __init__(self):
        self.exitcode = None
        self.killed = False

    def join(self, timeout=None):
        if self.interrupt[0]:
            self.interrupt[0] = False
            raise KeyboardInterrupt

    def kill(self):
        self.killed, self.exitcode = True, -9


class _Pipe:
    def __init__(self):
        self.closed = False

    def send(self, message):
        pass

    def close(self):
        self.closed = True


def test_a_second_ctrl_c_during_shutdowns_wait_still_ends_every_worker():
    """shutdown() marks itself closed first, so a Ctrl-C that interrupted its polite wait left
    the workers running (a later close() did nothing) until the interpreter's exit; they are
    killed on the way out now, and the interrupt still reaches the caller."""
    from enginespec.worker.tp_group import TensorParallel

    _Worker.interrupt[0] = True
    workers, pipes = [_Worker(), _Worker()], [_Pipe(), _Pipe()]
    tp = TensorParallel(world_size=3, device=torch.device("cpu"), processes=workers, conns=pipes)
    with pytest.raises(KeyboardInterrupt):
        tp.shutdown()
    assert all(w.killed and w.exitcode is not None for w in workers)
    assert all(p.closed for p in pipes) and tp.closed


def test_an_interrupted_engines_shutdown_terminates_its_workers_without_the_polite_wait():
    """Ctrl-C amid a step leaves the workers in a collective rank 0 never joins: the engine is
    dead at once (interrupted: no wait for a worker to die) and shutdown() kills the workers
    without first giving them STOP_WAIT_S to read a stop they cannot read (that wait and the
    dying wait made a Ctrl-C take 16 s). A live engine's workers are still asked and waited for."""
    from enginespec.worker.tp_group import STOP_WAIT_S, TensorParallel

    class Worker(_Worker):
        def __init__(self):
            super().__init__()
            self.polite_joins = 0

        def join(self, timeout=None):
            if not self.killed:
                self.polite_joins += 1
            if timeout is None or self.killed:
                self.exitcode = self.exitcode if self.exitcode is not None else 0

    _Worker.interrupt[0] = False
    for interrupted in (True, False):
        workers = [Worker(), Worker()]
        tp = TensorParallel(
            world_size=3, device=torch.device("cpu"), processes=workers, conns=[_Pipe(), _Pipe()]
        )
        if interrupted:
            tp.interrupted(KeyboardInterrupt())
            assert tp.dead and "interrupted" in tp.dead
        tp.shutdown()
        assert all(w.polite_joins == (0 if interrupted else 1) for w in workers), interrupted
        assert all(w.killed for w in workers)  # the stand-ins never exit on their own
    assert STOP_WAIT_S > 0


# Rank 0 stand-in: spawns one worker as tp_group does, waits for its ("ready",) (the worker then
# joins the group: it waits in the rendezvous for a rank 0 that never comes, reading no pipe),
# prints its pid and sleeps until the test kills it.
RANK0_SCRIPT = """
import multiprocessing, sys, time
import torch
from enginespec.engine_args import EngineArgs
from enginespec.worker.tp_group import RankInfo
from enginespec.worker.tp_worker import worker_main

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    info = RankInfo(1, 2, int(sys.argv[1]), "cpu", torch.float32, 1, EngineArgs())
    worker = ctx.Process(target=worker_main, args=(info, theirs), daemon=True)
    worker.start()
    assert ours.recv() == ("ready",)
    print(worker.pid, flush=True)
    time.sleep(600)
"""


def test_a_worker_ends_with_its_rank_0_also_where_it_reads_no_pipe(tmp_path):
    """A worker learnt of rank 0's death only from EOF on its control pipe, which it reads
    between steps. Joining the group, loading its shard (minutes for a large one) or building
    its runner, it outlived a rank 0 that was killed or exited at once (the server's engine
    process on SIGTERM, which a Ctrl-C during the startup sends) by as long as that took,
    holding its memory. Here it waits in the rendezvous (the store is this test's), until
    TIMEOUT_S (300 s) on the old code."""
    import datetime
    import subprocess
    import sys
    import time

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)
    script = tmp_path / "rank0.py"
    script.write_text(RANK0_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    rank0 = subprocess.Popen(
        [sys.executable, str(script), str(store.port)], stdout=subprocess.PIPE, text=True, env=env
    )
    pid = None
    try:
        pid = int(rank0.stdout.readline())
        rank0.kill()
        rank0.wait()
        deadline = time.monotonic() + 30  # liveness bound: the worker ends long before it
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _pid_alive(pid), "a tensor-parallel worker outlived its rank 0"
    finally:
        rank0.kill()
        if pid is not None and _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_the_cuda_death_watch_keeps_the_reason_the_engine_already_has(monkeypatch):
    """On CUDA a thread (tp_group._watch) marks the engine dead when a worker exits. It replaced
    any reason already set: the step that found the death first had read the worker's traceback
    off its pipe (_pending_error), so the watch's second reading, without it, overwrote the
    reason every later EngineDeadError and the server's 'the engine is dead' line give."""
    import multiprocessing

    from enginespec.worker import tp_group
    from enginespec.worker.tp_group import TensorParallel

    exited, writer = multiprocessing.Pipe(duplex=False)
    writer.close()  # the sentinel is ready: the worker has exited

    class Exited:
        pid, exitcode, sentinel = 4242, 1, exited

    ours, _ = multiprocessing.Pipe()
    tp = TensorParallel(world_size=2, device=torch.device("cpu"), processes=[Exited()], conns=[ours])
    tp.dead = "tensor-parallel worker rank 1 (pid 4242) exited with code 1:\nTraceback ..."
    monkeypatch.setattr(tp_group, "_destroy_group", lambda abort: None)
    tp_group._watch(tp)
    assert tp.dead.endswith("Traceback ..."), tp.dead


def test_hf_overrides_reach_every_rank(tmp_path):
    """hf_overrides travel in the pickled EngineArgs and every rank builds its shard from the
    config with them merged (tp_worker.load_shard): TP=2 with an override of rms_norm_eps and
    rope_theta gives the prompt logprobs of TP=1 over a copy saved with those values (a worker
    that read config.json alone would normalize and rotate its heads otherwise), and the plan
    checked before the spawn (check_plan) takes a max_model_len only the overridden
    max_position_embeddings allows."""
    import json
    import shutil

    path = make_checkpoint("qwen3", tmp_path / "qwen3")
    saved = tmp_path / "saved"
    shutil.copytree(path, saved)
    config = json.loads((saved / "config.json").read_text())
    config["rms_norm_eps"], config["rope_parameters"]["rope_theta"] = 0.5, 50.0
    config["max_position_embeddings"] = 512
    (saved / "config.json").write_text(json.dumps(config))
    kwargs = dict(impl="fast", dtype="float32", device="cpu", max_model_len=512)  # the checkpoint's: 256
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    prompt = [{"prompt_token_ids": list(PROMPTS[0])}]

    def prompt_logprobs(llm) -> list[float]:
        (out,) = llm.generate(prompt, params, use_tqdm=False)
        return [lp[t].logprob for lp, t in zip(out.prompt_logprobs[1:], PROMPTS[0][1:])]

    with LLM(str(saved), **kwargs) as tp1:
        expected = prompt_logprobs(tp1)
    overrides = {"rms_norm_eps": 0.5, "rope_theta": 50.0, "max_position_embeddings": 512}
    with LLM(str(path), tensor_parallel_size=2, hf_overrides=overrides, **kwargs) as tp2:
        assert tp2.engine.max_model_len == 512
        assert prompt_logprobs(tp2) == pytest.approx(expected, abs=1e-4)
