"""The reasoning parsers' split (entrypoints/openai/reasoning.py): the whole reply against a
plain reference of the rule, and any cut of it into stream deltas against the whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginespec.entrypoints.openai.reasoning import END, START, ReasoningStream, get_parser

# Pieces that make tags, partial tags and tags split across deltas likely.
_PIECES = st.sampled_from([START, END, "<", "</", "<th", "think", "ink>", ">", "a", "b c", "\n", "é"])
_TEXTS = st.lists(_PIECES, max_size=12).map("".join)
# Plain string work (milliseconds): far more examples than the CI profile's default.
_MANY = settings(max_examples=500)


def _reference(text: str, in_reasoning: bool) -> tuple[str, str]:
    """The module docstring's rule, on the whole text at once."""
    if not in_reasoning:
        return "", text
    start, end = text.find(START), text.find(END)
    stop = end if end >= 0 else len(text)
    if 0 <= start < stop:
        reasoning = text[:start] + text[start + len(START) : stop]
    else:
        reasoning = text[:stop]
    return reasoning, text[end + len(END) :] if end >= 0 else ""


def _streamed(text: str, cuts: list[int], in_reasoning: bool) -> tuple[str, str]:
    stream = ReasoningStream(in_reasoning)
    bounds = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
    parts = [stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    parts.append(stream.feed("", final=True))
    return "".join(p[0] for p in parts), "".join(p[1] for p in parts)


@_MANY
@given(text=_TEXTS, in_reasoning=st.booleans())
def test_whole_split_follows_the_rule(text, in_reasoning):
    reasoning, content = get_parser("qwen3").split(text, in_reasoning)
    want_reasoning, want_content = _reference(text, in_reasoning)
    assert (reasoning, content) == (want_reasoning or None, want_content or None)


@_MANY
@given(text=_TEXTS, cuts=st.lists(st.integers(0, 80), max_size=10), in_reasoning=st.booleans())
def test_any_cut_into_deltas_gives_the_whole_split(text, cuts, in_reasoning):
    assert _streamed(text, cuts, in_reasoning) == _reference(text, in_reasoning)


def test_a_tag_split_over_deltas_is_held_back_until_settled():
    stream = ReasoningStream(in_reasoning=True)
    assert stream.feed("<th") == ("", "")  # may begin <think>
    assert stream.feed("ink><t") == ("<t", "")  # after the first <think>, only </think> is looked for
    assert stream.feed("plan</") == ("plan", "")  # may begin </think>
    assert stream.feed("thi") == ("", "")
    assert stream.feed("nk>\n\nanswer") == ("", "\n\nanswer")
    assert stream.feed(" <think> kept") == ("", " <think> kept")  # content is never parsed


def test_held_back_text_that_is_no_tag_goes_out_with_the_next_delta_or_at_the_end():
    stream = ReasoningStream(in_reasoning=True)
    assert stream.feed("x </t") == ("x ", "")
    assert stream.feed("ea") == ("</tea", "")
    assert stream.feed(" <") == (" ", "")
    assert stream.feed("", final=True) == ("<", "")


def test_only_the_first_start_tag_of_the_reasoning_is_dropped():
    assert get_parser("qwen3").split("<think>a<think>b</think>c", True) == ("a<think>b", "c")
    assert get_parser("deepseek_r1").split("no end tag: cut off", True) == ("no end tag: cut off", None)
    assert get_parser("qwen3").split("</think>", True) == (None, None)


@pytest.mark.parametrize(
    "prompt, kwargs, expected",
    [
        ("<|im_start|>assistant\n", None, True),  # the model writes <think> itself (old template)
        ("<|im_start|>assistant\n<think>\n", None, True),  # the template opened it
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", None, False),  # enable_thinking off
        ("earlier <think>x</think> turn, now <think>\n", None, True),
        ("<|im_start|>assistant\n", {"enable_thinking": False}, False),
        ("<|im_start|>assistant\n", {"enable_thinking": True}, True),
        (None, None, True),
    ],
)
def test_qwen3_reply_starts_in_its_thinking_unless_the_prompt_or_the_request_closed_it(
    prompt, kwargs, expected
):
    assert get_parser("qwen3").starts_in_reasoning(prompt, kwargs) is expected


# Qwen3's template in an agent loop: the assistant turn after the last user query keeps its
# thinking (sent back as `reasoning`), then the tool's result, then the generation prompt
QWEN3_TOOL_LOOP = (
    "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n<think>\nask the tool\n</think>\n\n"
    "<tool_call>\n{}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n"
    "</tool_response><|im_end|>\n<|im_start|>assistant\n"
)


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_an_earlier_turns_closed_thinking_does_not_close_the_reply(parser):
    """The prompt's last end tag closes the reply's thinking only where the generation prompt
    ends with it (whitespace aside), or the request continues the final message (the tag is that
    message's own): an end tag of an earlier turn, followed by more turns, says nothing of the
    reply's (its thinking leaked into content on the second turn of every tool loop)."""
    reasoner = get_parser(parser)
    assert reasoner.starts_in_reasoning(QWEN3_TOOL_LOOP, None) is True
    assert reasoner.starts_in_reasoning(QWEN3_TOOL_LOOP + "<think>\n\n</think>\n\n", None) is False
    assert reasoner.starts_in_reasoning("A:<think>plan</think>The answer is", None, continues=True) is False
    assert reasoner.split("<think>\nsunny</think>\n\nIt is sunny.", True) == ("\nsunny", "\n\nIt is sunny.")


def test_deepseek_r1_ignores_enable_thinking():
    assert get_parser("deepseek_r1").starts_in_reasoning("assistant:", {"enable_thinking": False}) is True


def test_an_unknown_parser_name_lists_the_choices():
    assert get_parser(None) is None
    with pytest.raises(ValueError, match="--reasoning-parser must be one of deepseek_r1, qwen3, got 'qwen'"):
        get_parser("qwen")
