"""Draft-model speculation benchmark: acceptance rate and decode speed-up at batch 1 and 32.

Run from the repository root on one GPU (about 3-4 minutes with the checkpoints written once;
they are cached under $ENGINESPEC_SYNTH_DIR or /tmp/enginespec-synth):
    python benchmarks/spec_decode_draft.py --shape qwen3-8b --draft-shape qwen3-0.6b --out spec_draft_8b.json
CPU smoke run (seconds):
    python benchmarks/spec_decode_draft.py --shape tiny --draft-shape tiny --device cpu \
        --batch-sizes 1 4 --max-tokens 16 --passage-len 48 --k 3

Random weights make a draft useless: two random models agree on a next token about 1/vocab of
the time, so a random Qwen3-0.6B-shaped draft ("draft_random") measures the cost of drafting
when nothing is accepted (the lower bound). The upper bound needs a draft that agrees with the
target: both are written as spec_decode.py's cycle checkpoints of one permutation pi (same
vocabulary, same seed), so the 8B target and the 0.6B draft ("draft_cycle") both decode
t -> pi(t) greedily while every matmul, attention and KV write runs at its full cost. Real
drafts land between the two, at their acceptance rate.

Per config (off, draft_cycle, draft_random) one engine over the one loaded target (weights
shared, pools rebuilt), max_num_seqs = the largest batch size. Batch size B: B prompts of the
cycle generated together with max_tokens = N and = 1; decode ms per token = (t_N - t_1) / (N -
1), output tok/s = B (N - 1) / (t_N - t_1); greedy outputs must equal off's. Acceptance rate
(overall and per position) and mean tokens per verification step come from the engine's
counters of that phase.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.engine_runs import reset_prefix_cache, sync  # noqa: E402
from benchmarks.spec_decode import cycle_checkpoint, passage_prompts  # noqa: E402
from enginespec.testing import checkpoints  # noqa: E402


def _stats(engine) -> dict:
    s = engine.stats.spec_decode
    if s is None:
        return {}
    return {
        "num_draft_tokens": s.num_draft_tokens,
        "num_accepted_tokens": s.num_accepted_tokens,
        "acceptance_rate": s.acceptance_rate,
        "acceptance_rate_per_pos": s.acceptance_rate_per_pos,
        "mean_accepted_length": s.mean_accepted_length,
    }


def _generate(llm, prompts, max_tokens: int, device) -> tuple[float, list]:
    from enginespec.spec import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    reset_prefix_cache(llm)
    sync(device)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    sync(device)
    return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outs]


def phase(llm, prompts, max_tokens: int, device) -> dict:
    """One batch size: decode ms per step and output tok/s from t_N - t_1, with the spec
    counters of the N-token run alone."""
    engine = llm.engine
    _generate(llm, prompts, 4, device)  # this batch size's shapes, warm
    t1, _ = _generate(llm, prompts, 1, device)
    if engine.spec is not None:
        engine.spec.reset_stats()
        engine.stats.spec_decode = engine.spec.stats
    tn, outputs = _generate(llm, prompts, max_tokens, device)
    decode = max(tn - t1, 1e-9)
    return {
        "decode_ms_per_token": decode / (max_tokens - 1) * 1e3,
        "output_tok_s": len(prompts) * (max_tokens - 1) / decode,
        "outputs": outputs,
        **_stats(engine),
    }


def run(args) -> dict:
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs, resolve_device, resolve_dtype
    from enginespec.llm import LLM
    from enginespec.spec import load_impl
    from enginespec.worker.flat_model import FlatModel

    root = Path(args.cache_dir) if args.cache_dir else checkpoints.default_dir(args.shape).parent
    target_dir = cycle_checkpoint(args.shape, root / f"{args.shape}-cycle", args.seed, args.device)
    drafts = {
        "draft_cycle": cycle_checkpoint(
            args.draft_shape, root / f"{args.draft_shape}-cycle", args.seed, args.device
        ),
        "draft_random": checkpoints.make_checkpoint(
            args.draft_shape, checkpoints.default_dir(args.draft_shape), device=args.device
        ),
    }
    device = resolve_device(args.device)
    impl = load_impl(args.impl)
    dtype = resolve_dtype(args.dtype, str(target_dir), device)
    target = FlatModel.from_pretrained(
        target_dir, dtype=dtype, device=device, attention=impl.attention_backend(device)
    )
    vocab = target.vocab_size
    prompts = passage_prompts(max(args.batch_sizes), args.passage_len, vocab, args.seed)
    configs: dict = {"off": None}
    for name, path in drafts.items():
        configs[f"{name}_k{args.k}"] = {
            "method": "draft_model",
            "model": str(path),
            "num_speculative_tokens": args.k,
        }
    results: dict = {}
    for name, spec in configs.items():
        started = time.perf_counter()
        engine_args = EngineArgs.from_kwargs(
            str(target_dir),
            impl=impl,
            dtype=args.dtype,
            device=args.device,
            speculative_config=spec,
            max_num_seqs=max(args.batch_sizes),
        )
        llm = LLM.from_engine(EngineCore(engine_args, model=target))
        entry: dict = {"speculative_config": spec, "startup_s": time.perf_counter() - started}
        for b in args.batch_sizes:
            entry[f"batch{b}"] = phase(llm, prompts[:b], args.max_tokens, args.device)
        results[name] = entry
        del llm, engine_args
        gc.collect()  # the engine's pools go before the next engine sizes its own
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(name, json.dumps({k: _brief(v) for k, v in entry.items()}, default=str), flush=True)
    _compare(results, args.batch_sizes)
    return results


def _brief(value):
    return {k: v for k, v in value.items() if k != "outputs"} if isinstance(value, dict) else value


def _compare(results: dict, batch_sizes) -> None:
    """speedup_vs_off and outputs_equal_to_off per batch size; outputs dropped from the report."""
    off = results["off"]
    for entry in results.values():
        for b in batch_sizes:
            phase_ = entry[f"batch{b}"]
            base = off[f"batch{b}"]
            phase_["speedup_vs_off"] = base["decode_ms_per_token"] / phase_["decode_ms_per_token"]
            phase_["outputs_equal_to_off"] = phase_["outputs"] == base["outputs"]
    for entry in results.values():
        for b in batch_sizes:
            entry[f"batch{b}"].pop("outputs")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(checkpoints.SHAPES))
    p.add_argument("--draft-shape", default="qwen3-0.6b", choices=sorted(checkpoints.SHAPES))
    p.add_argument("--impl", default="fast")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--passage-len", type=int, default=256, help="prompt length (tokens of the cycle)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--cache-dir", default=None, help="where the cycle checkpoints go")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    report = {"args": vars(args), "results": run(args)}
    text = json.dumps(report, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text if not args.out else f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
