"""The engine soak at full size: >= 10,000 requests through one impl with random aborts,
injected faults at every phase, preemption by recompute and by swap, async scheduling on and
off, four tenants (cache salts); the tiny Qwen3 checkpoint on CPU. Prints the figures
(benchmarks/RESULTS.md records a run).

    python benchmarks/soak.py --impl fast --requests 10000 --seed 0

--mix features gives the requests bad_words, truncate_prompt_tokens, structured outputs,
logprobs=-1, seed=-1 and n=2 (conformance/soak.py's FEATURE_VARIANTS; needs xgrammar);
--speculative ngram turns n-gram speculation on. The defaults reproduce the earlier figures.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from enginespec.conformance.soak import MIXES, run_soak
from enginespec.spec import load_impl
from enginespec.testing.checkpoints import use_cache_root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="fast")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mix", choices=MIXES, default="plain")
    parser.add_argument("--speculative", choices=["ngram"], default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="enginespec-soak-") as tmp:
        use_cache_root(tmp)  # the tiny checkpoint is built here and goes away with the run
        figures = run_soak(load_impl(args.impl), args.requests, args.seed, args.mix, args.speculative)
    print(f"soak: impl={args.impl} seed={args.seed} mix={args.mix} speculative={args.speculative}")
    for line in figures.lines():
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
