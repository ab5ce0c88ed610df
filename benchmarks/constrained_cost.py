"""What a constrained request costs a decode step: ms per step of B equal requests (B in
--batches), each run once plain and once per kind of constraint, on one engine.

    python3 benchmarks/constrained_cost.py [--shape qwen3-0.6b] [--batches 1,8,32] [--tokens 128]
CPU smoke: --shape tiny --device cpu --batches 1,2 --tokens 8 --reps 1

Cases (every request of a run alike; ignore_eos, so each run is exactly --tokens steps of B
rows after its prefill):
- `greedy` and `t0.6`: no constraint (the device sampler's batches, the baselines);
- `bad_words`: two banned one-token words (until 2026-12-05 the host sampler; then the step
  before resolved first and the bans applied on the device, as for a grammar's mask; since the
  thirty-ninth session one-token words need no resolve: they ban whatever came before);
- `bad_pair`: one banned two-token word (bad_words_token_ids ((7, 8),)): its ban reads the
  newest token, so each step resolves the step before first, then bans on the device;
- `regex`: StructuredOutputsParams(regex=...) that about half the vocabulary can follow
  (xgrammar's bitmask filled on the host each step, applied before the draw).
- `one_regex`: the first request as in `regex`, the others greedy: what one constrained
  request costs the batch it rides in (until 0c70056 such a step was sampled serially, every
  row of it; since, it resolves the step before, masks, and draws on the device).

A synthetic shape's tokenizer spells token i "w{i}", so the regex `(w[1-4][0-9]*)+` allows the
ids whose first digit is 1-4 and every output stays in it. The ratio column is each case's step
over the greedy one at the same B; after it, from one more run with the engine's step trace on,
the decode steps' median wall and host wait and the steps that resolved first. Writes --out JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_runs import add_model_args, check_model_dir, checkpoint, engine_core, make_llm, sync  # noqa: E402
from enginespec.spec import SamplingParams  # noqa: E402
from enginespec.spec.structured_outputs import StructuredOutputsParams  # noqa: E402

REGEX = "(w[1-4][0-9]*)+"


def batch_params(case: str, tokens: int, batch: int) -> list[SamplingParams]:
    """Each request's SamplingParams in a run of `case`."""
    if case == "one_regex":
        return [case_params("regex", tokens)] + [case_params("greedy", tokens)] * (batch - 1)
    return [case_params(case, tokens)] * batch


def case_params(case: str, tokens: int) -> SamplingParams:
    """The SamplingParams of one case: `tokens` outputs exactly (ignore_eos)."""
    base = dict(max_tokens=tokens, ignore_eos=True, temperature=0.0)
    if case == "t0.6":
        base["temperature"] = 0.6
    elif case == "bad_words":
        base["bad_words"] = ["w7", "w8"]
    elif case == "bad_pair":
        base["bad_words_token_ids"] = ((7, 8),)
    elif case == "regex":
        base["structured_outputs"] = StructuredOutputsParams(regex=REGEX)
    elif case != "greedy":
        raise ValueError(f"case must be greedy, t0.6, bad_words, bad_pair or regex, got {case!r}")
    return SamplingParams(**base)


def time_case(llm, device, batch: int, case: str, tokens: int, prompt_len: int, reps: int = 3) -> dict:
    """One warm-up generate of the case, then `reps` timed ones interleaved with one-token runs
    of the same requests: ms per decode step = (median long run - median one-token run) /
    (tokens - 1), so the prefill is excluded and one slow run does not carry into the figure
    (until 2026-12-05 one run of each: the same batch-1 requests read 1.163 and 1.347 ms in two
    cases of the thirty-eighth session's table)."""
    prompts = [[100 + (7 * i + j) % 900 for j in range(prompt_len)] for i in range(batch)]

    def run(n: int) -> tuple[float, list]:
        sync(device)
        start = time.perf_counter()
        outs = llm.generate(prompts, batch_params(case, n, batch), use_tqdm=False)
        sync(device)
        return time.perf_counter() - start, outs

    run(tokens)  # compiles, captures, fills the grammar cache
    ones, walls = [], []
    for _ in range(reps):
        ones.append(run(1)[0])
        wall, outs = run(tokens)
        walls.append(wall)
    one, wall = statistics.median(ones), statistics.median(walls)
    trace = traced_run(llm, run, tokens)
    lengths = {len(o.outputs[0].token_ids) for o in outs}
    constrained = outs if case == "regex" else outs[:1] if case == "one_regex" else []
    # the text is the words spaced; the grammar saw them joined
    held = [re.fullmatch(REGEX, "".join(o.outputs[0].text.split())) is not None for o in constrained]
    reasons = {o.outputs[0].finish_reason for o in outs}
    return {
        "batch": batch,
        "case": case,
        "wall_s": wall,
        "walls_s": walls,
        "ms_per_step": (wall - one) * 1e3 / (tokens - 1),
        "output_lens": sorted(lengths),
        "finish_reasons": sorted(str(r) for r in reasons),
        "regex_held": all(held) if held else None,
        **trace,
    }


def traced_run(llm, run, tokens: int) -> dict:
    """One more long run with the engine's step trace on: the decode steps' wall (stamp to stamp)
    and the host's wait for the device inside each (medians, ms), and how many steps resolved
    the step before first (EngineStats.num_resolved_first): a constrained case slower than greedy
    with the same wait has more host work a step; with more wait, more device work or a sync."""
    core = engine_core(llm)
    if core is None:
        return {}
    core.stats.step_trace, resolved0 = [], core.stats.num_resolved_first
    try:
        run(tokens)
        steps = core.stats.step_trace
    finally:
        core.stats.step_trace = None
    decode = [i for i in range(1, len(steps)) if steps[i][1] == steps[i][0]]  # one token a row
    walls = [(steps[i][3] - steps[i - 1][3]) * 1e3 for i in decode]
    waits = [steps[i][4] * 1e3 for i in decode]
    return {
        "step_ms_median": statistics.median(walls) if walls else None,
        "wait_ms_median": statistics.median(waits) if waits else None,
        "num_resolved_first": core.stats.num_resolved_first - resolved0,
    }


CASES = ("greedy", "t0.6", "bad_words", "bad_pair", "regex", "one_regex")
HEADER = (
    "| batch | case | ms/step | over greedy | output lens, finish reasons | traced decode steps (ms) |\n"
    "| ---: | --- | ---: | ---: | --- | --- |"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/constrained_cost.py", description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes, each >= 1")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    p.add_argument("--tokens", type=int, default=128, help="outputs per request, >= 2")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--reps", type=int, default=3, help="timed runs of each case (medians)")
    p.add_argument("--out", default="constrained_cost.json")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and check every number before any work; ValueError naming the flag and its bound.
    --tokens >= 2: the per-step figure divides by tokens - 1 (the one-token run is the prefill)."""
    from enginespec.engine_args import resolve_device

    args = build_parser().parse_args(argv)
    try:
        args.batch_sizes = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--batches must be comma-separated ints >= 1, got {args.batches!r}") from None
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        raise ValueError(f"--batches must be comma-separated ints >= 1, got {args.batches!r}")
    args.case_names = [c for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in args.case_names if c not in CASES]
    if unknown or not args.case_names:
        raise ValueError(f"--cases must be of {', '.join(CASES)}, got {args.cases!r}")
    for name, bound in (("tokens", 2), ("prompt_len", 1), ("reps", 1)):
        if getattr(args, name) < bound:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {bound}, got {getattr(args, name)}")
    check_model_dir(args)
    args.engine_args = {}
    args.device = resolve_device(args.device)
    return args


def main(argv=None) -> int:
    """The command line; exit 2 with a one-line message on a bad flag."""
    try:
        args = parse_args(argv)
    except ValueError as e:
        print(f"benchmarks/constrained_cost.py: {e}", file=sys.stderr)
        return 2
    llm = make_llm(checkpoint(args.shape, args), args)
    rows = []
    print(HEADER)
    for batch in args.batch_sizes:
        base = None
        for case in args.case_names:
            row = time_case(llm, args.device, batch, case, args.tokens, args.prompt_len, args.reps)
            base = row["ms_per_step"] if case == "greedy" else base
            row["over_greedy"] = row["ms_per_step"] / base if base else None
            rows.append(row)
            ratio = "n/a" if row["over_greedy"] is None else f"{row['over_greedy']:.2f}"
            traced = " |"
            if row.get("step_ms_median") is not None:
                traced = (
                    f" step {row['step_ms_median']:.3f}, wait {row['wait_ms_median']:.3f},"
                    f" resolved first {row['num_resolved_first']} |"
                )
            print(
                f"| {batch} | {case} | {row['ms_per_step']:.3f} | {ratio} | {row['output_lens']} {row['finish_reasons']} |{traced}"
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"shape": args.shape, "device": str(args.device), "rows": rows}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
