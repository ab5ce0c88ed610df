"""`enginespec simulate`: drive a scheduler and block pool with no model at all.

A shared-prefix workload (requests that open with one of a few long system prompts) runs
against a small pool, so prefix-cache hits and preemptions both happen. The shared fake model
(testing/fake_model.py) emits the next token as a pure function of the tokens so far
(occasionally EOS), so a request recomputed after preemption produces the same text. Deterministic for a given --seed.
"""

from __future__ import annotations

import argparse
import sys

import enginespec.spec as spec
from enginespec.entrypoints.cli import impl_arg
from enginespec.testing.fake_model import FakeModel
from enginespec.testing.workload import make_workload

EOS = 0
VOCAB = 1000
SHARED_PREFIX_LEN, MAX_INPUT_LEN, MAX_OUTPUT_LEN = 32, 12, 24  # make_requests' workload
RECOMPUTE_FACTOR = 4  # a request's tokens may be computed again after preemptions


def step_limit(num_requests: int) -> int:
    """The steps after which the simulation counts as stuck: every step that makes progress
    computes at least one token, so a workload needs at most its arrival steps plus every token
    of every request (RECOMPUTE_FACTOR times, for recomputes after preemption), plus slack. A
    fixed 100,000 reported a 100,000-request run (about 100,000 steps of real work) as stuck."""
    per_request = SHARED_PREFIX_LEN + MAX_INPUT_LEN + MAX_OUTPUT_LEN
    return 10_000 + num_requests // 2 + RECOMPUTE_FACTOR * per_request * num_requests


def fake_model(seed: int) -> FakeModel:
    """The simulator's model: about 1 in 40 next tokens is EOS, so requests also stop early."""
    return FakeModel(vocab_size=VOCAB, eos_token_id=EOS, eos_rate=1 / 40, seed=seed)


def make_requests(impl, num_requests: int, seed: int) -> list:
    """Requests opening with one of three 32-token system prompts, each with a short user
    suffix (the shared workload generator, with shared prefixes)."""
    workload = make_workload(
        num_requests,
        min_input_len=2,
        max_input_len=MAX_INPUT_LEN,
        min_output_len=4,
        max_output_len=MAX_OUTPUT_LEN,
        id_bound=VOCAB,
        seed=seed,
        shared_prefix_len=SHARED_PREFIX_LEN,
        num_prefixes=3,
    )
    params = workload.sampling_params(ignore_eos=False)
    return [
        impl.new_request(f"req-{i}", prompt, p, eos_token_id=EOS, arrival_time=float(i))
        for i, (prompt, p) in enumerate(zip(workload.prompts, params))
    ]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="enginespec simulate", description=__doc__.splitlines()[0])
    p.add_argument(
        "--impl",
        type=impl_arg,
        default="reference",
        help="reference (the default), fast, an installed backend's enginespec.impls entry point, "
        "or pkg.module[:attr]",
    )
    p.add_argument("--num-requests", type=int, default=16, help="requests, two arriving a step (default 16)")
    p.add_argument("--block-size", type=int, default=4, help="tokens per KV block (default 4)")
    p.add_argument(
        "--num-blocks", type=int, default=40, help="blocks of the pool (default 40: preemptions happen)"
    )
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=64, help="token budget of a step (default 64)"
    )
    p.add_argument("--max-num-seqs", type=int, default=8, help="most requests in one step (default 8)")
    p.add_argument(
        "--preemption-mode",
        choices=spec.PREEMPTION_MODES,
        default="recompute",
        help="a preempted request's blocks are recomputed later (default) or swapped out",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the fake model (default 0)")
    p.add_argument("--quiet", action="store_true", help="print only the final statistics")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Run the simulation; returns 0 when every request finished and every block is free."""
    args = parse_args(argv)
    impl = spec.load_impl(args.impl)
    config = spec.SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        preemption_mode=args.preemption_mode,
        long_prefill_token_threshold=16,
    )
    bm = impl.new_block_manager(args.num_blocks, args.block_size)
    scheduler = impl.new_scheduler(config, bm)
    pending = make_requests(impl, args.num_requests, args.seed)
    model = fake_model(args.seed)
    num_steps = num_preemptions = num_generated = 0
    max_steps = step_limit(args.num_requests)
    peak_usage = 0.0
    while pending or scheduler.has_unfinished:
        for request in pending[:2]:  # two arrivals per step
            scheduler.add(request)
        pending = pending[2:]
        out = scheduler.schedule()
        sampled = model.sample(out)
        peak_usage = max(peak_usage, bm.usage)
        update = scheduler.update_from_output(out, sampled)
        num_steps += 1
        num_preemptions += len(out.preempted)
        num_generated += sum(len(t) for t in update.new_token_ids.values())
        if not args.quiet:
            print(
                f"step {num_steps:4d}  tokens {out.num_scheduled_tokens:4d}  running {len(scheduler.running):3d}"
                f"  waiting {len(scheduler.waiting):3d}  preempted {len(out.preempted)}"
                f"  swaps {len(out.swap_out)}/{len(out.swap_in)}  free {bm.num_free:4d}"
            )
        if num_steps > max_steps:
            print(f"enginespec simulate: did not finish within {max_steps} steps (stuck)", file=sys.stderr)
            return 1
    all_free = bm.num_free == args.num_blocks
    print(
        f"impl {impl.name}: {args.num_requests} requests, {num_steps} steps, {num_generated} tokens generated, "
        f"{num_preemptions} preemptions"
    )
    print(
        f"block pool: hit rate {bm.hit_rate:.3f}, peak usage {peak_usage:.3f}, "
        f"free {bm.num_free}/{args.num_blocks} at the end"
    )
    return 0 if all_free else 1


if __name__ == "__main__":
    raise SystemExit(main())
