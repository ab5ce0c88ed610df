"""CPU control-plane benchmarks: block pool, scheduler, batch builder, for every impl in one run.

    pytest benchmarks/bench_core.py --benchmark-enable
    pytest benchmarks/bench_core.py --benchmark-enable --impl=mypkg.backend:IMPL   # + an outside impl

Each case runs for "reference" and "fast" (plus the plugin's --impl when it names another), in
the same process, so the ratio between them is measured in one run. Without --benchmark-enable
(CI) every case runs once as an ordinary test and checks what it computed, never its speed.
The reference impl has no build_batch of its own: like the engine, it gets the spec's canonical
builder (spec/batch_layout.py). Workload: decoding requests with random prompts of 384-640
tokens, block size 16, prefix caching on; numbers go to benchmarks/RESULTS.md ("CPU control plane").

Cases:
- churn: 64 requests of 512 tokens sharing a 256-token prefix: lookup, allocate, publish, then
  free all (one round = 64 admissions and 64 frees over a 4096-block pool).
- schedule_256 / schedule_1024: schedule() over that many running decodes (steady state: a
  repeated schedule() without update makes the same decisions, so it is timed as is).
- mixed_step_caching / mixed_step_no_caching: schedule + build_batch + update_from_output of a
  steady mixed step (MixedWorkload: ~200 decodes plus prefill chunks of arriving prompts),
  prefix caching on (hashing included) or off.
- build_256 / build_mixed: build_batch for a 256-decode step and for a mixed step (plus
  build_*_cuda with the tensors placed on the GPU, where one is present).
- update_256: update_from_output of a 256-decode step (schedule() is the untimed setup).
- step_256: schedule + build_batch + update_from_output for 256 running decodes, the full CPU
  work of one engine step; target <= 1 ms for the fast impl.
"""

from __future__ import annotations

import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enginespec.spec import SamplingParams, SchedulerConfig, load_impl  # noqa: E402
from enginespec.spec import build_batch as plain_build_batch  # noqa: E402

PROMPT_LEN = 512
BLOCK_SIZE = 16
VOCAB = 32_000
IMPLS = ("reference", "fast")


def pytest_generate_tests(metafunc):
    if "impl_name" in metafunc.fixturenames:
        names = list(IMPLS)
        extra = metafunc.config.getoption("--impl", default=None)
        if extra and extra not in names:
            names.append(extra)
        metafunc.parametrize("impl_name", names)


def builder_of(impl):
    """The impl's own build_batch, else the plain one (what the engine does)."""
    return getattr(impl, "build_batch", None) or plain_build_batch


def samples_of(output) -> dict:
    """One token per request that reaches the end of its known tokens (call before update)."""
    return {
        r.request_id: [1 + (r.num_tokens % 997)]
        for r, n in output.scheduled
        if r.num_computed_tokens + n >= r.num_tokens
    }


def add_requests(
    impl, scheduler, count: int, first: int = 0, prefix=(), seed: int = 0, max_tokens: tuple = (4096, 4096)
) -> None:
    rng = random.Random(seed)
    for i in range(first, first + count):
        length = rng.randint(PROMPT_LEN - 128, PROMPT_LEN + 128)  # decodes cross blocks at different steps
        prompt = list(prefix) + [rng.randrange(1, VOCAB) for _ in range(length - len(prefix))]
        params = SamplingParams(max_tokens=rng.randint(*max_tokens), temperature=0.0, ignore_eos=True)
        scheduler.add(impl.new_request(f"r{i}", prompt, params, eos_token_id=0, arrival_time=float(i)))


def decoding_scheduler(
    impl,
    num_decodes: int,
    num_blocks: int,
    budget: int = 8192,
    max_seqs: int = 0,
    threshold: int = 0,
    caching: bool = True,
    max_tokens: tuple = (4096, 4096),
):
    """A scheduler whose `num_decodes` requests have finished their prompts (each step decodes)."""
    bm = impl.new_block_manager(num_blocks, BLOCK_SIZE, caching)
    config = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=max_seqs or num_decodes,
        long_prefill_token_threshold=threshold,
    )
    scheduler = impl.new_scheduler(config, bm)
    add_requests(impl, scheduler, num_decodes, max_tokens=max_tokens)
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running) or scheduler.waiting:
        output = scheduler.schedule()
        scheduler.update_from_output(output, samples_of(output))
    return scheduler


def engine_step(scheduler, build):
    """The CPU work of one engine step: schedule, lay out the batch, take the samples (one
    token per sampling row, as the sampler would return them), update."""
    output = scheduler.schedule()
    batch = build(output, scheduler.block_manager)
    sampled = {rid: [1 + i % 997] for i, rid in enumerate(batch.sample_request_ids)}
    scheduler.update_from_output(output, sampled)
    return output


def check_decode_step(output, num_decodes: int) -> None:
    assert len(output.scheduled) == num_decodes and all(n == 1 for _, n in output.scheduled)
    assert not output.preempted


@pytest.fixture
def impl(impl_name):
    return load_impl(impl_name)


def test_churn(benchmark, impl):
    bm = impl.new_block_manager(4096, BLOCK_SIZE, True)
    rng = random.Random(0)
    prefix = [rng.randrange(1, VOCAB) for _ in range(256)]
    params = SamplingParams(max_tokens=16)
    requests = [
        impl.new_request(
            f"c{i}", prefix + [rng.randrange(1, VOCAB) for _ in range(256)], params, arrival_time=float(i)
        )
        for i in range(64)
    ]

    def churn():
        for r in requests:
            cached = bm.find_cached_prefix(r)
            assert bm.allocate_slots(r, r.num_tokens - len(cached) * BLOCK_SIZE, cached)
            bm.cache_full_blocks(r, r.num_tokens)
        num_free = bm.num_free
        for r in requests:
            bm.free(r)
        return num_free

    benchmark.group = "churn"
    num_free = benchmark(churn)
    # 64 private 256-token halves (16 blocks each) plus one shared 16-block prefix.
    assert num_free == 4096 - 64 * 16 - 16
    assert bm.num_free == 4096


@pytest.mark.parametrize("num_decodes", [256, 1024])
def test_schedule(benchmark, impl, num_decodes):
    scheduler = decoding_scheduler(impl, num_decodes, num_blocks=num_decodes * 40)
    benchmark.group = f"schedule_{num_decodes}"
    output = benchmark(scheduler.schedule)
    check_decode_step(output, num_decodes)


class MixedWorkload:
    """Steady mixed traffic: up to 256 running requests that finish after 16-256 outputs, and
    new 384-640-token prompts (half sharing a 256-token prefix) arriving so that 16 wait at the
    start of every step; budget 2048, long_prefill_token_threshold 256. Every step decodes about
    200 requests and prefills chunks of several prompts."""

    def __init__(self, impl, caching: bool = True):
        self.impl = impl
        self.scheduler = decoding_scheduler(
            impl,
            192,
            num_blocks=16384,
            budget=2048,
            max_seqs=256,
            threshold=256,
            caching=caching,
            max_tokens=(16, 256),
        )
        self.num_added = 0

    def arrivals(self) -> None:
        """Top the waiting queue up to 16 (untimed setup of each round)."""
        missing = 16 - len(self.scheduler.waiting)
        for _ in range(missing):
            first = 10_000 + self.num_added
            prefix = [7] * 256 if first % 2 else ()
            add_requests(
                self.impl, self.scheduler, 1, first=first, prefix=prefix, seed=first, max_tokens=(16, 256)
            )
            self.num_added += 1


def mixed_template(impl, caching: bool = True):
    """A mixed workload after 20 warm-up steps (the steady state the cases measure)."""
    workload = MixedWorkload(impl, caching)
    build = builder_of(impl)
    for _ in range(20):
        workload.arrivals()
        engine_step(workload.scheduler, build)
    workload.arrivals()
    return workload


@pytest.mark.parametrize("caching", [True, False], ids=["caching", "no_caching"])
def test_mixed_step(benchmark, impl, caching):
    """schedule + build_batch + update of a mixed prefill/decode step. With caching on, both
    impls pay the same canonical BLAKE2b hashing of every admitted prompt's full blocks
    (spec.hash_block); with it off, the step is bookkeeping only."""
    workload = mixed_template(impl, caching)
    build = builder_of(impl)

    def setup():
        workload.arrivals()
        return (workload.scheduler, build), {}

    benchmark.group = f"mixed_step_{'caching' if caching else 'no_caching'}"
    output = benchmark.pedantic(engine_step, setup=setup, rounds=100, warmup_rounds=5)
    counts = [n for _, n in output.scheduled]
    assert max(counts) > 1 and counts.count(1) > 150 and sum(counts) <= 2048 and not output.preempted


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["decodes", "one_decode", "mixed"])
def test_build_batch(benchmark, impl, case, device):
    """build_batch of 256 decodes, of one (batch 1's host step) and of a mixed step."""
    if case == "mixed":
        scheduler = mixed_template(impl).scheduler
    else:
        num = 256 if case == "decodes" else 1
        scheduler = decoding_scheduler(impl, num, num_blocks=max(num * 40, 320))  # a request needs <= 296
    output = scheduler.schedule()
    build = builder_of(impl)
    group = {"decodes": "build_256", "one_decode": "build_1", "mixed": "build_mixed"}[case]
    benchmark.group = group + ("" if device == "cpu" else "_cuda")
    batch = benchmark(build, output, scheduler.block_manager, device)
    assert batch.num_reqs == len(output.scheduled) and batch.input_ids.device.type == device
    assert batch.num_scheduled_tokens == output.num_scheduled_tokens


def test_update(benchmark, impl):
    scheduler = decoding_scheduler(impl, 256, num_blocks=256 * 64)

    def setup():
        output = scheduler.schedule()
        return (output, samples_of(output)), {}

    benchmark.group = "update_256"
    result = benchmark.pedantic(scheduler.update_from_output, setup=setup, rounds=200, warmup_rounds=5)
    assert len(result.new_token_ids) == 256 and not result.finished


def test_step(benchmark, impl):
    scheduler = decoding_scheduler(impl, 256, num_blocks=256 * 64)
    build = builder_of(impl)
    benchmark.group = "step_256"
    output = benchmark.pedantic(engine_step, args=(scheduler, build), rounds=300, warmup_rounds=10)
    check_decode_step(output, 256)
