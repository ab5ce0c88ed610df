"""Host cost of n-gram speculation per engine step at batch 256, on the CPU, without a model.

`SpecDecoder.propose` (and, under async scheduling, `wants_real_tokens`) runs on the host
before every `schedule()`; on the GPU that time is added to a step that takes a few ms at batch
256. This times both over the fast impl's requests holding nano-vllm's prompts (random ids
below 10000, lengths 100-1024), each step appending one token per request, drawn either from
the whole Qwen3 vocabulary (`random`: drafts almost never match, the nano-vllm case) or from a
short loop per request (`loop`: every request drafts every step it is not backing off).

    python benchmarks/spec_host_cost.py [--num-requests 256] [--steps 200] [--k 4]

Prints microseconds per step for: propose with every token real (the serial engine), and
wants_real_tokens + propose with every newest token the async placeholder (the async engine's
common step), and the same with `disable_by_batch_size` at or below the batch (the cut-off).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from enginespec.engine.spec_decode import SpecDecoder, SpeculativeConfig  # noqa: E402
from enginespec.spec import SamplingParams, Status, load_impl  # noqa: E402
from enginespec.testing.workload import make_workload  # noqa: E402

VOCAB = 151936
PLACEHOLDER = VOCAB


def running_requests(num: int, seed: int) -> list:
    """num fast-impl requests in RUNNING state, prompts computed, one output token each."""
    impl = load_impl("fast")
    workload = make_workload(num, seed=seed)
    params = SamplingParams(max_tokens=1024, temperature=0.0, ignore_eos=True)
    reqs = []
    for i, prompt in enumerate(workload.prompts):
        r = impl.new_request(f"r{i}", prompt, params)
        r.status = Status.RUNNING
        r.append(1)
        r.num_computed_tokens = r.num_tokens - 1
        reqs.append(r)
    return reqs


def next_token(mode: str, rng: random.Random, r, step: int) -> int:
    if mode == "random":
        return rng.randrange(VOCAB)
    return 7 + (hash(r.request_id) + step) % 5  # a 5-token loop: n-grams match from step 5 on


def time_steps(
    spec: SpecDecoder, reqs: list, mode: str, steps: int, placeholder: bool
) -> tuple[float, float]:
    """Microseconds of the first step's host speculation work (it indexes every prompt) and
    the mean over the later steps."""
    rng = random.Random(1)
    times = []
    for step in range(steps):
        real = [next_token(mode, rng, r, step) for r in reqs]
        for r, t in zip(reqs, real):
            r.append(PLACEHOLDER if placeholder else t)
            r.num_computed_tokens = r.num_tokens - 1
        start = time.perf_counter()
        if placeholder and spec.wants_real_tokens(reqs, PLACEHOLDER):
            for r, t in zip(reqs, real):  # the engine resolves the step in flight first
                r.token_ids[-1] = t
        spec.propose(reqs, PLACEHOLDER)
        times.append(time.perf_counter() - start)
        for r, t in zip(reqs, real):
            r.token_ids[-1] = t
        for r in list(spec._drafted):  # every draft rejected: the worst case for nano-vllm
            spec._observe(r.request_id, len(r.spec_token_ids), 0)
    return times[0] * 1e6, statistics.mean(times[1:]) * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for label, disable in (("on", None), ("cut-off", args.num_requests)):
        cfg = SpeculativeConfig(
            num_speculative_tokens=args.k,
            prompt_lookup_min=2,
            prompt_lookup_max=4,
            disable_by_batch_size=disable,
        )
        for mode in ("random", "loop"):
            for placeholder in (False, True):
                spec = SpecDecoder(cfg, sampler=None, device="cpu", max_model_len=1 << 20)
                reqs = running_requests(args.num_requests, args.seed)
                first, later = time_steps(spec, reqs, mode, args.steps, placeholder)
                kind = "async" if placeholder else "serial"
                print(
                    f"{label:8s} {mode:6s} {kind:6s} first step {first:9.1f} us, "
                    f"later steps {later:8.1f} us (mean; {args.num_requests} requests)"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
