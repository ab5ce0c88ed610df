"""Reasoning parsers: a chat reply's `<think>...</think>` part as `reasoning`, the rest as `content`.

`enginespec serve --reasoning-parser qwen3` (or `deepseek_r1`) splits what a reasoning model
writes, as vLLM's parsers of those names do: the message (and every streamed delta) carries the
thinking under `reasoning` (vLLM's field since it dropped `reasoning_content`) and the answer
under `content`. The engine is untouched: only the server's chat responses change.

The rule (one for the whole reply and for its stream, so the streamed parts concatenate to the
whole reply's):

- A reply starts in its thinking unless the prompt already closed it: the prompt's last end tag
  comes after its last start tag and either ends the prompt, whitespace aside (Qwen3's template
  with enable_thinking off ends it with an empty `<think>\\n\\n</think>\\n\\n`), or belongs to the
  message the request continues (continue_final_message: the prompt ends inside an answer after
  its thinking); or, for qwen3, the request's chat_template_kwargs set enable_thinking to false.
  A reply that starts closed is all content. An end tag followed by more turns is an earlier
  turn's: Qwen3's template keeps the thinking of the turns since the last user query, so in a
  tool loop the prompt's last tag is the previous call's `</think>` and says nothing of the
  reply's (a last-tag test alone misreads that prompt and sends the thinking as content).
- Otherwise the text before the reply's first end tag is the reasoning, with the first start tag
  in it removed (older templates leave `<think>` for the model to write; newer ones put it in the
  prompt); the text after that end tag is the content, as it is. A reply with no end tag is all
  reasoning (a model cut off mid-thought), as vLLM's qwen3 and deepseek_r1 parsers return it.
- An empty part is None (null), as vLLM returns it.

With tool calls (openai/tool_calls.py) only the content part is parsed for them: a
`<tool_call>` block inside unclosed thinking is reasoning. vLLM's qwen3 parser ends the
reasoning at a `<tool_call>` only when `<function=` follows it (the XML call format of
Qwen3-Coder and Qwen3.5, not the hermes JSON this server parses), so for hermes calls it
splits as this does.

A request with structured outputs (response_format, structured_outputs, or a tool_choice that
forces calls) whose reply starts in its thinking thinks freely, as in vLLM: the server sets the
constraint's start_after_token_ids to the end tag's ids (`end_token_ids`), so the engine applies
the grammar only after the model has written `</think>`; the reply is split as any other, the
constrained part being the content (or the forced tool calls read from it). A reply that starts
closed follows the grammar from its first token and is all content. Where the tokenizer does
not write the end tag as one stable id sequence (`end_token_ids` is None) the split is off and
the grammar governs the whole reply, which then has no thinking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    """One parser, by the name `--reasoning-parser` takes. honours_enable_thinking: a request's
    chat_template_kwargs {"enable_thinking": false} means its reply has no reasoning (qwen3; the
    deepseek_r1 parser ignores that key, as vLLM's does)."""

    name: str
    honours_enable_thinking: bool

    def starts_in_reasoning(
        self, prompt: Optional[str], chat_template_kwargs: Optional[dict], continues: bool = False
    ) -> bool:
        """Whether a reply to this rendered prompt begins inside its thinking (module docstring);
        continues: the prompt ends inside its final message (continue_final_message)."""
        kwargs = chat_template_kwargs or {}
        if self.honours_enable_thinking and kwargs.get("enable_thinking", True) is False:
            return False
        prompt = prompt or ""
        end = prompt.rfind(END)
        if end < 0 or end < prompt.rfind(START):
            return True
        return not (continues or not prompt[end + len(END) :].strip())

    def split(self, text: str, in_reasoning: bool) -> tuple[Optional[str], Optional[str]]:
        """(reasoning, content) of a whole reply; each None where empty."""
        stream = ReasoningStream(in_reasoning)
        reasoning, content = stream.feed(text, final=True)
        return reasoning or None, content or None


#: Text around the end tag that must not change its ids (end_token_ids): what a model writes
#: before `</think>` (nothing, a word, a stop, a newline, a space) and after it.
_BEFORE, _AFTER = ("", "a", ".", "\n", " "), ("", "\n\n", "a", " ")


def end_token_ids(tokenizer) -> Optional[tuple[int, ...]]:
    """The ids the tokenizer writes the end tag as, where they are stable: the tag alone encodes
    to them, they decode back to it, and they appear as they are in the tag's encoding between
    any of _BEFORE and _AFTER (an added token such as Qwen3's and DeepSeek-R1's `</think>` is
    so). None otherwise (a BPE that merges the tag's first or last characters with its
    neighbours): the engine finds the end by ids, the split by text, and the two must agree,
    or the grammar would start where the split sees no end, or never start at all."""
    ids = tuple(int(t) for t in tokenizer.encode(END, add_special_tokens=False))
    if not ids or tokenizer.decode(list(ids)) != END:
        return None
    for before in _BEFORE:
        for after in _AFTER:
            around = tuple(tokenizer.encode(before + END + after, add_special_tokens=False))
            if not _contains(around, ids):
                return None
    return ids


def _contains(seq: tuple, part: tuple) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


PARSERS = {
    "qwen3": ReasoningParser("qwen3", honours_enable_thinking=True),
    "deepseek_r1": ReasoningParser("deepseek_r1", honours_enable_thinking=False),
}


def get_parser(name: Optional[str]) -> Optional[ReasoningParser]:
    """The parser `--reasoning-parser NAME` names (None: none); ValueError naming the choices."""
    if name is None:
        return None
    if name not in PARSERS:
        raise ValueError(f"--reasoning-parser must be one of {', '.join(sorted(PARSERS))}, got {name!r}")
    return PARSERS[name]


class ReasoningStream:
    """Splits a reply's text as it grows, delta by delta: feed() returns the new (reasoning,
    content) text. A tag may arrive in pieces (a tokenizer without it as one token), so text that
    could be the start of the tag being looked for is held back until the next delta settles it,
    or until final=True (the reply ended), which flushes it to the part it belongs to.

    Invariant: for any cut of a text into deltas, the concatenated parts equal
    ReasoningParser.split of the whole text (before None-for-empty)."""

    def __init__(self, in_reasoning: bool):
        self.in_reasoning = in_reasoning
        self._start_seen = False  # the first start tag of the reasoning is dropped, later ones kept
        self._pending = ""  # text held back: it may begin a tag

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        """The (reasoning, content) text this delta settles."""
        text = self._pending + delta
        self._pending = ""
        if not self.in_reasoning:
            return "", text
        reasoning = []
        while True:
            tag = END if self._start_seen else _first_tag(text)
            at = text.find(tag) if tag else -1
            if at < 0:  # no tag looked for is whole in text: hold back what could begin one
                tags = (END,) if self._start_seen else (START, END)
                keep = 0 if final else max(_partial_tag(text, t) for t in tags)
                reasoning.append(text[: len(text) - keep])
                self._pending = text[len(text) - keep :]
                return "".join(reasoning), ""
            reasoning.append(text[:at])
            text = text[at + len(tag) :]
            if tag == END:
                self.in_reasoning = False
                return "".join(reasoning), text
            self._start_seen = True


def _first_tag(text: str) -> Optional[str]:
    """Whichever of START and END occurs first in text (None: neither)."""
    start, end = text.find(START), text.find(END)
    if start < 0 and end < 0:
        return None
    if start < 0:
        return END
    if end < 0:
        return START
    return START if start < end else END


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest proper prefix of tag that text ends with (0: none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
