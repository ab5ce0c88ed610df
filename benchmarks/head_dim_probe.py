"""Odd head dims on the device: one process builds several fast-impl engines in a row, bf16,
CUDA graphs on, and compares each one's greedy tokens with the same model run eagerly.

Why: a reviewer saw cudaErrorIllegalAddress once, in warm-up, for a Qwen3 of head_dim 80 in a
process that had already run five engines (forty-fourth session); a fresh process ran it. This
probe repeats that order (other head dims first, then 80, twice) and reports per engine: built,
generated, and how many of its greedy tokens equal the eager run's (bf16: a few may differ at
near-ties; a crash or a row of garbage is the fault). Run it again under CUDA_LAUNCH_BLOCKING=1
or compute-sanitizer when it fails.

    python3 benchmarks/head_dim_probe.py --head-dims 16,64,128,32,96,80,80 --out probe.json
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import traceback
from pathlib import Path


def _prompts():
    return [{"prompt_token_ids": [(7 * i + 3 * j) % 90 + 4 for j in range(5 + 9 * i)]} for i in range(11)]


def _tokens(path, eager: bool, max_tokens: int, device: str):
    from enginespec import LLM, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm = LLM(str(path), impl="fast", dtype="bfloat16", device=device, enforce_eager=eager, max_num_seqs=16)
    try:
        return [list(o.outputs[0].token_ids) for o in llm.generate(_prompts(), params, use_tqdm=False)]
    finally:
        llm.close()
        del llm
        gc.collect()


def probe(head_dim: int, root: Path, max_tokens: int, device: str = "cuda") -> dict:
    """One head dim: the checkpoint, a graphs-on engine, an eager engine, their agreement."""
    import torch

    from enginespec.testing.checkpoints import make_checkpoint

    path = make_checkpoint("qwen3", root / f"hd{head_dim}", seed=5, head_dim=head_dim)
    row = {"head_dim": head_dim}
    try:
        graphs = _tokens(path, eager=False, max_tokens=max_tokens, device=device)
        if device == "cuda":
            torch.cuda.synchronize()
        eager = _tokens(path, eager=True, max_tokens=max_tokens, device=device)
        same = sum(a == b for g, e in zip(graphs, eager) for a, b in zip(g, e))
        row.update(ok=True, tokens=sum(map(len, graphs)), equal_to_eager=same)
    except Exception as exc:  # the probe reports, it does not stop at the first fault
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:400], trace=traceback.format_exc()[-1500:])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dims", default="16,64,128,32,96,80,80")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for head_dim in (int(h) for h in args.head_dims.split(",")):
            row = probe(head_dim, Path(tmp), args.max_tokens, args.device)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)
            if not row["ok"]:
                print(row["trace"], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
