"""Incremental detokenization with stop strings.

Decoding the whole output after every token costs O(n) per token; instead each step decodes a
short window: the text of ids[prefix:] minus the text of ids[prefix:read] is what the newest ids
add (the prefix gives tokenizers that render a leading space or merge bytes their left context;
the output's first windows have the prompt's last PROMPT_CONTEXT_IDS ids as theirs, as vLLM's).
While that difference ends in U+FFFD the newest ids end inside a multi-byte UTF-8 character, so
nothing is emitted until a later id completes it. For tokenizers whose decode is additive over
such windows (byte-level BPE, WordLevel, SentencePiece metaspace) the accumulated `text` equals
what `tokenizer.decode(context + output_ids, ...)` adds to `tokenizer.decode(context, ...)`
once `flush()` has run (context: those prompt ids; for byte-level BPE that is
`tokenizer.decode(output_ids, ...)` itself; a metaspace output keeps its first word's space),
with `skip_special_tokens` and `spaces_between_special_tokens` taken from the request's
SamplingParams (vLLM's names and defaults: True, True; no params means the defaults). spaces_between_special_tokens goes to the
tokenizer's decode only when False (the default is every tokenizer's own, and duck-typed ones
need not know the keyword); Hugging Face's fast tokenizers ignore it, as vLLM's fast
detokenizer does, so their bare backend may still decode.

A SentencePiece byte-fallback decoder (Llama 2, Mistral: characters without a piece are written
as <0xNN> byte tokens) is additive only over valid UTF-8: it renders a run of byte tokens that
is invalid as a whole as one U+FFFD per byte, the run's complete characters included. Settled
text is never rewritten (a stream has shown it): new ids that make such a run invalid add their
own text (vLLM's DecodeStream restarts there the same way), and `flush()` settles the complete
characters before a dangling partial one first. So an output cut inside a character keeps every
character before the cut, whatever the split, where a full decode shows only U+FFFD; the
dangling bytes show as the tokenizer renders them alone (vLLM drops them from its final text;
here the text shows that the output was cut). Only an output with invalid bytes inside it,
which no trained model writes, can differ from a full decode and between splits.

Stop strings: after each token the newly settled text is searched for matches that END in it
(earlier matches would have fired earlier). Of those, the one that ends first wins, then the
one that starts first: the stop that a character-by-character stream would see first, so the
outcome does not depend on how the text was split into tokens. (On purpose unlike vLLM, whose
check takes the first string of `stop`, in list order, found in a step's new text: there
stop=["STOP", "S"] on a token " STOP" ends with "STOP", on tokens " S" "TOP" with "S", which
include_stop_str_in_output and stop_reason show.) Everything after the stop string
is dropped from `text`, and the stop string too unless `params.include_stop_str_in_output`.
A stop string fires only once there are more than `min_tokens` outputs (vLLM's rule, and
spec.stops' for stop tokens): the ids up to the `min_tokens`-th are not searched. (A stop
token's own text never reaches this class unless that flag is set: the output processor
leaves it out.)

Cost: two decodes of a short window per id while stop strings are watched (each id must be
checked as it arrives); without stop strings an update settles all its ids with two decodes,
whatever their number. That matters at a request's end under `generate()`, which feeds a whole
output (up to thousands of ids) in one update: one id at a time that took about 4.5 ms of host
time per finished 1,000-token request on the H200's host, inside the async engine's step (the
GPU idled meanwhile). An update whose last id ends inside a character holds all its new text
until a later id completes it (or `flush()`).

Streaming: the delta returned by `update` never includes a tail of `text` that could still grow
into a stop string (the longest suffix that is a proper prefix of some stop), so emitted text is
never retracted; with `include_stop_str_in_output` nothing is held back, as a stop string stays
in the text with all before it (the first to end wins, so no later cut falls before it). `text`
always holds all settled text, held-back tail included; `flush()` settles pending bytes and
returns the not-yet-emitted tail (call it when a request ends without a stop string if you
stream deltas). `shown_text(finished)` is `text` as a cumulative output shows it:
without that tail while the request runs.
"""

from __future__ import annotations

from typing import Optional, Sequence

_REPLACEMENT = "\ufffd"
# Prompt ids decoded before the first output ids, as their left context (vLLM's initial offset).
PROMPT_CONTEXT_IDS = 5


def _plain_backend(tokenizer):
    """The Rust `tokenizers.Tokenizer` behind a fast HF tokenizer when its decode is exactly
    the backend's (no space clean-up pass): same text at a quarter of the per-call cost."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return backend


class _StopTail:
    """The longest suffix of a growing text that is a proper prefix of `stop`, followed one
    character at a time (Knuth-Morris-Pratt): `feed(chars)` returns its length after them.
    Amortized O(1) per character, whatever the stop string's length."""

    def __init__(self, stop: str):
        self.stop, self.matched = stop, 0
        # border[i]: length of the longest proper prefix of stop[: i + 1] that is also its suffix
        self.border = border = [0] * len(stop)
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = border[k - 1]
            if stop[i] == stop[k]:
                k += 1
            border[i] = k

    def feed(self, chars: str) -> int:
        stop, border, k = self.stop, self.border, self.matched
        last = len(stop) - 1
        for c in chars:
            while k and stop[k] != c:
                k = border[k - 1]
            if stop[k] == c:
                if k == last:  # the whole stop string: keep its longest proper prefix
                    k = border[k]
                else:
                    k += 1
        self.matched = k
        return k


class StopPrefixes:
    """The tail a stream holds back while it may still grow into a stop string: the longest
    suffix of a text that is a proper prefix of one of `stops`. `held(text)` takes a text that
    extends every text given before (a running sample's only grows) and reads only what is new,
    one matcher per stop string (_StopTail): searched again at every step, as it was, long stop
    strings (a request may send any) cost each step their length times the text's."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self._tails: Optional[list[_StopTail]] = None  # made on first use
        self._scanned = 0  # chars of the text read
        self._held = 0  # the answer for those chars

    def held(self, text: str) -> int:
        if self._scanned < len(text) and self.stops:  # else nothing new since the last call
            if self._tails is None:
                self._tails = [_StopTail(stop) for stop in self.stops]
            new = text[self._scanned :]
            self._scanned = len(text)
            self._held = max([tail.feed(new) for tail in self._tails])
        return self._held


class IncrementalDetokenizer:
    """Turns one request's output ids into text, step by step. See the module docstring."""

    def __init__(self, tokenizer, prompt_token_ids: Sequence[int], params):
        self.tokenizer = tokenizer
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.skip_special_tokens: bool = getattr(params, "skip_special_tokens", True)
        spaces: bool = getattr(params, "spaces_between_special_tokens", True)
        self._decode_kwargs = {} if spaces else {"spaces_between_special_tokens": False}
        self.stops: tuple[str, ...] = tuple(params.stop) if params is not None else ()
        self.min_tokens: int = params.min_tokens if params is not None else 0
        self.include_stop: bool = bool(getattr(params, "include_stop_str_in_output", False))
        self.output_token_ids: list[int] = []
        self.text = ""
        self.stop_reason: Optional[str] = None
        self._prefix = 0  # window start in output_token_ids
        self._read = 0  # ids before this are settled into text
        self._emitted = 0  # chars of text already returned as deltas
        self._backend = _plain_backend(tokenizer)
        self._context = self._prompt_context(self.prompt_token_ids)
        self._stop_prefixes = StopPrefixes(self.stops)

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=self.skip_special_tokens, **self._decode_kwargs
        )

    def _prompt_context(self, prompt_ids: list[int]) -> list[int]:
        """The prompt's last ids, decoded before the output's first ones as their left context:
        a SentencePiece (metaspace) decode drops the leading space of a text's first word, so
        without it an output's first word lost its space ("is" + "Paris", where vLLM and a full
        decode of prompt + output give "is Paris"). None when they end inside a character (the
        output's first ids would complete it: their text is not the context's plus theirs), or
        when the tokenizer cannot decode them (a slow SentencePiece one on an id of a padded
        vocabulary): the context is a nicety, and the request is served without it."""
        tail = prompt_ids[-PROMPT_CONTEXT_IDS:]
        try:
            if not tail or self._decode(tail).endswith(_REPLACEMENT):
                return []
        except Exception:
            return []
        return tail

    def _settle(self, force: bool = False, end: Optional[int] = None) -> str:
        """Text the unsettled ids (up to `end`, default all) add; empty, and nothing settled,
        while it ends mid-character. A decode that rewrote the settled text (a byte-fallback
        run made invalid by the new ids) settles the new ids' own text: settled text is never
        taken back, as a stream has shown it."""
        ids = self.output_token_ids[:end] if end is not None else self.output_token_ids
        context = self._context if self._prefix == 0 else []  # windows at the output's start
        before = self._decode(context + ids[self._prefix : self._read])
        after = self._decode(context + ids[self._prefix :])
        if not force and (after.endswith(_REPLACEMENT) or len(after) <= len(before)):
            return ""
        new = after[len(before) :] if after.startswith(before) else self._decode(ids[self._read :])
        self._prefix, self._read = self._read, len(ids)
        return new

    def _settle_at_end(self) -> str:
        """Settle every pending id once no more will come: first the longest run of them that
        ends on a whole character (a UTF-8 character is at most 4 bytes, so one of the last 3
        cuts does unless the text is broken), then the dangling partial character's ids, forced.
        A byte-fallback decoder (Llama 2, Mistral) renders a run of byte tokens that is invalid
        as a whole as one U+FFFD per byte, the run's complete characters included: settled
        together, an output cut inside its last character (max_tokens) lost every character
        written in bytes before it."""
        ids = self.output_token_ids
        new = ""
        for end in range(len(ids) - 1, max(self._read, len(ids) - 4), -1):
            new = self._settle(end=end)
            if new:
                break
        return new + self._settle(force=True)

    def update(self, new_token_ids: Sequence[int]) -> tuple[str, Optional[str]]:
        """Append ids; return (text delta safe to stream, the stop string that fired or None).
        After a stop fired, further ids are ignored and ("", None) is returned."""
        if self.stop_reason is not None:
            return "", None
        if not self.stops:  # nothing to look for between ids: settle them together
            # map: twice a generator expression's speed on generate()'s 1,000-id final update
            self.output_token_ids.extend(map(int, new_token_ids))
            self.text += self._settle()
            return self._take(len(self.text)), None
        for tok in new_token_ids:
            self.output_token_ids.append(int(tok))
            start = len(self.text)
            self.text += self._settle()
            if len(self.output_token_ids) > self.min_tokens:
                stop = self._find_stop(start)
                if stop is not None:
                    return self._take(stop[0]), stop[1]
        return self._take(len(self.text) - self._held_back()), None

    def _find_stop(self, new_start: int) -> Optional[tuple[int, str]]:
        """(cut, stop) of the match ending first (ties: starting first) among matches that
        end after `new_start`; truncates `text` at `cut`, the match's start (its end when the
        stop string is kept), and records `stop_reason`."""
        best: Optional[tuple[int, int, str]] = None
        for stop in self.stops:
            pos = self.text.find(stop, max(0, new_start - len(stop) + 1))
            if pos >= 0:
                cand = (pos + len(stop), pos, stop)
                if best is None or cand[:2] < best[:2]:
                    best = cand
        if best is None:
            return None
        cut = best[0] if self.include_stop else best[1]
        self.text = self.text[:cut]
        self.stop_reason = best[2]
        return cut, best[2]

    def shown_text(self, finished: bool) -> str:
        """`text` as an output shows it: all of it once the sample is finished, else without
        the held-back tail that may still grow into a stop string (vLLM's rule), so that a
        cumulative output's text only ever grows and DELTA texts concatenate to the final one."""
        held = 0 if finished else self._held_back()
        return self.text[: len(self.text) - held] if held else self.text  # no copy a step when none is held

    def _held_back(self) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string;
        0 with include_stop_str_in_output, where a stop string stays in the text with all
        before it, so no shown text can be cut (vLLM's stop_buffer_length is 0 then too), and
        once a stop string fired (the text is final). Followed as text arrives (StopPrefixes),
        so a step costs its new characters, not the stop strings' length times the text's."""
        if self.include_stop or self.stop_reason is not None:
            return 0
        return self._stop_prefixes.held(self.text)

    def _take(self, end: int) -> str:
        """The not-yet-emitted text up to `end`, marked emitted."""
        end = max(end, self._emitted)
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta

    def flush(self) -> str:
        """Settle pending ids (a dangling partial character decodes as U+FFFD, as a full decode
        would) and return every char of `text` not yet emitted. Idempotent."""
        if self.stop_reason is None and self._read < len(self.output_token_ids):
            self.text += self._settle_at_end()
        return self._take(len(self.text))
