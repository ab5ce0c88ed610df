"""The transformers baseline: `generate` on the same prompts, greedy, left-padded batches in
request order; each batch runs to its longest requested output and only useful tokens count.
"""

from __future__ import annotations

import sys
import time

import torch

from benchmarks.engine_runs import DTYPES, sync
from enginespec.testing.workload import Workload


def _hf_batch(model, prompts: list[list[int]], output_lens: list[int], pad_id: int, device) -> int:
    """Generate one left-padded batch to its longest requested output; return useful tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    new = max(output_lens)
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        pad_token_id=pad_id,
    )
    generated = out.shape[1] - width
    return sum(min(o, generated) for o in output_lens)


def phase_hf(args, model_dir, workload: Workload) -> dict:
    """transformers `generate` on the same prompts, in batches of hf_batch_size (request order)."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    part = workload.head(min(args.hf_num_requests or len(workload.prompts), len(workload.prompts)))
    model = (
        AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=DTYPES[args.dtype]).to(args.device).eval()
    )
    pad_id = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0
    bs = args.hf_batch_size
    chunks = [
        (part.prompts[i : i + bs], part.output_lens[i : i + bs]) for i in range(0, len(part.prompts), bs)
    ]
    with torch.inference_mode():
        warm = [p[:16] for p in part.prompts[:2]]
        _hf_batch(model, warm, [2] * len(warm), pad_id, args.device)  # warm-up: lazy init, kernels
        sync(args.device)
        start = time.perf_counter()
        tokens = sum(
            _hf_batch(model, prompts, outs, pad_id, args.device)
            for prompts, outs in tqdm(chunks, desc="transformers generate", file=sys.stderr)
        )
        sync(args.device)
        wall = time.perf_counter() - start
    attn = getattr(model.config, "_attn_implementation", None)
    del model
    return {
        "wall_s": wall,
        "output_tokens": tokens,
        "requested_output_tokens": part.num_output_tokens,
        "num_requests": len(part.prompts),
        "batch_size": bs,
        "output_tok_s": tokens / wall,
        "attn_implementation": attn,
        "order": "request order, left padding, greedy",
    }
