"""OutputProcessor's own rules, checked without an engine: the per-tokenizer cache of token texts."""

from __future__ import annotations

from enginespec.engine.output_processor import OutputProcessor
from enginespec.outputs import Logprob


class CountingTokenizer:
    """decode([id]) is `prefix` + the id; each call is recorded."""

    def __init__(self, prefix: str):
        self.prefix, self.calls = prefix, []

    def decode(self, ids):
        self.calls.append(list(ids))
        return "".join(f"{self.prefix}{i}" for i in ids)


def test_token_texts_are_decoded_once_per_id_and_per_tokenizer():
    """name_tokens caches a token's text for the tokenizer that decoded it: the same id named
    again under that tokenizer is not decoded again, and under another tokenizer it takes that
    tokenizer's text (never the first one's cached text)."""
    processor = OutputProcessor(lambda *a: None, placeholder_id=96)
    first, second = CountingTokenizer("a"), CountingTokenizer("b")
    entries = [{5: Logprob(-0.5, 1), 7: Logprob(-1.5, 2)} for _ in range(3)]
    processor.name_tokens(entries[0], first)
    processor.name_tokens(entries[1], first)
    assert [lp.decoded_token for lp in entries[1].values()] == ["a5", "a7"]
    assert first.calls == [[5], [7]]  # once per id
    processor.name_tokens(entries[2], second)
    assert [lp.decoded_token for lp in entries[2].values()] == ["b5", "b7"]
    assert second.calls == [[5], [7]]
