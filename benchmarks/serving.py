"""Online serving benchmark, in the manner of vLLM's benchmark_serving: the throughput workload
(enginespec.testing.workload: 256 requests, prompt and output lengths randint(100, 1024), ids below
min(10000, vocab), seed 0, ignore_eos) sent to `enginespec serve` as streaming completions with
token ids, at Poisson arrivals of --request-rate requests/s (inf: all at once).

Reports, as JSON: request and output-token throughput, TTFT and ITL (p50, p99, mean; ITL is the
gap between successive token-carrying frames of one stream, as vLLM's harness measures it), TPOT
(per-request (latency - TTFT) / (tokens - 1), one-token requests left out) and end-to-end latency
(p50, p99, mean; percentiles interpolated as numpy's), and whether every request got exactly its
requested number of tokens. With --offline, the same workload through LLM.generate (same engine
settings, after the server has exited so both get the whole device) and the ratio of the two
output throughputs.

    python -m benchmarks.serving --shape qwen3-0.6b --request-rate inf --offline --out serve.json
    python -m benchmarks.serving --base-url http://127.0.0.1:8000 --model-dir DIR ...  (a running server)

Warm-up: a few requests with other prompts (seed + 1) and 2 output tokens each, before timing,
so lazy initialisation and graph capture are not timed and the timed prompts get no prefix hit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import httpx
import numpy as np

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import engine_runs  # noqa: E402
from benchmarks.throughput import _engine_arg  # noqa: E402
from enginespec.testing.workload import Workload, make_workload  # noqa: E402


@dataclass
class RequestResult:
    """One streamed request: send time, arrival times of its token-carrying frames, token count."""

    sent: float
    frame_times: list[float] = field(default_factory=list)
    num_tokens: int = 0
    done: float = 0.0
    error: Optional[str] = None


def arrival_offsets(num: int, rate: float, seed: int) -> list[float]:
    """Send times (s from start) of a Poisson process of `rate` requests/s; all 0 for inf."""
    if math.isinf(rate):
        return [0.0] * num
    if rate <= 0:
        raise ValueError(f"--request-rate must be > 0 (or inf), got {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(num):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def _one(http: httpx.AsyncClient, url: str, body: dict, delay: float, start: float) -> RequestResult:
    """Send one request at `start + delay` and stream it. Invariant: `done` is set however the
    request ends (a refusal, an error frame, a broken connection), so `done >= sent` always and
    the run's wall time covers failed requests too."""
    await asyncio.sleep(max(0.0, start + delay - time.perf_counter()))
    result = RequestResult(time.perf_counter())
    try:
        await _stream_into(http, url, body, result)
    except httpx.HTTPError as exc:
        result.error = repr(exc)
    finally:
        result.done = time.perf_counter()
    return result


async def _stream_into(http: httpx.AsyncClient, url: str, body: dict, result: RequestResult) -> None:
    """Record the arrival time of each token-carrying SSE frame in `result` (a frame may carry
    several tokens: one arrival, all its tokens counted), or the error the server answered."""
    async with http.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                result.error = str(chunk["error"])
                continue
            num = sum(len(c.get("token_ids") or ()) for c in chunk.get("choices", ()))
            if num:
                result.frame_times.append(time.perf_counter())
                result.num_tokens += num


def _bodies(model: str, workload: Workload, temperature: float) -> list[dict]:
    return [
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": out_len,
            "temperature": temperature,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        for prompt, out_len in zip(workload.prompts, workload.output_lens)
    ]


async def _send_all(url: str, bodies: list[dict], offsets: list[float], start: float) -> list[RequestResult]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as http:
        return list(await asyncio.gather(*(_one(http, url, b, o, start) for b, o in zip(bodies, offsets))))


def _client_process(url: str, bodies: list[dict], offsets: list[float], start: float) -> list[RequestResult]:
    """One client process's share, sent from `start` (a time.perf_counter() value: on Linux it
    is CLOCK_MONOTONIC, one clock for every process of the machine)."""
    return asyncio.run(_send_all(url, bodies, offsets, start))


def _ready(_: int) -> None:
    """Holds its process a moment, so each of the pool's processes takes one and is started
    (and has imported this module) before the clock starts."""
    time.sleep(0.2)


def run_clients(
    base_url: str,
    model: str,
    workload: Workload,
    rate: float,
    seed: int,
    temperature: float,
    num_processes: int = 1,
) -> tuple[list[RequestResult], float]:
    """Send every request of the workload at its arrival time; (results in workload order, wall
    seconds from the first send to the last frame).

    With num_processes > 1 the requests are dealt round-robin to that many client processes, each
    with its own event loop: one Python process parsing every SSE frame of a saturated server
    (about 150,000 frames in 6-8 s on the H200) is itself a bottleneck, and the figure would be
    the client's, not the server's. Arrival times are unchanged: all processes share one start."""
    url = f"{base_url}/v1/completions"
    bodies = _bodies(model, workload, temperature)
    offsets = arrival_offsets(len(bodies), rate, seed)
    if num_processes <= 1:
        start = time.perf_counter()
        results = asyncio.run(_send_all(url, bodies, offsets, start))
        return results, max([r.done for r in results], default=start) - start
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")  # no inherited CUDA or event loop state
    with ProcessPoolExecutor(num_processes, mp_context=ctx) as pool:
        list(pool.map(_ready, range(num_processes)))  # every process started and imported
        start = time.perf_counter() + 0.05
        shares = [range(i, len(bodies), num_processes) for i in range(num_processes)]
        futures = [
            pool.submit(_client_process, url, [bodies[j] for j in js], [offsets[j] for j in js], start)
            for js in shares
        ]
        results: list = [None] * len(bodies)
        for js, fut in zip(shares, futures):
            for j, r in zip(js, fut.result()):
                results[j] = r
    return results, max(r.done for r in results) - start


def _request_rate(text: str) -> float:
    """--request-rate: a positive number of requests/s, or inf (all at once). Checked when the
    flags are parsed, not after the server has started and warmed up."""
    rate = float(text)
    if math.isnan(rate) or rate <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {text}")
    return rate


def _pcts(values: list[float]) -> dict:
    """p50, p99 and mean in milliseconds (None when there are no values)."""
    if not values:
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None}
    # numpy's default percentiles (linear between the two nearest ranks), which vLLM's
    # benchmark_serving reports: p50 of an even count is the mean of the middle two
    p50, p99 = np.percentile(values, [50, 99]) * 1e3
    return {"p50_ms": float(p50), "p99_ms": float(p99), "mean_ms": statistics.fmean(values) * 1e3}


def summarize(results: list[RequestResult], workload: Workload, wall: float) -> dict:
    """The run's figures over the requests that did not fail, as vLLM's benchmark_serving
    defines them: TTFT = first token frame - send; ITL = gaps between successive token frames of
    a request, pooled (a frame carrying k tokens is one arrival); TPOT per request = (last token
    frame - first) / (tokens - 1), requests of one token left out; E2EL = end of the stream -
    send. Throughputs divide by `wall`, which covers failed requests too."""
    ok = [r for r in results if r.error is None]
    ttft = [r.frame_times[0] - r.sent for r in ok if r.frame_times]
    itl = [b - a for r in ok for a, b in zip(r.frame_times, r.frame_times[1:])]
    tpot = [(r.frame_times[-1] - r.frame_times[0]) / (r.num_tokens - 1) for r in ok if r.num_tokens > 1]
    e2el = [r.done - r.sent for r in ok]
    tokens = sum(r.num_tokens for r in ok)
    exact = all(r.num_tokens == n for r, n in zip(results, workload.output_lens))
    return {
        "num_requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "wall_s": wall,
        "output_tokens": tokens,
        "exact_output_lengths": exact,
        "request_throughput": len(ok) / wall,
        "output_tok_s": tokens / wall,
        "total_tok_s": (
            tokens + sum(len(workload.prompts[i]) for i, r in enumerate(results) if r.error is None)
        )
        / wall,
        "ttft": _pcts(ttft),
        "itl": _pcts(itl),
        "tpot_mean_ms": statistics.fmean(tpot) * 1e3 if tpot else None,
        "tpot": _pcts(tpot),
        "e2el": _pcts(e2el),
    }


# ---- the server process ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_server(
    model_dir: Path, args, timeout: float = 900.0, env: Optional[dict] = None
) -> tuple[subprocess.Popen, str]:
    """`enginespec serve` on a free loopback port with the run's engine settings (and `env` added
    to its environment); waits for /health."""
    port = _free_port()
    cmd = [sys.executable, "-m", "enginespec.entrypoints.cli", "serve", str(model_dir), "--port", str(port)]
    cmd += [
        "--served-model-name",
        "bench",
        "--impl",
        args.impl,
        "--device",
        args.device,
        "--dtype",
        args.dtype,
    ]
    cmd += [
        "--seed",
        str(args.seed),
        "--max-waiting-requests",
        str(max(1024, args.num_requests)),
        *args.serve_arg,
    ]
    proc = subprocess.Popen(cmd, env=dict(os.environ, TOKENIZERS_PARALLELISM="false", **(env or {})))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} during start-up")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not become healthy in time")


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# ---- runs -----------------------------------------------------------------------------------------


def _workloads(args, model_dir: Path) -> tuple[Workload, Workload]:
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(str(model_dir)).vocab_size
    kw = dict(
        min_input_len=args.min_input_len,
        max_input_len=args.max_input_len,
        min_output_len=args.min_output_len,
        max_output_len=args.max_output_len,
        id_bound=min(args.id_bound, vocab),
    )
    timed = make_workload(args.num_requests, seed=args.seed, **kw)
    num_warm = min(args.num_requests, args.warmup_requests)
    if num_warm < 1:  # --warmup-requests 0: no warm-up (make_workload wants at least one)
        return timed, Workload([], [])
    warm = make_workload(num_warm, seed=args.seed + 1, **kw)
    return timed, Workload(warm.prompts, [2] * len(warm.prompts))


BUCKETS = ((0, 0), (1, 512), (513, 2048), (2049, 8192), (8193, 1 << 40))


def step_summary(trace: list, since: float) -> dict:
    """The engine's steps that ended after `since` (EngineStats.step_trace rows: requests,
    tokens, context tokens, end time, host wait): the gaps between successive step ends (what a
    streaming client sees as inter-token latency, minus the front end), overall and by the
    step's prefill tokens (tokens beyond one per request)."""
    rows = [r for r in trace if r[3] >= since]
    gaps = [(b[1] - b[0], b[3] - a[3]) for a, b in zip(rows, rows[1:])]
    out = {"num_steps": len(rows), "gap": _pcts([g for _, g in gaps]), "by_prefill_tokens": {}}
    for lo, hi in BUCKETS:
        sel = [g for extra, g in gaps if lo <= extra <= hi]
        if sel:
            out["by_prefill_tokens"][f"{lo}-{hi}"] = dict(_pcts(sel), num_steps=len(sel))
    return out


def serve_run(args, model_dir: Path, workload: Workload, warm: Workload) -> dict:
    trace_file = Path(args.step_trace) if args.step_trace else None
    env = {"ENGINESPEC_STEP_TRACE": str(trace_file)} if trace_file else None
    proc, url = (None, args.base_url) if args.base_url else launch_server(model_dir, args, env=env)
    model = args.served_model_name or "bench"
    try:
        if warm.prompts:
            run_clients(url, model, warm, math.inf, args.seed, args.temperature)
        since = time.perf_counter()
        results, wall = run_clients(
            url, model, workload, args.request_rate, args.seed, args.temperature, args.client_processes
        )
    finally:
        exit_status = stop_server(proc) if proc is not None else None
    out = summarize(results, workload, wall)
    out.update(request_rate=args.request_rate, server_exit_status=exit_status)
    if trace_file and trace_file.exists():
        out["steps"] = step_summary(json.loads(trace_file.read_text()), since)
    return out


def offline_run(args, model_dir: Path, workload: Workload) -> dict:
    import torch

    from enginespec.engine_args import resolve_device

    device = resolve_device(args.device)
    llm = engine_runs.make_llm(model_dir, args)
    engine_runs.warm_up(llm, workload, device, args.temperature)
    out = engine_runs.timed_generate(llm, workload, device, args.temperature, use_tqdm=False)
    del llm
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def build_parser() -> argparse.ArgumentParser:
    from enginespec.testing import checkpoints

    p = argparse.ArgumentParser(prog="benchmarks.serving", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shape",
        choices=sorted(checkpoints.SHAPES),
        default="qwen3-0.6b",
        help="synthetic checkpoint shape when no --model-dir",
    )
    p.add_argument(
        "--model-dir",
        help="use this checkpoint (a directory, or a repo id in the local Hugging Face cache) "
        "instead of a synthetic one of --shape",
    )
    p.add_argument("--base-url", help="benchmark this running server instead of launching one")
    p.add_argument("--served-model-name", help="the model name a --base-url server answers to")
    p.add_argument("--impl", default="fast", help="engine implementation (reference, fast, pkg.mod:attr)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--dtype", default="auto", help="model dtype (auto: the checkpoint's)")
    p.add_argument("--seed", type=int, default=0, help="seeds the workload, arrivals and engine")
    p.add_argument(
        "--request-rate", type=_request_rate, default=math.inf, help="requests/s of Poisson arrivals (inf)"
    )
    p.add_argument("--num-requests", type=int, default=256, help="timed requests")
    p.add_argument("--min-input-len", type=int, default=100, help="shortest prompt, tokens")
    p.add_argument("--max-input-len", type=int, default=1024, help="longest prompt, tokens")
    p.add_argument("--min-output-len", type=int, default=100, help="fewest output tokens")
    p.add_argument("--max-output-len", type=int, default=1024, help="most output tokens")
    p.add_argument("--id-bound", type=int, default=10000, help="prompt ids below min(this, vocab)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--warmup-requests", type=int, default=32, help="untimed 2-token requests first (0: none)")
    p.add_argument(
        "--client-processes",
        type=int,
        default=max(1, min(4, (os.cpu_count() or 1) // 4)),
        help="client processes sharing the requests (default: a quarter of the cores, 1 to 4)",
    )
    p.add_argument(
        "--offline", action="store_true", help="also LLM.generate on the workload; report the ratio"
    )
    p.add_argument(
        "--serve-arg", action="append", default=[], help="an extra `enginespec serve` flag (repeat)"
    )
    p.add_argument(
        "--engine-arg", action="append", default=[], type=_engine_arg, help="offline LLM KEY=VALUE"
    )
    p.add_argument(
        "--step-trace", help="the server's engine writes its step trace here; the JSON gets a summary"
    )
    p.add_argument("--out", help="write the JSON here")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.engine_args = dict(args.engine_arg)
    try:
        engine_runs.check_model_dir(args)
    except ValueError as e:
        print(f"benchmarks/serving.py: {e}", file=sys.stderr)
        return 2
    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        from enginespec.testing import checkpoints

        model_dir = checkpoints.make_checkpoint(
            args.shape, checkpoints.default_dir(args.shape), seed=args.seed
        )
    workload, warm = _workloads(args, model_dir)
    report = {"model_dir": str(model_dir), "num_requests": len(workload.prompts)}
    report["serve"] = serve_run(args, model_dir, workload, warm)
    if args.offline:
        report["offline"] = offline_run(args, model_dir, workload)
        report["serve_over_offline"] = report["serve"]["output_tok_s"] / report["offline"]["output_tok_s"]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
