"""The one script the H200 run executes: kernel tests on CUDA, then timings, in one call.

    PYTHONUNBUFFERED=1 python benchmarks/gpu_kernels.py [--sweep] [--out DIR]

Order: (1) pytest kernels/ and benchmarks/bench_attention.py on CUDA (real shapes); (2) device-to-device copy bandwidth;
(3) decode attention achieved bandwidth (K/V bytes read / median time) for batch
1/16/64/256 x context 1k/4k/16k/32k, Qwen3-0.6B (16 q / 8 kv heads) and Qwen3-8B (32 q / 8 kv)
head shapes, head_dim 128, bf16, block_size 16, beside torch SDPA over a contiguous cache of the
same shape; (4) causal prefill TFLOP/s beside SDPA's flash path; (5) with --sweep, launch
configs at a few shapes, for tuning the heuristics. Inputs rotate among several sets whose
total exceeds the L2 several times; timings are triton.testing.do_bench medians of CUDA-graph
replays (launch overhead out, for ours and SDPA alike). Writes JSON to
$OUT (or --out) as it goes and prints a short table last. Not a test: nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import os
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enginespec.kernels.paged_attention import LaunchConfig, choose_config, paged_attention  # noqa: E402

T0 = time.time()
MODELS = {"qwen3-0.6b": (16, 8), "qwen3-8b": (32, 8)}
HEAD_DIM, BLOCK_SIZE, DTYPE = 128, 16, torch.bfloat16
ROTATE_BYTES = 256 << 20  # > 4x the H200's 60 MB L2
CHECK_SHAPES = [(16, 1024), (1, 32768)]  # decode shapes also checked against fp32 SDPA
RESULTS: dict = {}
DEV = "cuda"  # --dry-run: "cpu" under TRITON_INTERPRET, tiny shapes


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def save(out_dir: str) -> None:
    with open(os.path.join(out_dir, "kernels_h200.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def bench(fn) -> float:
    """Median milliseconds of fn (do_bench flushes L2 between reps, we rotate inputs too)."""
    if DEV == "cpu":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def time_calls(calls) -> float:
    """Median ms of one call, the calls (one per rotating input set) captured in one CUDA
    graph so that Python launch overhead stays out of the numbers for ours and SDPA alike."""
    for call in calls:  # compile / pick kernels outside the capture
        call()
    if DEV == "cpu":
        return bench(calls[0])
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    ms = bench(graph.replay) / len(calls)
    del graph
    return ms


def run_tests(out_dir: str) -> None:
    log("pytest kernels/ on CUDA")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "kernels",
        "benchmarks/bench_attention.py",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(out_dir, "pytest_kernels.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    tail = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    RESULTS["tests"] = {"returncode": proc.returncode, "summary": tail}
    print("\n".join(proc.stdout.splitlines()[-25:]), flush=True)
    log(f"pytest: rc={proc.returncode} {tail}")


def copy_bandwidth() -> float:
    x = torch.randn(1 << 30, device=DEV, dtype=DTYPE)  # 2 GiB
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    gbps = 2 * x.numel() * x.element_size() / ms / 1e6
    x = y = None  # free the 4 GiB before the next section
    RESULTS["copy_GBps"] = gbps
    log(f"copy bandwidth {gbps:.0f} GB/s")
    return gbps


def decode_case(num_reqs: int, ctx: int, num_q_heads: int, num_kv_heads: int):
    """Pool with n_sets disjoint shuffled block tables (rotation), queries per set."""
    kv_bytes = 2 * num_reqs * ctx * num_kv_heads * HEAD_DIM * 2
    n_sets = max(1, min(64, math.ceil(ROTATE_BYTES / kv_bytes)))
    per_req = ctx // BLOCK_SIZE
    total = n_sets * num_reqs * per_req
    cache = torch.randn(2, total + 1, BLOCK_SIZE, num_kv_heads, HEAD_DIM, device=DEV, dtype=DTYPE)
    tables = torch.randperm(total, device=DEV).view(n_sets, num_reqs, per_req).int()
    qs = torch.randn(n_sets, num_reqs, num_q_heads, HEAD_DIM, device=DEV, dtype=DTYPE)
    qsl = torch.arange(num_reqs + 1, device=DEV, dtype=torch.int32)
    seq_lens = torch.full((num_reqs,), ctx, device=DEV, dtype=torch.int32)
    return cache, tables, qs, qsl, seq_lens, kv_bytes, n_sets


def time_paged_decode(case, ctx: int, config=None) -> float:
    cache, tables, qs, qsl, seq_lens, _, n_sets = case
    out = torch.empty_like(qs[0])
    calls = [
        lambda i=i: paged_attention(
            qs[i], cache, qsl, seq_lens, tables[i], max_query_len=1, max_seq_len=ctx, out=out, config=config
        )
        for i in range(n_sets)
    ]
    return time_calls(calls)


def sdpa_backends():
    """The default choice and the flash path (cuDNN and mem-efficient refuse GQA inputs,
    seen on torch 2.11)."""
    from torch.nn.attention import SDPBackend

    return {"default": None, "flash": SDPBackend.FLASH_ATTENTION}


def time_sdpa(q_sets, k_sets, v_sets, is_causal: bool) -> dict:
    """Median ms per SDPA backend (None where the backend refuses these inputs)."""
    from torch.nn.attention import sdpa_kernel

    times = {}
    for name, backend in sdpa_backends().items():
        calls = [
            lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                q, k, v, is_causal=is_causal, enable_gqa=True
            )
            for q, k, v in zip(q_sets, k_sets, v_sets)
        ]
        try:
            if backend is None:
                times[name] = time_calls(calls)
            else:
                with sdpa_kernel([backend]):
                    times[name] = time_calls(calls)
        except RuntimeError:
            times[name] = None
    return times


def check_against_sdpa(case, ctx: int) -> float:
    """Max |ours - SDPA| on one set (contiguous copy gathered from the pool)."""
    cache, tables, qs, qsl, seq_lens, _, _ = case
    ours = paged_attention(qs[0], cache, qsl, seq_lens, tables[0], max_query_len=1, max_seq_len=ctx)
    blocks = tables[0].long()  # [B, ctx/bs]
    k = cache[0, blocks].flatten(1, 2).transpose(1, 2)  # [B, Hkv, ctx, D]
    v = cache[1, blocks].flatten(1, 2).transpose(1, 2)
    ref = F.scaled_dot_product_attention(qs[0][:, :, None].float(), k.float(), v.float(), enable_gqa=True)[
        :, :, 0
    ]
    return float((ours.float() - ref).abs().max())


def decode_table(batches, contexts) -> None:
    rows = RESULTS.setdefault("decode", [])
    for (model, (hq, hkv)), ctx, b in itertools.product(MODELS.items(), contexts, batches):
        case = decode_case(b, ctx, hq, hkv)
        kv_bytes, n_sets = case[5], case[6]
        cfg = choose_config(b, b, hq, hkv, HEAD_DIM, 1, ctx, torch.device(DEV))
        ours = time_paged_decode(case, ctx)
        err = check_against_sdpa(case, ctx) if (b, ctx) in CHECK_SHAPES else None
        del case
        torch.cuda.empty_cache()
        n_s = max(1, min(64, math.ceil(ROTATE_BYTES / kv_bytes)))
        k_sets = [torch.randn(b, hkv, ctx, HEAD_DIM, device=DEV, dtype=DTYPE) for _ in range(n_s)]
        v_sets = [torch.randn_like(k_sets[0]) for _ in range(n_s)]
        q_sets = [torch.randn(b, hq, 1, HEAD_DIM, device=DEV, dtype=DTYPE) for _ in range(n_s)]
        sdpa = time_sdpa(q_sets, k_sets, v_sets, is_causal=False)
        del k_sets, v_sets, q_sets
        torch.cuda.empty_cache()
        best_sdpa = min(t for t in sdpa.values() if t is not None)
        row = dict(
            model=model,
            batch=b,
            context=ctx,
            kv_bytes=kv_bytes,
            n_sets=n_sets,
            config=dataclasses.asdict(cfg),
            ours_ms=ours,
            ours_GBps=kv_bytes / ours / 1e6,
            sdpa_ms=sdpa,
            sdpa_best_GBps=kv_bytes / best_sdpa / 1e6,
            vs_sdpa=best_sdpa / ours,
            max_abs_err_vs_fp32=err,
        )
        rows.append(row)
        log(
            f"decode {model} B={b} ctx={ctx}: ours {row['ours_GBps']:.0f} GB/s "
            f"sdpa {row['sdpa_best_GBps']:.0f} GB/s ({row['vs_sdpa']:.2f}x) splits={cfg.num_splits}"
            + (f" err={err:.2e}" if err is not None else "")
        )


def prefill_case(num_reqs: int, length: int, hq: int, hkv: int):
    per_req = length // BLOCK_SIZE
    total = num_reqs * per_req
    cache = torch.randn(2, total + 1, BLOCK_SIZE, hkv, HEAD_DIM, device=DEV, dtype=DTYPE)
    table = torch.randperm(total, device=DEV).view(num_reqs, per_req).int()
    q = torch.randn(num_reqs * length, hq, HEAD_DIM, device=DEV, dtype=DTYPE)
    qsl = torch.arange(0, num_reqs + 1, device=DEV, dtype=torch.int32) * length
    seq_lens = torch.full((num_reqs,), length, device=DEV, dtype=torch.int32)
    return cache, table, q, qsl, seq_lens


def time_paged_prefill(case, length: int, config=None) -> float:
    cache, table, q, qsl, seq_lens = case
    out = torch.empty_like(q)
    return time_calls(
        [
            lambda: paged_attention(
                q,
                cache,
                qsl,
                seq_lens,
                table,
                max_query_len=length,
                max_seq_len=length,
                out=out,
                config=config,
            )
        ]
    )


def prefill_table(shapes) -> None:
    rows = RESULTS.setdefault("prefill", [])
    for (model, (hq, hkv)), (b, length) in itertools.product(MODELS.items(), shapes):
        flops = 2.0 * b * hq * HEAD_DIM * length * length  # causal: half of 4 L^2 D
        case = prefill_case(b, length, hq, hkv)
        cfg = choose_config(b * length, b, hq, hkv, HEAD_DIM, length, length, torch.device(DEV))
        ours = time_paged_prefill(case, length)
        del case
        q = torch.randn(b, hq, length, HEAD_DIM, device=DEV, dtype=DTYPE)
        k = torch.randn(b, hkv, length, HEAD_DIM, device=DEV, dtype=DTYPE)
        v = torch.randn_like(k)
        sdpa = time_sdpa([q], [k], [v], is_causal=True)
        del q, k, v
        torch.cuda.empty_cache()
        flash = sdpa.get("flash") or min(t for t in sdpa.values() if t is not None)
        row = dict(
            model=model,
            batch=b,
            length=length,
            config=dataclasses.asdict(cfg),
            ours_ms=ours,
            ours_TFLOPs=flops / ours / 1e9,
            sdpa_ms=sdpa,
            sdpa_flash_TFLOPs=flops / flash / 1e9,
            vs_flash=flash / ours,
        )
        rows.append(row)
        log(
            f"prefill {model} {b}x{length}: ours {row['ours_TFLOPs']:.0f} TFLOP/s "
            f"flash {row['sdpa_flash_TFLOPs']:.0f} ({row['vs_flash']:.2f}x)"
        )


DECODE_SWEEP = [(64, 4, 2), (64, 4, 3), (128, 4, 2)]
PREFILL_SWEEP = [(128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3)]


def sweep_decode(shapes, splits=(1, 2, 4, 8), min_tiles: int = 4) -> None:
    """Launch-config variants around choose_config at each shape: tile/warps/stages at its split
    count, then each split count in `splits` that leaves >= min_tiles key tiles per split."""
    rows = RESULTS.setdefault("sweep_decode", [])
    for model, b, ctx in shapes:
        hq, hkv = MODELS[model]
        case = decode_case(b, ctx, hq, hkv)
        base = choose_config(b, b, hq, hkv, HEAD_DIM, 1, ctx, torch.device(DEV))
        variants = [dataclasses.replace(base, tile=t, num_warps=w, num_stages=s) for t, w, s in DECODE_SWEEP]
        variants += [
            dataclasses.replace(base, num_splits=n)
            for n in splits
            if n != base.num_splits and n <= max(1, ctx // (min_tiles * base.tile))
        ]
        key = dict(model=model, batch=b, context=ctx)
        best = _time_variants(
            rows, key, variants, functools.partial(time_paged_decode, case, ctx), "GBps", case[5] / 1e6
        )
        log(f"sweep decode {model} B={b} ctx={ctx}: best {best['GBps']:.0f} GB/s {best['config']}")
        del case
        torch.cuda.empty_cache()


def _time_variants(rows: list, key: dict, configs, time_fn, metric: str, per_ms: float) -> dict:
    """Time each launch config; append a row per config (key's fields, the config, and ms with
    metric = per_ms / ms, or the error that stopped it: out of shared memory, say) and return
    the best row of this key."""
    for cfg in configs:
        try:
            ms = time_fn(cfg)
        except Exception as exc:  # record and go on
            rows.append(dict(**key, config=dataclasses.asdict(cfg), error=type(exc).__name__))
            continue
        rows.append(dict(**key, config=dataclasses.asdict(cfg), ms=ms, **{metric: per_ms / ms}))
    mine = (r for r in rows if r.get(metric) and all(r.get(k) == v for k, v in key.items()))
    return max(mine, key=lambda r: r[metric])


def sweep_prefill(shapes) -> None:
    rows = RESULTS.setdefault("sweep_prefill", [])
    for model, b, length in shapes:
        hq, hkv = MODELS[model]
        flops = 2.0 * b * hq * HEAD_DIM * length * length
        case = prefill_case(b, length, hq, hkv)
        configs = [
            LaunchConfig(block_m=m, tile=t, num_splits=1, num_warps=w, num_stages=st)
            for m, t, w, st in PREFILL_SWEEP
        ]
        key = dict(model=model, batch=b, length=length)
        best = _time_variants(
            rows, key, configs, functools.partial(time_paged_prefill, case, length), "TFLOPs", flops / 1e9
        )
        log(f"sweep prefill {model} {b}x{length}: best {best['TFLOPs']:.0f} {best['config']}")
        del case
        torch.cuda.empty_cache()


def print_table() -> None:
    copy = RESULTS.get("copy_GBps", float("nan"))
    print(f"\n== tests: {RESULTS.get('tests', {}).get('summary')}")
    print(f"== copy bandwidth {copy:.0f} GB/s; decode bf16, block 16, head_dim 128")
    print(
        f"{'model':11} {'B':>4} {'ctx':>6} {'ours GB/s':>9} {'/copy':>6} {'sdpa GB/s':>9} "
        f"{'vs sdpa':>7} {'splits':>6}"
    )
    for r in RESULTS.get("decode", []):
        print(
            f"{r['model']:11} {r['batch']:4} {r['context']:6} {r['ours_GBps']:9.0f} "
            f"{r['ours_GBps'] / copy:6.2f} {r['sdpa_best_GBps']:9.0f} {r['vs_sdpa']:7.2f} "
            f"{r['config']['num_splits']:6}"
        )
    print("== prefill (causal) TFLOP/s")
    for r in RESULTS.get("prefill", []):
        print(
            f"{r['model']:11} {r['batch']}x{r['length']:<6} ours {r['ours_TFLOPs']:5.0f} "
            f"flash {r['sdpa_flash_TFLOPs']:5.0f} ({r['vs_flash']:.2f}x)"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--sweep", action="store_true", help="also sweep launch configs")
    parser.add_argument(
        "--sweep-small",
        action="store_true",
        help="only sweep split counts of small decode batches (Qwen3-0.6B heads)",
    )
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the script on CPU (interpreter, tiny shapes); times mean nothing",
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*(kernel not used|runtime disabled|num_heads).*")
    if args.dry_run:
        return dry_run(args.out)
    import triton

    RESULTS["env"] = dict(
        torch=torch.__version__,
        triton=triton.__version__,
        device=torch.cuda.get_device_name(),
        date=time.strftime("%Y-%m-%d"),
        sms=torch.cuda.get_device_properties(0).multi_processor_count,
    )
    log(f"env {RESULTS['env']}")
    if not args.skip_tests:
        run_tests(args.out)
        save(args.out)
    torch.manual_seed(0)
    copy_bandwidth()
    if args.sweep_small:  # the end-to-end run's tail: few requests, 1-2k contexts
        sweep_decode(
            [("qwen3-0.6b", b, ctx) for b in (4, 16, 32, 64) for ctx in (1024, 2048)],
            splits=(1, 2, 4, 8, 16, 32),
            min_tiles=1,
        )
        save(args.out)
        return
    decode_table([1, 16, 64, 256], [1024, 4096, 16384, 32768])
    save(args.out)
    prefill_table([(1, 16384), (4, 4096)])
    save(args.out)
    if args.sweep:
        sweep_decode([("qwen3-8b", 64, 4096), ("qwen3-8b", 64, 32768)])
        save(args.out)
    print_table()
    log("done")


def dry_run(out_dir: str) -> None:
    global DEV, HEAD_DIM, BLOCK_SIZE, DTYPE, ROTATE_BYTES, DECODE_SWEEP, PREFILL_SWEEP
    DEV, HEAD_DIM, BLOCK_SIZE, DTYPE, ROTATE_BYTES = "cpu", 16, 4, torch.float32, 1 << 16
    CHECK_SHAPES[:] = [(3, 32)]
    MODELS.clear()
    MODELS.update({"tiny-a": (4, 2), "tiny-b": (8, 2)})
    DECODE_SWEEP, PREFILL_SWEEP = DECODE_SWEEP[:2], PREFILL_SWEEP[:1]
    RESULTS["copy_GBps"] = 1.0
    decode_table([1, 3], [16, 32])
    prefill_table([(1, 32)])
    sweep_decode([("tiny-a", 2, 32)])
    sweep_prefill([("tiny-b", 1, 32)])
    save(out_dir)
    print_table()


if __name__ == "__main__":
    main()
