"""IncrementalDetokenizer: text equals a full decode, partial UTF-8 is never emitted, stop
strings are matched across token boundaries, excluded from the text, and the first to complete
wins, whatever the token split.

Two tiny tokenizers built with the `tokenizers` library: a byte-level BPE (multi-byte characters
split over several tokens, as in Qwen's and Llama 3's tokenizers) and a WordLevel tokenizer
whose decoder joins tokens with spaces.
"""

from __future__ import annotations

import functools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginespec.engine.detokenizer import IncrementalDetokenizer, StopPrefixes
from enginespec.spec import SamplingParams

CORPUS = ["hello world, stop here. 你好 世界 🙂 héllo wörld ab abc abcd STOP"] * 8
ALPHABET = "ab cdST.你好🙂é"


@functools.lru_cache(maxsize=None)
def byte_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@functools.lru_cache(maxsize=None)
def word_level(clean_up: bool = False):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "</s>", "a", "b", "c", "d", "stop", "x", ".", "n't"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(cleanup=False)  # joins tokens with spaces, no clean-up
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="</s>", clean_up_tokenization_spaces=clean_up
    )


@functools.lru_cache(maxsize=None)
def metaspace():
    """SentencePiece-style pieces ('▁' marks a word start; Llama 2 / Mistral decoders drop the
    first one): decoding a window must not lose or add the spaces a full decode has."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "</s>", "▁a", "▁b", "c", "d", "▁", "▁stop", "é", "▁你", "好"]
    tok = Tokenizer(models.WordLevel(vocab={p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


@functools.lru_cache(maxsize=None)
def byte_fallback():
    """A SentencePiece BPE with byte fallback (Llama 2, Mistral): a character without a piece is
    written as <0xNN> byte tokens, and the decoder renders a run of byte tokens that is not
    valid UTF-8 as a whole as one U+FFFD per byte, the run's valid characters included."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "▁", "a", "b", "▁a", "▁b"]
    tok = Tokenizer(
        models.BPE(
            vocab={p: i for i, p in enumerate(pieces)},
            merges=[("▁", "a"), ("▁", "b")],
            byte_fallback=True,
            unk_token="<unk>",
        )
    )
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        clean_up_tokenization_spaces=False,
    )


def fallback_ids(text: str) -> list[int]:
    """`text` as byte_fallback()'s byte tokens, one per UTF-8 byte."""
    return byte_fallback().convert_tokens_to_ids([f"<0x{b:02X}>" for b in text.encode("utf-8")])


def _byte_char(b: int) -> str:
    """The printable stand-in the byte-level alphabet uses for byte b."""
    if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
        return chr(b)
    others = [c for c in range(256) if not (33 <= c <= 126 or 161 <= c <= 172 or 174 <= c <= 255)]
    return chr(256 + others.index(b))


def byte_ids(text: str) -> list[int]:
    """One token per UTF-8 byte: the worst split, every multi-byte character cut apart."""
    tok = byte_bpe()
    return [tok.convert_tokens_to_ids(_byte_char(b)) for b in text.encode("utf-8")]


PROMPT = [1, 2]


def after_prompt(tokenizer, ids, prompt=PROMPT) -> str:
    """What decoding `ids` after the prompt adds to the prompt's own text: the output's text
    (the detokenizer decodes the prompt's last ids as the output's left context, as vLLM does)."""
    return tokenizer.decode(list(prompt) + list(ids))[len(tokenizer.decode(list(prompt))) :]


def run(tokenizer, ids, params, chunks, prompt=PROMPT):
    """Feed ids in chunks of the given sizes; return (deltas, stop, detokenizer)."""
    detok = IncrementalDetokenizer(tokenizer, prompt, params)
    deltas, stop, pos = [], None, 0
    for size in chunks:
        delta, stop = detok.update(ids[pos : pos + size])
        deltas.append(delta)
        pos += size
        if stop is not None:
            break
    if stop is None:
        deltas.append(detok.flush())
    return deltas, stop, detok


def chunking(rng: random.Random, n: int) -> list[int]:
    sizes = []
    while sum(sizes) < n:
        sizes.append(rng.randint(1, 3))
    return sizes


def first_stop(text: str, stops) -> tuple[str, str | None]:
    """Reference: the occurrence that ends first (then starts first) cuts the text."""
    best = None
    for s in stops:
        i = text.find(s)
        while i >= 0:
            cand = (i + len(s), i, s)
            best = cand if best is None or cand[:2] < best[:2] else best
            i = text.find(s, i + 1)
    return (text, None) if best is None else (text[: best[1]], best[2])


# ---------------------------------------------------------------- no stop strings


@pytest.mark.parametrize("seed", range(6))
def test_text_equals_full_decode_for_valid_text(seed):
    rng = random.Random(seed)
    tok = byte_bpe()
    text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 30)))
    for ids in (tok.encode(text), byte_ids(text)):
        deltas, stop, detok = run(tok, ids, SamplingParams(), chunking(rng, len(ids)))
        assert stop is None
        assert detok.text == tok.decode(ids) == text
        assert "".join(deltas) == text
        assert not any("\ufffd" in d for d in deltas), deltas


def test_partial_utf8_is_held_until_complete():
    tok = byte_bpe()
    ids = byte_ids("a🙂")  # 'a' then four byte tokens
    detok = IncrementalDetokenizer(tok, [1], SamplingParams())
    assert detok.update(ids[:1]) == ("a", None)
    for i in ids[1:4]:
        assert detok.update([i]) == ("", None)
        assert detok.text == "a"
    assert detok.update(ids[4:]) == ("🙂", None)


@given(st.lists(st.integers(0, 319), min_size=1, max_size=25), st.randoms(use_true_random=False))
def test_arbitrary_ids_decode_like_full_decode(ids, rng):
    """Even invalid byte sequences end up exactly as a full decode renders them."""
    tok = byte_bpe()
    deltas, stop, detok = run(tok, ids, SamplingParams(), chunking(rng, len(ids)))
    want = tok.decode(ids, skip_special_tokens=True)
    assert detok.text == want
    assert "".join(deltas) == want


@given(st.lists(st.integers(2, 10), min_size=1, max_size=20), st.randoms(use_true_random=False))
def test_metaspace_windows_keep_spaces(ids, rng):
    tok = metaspace()
    deltas, _, detok = run(tok, ids, SamplingParams(), chunking(rng, len(ids)))
    assert detok.text == after_prompt(tok, ids) == "".join(deltas)


def test_a_metaspace_output_keeps_its_first_word_s_space():
    """SentencePiece (Llama 2, Mistral) decodes drop a text's leading space: the output's first
    word keeps it, so prompt + text reads as the whole sequence decoded (vLLM's text too)."""
    tok = metaspace()
    prompt, output = tok.convert_tokens_to_ids(["▁a", "▁b"]), tok.convert_tokens_to_ids(["▁stop", "c"])
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams())
    assert detok.update(output) == (" stopc", None)
    assert tok.decode(prompt) + detok.text == tok.decode(prompt + output) == "a b stopc"
    assert IncrementalDetokenizer(tok, [], SamplingParams()).update(output)[0] == "stopc"  # no prompt


def test_word_level_tokens_join_with_spaces():
    tok = word_level()
    ids = tok.encode("a b stop c")
    deltas, stop, detok = run(tok, ids, SamplingParams(), [1] * len(ids))
    assert detok.text == after_prompt(tok, ids) == " a b stop c"
    assert deltas[:4] == [" a", " b", " stop", " c"]


def test_tokenizer_space_clean_up_is_honoured():
    """With clean_up_tokenization_spaces the HF decode (not the bare backend) is the truth."""
    tok = word_level(clean_up=True)
    ids = tok.encode("a n't b . c")
    want = after_prompt(tok, ids)
    assert want != " a n't b . c", "the clean-up pass must change this text for the test to bite"
    assert run(tok, ids, SamplingParams(), [1] * len(ids))[2].text == want


def test_special_tokens_skipped_by_default_and_kept_on_request():
    tok = byte_bpe()
    ids = tok.encode("ab") + [tok.eos_token_id]
    assert run(tok, ids, SamplingParams(), [1] * len(ids))[2].text == "ab"
    assert run(tok, ids, None, [len(ids)])[2].text == "ab"  # no params: vLLM's defaults
    kept = SamplingParams(skip_special_tokens=False)
    for params in (kept, SamplingParams(skip_special_tokens=False, stop=("never",))):
        assert run(tok, ids, params, [1] * len(ids))[2].text == tok.decode(ids) == "ab<eos>"


class RecordingTokenizer:
    """A tokenizer without a plain backend that records the keywords of its decodes."""

    def __init__(self, inner):
        self.inner, self.kwargs = inner, []

    def decode(self, ids, **kwargs):
        self.kwargs.append(kwargs)
        return self.inner.decode(ids, **kwargs)


@pytest.mark.parametrize("spaces", [True, False])
def test_spaces_between_special_tokens_reaches_the_tokenizers_decode(spaces):
    """Passed only when False (the default is every tokenizer's own); a fast tokenizer ignores
    it, so the text is its decode's either way."""
    tok = RecordingTokenizer(byte_bpe())
    ids = [tok.inner.eos_token_id] + tok.inner.encode("ab") + [tok.inner.eos_token_id]
    params = SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=spaces)
    detok = run(tok, ids, params, [1] * len(ids))[2]
    want = (
        {"skip_special_tokens": False}
        if spaces
        else {"skip_special_tokens": False, "spaces_between_special_tokens": False}
    )
    assert tok.kwargs and all(kw == want for kw in tok.kwargs)
    assert detok.text == tok.inner.decode(ids, **want) == "<eos>ab<eos>"


@given(st.lists(st.integers(0, 319), min_size=1, max_size=60), st.integers(0, 60))
def test_a_whole_output_in_one_update_decodes_like_full_decode(ids, split):
    """generate() feeds a request's whole output at its end (or in two pieces, a dangling
    partial character at the cut included): the text and the deltas are a full decode's."""
    tok = byte_bpe()
    for chunks in ([len(ids)], [split, len(ids) - split]):
        deltas, stop, detok = run(tok, ids, SamplingParams(), chunks)
        want = tok.decode(ids, skip_special_tokens=True)
        assert stop is None and detok.text == want == "".join(deltas)


class CountingTokenizer:
    """A tokenizer without a plain backend whose decode counts its calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def decode(self, ids, skip_special_tokens=True):
        self.calls += 1
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def test_an_update_without_stop_strings_decodes_twice_whatever_its_length():
    """The cost a finished request pays at generate()'s end: two window decodes for 1,000 ids,
    not two per id (with stop strings every id is still checked as it arrives)."""
    text = "hello world, abc. " * 60
    ids = byte_bpe().encode(text)
    tok = CountingTokenizer(byte_bpe())
    detok = IncrementalDetokenizer(tok, [1], SamplingParams())
    assert detok.update(ids) == (text, None) and tok.calls <= 3  # and the prompt context's check
    watched = CountingTokenizer(byte_bpe())
    detok = IncrementalDetokenizer(watched, [1], SamplingParams(stop=("never",)))
    assert detok.update(ids)[0] == text[: len(text) - detok._held_back()]
    assert watched.calls >= len(ids)


# ---------------------------------------------------------------- stop strings


def test_stop_string_across_byte_tokens_is_excluded():
    tok = byte_bpe()
    ids = byte_ids("hello STOP world")
    deltas, stop, detok = run(tok, ids, SamplingParams(stop=("STOP",)), [1] * len(ids))
    assert stop == "STOP" and detok.stop_reason == "STOP"
    assert detok.text == "hello " == "".join(deltas)
    assert detok.update(byte_ids("more")) == ("", None)  # a stopped detokenizer ignores input


def test_stop_string_across_word_tokens():
    tok = word_level()
    ids = tok.encode("x a b c d")
    deltas, stop, detok = run(tok, ids, SamplingParams(stop=("b c",)), [1] * len(ids))
    assert stop == "b c" and detok.text == " x a " == "".join(deltas)


def test_multibyte_stop_string():
    tok = byte_bpe()
    ids = byte_ids("ab你好cd")
    deltas, stop, detok = run(tok, ids, SamplingParams(stop=("好c",)), [1] * len(ids))
    assert (detok.text, stop) == ("ab你", "好c")


@pytest.mark.parametrize("stops", [("abcd", "bc"), ("bc", "abcd")])
def test_first_completed_stop_wins_regardless_of_order(stops):
    tok = byte_bpe()
    ids = tok.encode("xabcdy")
    for chunks in ([len(ids)], [1] * len(ids)):
        deltas, stop, detok = run(tok, ids, SamplingParams(stop=stops), chunks)
        assert (detok.text, stop) == ("xa", "bc")


def test_one_token_completing_two_stops():
    """'hello' is one token: both stops complete in it; the one a char stream sees first wins,
    and for equal ends the longer (earlier-starting) one."""
    tok = byte_bpe()
    ids = tok.encode("hello")
    assert len(ids) == 1
    for stops, want in ((("hello", "ell"), ("h", "ell")), (("llo", "hello"), ("", "hello"))):
        _, stop, detok = run(tok, ids, SamplingParams(stop=stops), [1])
        assert (detok.text, stop) == want


def test_possible_stop_prefix_is_held_back_then_released():
    tok = byte_bpe()
    detok = IncrementalDetokenizer(tok, [1], SamplingParams(stop=("STOP",)))
    assert detok.update(byte_ids("abST")) == ("ab", None)
    assert detok.text == "abST"
    assert detok.update(byte_ids("x")) == ("STx", None)
    assert detok.update(byte_ids("S")) == ("", None)
    assert detok.flush() == "S"
    assert detok.text == "abSTxS"


def test_stop_strings_do_not_fire_before_min_tokens():
    tok = byte_bpe()
    ids = byte_ids("STOP..STOP")
    params = SamplingParams(stop=("STOP",), min_tokens=5, max_tokens=20)
    _, stop, detok = run(tok, ids, params, [1] * len(ids))
    assert stop == "STOP" and detok.text == "STOP.."


@pytest.mark.parametrize("min_tokens, fires", [(3, True), (4, False)])
def test_a_stop_string_fires_only_past_min_tokens_outputs(min_tokens, fires):
    """The 4th id completes "STOP": with min_tokens 3 that output is past the minimum and the
    stop fires; with min_tokens 4 it is the 4th of the 4 required and nothing fires (vLLM's
    rule, and spec.stops' for a stop token: num_output_tokens > min_tokens)."""
    tok = byte_bpe()
    params = SamplingParams(stop=("STOP",), min_tokens=min_tokens, max_tokens=20)
    _, stop, detok = run(tok, byte_ids("STOP.."), params, [1] * 6)
    assert (stop, detok.text) == (("STOP", "") if fires else (None, "STOP.."))


@given(
    st.text(alphabet=ALPHABET, min_size=1, max_size=24),
    st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=3), min_size=1, max_size=3),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_stops_match_reference_for_any_split(text, stops, per_byte, rng):
    tok = byte_bpe()
    ids = byte_ids(text) if per_byte else tok.encode(text)
    deltas, stop, detok = run(tok, ids, SamplingParams(stop=tuple(stops)), chunking(rng, len(ids)))
    want_text, want_stop = first_stop(text, stops)
    assert (detok.text, stop) == (want_text, want_stop)
    assert "".join(deltas) == want_text


def test_include_stop_str_in_output_keeps_the_stop_string_and_cuts_after_it():
    tok = byte_bpe()
    params = SamplingParams(stop=("ST",), include_stop_str_in_output=True, max_tokens=20)
    _, stop, detok = run(tok, byte_ids("abSTxy"), params, [1] * 6)
    assert (stop, detok.text) == ("ST", "abST")


@pytest.mark.parametrize("stops", [(), ("zz",)])
def test_a_metaspace_word_after_a_skipped_special_token_keeps_its_space(stops):
    """An id whose text is empty (a special token skipped, e.g. an EOS inside an ignore_eos
    output) adds no text, so it settles nothing: the window keeps the text before it, and the
    next word's '▁' still reads as a space. Settled alone, it would start the next window and
    the SentencePiece decode would drop that word's space ("a" + "b" for "a b")."""
    tok = metaspace()
    prompt = tok.convert_tokens_to_ids(["▁a"])
    output = tok.convert_tokens_to_ids(["▁a", "</s>", "▁b", "c"])
    want = after_prompt(tok, tok.convert_tokens_to_ids(["▁a", "▁b", "c"]), prompt)
    assert want == " a bc"
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=stops))
    deltas = [detok.update([i])[0] for i in output] + [detok.flush()]
    assert detok.text == "".join(deltas) == want


def test_a_whole_stop_string_before_min_tokens_streams_as_plain_text():
    """Before min_tokens a completed stop string is plain text: it streams as soon as it is
    settled. Only a proper prefix of a stop string (which could still complete one) is held
    back, never a whole stop string nor more than its length."""
    tok = byte_bpe()
    detok = IncrementalDetokenizer(tok, [1], SamplingParams(stop=("ST",), min_tokens=5, max_tokens=20))
    deltas = [detok.update([i]) for i in byte_ids("abSTx")]
    assert deltas == [("a", None), ("b", None), ("", None), ("ST", None), ("x", None)]
    assert detok.shown_text(False) == "abSTx"


def test_no_params_pass_no_spaces_keyword():
    """Without SamplingParams the defaults apply: spaces_between_special_tokens stays the
    tokenizer's own (not passed), skip_special_tokens is True."""
    tok = RecordingTokenizer(byte_bpe())
    ids = tok.inner.encode("ab") + [tok.inner.eos_token_id]
    assert run(tok, ids, None, [1] * len(ids))[2].text == "ab"
    assert tok.kwargs and all(kw == {"skip_special_tokens": True} for kw in tok.kwargs)


class PostProcessingTokenizer:
    """A duck-typed tokenizer over a `tokenizers` backend whose own decode post-processes the
    backend's text (upper case here) and that says nothing about clean_up_tokenization_spaces."""

    def __init__(self, inner):
        self.inner, self.backend_tokenizer = inner, inner.backend_tokenizer

    def decode(self, ids, **kwargs):
        return self.inner.decode(ids, **kwargs).upper()


def test_a_tokenizer_that_does_not_say_it_skips_clean_up_is_decoded_through_its_own_decode():
    """The bare backend replaces decode() only for a tokenizer stating
    clean_up_tokenization_spaces=False; one that does not say is decoded through its decode()."""
    tok = PostProcessingTokenizer(byte_bpe())
    ids = tok.inner.encode("ab cd")
    assert run(tok, ids, SamplingParams(), [1] * len(ids))[2].text == after_prompt(tok, ids) == "AB CD"


@pytest.mark.parametrize("chunks", [[8], [1] * 8, [6, 2], [3, 4, 1]], ids=str)
def test_a_dangling_byte_fallback_character_leaves_the_text_before_it(chunks):
    """An output cut inside a character (max_tokens) by a byte-fallback tokenizer: "你好" as
    byte tokens, then two of the three bytes of a third character. The decoder renders the whole
    byte run as eight U+FFFD, since the run is not valid UTF-8 as a whole; generate(), which
    settles a whole output at once, returned that, and a stream returned "你好" and then
    five U+FFFD (好's own bytes again, then the two). vLLM's stream keeps "你好" too. Now every
    split gives the complete characters, then the dangling bytes as the tokenizer renders them
    on their own."""
    tok = byte_fallback()
    ids = fallback_ids("你好") + fallback_ids("你")[:2]
    assert tok.decode(ids) == "\ufffd" * 8, "the full decode must lose the valid text for the test to bite"
    deltas, stop, detok = run(tok, ids, SamplingParams(), chunks)
    assert stop is None
    assert detok.text == "".join(deltas) == "你好" + tok.decode(ids[-2:]) == "你好\ufffd\ufffd"


def test_a_dangling_byte_fallback_character_after_byte_ascii_keeps_it():
    """The same after an ASCII character written as a byte token ('a' as <0x61>), whose text a
    stream showed before the dangling bytes came: it stays, whatever the split."""
    tok = byte_fallback()
    ids = fallback_ids("a") + fallback_ids("你")[:2]
    for chunks in ([3], [1, 1, 1]):
        deltas, _, detok = run(tok, ids, SamplingParams(stop=("zz",)), chunks)
        assert detok.text == "".join(deltas) == "a\ufffd\ufffd"


@given(
    st.text(alphabet="ab 你好🙂é", min_size=1, max_size=12),
    st.integers(0, 3),
    st.randoms(use_true_random=False),
)
def test_byte_fallback_text_equals_a_full_decode_whatever_the_split(text, cut, rng):
    """Valid text written in byte tokens and pieces decodes as a full decode would, whatever the
    split; cut inside its last character, it keeps every complete character before the cut."""
    tok = byte_fallback()
    prompt = tok.encode("a b", add_special_tokens=False)
    ids = tok.encode(text, add_special_tokens=False)
    deltas, _, detok = run(tok, ids, SamplingParams(), chunking(rng, len(ids)), prompt)
    assert detok.text == "".join(deltas) == after_prompt(tok, ids, prompt)
    last = fallback_ids(text[-1])
    if 0 < cut < len(last):
        valid = tok.encode(text[:-1], add_special_tokens=False) if len(text) > 1 else []
        ids = valid + last[:cut]
        deltas, _, detok = run(tok, ids, SamplingParams(), chunking(rng, len(ids)), prompt)
        assert detok.text == "".join(deltas) == after_prompt(tok, valid, prompt) + tok.decode(last[:cut])


@pytest.mark.parametrize(
    "include, want", [(False, ["a", "b", "", "", "STx"]), (True, ["a", "b", "S", "T", "x"])]
)
def test_text_is_held_back_for_a_stop_string_only_when_the_stop_string_is_cut(include, want):
    """A tail that may still grow into a stop string is held back only when the stop string
    would be cut from the text: with include_stop_str_in_output the stop string and all before
    it stay, so each character streams as it is settled (vLLM's stop_buffer_length is 0 then).
    It was held back either way, delaying a stream by up to len(stop) - 1 characters."""
    tok = byte_bpe()
    params = SamplingParams(stop=("STOP",), include_stop_str_in_output=include)
    detok = IncrementalDetokenizer(tok, [1], params)
    deltas = []
    for i in byte_ids("abSTx"):
        deltas.append(detok.update([i])[0])
        assert detok.shown_text(False) == "".join(deltas)
    assert deltas == want and detok.flush() == ""


def builtin_calls(fn, *args) -> int:
    """How many calls of builtins (str methods, len, ...) fn(*args) makes: work done in C that a
    Python-level count would not see."""
    import sys

    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "c_call"

    sys.setprofile(count)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return calls


def test_holding_back_a_stop_prefix_costs_the_same_whatever_the_stop_strings_length():
    """The held-back tail is followed as text arrives (a matcher per stop string), not searched
    again every step: it was, one str.endswith per length the tail could have, so a request
    with long stop strings (the server takes any) cost every step of the engine loop time in
    their length times the text's (64 stops of 4,000 chars: about 30 ms a token and 60 ms an
    output). A token, and an output's text, now take as many builtin calls with stop strings
    of 4,000 chars as with stop strings of 4, and hold back the same tail."""
    tok = byte_bpe()
    costs = {}
    for length in (4, 4000):
        stops = tuple("a" * (length - 1) + end for end in "ST")
        detok = IncrementalDetokenizer(tok, [1], SamplingParams(stop=stops))
        detok.update(tok.encode("hello world, abc. " * 120))
        (a,) = tok.encode("a")
        update = builtin_calls(detok.update, [a])
        shown = builtin_calls(detok.shown_text, False)
        costs[length] = (update, shown, len(detok.text) - len(detok.shown_text(False)))
    assert costs[4000] == costs[4] and costs[4][2] == 1, costs


def held_back(text: str, stops) -> int:
    """Reference: the longest suffix of text that is a proper prefix of some stop string."""
    return max(
        (n for s in stops for n in range(len(s)) if n <= len(text) and text.endswith(s[:n])), default=0
    )


@given(
    st.lists(st.text(alphabet="abS", min_size=1, max_size=8), min_size=1, max_size=20),
    st.lists(st.text(alphabet="abS", min_size=1, max_size=6), min_size=1, max_size=3),
)
def test_the_followed_tail_is_the_longest_stop_prefix_ending_the_text(pieces, stops):
    """The matchers that follow the held-back tail give the reference's length after every
    piece of text, stop strings that repeat themselves ("aab", "abab") and whole stop strings
    inside the text (before min_tokens a stop string is plain text) included."""
    detok = IncrementalDetokenizer(byte_bpe(), [1], SamplingParams(stop=tuple(stops)))
    for piece in pieces:
        detok.text += piece
        assert detok._held_back() == held_back(detok.text, stops)


def test_the_followed_tail_matches_the_reference_for_every_short_text_and_stop():
    """Every stop string of up to 6 characters over "ab" against every text of up to 8, fed one
    character at a time (a stop string inside the text included: before min_tokens it is plain
    text). The matcher's failure links are exercised only by stop strings that repeat themselves
    ("aab", "abaa"; a link followed two deep, as while building "aabaaa"'s, needs six
    characters): the random test above may draw too few of them in a run to see a wrong link."""
    import itertools

    words = ["".join(w) for n in range(1, 9) for w in itertools.product("ab", repeat=n)]
    for stop in [w for w in words if len(w) <= 6]:
        for text in [w for w in words if len(w) == 8]:
            prefixes = StopPrefixes([stop])
            for end in range(1, len(text) + 1):
                assert prefixes.held(text[:end]) == held_back(text[:end], [stop]), (stop, text[:end])


def test_stop_prefixes_hold_nothing_back_before_any_text_or_without_stops():
    """held() is 0 for an empty text and for any text without stop strings (a detokenizer
    without stops still answers shown_text through it): nothing is a prefix of no stop."""
    assert StopPrefixes(["ab"]).held("") == 0
    assert StopPrefixes([]).held("") == StopPrefixes([]).held("aba") == 0
    detok = IncrementalDetokenizer(byte_bpe(), [1], SamplingParams())
    detok.update(byte_ids("abc"))
    assert detok.shown_text(False) == "abc"


@pytest.mark.parametrize("before, last", [("é", "é"), ("你", "好"), ("🙂", "é"), ("a", "🙂")])
def test_a_character_cut_after_its_first_byte_keeps_the_characters_before_it(before, last):
    """One update holding a whole output (generate()'s way) that ends one byte into a
    character: the flush settles the characters before the cut first, cutting off exactly that
    one byte (the last cut it tries). Chunked runs settle the earlier characters before the
    flush, so only a single update reaches that cut."""
    tok = byte_fallback()
    for cut in range(1, len(last.encode())):
        ids = fallback_ids(before) + fallback_ids(last)[:cut]
        _, _, detok = run(tok, ids, SamplingParams(), [len(ids)])
        assert detok.text == before + tok.decode(fallback_ids(last)[:cut]), (before, last, cut)
