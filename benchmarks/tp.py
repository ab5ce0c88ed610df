"""Tensor parallelism benchmark (issue 18): TP=2 against TP=1 on one host, and the cost of the
pieces TP adds. Run from the repository root:

    # on a host with 2 GPUs (nvidia-h200-x2), Qwen3-8B shape, bf16, every phase:
    python benchmarks/tp.py --out tp.json
    # on the CPU (gloo), tiny shape: the per-step control cost only
    python benchmarks/tp.py --device cpu --shape tiny --phases control

Phases (each recorded in the JSON, an exception as the phase's "error"):
- latency: batch-1 decode ms/token for TP=1 and TP=2 ((t(n + 1 tokens) - t(1)) / n, after a
  warm-up, CUDA graphs on), and the speedup TP=1 / TP=2. Target: >= 1.7x.
- throughput: nano-vllm's workload (benchmarks/throughput.py's, --num-requests of it) through
  LLM.generate with TP=1 and TP=2, output tok/s and the ratio. Target: >= 1.8x.
- allreduce: two processes, NCCL; one all-reduce of a [batch, hidden] tensor in the model's
  dtype (8 KiB at batch 1 for hidden 4096 bf16): microseconds per call eager, and inside a CUDA
  graph of --graph-calls calls (replay time / calls), through the engine's own op
  (enginespec::tp_all_reduce_) and, where torch has it, symmetric memory's one-shot all-reduce
  (the candidate for the <= 6 us target). NCCL measured here before: 19.6 us in a graph.
- control: the per-step cost rank 0 adds (control message to the workers + the batch
  broadcast), as a mean over the steps of a decode workload, with the mean step time beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.engine_runs import timed_generate, warm_up  # noqa: E402
from benchmarks.phases import decode_latency  # noqa: E402
from enginespec.testing import checkpoints  # noqa: E402
from enginespec.testing.workload import Workload, make_workload  # noqa: E402

PHASES = ("latency", "throughput", "allreduce", "control")


def _llm(args, tp: int, **extra):
    from enginespec import LLM

    kwargs = dict(impl="fast", device=args.device, dtype=args.dtype, tensor_parallel_size=tp)
    kwargs.update(extra)
    return LLM(str(args.model_dir), **kwargs)


def phase_latency(args) -> dict:
    prompt = list(range(100, 100 + args.latency_prompt_len))
    out = {}
    for tp in (1, 2):
        with _llm(args, tp) as llm:
            out[f"tp{tp}_ms_per_token"] = decode_latency(llm, prompt, args.latency_tokens, args.device)
    out["speedup"] = out["tp1_ms_per_token"] / out["tp2_ms_per_token"]
    return out


def phase_throughput(args) -> dict:
    workload = make_workload(args.num_requests, max_input_len=args.max_len, max_output_len=args.max_len)
    out = {}
    for tp in (1, 2):
        with _llm(args, tp) as llm:
            warm_up(llm, workload, args.device)
            out[f"tp{tp}"] = timed_generate(llm, workload, args.device, use_tqdm=False)
    out["ratio"] = out["tp2"]["output_tok_s"] / out["tp1"]["output_tok_s"]
    out["same_tokens"] = out["tp1"]["tokens_digest"] == out["tp2"]["tokens_digest"]
    return out


def phase_control(args) -> dict:
    """Mean seconds per step in rank 0's control path, timed around its two calls."""
    from enginespec.worker import tp_group, tp_runner

    spent = {"send": 0.0, "broadcast": 0.0}

    def timed(name, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - start

        return wrapper

    send, broadcast = tp_group.TensorParallel.send, tp_runner._broadcast
    tp_group.TensorParallel.send = timed("send", send)
    tp_runner._broadcast = timed("broadcast", broadcast)
    try:
        with _llm(args, 2) as llm:
            workload = Workload([list(range(10, 42))] * 8, [64] * 8)
            timed_generate(llm, workload, args.device, use_tqdm=False)  # warm-up
            spent.update(send=0.0, broadcast=0.0)
            steps0, seconds0 = llm.engine.stats.num_steps, llm.engine.stats.step_seconds
            timed_generate(llm, workload, args.device, use_tqdm=False)
            steps = llm.engine.stats.num_steps - steps0
            step_s = llm.engine.stats.step_seconds - seconds0
    finally:
        tp_group.TensorParallel.send, tp_runner._broadcast = send, broadcast
    with _llm(args, 1) as llm:
        timed_generate(llm, workload, args.device, use_tqdm=False)
        steps0, seconds0 = llm.engine.stats.num_steps, llm.engine.stats.step_seconds
        timed_generate(llm, workload, args.device, use_tqdm=False)
        tp1_step_s = (llm.engine.stats.step_seconds - seconds0) / (llm.engine.stats.num_steps - steps0)
    return {
        "tp1_step_us": tp1_step_s * 1e6,
        "num_steps": steps,
        "send_us_per_step": spent["send"] / steps * 1e6,
        "broadcast_us_per_step": spent["broadcast"] / steps * 1e6,
        "step_us": step_s / steps * 1e6,
    }


def _allreduce_rank(rank: int, port: int, args, queue) -> None:
    import torch.distributed as dist

    from enginespec.worker import tp_layers  # registers enginespec::tp_all_reduce_

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.randn(args.ar_batch, args.hidden, dtype=getattr(torch, args.dtype), device="cuda")
    out = {"bytes": x.numel() * x.element_size()}
    ops = {"engine_op": lambda: torch.ops.enginespec.tp_all_reduce_(x)}
    try:
        import torch.distributed._symmetric_memory as symm_mem

        buf = symm_mem.empty(x.shape, dtype=x.dtype, device="cuda")
        symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
        ops["symm_mem_one_shot"] = lambda: torch.ops.symm_mem.one_shot_all_reduce(
            buf, "sum", dist.group.WORLD.group_name
        )
    except Exception as e:  # noqa: BLE001 - not in this torch build: record why
        out["symm_mem_one_shot"] = f"unavailable: {type(e).__name__}: {e}"
    for name, op in ops.items():
        try:
            out[name] = _time_op(op, args.graph_calls)
        except Exception as e:  # noqa: BLE001 - record it; the parent ends a rank left waiting
            out[name] = f"failed: {type(e).__name__}: {e}"
    tp_layers.set_group(None)
    if rank == 0:
        queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


def _time_op(op, calls: int) -> dict:
    """us per call eagerly and inside one CUDA graph of `calls` calls."""
    for _ in range(10):
        op()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        op()
    torch.cuda.synchronize()
    eager = (time.perf_counter() - start) / calls * 1e6
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                op()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    return {"eager_us": eager, "graph_us": (time.perf_counter() - start) / (5 * calls) * 1e6}


def phase_allreduce(args) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, port, args, queue), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        return queue.get(timeout=300)
    finally:  # a rank that failed leaves the other waiting in a collective: end both
        for p in procs:
            p.join(timeout=60)
            if p.exitcode is None:
                p.kill()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(checkpoints.SHAPES))
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--latency-prompt-len", type=int, default=128)
    parser.add_argument("--latency-tokens", type=int, default=128)
    parser.add_argument("--ar-batch", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--graph-calls", type=int, default=72, help="2 all-reduces x 36 layers of Qwen3-8B")
    parser.add_argument("--out", type=Path, default=Path("tp.json"))
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.model_dir is None:
        root = Path(
            os.environ.get(
                "ENGINESPEC_SYNTH_DIR", Path(os.environ.get("TMPDIR", "/tmp")) / "enginespec-synth"
            )
        )
        args.model_dir = checkpoints.make_checkpoint(args.shape, root / args.shape, device=args.device)
    if args.device == "cpu":
        torch.set_num_threads(1)  # per rank: two ranks on a small host must not fight for cores
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    for name in args.phases.split(","):
        try:
            results[name] = globals()[f"phase_{name}"](args)
        except Exception as e:  # noqa: BLE001 - record and go on to the next phase
            results[name] = {"error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps(results[name], indent=1), flush=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
