"""Structured outputs (vLLM's guided decoding) with xgrammar: the one module that imports it.

vLLM V1's design (vllm/v1/structured_output), on this engine's step:
- on add, the request's StructuredOutputsParams is compiled once (`StructuredOutputManager.
  compile`, through xgrammar's GrammarCompiler and its cache, bounded by CACHE_LIMIT_BYTES:
  equal constraints compile once per engine), and each of its n samples gets its own matcher (`GrammarState`, kept on the
  engine's Sample, never on the impl's Request, whose only state is its tokens);
- before a step's sample, the engine fills each constrained row's bitmask on the host from its
  matcher and masks the raw logits with it in place (sample/grammar_mask.py), as vLLM's model
  runner does before its sampler: allowed_token_ids, bad words, min_tokens, logit_bias and
  penalties come after, and logprobs see the mask (a masked token's logprob is -inf);
- every real output token the scheduler appends is accepted by the matcher; once the matcher
  has terminated (it accepted a stop token where the grammar may end) the request is finished
  ("stop"), so no mask is ever asked of a terminated matcher; one that refuses a token (the
  sampler's other edits left its row no token the grammar allows) finishes it as an error;
- with StructuredOutputsParams.start_after_token_ids (a reasoning model's `</think>`, set by
  the server), the grammar starts after those ids first appear in the output, as vLLM's
  structured outputs with reasoning do: before them the row is not masked and the matcher
  takes nothing (GrammarState.active); the tokens after them are accepted as above;
- a matcher that raises (filling its mask, accepting a token: a fault inside xgrammar) fails
  its own sample alone, as an error (EngineCore._fail_grammar, engine_core._advance): the
  step and every other request go on as if it were not there.

Invariants: a matcher has accepted exactly the sample's real output tokens (those after its
start marker, if it has one), in order, before its mask is filled. That holds because a step
with a constrained row resolves the step before it first (EngineCore._masked_logits: under
async scheduling the previous tokens are read and accepted, then the mask is filled; the draw
may stay on the device, so the step after still launches before this one's tokens are read),
a constrained request is never drafted for (spec_decode/decoder.py; nor in its thinking, so
no step holds unmasked tokens after its marker), and preemption keeps output tokens
(recompute and swap alike), so the matcher stays valid across it. A row whose request
finished since it was scheduled (at that resolve) is not masked: its token is dropped.

xgrammar is optional (`pip install 'enginespec[structured]'`): it is imported on the first
request that asks for structured outputs, and its absence is a ValueError naming the package.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Optional, Sequence

import torch

from enginespec.engine.schema_limits import unenforced_keyword
from enginespec.spec.structured_outputs import StructuredOutputsParams

log = logging.getLogger(__name__)

#: The most memory xgrammar's cache of compiled grammars may hold (vLLM's default,
#: VLLM_XGRAMMAR_CACHE_MB=512): past it the least recently used are evicted, so a server that
#: sees a new schema per request (tool calls, response_format) does not grow without bound.
CACHE_LIMIT_BYTES = 512 << 20

INSTALL_HINT = (
    "structured outputs need the xgrammar package: pip install xgrammar "
    "(or pip install 'enginespec[structured]')"
)


def import_xgrammar():
    """The xgrammar module, or a ValueError with the install hint (a request asked for
    structured outputs on an install without it: the caller's error, 400 over HTTP)."""
    try:
        import xgrammar
    except ImportError as exc:
        raise ValueError(f"SamplingParams.structured_outputs: {INSTALL_HINT}") from exc
    return xgrammar


def choice_grammar(choices: Sequence[str]) -> str:
    """An EBNF grammar whose sentences are exactly `choices` (vLLM's choice_as_grammar): each
    one a quoted literal (`ebnf_literal`)."""
    return "root ::= " + " | ".join(ebnf_literal(c) for c in choices)


def ebnf_literal(text: str) -> str:
    """`text` as an EBNF string literal that matches exactly it: backslashes and quotes
    escaped, and each control character (a newline, a tab: xgrammar's lexer refuses them raw)
    written as a four-digit \\u escape, which cannot run into a hex digit after it (a \\x
    escape takes every hex digit that follows). NUL is left raw: xgrammar reads \\u0000 as
    nothing, so it is refused (a ValueError naming the field) rather than matched as ""."""
    out = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch != "\0" and (ch < " " or ch == "\x7f"):
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# A length-bounded string's character in xgrammar's EBNF of a JSON schema (any but quote,
# backslash, CR, LF: control characters pass), and JSON's string character, as xgrammar's own
# unbounded strings write it (_compile_json_schema).
_LAX_STRING_CHARACTER = r'[^\"\\\r\n]'
_JSON_STRING_CHARACTER = r'[^\0-\x1f\"\\\r\n]'

# xgrammar's C++ log prefix on an error's last line: "[10:01:02] /project/cpp/regex_converter.cc:94: "
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")


def _reason(exc: BaseException) -> str:
    """The last line of xgrammar's error without its log prefix (a timestamp and a C++ source
    path: noise to the user, and the timestamp made equal requests' 400s differ)."""
    text = str(exc).strip()
    return _LOG_PREFIX.sub("", text.splitlines()[-1]) if text else type(exc).__name__


class StructuredOutputManager:
    """One engine's grammar compiler over its tokenizer and vocabulary (the model's, so the
    bitmask covers every logits column a token can take; ids the tokenizer lacks are never
    allowed). Built on the first constrained request, so an engine that never sees one never
    imports xgrammar."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        cache_limit_bytes: int = CACHE_LIMIT_BYTES,
    ):
        xgr = import_xgrammar()
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
        )
        self._xgr = xgr
        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=True, cache_limit_bytes=cache_limit_bytes)
        self._control = control_token_ids(info, tokenizer)

    def compile(self, params: StructuredOutputsParams):
        """The compiled grammar of `params` (xgrammar's cache makes a repeat free); a constraint
        that does not compile is a ValueError naming its field and xgrammar's reason. A schema
        given as text must be JSON text in full, as vLLM parses it before compiling: xgrammar's
        parser reads the first JSON value and ignores what follows, so a brace too many would
        drop the rest of the schema ("required", say) unseen. So is a schema with a keyword
        xgrammar compiles but does not enforce (engine/schema_limits.py), as vLLM refuses it
        with xgrammar as its backend."""
        kind = params.kind
        try:
            compiled = self._compile(params, kind)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"StructuredOutputsParams.{kind} is invalid: {_reason(exc)}") from exc
        if not self._startable(compiled):
            raise ValueError(
                f"StructuredOutputsParams.{kind}: no token of this model's vocabulary can begin it"
            )
        return compiled

    def _startable(self, compiled) -> bool:
        """Whether a fresh matcher allows some first token (a stop token counts: the grammar
        may be empty). Not so when the vocabulary cannot write the constraint's first character
        (a regex of "é+" over an ASCII vocabulary): refused on add, where the request's own
        fault is a ValueError (400), rather than as a failed first step (a 500)."""
        bitmask = self._xgr.allocate_token_bitmask(1, self.vocab_size)
        self._xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask, 0)
        return bool(bitmask.any())

    def _compile(self, params: StructuredOutputsParams, kind: str):
        compiler, any_ws = self.compiler, not params.disable_any_whitespace
        if kind == "json":  # strict (xgrammar's default, vLLM's): no unlisted properties
            # JSON text in full (json.JSONDecodeError: a ValueError), then what xgrammar drops
            schema = json.loads(params.json) if isinstance(params.json, str) else params.json
            where = unenforced_keyword(schema)
            if where is not None:
                raise ValueError(f"the schema uses {where}, which the xgrammar backend does not enforce")
            return self._compile_json_schema(params.json_text(), any_ws)
        if kind == "json_object":  # any object, not any JSON value (vLLM's, OpenAI's meaning)
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=any_ws)
        if kind == "regex":
            return compiler.compile_regex(params.regex)
        if kind == "choice":
            return compiler.compile_grammar(choice_grammar(params.choice))
        return compiler.compile_grammar(params.grammar)

    def _compile_json_schema(self, text: str, any_ws: bool):
        """compile_json_schema(text), except that a string bounded by minLength / maxLength
        takes no raw control character. xgrammar (0.2.9 and before: its issue #800) writes
        such a string's character as a class that leaves out only the quote, the backslash,
        CR and LF (_LAX_STRING_CHARACTER), so the other characters U+0000-U+001F passed
        unescaped: JSON forbids them in a string, and the reply (a tab or U+001C inside a
        name of maxLength 4) was no JSON that json.loads takes, with finish_reason "stop".
        The schema's EBNF is compiled instead, that class narrowed to JSON's string character
        (xgrammar's own, for unbounded strings). A schema without a bounded string compiles
        as it always did, and so does one whose EBNF this xgrammar does not read back (its
        printed form is not a promise: the schema is served as before rather than refused).
        (A bounded string still cannot hold an escape: xgrammar's limit.)"""
        grammar = self._xgr.Grammar.from_json_schema(text, any_whitespace=any_ws, strict_mode=True)
        ebnf = str(grammar)
        if _LAX_STRING_CHARACTER in ebnf:
            try:
                return self.compiler.compile_grammar(
                    ebnf.replace(_LAX_STRING_CHARACTER, _JSON_STRING_CHARACTER)
                )
            except (RuntimeError, ValueError) as exc:
                log.warning(
                    "a JSON schema's EBNF did not compile (%s): compiled as xgrammar writes it", _reason(exc)
                )
        return self.compiler.compile_json_schema(text, any_whitespace=any_ws)

    def new_state(
        self, compiled, stop_token_ids: Sequence[int], start_after: Sequence[int] = ()
    ) -> "GrammarState":
        """A fresh matcher over `compiled` for one sample, governing the output from its first
        token, or with `start_after` (StructuredOutputsParams.start_after_token_ids) from the
        token after those ids first appear in it. Of `stop_token_ids` (its EOS unless
        ignore_eos, and its stop_token_ids), the control tokens (`control_token_ids`) are the
        tokens that may end the grammar (none: the EOS ids given at construction). A stop id
        that is text stays text to the grammar, as in vLLM, whose matcher knows only the
        tokenizer's EOS: the grammar allows it where its text fits, and when drawn it stops
        the request as any stop id does. xgrammar would take an ending token out of the text
        (a choice of "55a" with "5" a stop id could not begin), so none is made one."""
        ends = [t for t in stop_token_ids if t in self._control]
        matcher = self._xgr.GrammarMatcher(compiled, override_stop_tokens=ends or None)
        return GrammarState(matcher, self.vocab_size, self._xgr, start_after)


def control_token_ids(info, tokenizer) -> frozenset[int]:
    """The ids that are not text: those xgrammar writes no text for (its special ids: empty,
    or past the tokenizer's vocabulary), its stop ids, and the tokenizer's special tokens
    (<unk>, <|im_end|>: xgrammar reads their markup as text). Only these may end a grammar."""
    ids = set(info.special_token_ids) | set(info.stop_token_ids)
    ids.update(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, token in added.items() if getattr(token, "special", False))
    return frozenset(int(i) for i in ids)


class GrammarState:
    """One sample's matcher. `accept` advances it with each real output token; `fill` writes
    the mask of the tokens it may take next into one bitmask row. Never asked for a mask once
    `terminated` (the engine finishes the request first), nor while not `active`.

    With a start marker (start_after_token_ids: a reasoning model's end tag), the output is free
    until the marker has appeared in it: till then the matcher is untouched and `active` is
    False (the engine masks nothing), and `_tail` holds the newest output tokens, at most the
    marker's length, so a marker that arrives over several steps is found. The tokens after
    the marker's first appearance, in the same accept or later ones, go to the matcher."""

    def __init__(self, matcher, vocab_size: int, xgr, start_after: Sequence[int] = ()):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self._xgr = xgr
        self.num_rejected = 0
        self._marker = tuple(int(t) for t in start_after)  # () once seen, or never asked for
        self._tail: list[int] = []

    @property
    def terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    @property
    def active(self) -> bool:
        """Whether the grammar governs the next token (no marker, or the marker has appeared)."""
        return not self._marker

    def _watch(self, token: int) -> None:
        """Take one output token before the marker; the marker is seen when the newest tokens
        are it (the first appearance: a later one is the grammar's text)."""
        self._tail.append(token)
        if len(self._tail) > len(self._marker):
            del self._tail[0]
        if tuple(self._tail) == self._marker:
            self._marker, self._tail = (), []

    def accept(self, tokens: Sequence[int]) -> Optional[int]:
        """Advance over `tokens` (the sample's newest output tokens, real ones): those before
        the marker are only watched for it, the rest go to the matcher. Returns None,
        or the first token the grammar refused (the matcher stays where it was before it): only
        possible when the sampler's other edits left the row no token the grammar allows (an
        allowed_token_ids or bad_words that excludes them all, or a grammar that needs text
        the vocabulary cannot write), so the row was all -inf. The engine ends the request
        there (vLLM finishes it as an error)."""
        for token in tokens:
            if self._marker:
                self._watch(int(token))
                continue
            if self.terminated:
                return None
            if not self.matcher.accept_token(int(token)):
                self.num_rejected += 1
                log.warning("structured outputs: the grammar refused sampled token %d", token)
                return int(token)
        return None

    def allocate(self, num_rows: int) -> torch.Tensor:
        """An int32 [num_rows, ceil(vocab / 32)] host bitmask, every token allowed."""
        return self._xgr.allocate_token_bitmask(num_rows, self.vocab_size)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Row `row` of `bitmask`: bit t set iff the grammar may take token t next."""
        self.matcher.fill_next_token_bitmask(bitmask, row)


def fill_bitmask(states: Sequence[GrammarState]) -> tuple[Optional[torch.Tensor], dict[int, Exception]]:
    """The int32 bitmask of `states`, one row each in order (None for no state), and
    {index: exception} of the states whose matcher raised filling its row. One sample's matcher
    fault is that sample's alone: the caller fails that sample and leaves its row (maybe half
    written) out, while every other row is filled as if nothing happened."""
    if not states:
        return None, {}
    bitmask = states[0].allocate(len(states))
    faults: dict[int, Exception] = {}
    for row, state in enumerate(states):
        try:
            state.fill(bitmask, row)
        except Exception as exc:
            faults[row] = exc
    return bitmask, faults
