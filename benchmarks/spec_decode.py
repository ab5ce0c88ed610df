"""Speculative decoding benchmark: batch-1 decode speed with n-gram speculation on a workload
whose continuation repeats a quoted passage, and nano-vllm's throughput workload with
speculation on vs off (it must not hurt when it does not help: target >= 0.95x).

Run from the repository root on one GPU:
    python benchmarks/spec_decode.py --shape qwen3-0.6b --out spec_decode.json
    python benchmarks/spec_decode.py --shape qwen3-8b --skip-throughput --out spec_decode_8b.json
The throughput target alone (nano-vllm's workload at temperatures 0 and 0.6; off, n-gram k = 4
with the defaults, and k = 4 with every draft made wrong; ratios to off):
    python benchmarks/spec_decode.py --skip-batch1 --out spec_throughput.json
CPU smoke run (seconds):
    python benchmarks/spec_decode.py --shape tiny --device cpu --num-requests 8 --passage-len 96 \
        --max-tokens 48 --max-input-len 64 --max-output-len 32

The repetitive workload needs a model whose greedy continuation repeats a passage, which
random weights do not give. `cycle_checkpoint` writes a random-weight checkpoint of the shape
(untied head) whose every layer's o_proj and down_proj are zero, so the residual stream stays
the current token's embedding, and whose head row pi(t) is token t's embedding: greedy decoding
then follows one cycle t -> pi(t) over the vocabulary (a margin of sqrt(hidden) standard
deviations over every other logit). Every matmul, attention and KV write still runs at full
cost. Prompts are a passage of the cycle (passage_len tokens) followed by its first 16 tokens
quoted again, so the continuation repeats the passage, as in a model quoting a document; the
n-gram drafter finds it in the prompt.

Batch-1 phase, per config (off, ngram k = 2, 4, 6...): decode ms/token = (time of max_tokens
= N) - (time of max_tokens = 1) over N - 1, per prompt, median over prompts; greedy outputs
must be identical to off's; acceptance rate (overall and per draft position) and mean tokens
per verification step. Throughput phase: the standard random-weight checkpoint and
make_workload's nano-vllm workload, per config and --temperatures (greedy, and nano-vllm's
bench setting 0.6) one warm-up and one timed generate, output tok/s and the ratio to off at
the same temperature, and whether the greedy outputs are equal. On that checkpoint (random
bf16 weights, tied head) greedy output repeats one token, so prompt lookup's drafts are
accepted (about 90% on a CPU probe of the shape), while at temperature 0.6 the logits are
nearly flat, the output is random, and nothing is ever drafted. Its configs: off; ngram with
k = --throughput-k and the config's defaults (SpeculativeConfig: adaptive drafting on,
disable_by_batch_size 64); the same without the cut-off (None); the same with every draft made wrong (`RejectedDrafter`: the
case "speculation must not hurt when it does not help" with drafts proposed); and, with --disable-by-batch-size N,
ngram with that cut-off. Target: every speculative config >= 0.95x off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.engine_runs import engine_core, reset_prefix_cache, sync, timed_generate, warm_up  # noqa: E402
from enginespec.engine.spec_decode import Drafter  # noqa: E402
from enginespec.testing import checkpoints  # noqa: E402
from enginespec.testing.workload import make_workload  # noqa: E402

QUOTE = 16  # tokens of the passage quoted again at the end of the prompt


def cycle_permutation(vocab: int, seed: int) -> list[int]:
    """pi as a list: one cycle through every id, in a seeded random order."""
    order = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed)).tolist()
    pi = [0] * vocab
    for i, t in enumerate(order):
        pi[t] = order[(i + 1) % vocab]
    return pi


def cycle_checkpoint(shape: str, path: Path, seed: int, device: str) -> Path:
    """The shape's random checkpoint, rewritten so that greedy decoding follows pi (module doc)."""
    from safetensors.torch import load_file, save_file

    path = checkpoints.make_checkpoint(shape, path, seed=seed, device=device, tie_word_embeddings=False)
    marker = path / ".cycle-done"
    if marker.exists():
        return path
    shards = sorted(path.glob("model*.safetensors"))
    embed = None
    for shard in shards:
        tensors = load_file(str(shard))
        embed = tensors.get("model.embed_tokens.weight", embed)
    assert embed is not None, "no model.embed_tokens.weight in the checkpoint"
    pi = torch.tensor(cycle_permutation(embed.shape[0], seed))
    head = torch.empty_like(embed)
    head[pi] = embed  # row pi(t) = embedding of t
    for shard in shards:
        tensors = load_file(str(shard))
        for name in list(tensors):
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                tensors[name] = torch.zeros_like(tensors[name])
            if name == "lm_head.weight":
                tensors[name] = head
        save_file(tensors, str(shard), metadata={"format": "pt"})
    marker.write_text("ok")
    return path


def passage_prompts(num: int, passage_len: int, vocab: int, seed: int) -> list[list[int]]:
    """Prompts: a stretch of the cycle, then its first QUOTE tokens again."""
    pi = cycle_permutation(vocab, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    prompts = []
    for _ in range(num):
        t = int(torch.randint(vocab, (1,), generator=gen))
        passage = []
        for _ in range(passage_len):
            passage.append(t)
            t = pi[t]
        prompts.append(passage + passage[:QUOTE])
    return prompts


class RejectedDrafter(Drafter):
    """The engine's drafter with every draft token shifted by one id: same proposals (same
    steps, same counts, same lagged look-ups), each rejected at its first position under
    greedy decoding unless the target's choice happens to be that shifted id."""

    def __init__(self, inner: Drafter, vocab: int):
        self.inner, self.vocab = inner, vocab

    def propose_batch(self, requests, num_reals, max_drafts) -> list[list[int]]:
        found = self.inner.propose_batch(requests, num_reals, max_drafts)
        return [[(t + 1) % self.vocab for t in drafts] for drafts in found]

    def first_to_propose(self, requests, num_reals):
        return self.inner.first_to_propose(requests, num_reals)

    def forget(self, request_id: str) -> None:
        self.inner.forget(request_id)


def spec_stats(llm) -> dict:
    spec = engine_core(llm).spec
    stats = getattr(engine_core(llm).stats, "spec_decode", None)
    if stats is None or spec is None:
        return {}
    return {
        "num_disabled_steps": spec.num_disabled_steps,
        "num_drafts": stats.num_drafts,
        "num_draft_tokens": stats.num_draft_tokens,
        "num_accepted_tokens": stats.num_accepted_tokens,
        "acceptance_rate": stats.acceptance_rate,
        "acceptance_rate_per_pos": stats.acceptance_rate_per_pos,
        "mean_accepted_length": stats.mean_accepted_length,
    }


def _timed(llm, prompt: list[int], max_tokens: int, device) -> tuple[float, list[int]]:
    from enginespec.spec import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    reset_prefix_cache(llm)
    sync(device)
    start = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    sync(device)
    return time.perf_counter() - start, list(out[0].outputs[0].token_ids)


def batch1(args, model_dir: Path, vocab: int, configs: dict) -> dict:
    from enginespec.llm import LLM

    prompts = passage_prompts(args.num_prompts, args.passage_len, vocab, args.seed)
    results, reference = {}, None
    for name, spec in configs.items():
        llm = LLM(
            str(model_dir), impl=args.impl, dtype=args.dtype, device=args.device, speculative_config=spec
        )
        _timed(llm, prompts[0], 8, args.device)  # warm-up: compile, graphs, kernels
        per_token, outputs = [], []
        for prompt in prompts:
            t1, _ = _timed(llm, prompt, 1, args.device)
            tn, tokens = _timed(llm, prompt, args.max_tokens, args.device)
            per_token.append((tn - t1) / (args.max_tokens - 1) * 1e3)
            outputs.append(tokens)
        reference = outputs if reference is None else reference
        repeats = sum(o == p[QUOTE : QUOTE + len(o)] for o, p in zip(outputs, prompts))
        results[name] = {
            "speculative_config": spec,
            "decode_ms_per_token": statistics.median(per_token),
            "decode_ms_per_token_all": per_token,
            "outputs_equal_to_off": outputs == reference,
            "outputs_repeating_the_passage": repeats,
            **spec_stats(llm),
        }
        print(name, json.dumps({k: v for k, v in results[name].items() if k != "decode_ms_per_token_all"}))
        del llm
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    base = results["off"]["decode_ms_per_token"]
    for r in results.values():
        r["speedup_vs_off"] = base / r["decode_ms_per_token"]
    return results


def throughput(args, configs: dict) -> dict:
    from enginespec.llm import LLM

    model_dir = checkpoints.make_checkpoint(
        args.shape, checkpoints.default_dir(args.shape), device=args.device
    )
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    workload = make_workload(
        args.num_requests,
        max_input_len=args.max_input_len,
        max_output_len=args.max_output_len,
        min_input_len=min(100, args.max_input_len),
        min_output_len=min(100, args.max_output_len),
        id_bound=min(10000, vocab),
    )
    runs: dict = {}
    for name, spec in configs.items():
        rejected = spec is not None and spec.pop("rejected", False)
        llm = LLM(
            str(model_dir), impl=args.impl, dtype=args.dtype, device=args.device, speculative_config=spec
        )
        core = engine_core(llm)
        if rejected:
            core.spec.drafter = RejectedDrafter(core.spec.drafter, vocab)
        for temperature in args.temperatures:
            run = _one_run(llm, core, workload, args.device, temperature)
            entry = {"speculative_config": spec, "rejected_drafts": rejected, **run}
            runs.setdefault(f"t{temperature:g}", {})[name] = entry
            print(f"t{temperature:g}", name, json.dumps(entry, default=str))
        del llm, core
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    for temperature, results in runs.items():
        off = results["off"]
        for r in results.values():
            r["throughput_vs_off"] = r["output_tok_s"] / off["output_tok_s"]
            if temperature == "t0":  # sampled runs draw differently from run to run
                r["outputs_equal_to_off"] = r["tokens_digest"] == off["tokens_digest"]
        print(
            temperature,
            "throughput vs off:",
            {n: round(r["throughput_vs_off"], 3) for n, r in results.items()},
        )
    return runs


def _one_run(llm, core, workload, device, temperature: float) -> dict:
    """Warm-up, then one timed generate at `temperature`, with the timed run's counters."""
    warm_up(llm, workload, device, temperature)
    if core.spec is not None:
        core.spec.reset_stats()
        core.spec.num_disabled_steps = 0
        core.stats.spec_decode = core.spec.stats
    run = timed_generate(llm, workload, device, temperature, use_tqdm=False)
    return {**run, **spec_stats(llm)}


def throughput_configs(args, ngram: dict) -> dict:
    """off, n-gram with k = --throughput-k (the config's defaults: the batch cut-off included),
    the same without the cut-off, the same with rejected drafts, and with
    --disable-by-batch-size if given."""
    k = args.throughput_k
    base = {**ngram, "num_speculative_tokens": k}
    configs: dict = {"off": None, f"ngram_k{k}": dict(base)}
    configs[f"ngram_k{k}_nocutoff"] = {**base, "disable_by_batch_size": None}
    if not args.skip_rejected:
        configs[f"ngram_k{k}_rejected"] = {**base, "rejected": True}
    if args.disable_by_batch_size is not None:
        name = f"ngram_k{k}_disable{args.disable_by_batch_size}"
        configs[name] = {**base, "disable_by_batch_size": args.disable_by_batch_size}
    return configs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="qwen3-0.6b", choices=sorted(checkpoints.SHAPES))
    p.add_argument("--impl", default="fast")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--passage-len", type=int, default=600)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--k", type=int, nargs="+", default=[2, 4, 6], help="num_speculative_tokens to try")
    p.add_argument("--prompt-lookup-min", type=int, default=2)
    p.add_argument("--prompt-lookup-max", type=int, default=4)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--max-input-len", type=int, default=1024)
    p.add_argument("--max-output-len", type=int, default=1024)
    p.add_argument(
        "--throughput-k", type=int, default=4, help="num_speculative_tokens of the throughput phase"
    )
    p.add_argument("--disable-by-batch-size", type=int, default=None, help="also run ngram with this cut-off")
    p.add_argument(
        "--skip-rejected", action="store_true", help="no rejected-drafts config in the throughput phase"
    )
    p.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        default=[0.0, 0.6],
        help="throughput phase: greedy (the random checkpoint repeats a token: drafts accepted) "
        "and nano-vllm's 0.6 (flat logits: nothing to draft)",
    )
    p.add_argument("--skip-batch1", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--cache-dir", default=None, help="where the cycle checkpoint goes (default: temp dir)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.max_tokens + QUOTE > args.passage_len:
        p.error("--passage-len must be >= --max-tokens + 16 (the continuation must stay in the passage)")
    configs: dict = {"off": None}
    for k in args.k:
        configs[f"ngram_k{k}"] = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": args.prompt_lookup_min,
            "prompt_lookup_max": args.prompt_lookup_max,
        }
    report: dict = {"args": vars(args)}
    if not args.skip_batch1:
        root = Path(args.cache_dir) if args.cache_dir else checkpoints.default_dir(args.shape).parent
        model_dir = cycle_checkpoint(args.shape, root / f"{args.shape}-cycle", args.seed, args.device)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        report["batch1"] = batch1(args, model_dir, vocab, configs)
    if not args.skip_throughput:
        ngram = {"method": "ngram", "prompt_lookup_min": args.prompt_lookup_min}
        ngram["prompt_lookup_max"] = args.prompt_lookup_max
        report["throughput"] = throughput(args, throughput_configs(args, ngram))
    text = json.dumps(report, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text if not args.out else f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
