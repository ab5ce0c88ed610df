"""Sampler cost beside a bare greedy argmax, on the shape of one Qwen3 decode step.

    pytest benchmarks/bench_sampler.py --benchmark-enable          # timed (CUDA when present)
    python benchmarks/bench_sampler.py                               # ratio table, CUDA timings

256 rows over a 151,936-token vocabulary of random float32 logits. Cases: `argmax` (torch.argmax
plus the host copy of the ids: the floor any sampler pays), `sampler_greedy` (our Sampler with
every row greedy), `sampler_temperature` (every row temperature 0.6, no cut: the throughput
benchmark's setting), `sampler_mixed` (a quarter each of greedy; temperature only; top-k 50 +
top-p 0.9, half of them seeded; top-p 0.95 + min-p 0.05 with repetition/frequency penalties
over 256-token histories and logprobs=5), `sampler_seeded` (every row temperature 0.6 with its
own seed: per-step keys), `sampler_chat` (every row Qwen3's chat settings: temperature 0.7,
top-p 0.8, top-k 20), `sampler_top_p` (top-p 0.95 alone, seeded: on these flat rows the
nucleus holds thousands of tokens, beyond the fused draw's candidates: drawn by rejection,
sample/reject.py; ENGINESPEC_REJECT_TOP_P=0 for the exact cut instead).
The `device_*` cases time the device path async scheduling uses
(Sampler.sample_deferred, then the one host copy of ids and logprobs): `device_temperature`,
`device_chat` (the top-k/top-p-only case), `device_mixed`, `device_greedy`, `device_seeded`;
their penalty rows append each drawn token (as the engine does), so the device output counts
stay current. `--json PATH` writes the medians (and with `--profile` each case's launch count
and device time: `<case>_launches`, `<case>_device_us`). On CPU (CI, --benchmark-disable runs each case once) the row count
drops to 16 so the suite stays fast; ENGINESPEC_BENCH_ROWS overrides it. Nothing here asserts
speed; numbers go to benchmarks/RESULTS.md.

`python benchmarks/bench_sampler.py --profile` also prints, per case, the device kernels one
call launches and their summed device time (torch.profiler; CUDA only), so host-bound and
device-bound cases can be told apart; `--check` also counts the rows where the Triton draws
(serial and device paths) and the plain-torch draw agree on seeded versions of the seeded,
chat, mixed and top-p cases; `--sweep` times the Triton draw alone
(CUDA events, all rows temperature 0.6) over block sizes and warp counts, for tuning
sampling_triton.BLOCK / NUM_WARPS, and the fused cut_draw (chat settings) over warp counts, and
on the top-p case with its in-program wide cut and its spread cut (`cut_draw.draw(spread=)`).
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Optional

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enginespec.sample.deferred import pack  # noqa: E402
from enginespec.sample.draw import CHUNK  # noqa: E402
from enginespec.sample.sampler import Sampler  # noqa: E402
from enginespec.spec import SamplingParams, load_impl  # noqa: E402

VOCAB = 151_936
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROWS = int(os.environ.get("ENGINESPEC_BENCH_ROWS", 256 if DEVICE == "cuda" else 16))


def mixed_params(i: int) -> SamplingParams:
    """Row i's settings: four equal groups (see the module docstring)."""
    group = i % 4
    if group == 0:
        return SamplingParams(temperature=0.0)
    if group == 1:
        return SamplingParams(temperature=0.8)
    if group == 2:
        return SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=i if i % 8 == 2 else None)
    return SamplingParams(
        temperature=0.7, top_p=0.95, min_p=0.05, repetition_penalty=1.1, frequency_penalty=0.2, logprobs=5
    )


def chat_params(i: int) -> SamplingParams:
    """Qwen3's recommended chat settings (the issue's top-k/top-p-only case)."""
    return SamplingParams(temperature=0.7, top_p=0.8, top_k=20)


def penalty_rows(reqs: list) -> list:
    """The rows whose params ask for a penalty (deferred_ids appends their tokens)."""
    return [
        i
        for i, r in enumerate(reqs)
        if r.params.repetition_penalty != 1.0
        or r.params.frequency_penalty != 0.0
        or r.params.presence_penalty != 0.0
    ]


def deferred_ids(sampler: Sampler, logits: torch.Tensor, reqs: list, append=None) -> list:
    """The device path as async scheduling pays it: sample_deferred, then the one host copy
    of the packed ids and logprobs (the engine makes it a step later; here at once). The
    `append` rows (default: penalty_rows) then append their token, as the engine does, so the
    device output counts stay current (otherwise every call would rebuild them from the host
    lists); those appends are host time the engine pays outside the sampler, counted here."""
    flat = pack(sampler.sample_deferred(logits, reqs)).tolist()
    for i in penalty_rows(reqs) if append is None else append:
        reqs[i].append(int(flat[i]))
    return flat


def make_requests(num_rows: int, params_of) -> list:
    """Reference-impl requests with 192-token prompts and 64 outputs (penalty histories)."""
    impl, rng = load_impl("reference"), random.Random(0)
    reqs = []
    for i in range(num_rows):
        req = impl.new_request(
            f"r{i}", [rng.randrange(VOCAB) for _ in range(192)], params_of(i), eos_token_id=VOCAB - 1
        )
        for _ in range(64):
            req.append(rng.randrange(VOCAB))
        reqs.append(req)
    return reqs


def make_logits(num_rows: int) -> torch.Tensor:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    return torch.randn(num_rows, VOCAB, generator=gen, device=DEVICE) * 3.0


def argmax_ids(logits: torch.Tensor) -> list[int]:
    return logits.argmax(dim=1).tolist()


@pytest.fixture(scope="module")
def logits():
    return make_logits(ROWS)


@pytest.fixture(scope="module")
def sampler():
    return Sampler(VOCAB, device=DEVICE, seed=0)


def test_argmax(benchmark, logits):
    benchmark.group = "sampler"
    ids = benchmark(argmax_ids, logits)
    assert ids == logits.argmax(dim=1).tolist() and len(ids) == ROWS


def test_sampler_greedy(benchmark, logits, sampler):
    benchmark.group = "sampler"
    reqs = make_requests(ROWS, lambda i: SamplingParams(temperature=0.0))
    out = benchmark(sampler, logits, reqs)
    assert out.token_ids == argmax_ids(logits)


def test_sampler_temperature(benchmark, logits, sampler):
    benchmark.group = "sampler"
    reqs = make_requests(ROWS, lambda i: SamplingParams(temperature=0.6))
    out = benchmark(sampler, logits, reqs)
    assert len(out.token_ids) == ROWS and all(0 <= t < VOCAB for t in out.token_ids)


def test_sampler_mixed(benchmark, logits, sampler):
    benchmark.group = "sampler"
    reqs = make_requests(ROWS, mixed_params)
    out = benchmark(sampler, logits, reqs)
    assert len(out.token_ids) == ROWS and all(0 <= t < VOCAB for t in out.token_ids)
    greedy_rows = list(range(0, ROWS, 4))
    assert [out.token_ids[i] for i in greedy_rows] == logits[greedy_rows].argmax(dim=1).tolist()


def test_sampler_seeded(benchmark, logits, sampler):
    benchmark.group = "sampler"
    reqs = make_requests(ROWS, lambda i: SamplingParams(temperature=0.6, seed=i))
    out = benchmark(sampler, logits, reqs)
    again = Sampler(VOCAB, device=DEVICE, seed=1)(logits, reqs)
    assert out.token_ids == again.token_ids  # seeded rows ignore the sampler's own seed


def test_device_chat(benchmark, logits, sampler):
    benchmark.group = "sampler"
    reqs = make_requests(ROWS, chat_params)
    ids = benchmark(deferred_ids, sampler, logits, reqs)
    top = logits.topk(20, dim=1).indices.tolist()
    assert len(ids) == ROWS and all(int(t) in row for t, row in zip(ids, top))


def test_device_mixed(benchmark, logits, sampler):
    benchmark.group = "sampler"
    reqs = make_requests(ROWS, mixed_params)
    ids = benchmark(deferred_ids, sampler, logits, reqs)
    greedy_rows = list(range(0, ROWS, 4))
    assert [int(ids[i]) for i in greedy_rows] == logits[greedy_rows].argmax(dim=1).tolist()


def _time_ms(fn, reps: int = 20) -> float:
    """Median milliseconds over reps (every case ends in a host copy, which syncs): wall time
    on the host, which on CUDA includes the launches' host cost and the device time."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


TOP_OPS = int(
    os.environ.get("ENGINESPEC_BENCH_TOP_OPS", 8)
)  # device ops named per case in --profile's lines, longest first


def _device_profile(fn) -> tuple[int, float, str]:
    """(kernels launched by one call of fn, their summed device time in us, a summary line);
    CUDA only. Memcpy/memset count too: each is a launch the step pays."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(e.time_range.elapsed_us() for e in kernels)
    top = sorted(kernels, key=lambda e: -e.time_range.elapsed_us())[:TOP_OPS]
    names = ", ".join(f"{e.name[:40]} {e.time_range.elapsed_us():.0f}us" for e in top)
    return len(kernels), busy_us, f"    {len(kernels)} device ops, {busy_us:.0f} us device time; top: {names}"


def _torch_only(fn):
    """fn's result with every Triton path switched off (the plain-torch reference draw)."""
    from enginespec.kernels import cut_draw
    from enginespec.kernels import sampling as sampling_triton
    from enginespec.kernels import top_p as top_p_kernel

    saved = [(m, m.available) for m in (cut_draw, sampling_triton, top_p_kernel)]
    for module, _ in saved:
        module.available = lambda device: False
    try:
        return fn()
    finally:
        for module, real in saved:
            module.available = real


def _agreement(lg, params_of) -> str:
    """Rows where the Triton draw (serial path and device path, fresh samplers and requests)
    and the plain-torch draw pick the same token, every row seeded (seeded rows see the same
    keys; rounding may flip a rare row whose uniform lands within float rounding of a
    boundary)."""

    def fresh() -> tuple[Sampler, list]:
        return Sampler(VOCAB, device=DEVICE, seed=0), make_requests(ROWS, lambda i: _seeded(params_of(i), i))

    sm, reqs = fresh()
    serial = sm(lg, reqs).token_ids
    sm, reqs = fresh()
    device = [int(t) for t in deferred_ids(sm, lg, reqs)[: len(reqs)]]
    sm, reqs = fresh()
    plain = _torch_only(lambda: sm(lg, reqs).token_ids)
    agree = [sum(a == b for a, b in zip(got, plain)) for got in (serial, device)]
    return (
        f"    torch draw vs serial / device path: {agree[0]}/{len(plain)}, {agree[1]}/{len(plain)} rows agree"
    )


def _sweep(lg) -> None:
    """Median device ms of the Triton draw alone per (block, num_warps)."""
    import math

    from enginespec.kernels import cut_draw
    from enginespec.kernels import sampling as sampling_triton

    rows = lg.shape[0]
    scale = torch.full((rows,), math.log2(math.e) / 0.6, device=DEVICE)
    thr = torch.full((rows,), float("-inf"), device=DEVICE)
    noisy = torch.ones(rows, device=DEVICE)
    keys = torch.full((rows,), -1, dtype=torch.int64, device=DEVICE)
    for block in (1024, 2048, 4096, 8192):
        for warps in (4, 8, 16):
            run = lambda: sampling_triton.draw(
                lg, scale, thr, noisy, keys, (1, 2), chunk=CHUNK, block=block, num_warps=warps
            )
            print(f"    draw block={block:5d} warps={warps:2d}: {_event_us(run):7.1f} us")
    sampler = Sampler(VOCAB, device=DEVICE, seed=0)
    plan = sampler._plan(make_requests(rows, chat_params), lg.device)
    prm, keys = plan.fused_params()
    for warps in (4, 8, 16):
        run = lambda: cut_draw.draw(lg, prm, keys, (1, 2), chunk=CHUNK, num_warps=warps)
        print(f"    cut_draw chat warps={warps:2d}: {_event_us(run):7.1f} us")
    plan = sampler._plan(make_requests(rows, CASES["top_p"]), lg.device)
    prm, keys = plan.fused_params()
    for spread in (False, True):  # top-p 0.95 alone: the in-program wide cut, then the spread one
        for warps in (4, 8):
            run = lambda: cut_draw.draw(lg, prm, keys, (1, 2), chunk=CHUNK, num_warps=warps, spread=spread)
            print(f"    cut_draw top_p spread={spread!s:5} warps={warps:2d}: {_event_us(run):7.1f} us")


def _event_us(run) -> float:
    """Median device microseconds of run() over 20 calls (CUDA events)."""
    run()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[10] * 1e3


CASES = {
    "greedy": lambda i: SamplingParams(temperature=0.0),
    "temperature": lambda i: SamplingParams(temperature=0.6),
    "seeded": lambda i: SamplingParams(temperature=0.6, seed=i),
    "chat": chat_params,
    "mixed": mixed_params,
    # top-p alone over these flat random rows: the nucleus (thousands of tokens) lies beyond
    # cut_draw's candidates, so every row takes its wide (bisection) path: the worst case
    "top_p": lambda i: SamplingParams(temperature=1.0, top_p=0.95, seed=i),
}


def _report(figures: dict, name: str, fn, base: Optional[float], profile: bool) -> None:
    """Time fn into figures[name_ms] and print it over base (None: fn is the base)."""
    ms = _time_ms(fn)
    figures[f"{name}_ms"] = ms
    print(f"{name:19s} {ms:8.3f} ms  {ms / (base or ms):.2f}x")
    if profile:
        launches, busy_us, line = _device_profile(fn)
        figures[f"{name}_launches"], figures[f"{name}_device_us"] = launches, busy_us
        print(line)


def main() -> None:
    """Every case on both paths: `sampler_*` (serial: __call__, host lists) and `device_*`
    (sample_deferred + the one host copy), against a bare argmax."""
    lg, sm = make_logits(ROWS), Sampler(VOCAB, device=DEVICE, seed=0)
    profile = "--profile" in sys.argv and DEVICE == "cuda"
    figures: dict = {}
    print(f"device={DEVICE} rows={ROWS} vocab={VOCAB}")
    _report(figures, "argmax", lambda: argmax_ids(lg), None, profile)
    base = figures["argmax_ms"]
    if "--sweep" in sys.argv and DEVICE == "cuda":
        _sweep(lg)
    for case, params_of in CASES.items():
        reqs = make_requests(ROWS, params_of)
        _report(figures, f"sampler_{case}", lambda: sm(lg, reqs), base, profile)
        # a fresh request list: the device path keeps output counts per request object
        dev_reqs = make_requests(ROWS, params_of)
        grow = penalty_rows(dev_reqs)
        _report(figures, f"device_{case}", lambda: deferred_ids(sm, lg, dev_reqs, grow), base, profile)
        if case in ("seeded", "chat", "mixed", "top_p") and "--check" in sys.argv:
            print(_agreement(lg, params_of))
    if "--json" in sys.argv:
        import json

        path = sys.argv[sys.argv.index("--json") + 1]
        with open(path, "w") as f:
            json.dump({"device": DEVICE, "rows": ROWS, "vocab": VOCAB, **figures}, f, indent=1)


def _seeded(params: SamplingParams, i: int) -> SamplingParams:
    """params with seed i (so the Triton and torch draws see the same keys)."""
    import dataclasses

    return dataclasses.replace(params, seed=i)


if __name__ == "__main__":
    main()
