"""Where a speculative (verification) step's time goes at batch 1: torch.profiler over one
greedy generate with n-gram speculation on the cycle checkpoint (benchmarks/spec_decode.py),
the top ops by host time and by device time, and torch.compile's recompile counters.

    python3 benchmarks/spec_step_profile.py [--shape qwen3-0.6b] [--tokens 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.spec_decode import QUOTE, cycle_checkpoint, passage_prompts
from enginespec.spec import SamplingParams


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen3-0.6b")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    from enginespec.llm import LLM

    model_dir = cycle_checkpoint(args.shape, Path(tempfile.mkdtemp()) / "m", 0, args.device)
    spec = {
        "method": "ngram",
        "num_speculative_tokens": args.k,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    llm = LLM(str(model_dir), device=args.device, speculative_config=spec)
    prompt = passage_prompts(1, 600, llm.engine.vocab_size, 0)[0]
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    llm.generate([prompt], params, use_tqdm=False)  # warm
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        out = llm.generate([prompt], params, use_tqdm=False)
        torch.cuda.synchronize() if args.device != "cpu" else None
    steps = llm.engine.stats.num_steps
    print(
        f"steps {steps}, tokens {len(out[0].outputs[0].token_ids)}, quote ok {out[0].outputs[0].token_ids[:8] == prompt[QUOTE : QUOTE + 8]}"
    )
    table = prof.key_averages()
    print(table.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    if args.device != "cpu":
        print(table.table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60))
    from torch._dynamo.utils import counters

    print("dynamo counters:", {k: dict(v) for k, v in counters.items() if v})
    return 0


if __name__ == "__main__":
    sys.exit(main())
