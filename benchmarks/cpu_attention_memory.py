"""Peak memory of the CPU attention (kernels/reference.py's paged_attention_ref, the fast impl's
path off CUDA) for one prefill chunk at a long context. CPU only; nothing asserts.

    python benchmarks/cpu_attention_memory.py --rows 2048 --context 20000 [--module-file F]

One call in this process: ROWS queries at the end of a CONTEXT-token context, Qwen3-0.6B's heads
(16 query / 8 KV heads, head_dim 128), float32, 16-token blocks in a shuffled table; prints the
growth of the process's peak RSS (ru_maxrss) over the call. --module-file loads another copy of
reference.py instead (an older commit's: `git show REV:kernels/reference.py > old.py`), for A/B
runs; run each case in its own process (the peak never comes down).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module(path):
    if path is None:
        from enginespec.kernels import reference

        return reference
    spec = importlib.util.spec_from_file_location("reference_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2048, help="queries of the prefill chunk (default 2048)")
    p.add_argument("--context", type=int, default=20000, help="tokens of context, the chunk included")
    p.add_argument("--module-file", default=None, help="a reference.py to load instead of enginespec's")
    args = p.parse_args(argv)
    if not 1 <= args.rows <= args.context:
        print(
            f"cpu_attention_memory.py: need 1 <= --rows <= --context, got {args.rows}, {args.context}",
            file=sys.stderr,
        )
        return 2
    ref = _module(args.module_file)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    block, num_q, num_kv, dim = 16, 16, 8, 128
    num_blocks = (args.context + block - 1) // block
    cache = torch.randn(2, num_blocks + 1, block, num_kv, dim)
    table = torch.randperm(num_blocks, dtype=torch.int32)[None]
    q = torch.randn(args.rows, num_q, dim)
    starts = torch.tensor([0, args.rows], dtype=torch.int32)
    lens = torch.tensor([args.context], dtype=torch.int32)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ref.paged_attention_ref(q, cache, starts, lens, table)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(f"rows {args.rows}, context {args.context}: peak RSS grew {grown:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
