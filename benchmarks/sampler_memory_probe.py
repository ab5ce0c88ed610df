"""Does the KV sizing's profile run cover what a served step allocates? (CUDA)

The pool is sized as total * gpu_memory_utilization - (memory in use before) - (the profile
run's activation peak), and the profile run samples greedily. A served step may allocate more:
the sampler's device tables for penalties (int32 counts and a bool prompt mask, [slots, vocab],
grown by doubling), top-p / top-k cuts and logprobs. Whatever a step allocates beyond the
profile's peak comes out of the (1 - utilization) share the engine promised to leave alone, and
past it is an out-of-memory error in the middle of serving.

This starts one engine (the sweep's synthetic shape, max_num_seqs = --rows), then serves
--rows requests at a time under each sampling setting and records the CUDA caching allocator's
peak above what was allocated after startup, against the profile run's activation peak:

    python3 benchmarks/sampler_memory_probe.py [--rows 256] [--out probe.json]
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import decode_sweep  # noqa: E402
from benchmarks.engine_runs import checkpoint, engine_core, make_llm, own_args, shape_of  # noqa: E402
from enginespec.spec import SamplingParams  # noqa: E402

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "t 0.6, top-p 0.9": dict(temperature=0.6, top_p=0.9),
    "top-k 50, min-p 0.05": dict(temperature=1.0, top_k=50, min_p=0.05),
    "penalties": dict(temperature=0.8, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1),
    "logprobs 20": dict(temperature=0.8, logprobs=20),
    "all of them": dict(
        temperature=0.8,
        top_p=0.9,
        top_k=50,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        repetition_penalty=1.1,
        logprobs=20,
    ),  # fmt: skip
}


def served_peak(llm, prompts: list, settings: dict, max_tokens: int) -> int:
    """Bytes the allocator peaked at above its allocation before the call, over one generate()."""
    import torch

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=0, **settings)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def main(argv=None) -> int:
    import argparse

    import torch

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--rows", type=int, default=256)
    own.add_argument("--max-tokens", type=int, default=16)
    extra, rest = own_args(own, argv)
    args = decode_sweep.parse_args(["--batches", str(extra.rows), *rest])
    if torch.device(args.device).type != "cuda":
        raise SystemExit("sampler_memory_probe.py measures the CUDA allocator: run it on a GPU")
    model_dir = checkpoint(args.shape, args)
    shape = shape_of(model_dir, args)
    llm = make_llm(model_dir, args)
    runner = engine_core(llm).runner
    rng = random.Random(args.seed)
    prompts = [
        {"prompt_token_ids": [rng.randrange(min(shape.vocab_size, 10000)) for _ in range(args.prompt_len)]}
        for _ in range(extra.rows)
    ]
    free, total = torch.cuda.mem_get_info()
    util = getattr(runner, "gpu_memory_utilization", None) or args.engine_args.get(
        "gpu_memory_utilization", 0.9
    )
    out = {
        "rows": extra.rows,
        "vocab": shape.vocab_size,
        "profile_bytes": runner.profile_bytes,
        "free_after_startup": free,
        "total": total,
        "left_alone": int(total * (1 - util)),
        "served_peak": {},
    }
    print(
        f"profile run: {runner.profile_bytes}; free after startup {free / 2**20:.0f} MiB of {total / 2**20:.0f}"
    )
    for name, settings in SETTINGS.items():
        peak = served_peak(llm, prompts, settings, extra.max_tokens)
        out["served_peak"][name] = peak
        over = peak - runner.profile_bytes.get("activation_peak", 0)
        print(f"| {name} | {peak / 2**20:.1f} MiB | {over / 2**20:+.1f} MiB over the profile's peak |")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
