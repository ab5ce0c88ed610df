"""How long a finished request's text takes to settle: one `IncrementalDetokenizer.update` of a
whole output plus `flush()`, as `generate()`'s final-only outputs feed it at a request's end,
through the word-level tokenizer of the benchmark shapes (testing/checkpoints.write_tokenizer,
Qwen3's 151,936 ids). Prints the best of --repeat rounds of --number calls, ms a call.

    python3 -m benchmarks.detokenizer_probe [--ids 1000]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import timeit
from pathlib import Path


def settle_ms(num_ids: int, number: int = 20, repeat: int = 5) -> float:
    from transformers import AutoTokenizer

    from enginespec.engine.detokenizer import IncrementalDetokenizer
    from enginespec.spec import SamplingParams
    from enginespec.testing.checkpoints import write_tokenizer

    vocab = 151_936
    with tempfile.TemporaryDirectory() as d:
        write_tokenizer(Path(d), vocab, vocab - 291)
        tokenizer = AutoTokenizer.from_pretrained(d)
    rng = random.Random(0)
    ids = [rng.randrange(vocab) for _ in range(num_ids)]
    params = SamplingParams(max_tokens=max(1, num_ids))

    def once() -> None:
        detok = IncrementalDetokenizer(tokenizer, [1, 2, 3], params)
        detok.update(ids)
        detok.flush()

    return min(timeit.repeat(once, number=number, repeat=repeat)) / number * 1e3


def main(argv=None) -> float:
    p = argparse.ArgumentParser(prog="benchmarks/detokenizer_probe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--ids", type=int, default=1000)
    p.add_argument("--number", type=int, default=20)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    ms = settle_ms(args.ids, args.number, args.repeat)
    print(f"{args.ids} ids: {ms:.3f} ms a settle (best of {args.repeat} x {args.number})")
    return ms


if __name__ == "__main__":
    main()
