"""`enginespec serve --reasoning-parser`: chat replies carry `reasoning` and `content` (vLLM's
fields), in the full body and in the stream, and the streamed parts concatenate to the full
body's. First the handlers' choice builders over scripted outputs (the tags in the text, arriving
a character a step as the tiny character tokenizer streams them), then the handlers over a real
in-process engine (a random model never writes the tags: there the prompt's template decides)."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginespec.entrypoints.cli import _parser
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest
from enginespec.entrypoints.openai.reasoning import END, START, get_parser
from enginespec.entrypoints.openai.serving import (
    ServerContext,
    _Call,
    create_chat_completion,
    render_chat,
)
from tests.entrypoints.client_helpers import in_process_client, never, stream_then_full

MESSAGES = [{"role": "user", "content": "hi"}]


def _call(include_reasoning: bool = True, in_reasoning: bool = True, stop=None) -> _Call:
    body = ChatCompletionRequest(messages=MESSAGES, include_reasoning=include_reasoning, stop=stop)
    call = _Call("chat", "chatcmpl-1", "m", body, [("p", [1])], tuple([stop] if stop else []))
    call.reasoning, call.starts_in_reasoning = get_parser("qwen3"), in_reasoning
    call.index_of["r"] = 0
    return call


def _stream_then_full(call: _Call, text: str) -> tuple[list[dict], dict]:
    """The deltas of text growing a character a step, and the full body's message."""
    choices, full = stream_then_full(call, text)
    return [c["delta"] for c in choices], full["message"]


def _joined(deltas: list[dict], key: str):
    return "".join(d.get(key, "") for d in deltas) or None


_TEXTS = st.lists(st.sampled_from([START, END, "<", "</th", "ink>", "a", " b\n"]), min_size=1, max_size=10)


@settings(max_examples=200)
@given(pieces=_TEXTS, in_reasoning=st.booleans())
def test_streamed_parts_concatenate_to_the_full_message(pieces, in_reasoning):
    text = "".join(pieces)
    deltas, message = _stream_then_full(_call(in_reasoning=in_reasoning), text)
    assert deltas[0]["role"] == "assistant" and all("role" not in d for d in deltas[1:])
    assert _joined(deltas, "reasoning") == message["reasoning"]
    assert _joined(deltas, "content") == message["content"]
    assert message == {"role": "assistant", **dict(zip(("reasoning", "content"), _split(text, in_reasoning)))}


def _split(text: str, in_reasoning: bool):
    return get_parser("qwen3").split(text, in_reasoning)


def test_a_think_block_goes_to_reasoning_and_the_tags_never_reach_the_client():
    deltas, message = _stream_then_full(_call(), "<think>\nplan</think>\n\nanswer")
    assert message == {"role": "assistant", "content": "\n\nanswer", "reasoning": "\nplan"}
    assert not any(t in json.dumps(deltas) for t in ("<th", "</", "k>"))
    assert all(set(d) - {"role"} for d in deltas)  # no frame without news (held-back steps are skipped)


def test_include_reasoning_false_leaves_the_reasoning_out():
    deltas, message = _stream_then_full(_call(include_reasoning=False), "<think>plan</think>answer")
    assert message == {"role": "assistant", "content": "answer", "reasoning": None}
    assert _joined(deltas, "reasoning") is None and _joined(deltas, "content") == "answer"


def test_a_stop_string_cuts_before_the_split():
    """The engine's text is already cut at the stop string; held-back stop text and held-back
    tag text do not lose each other's characters."""
    call = _call(stop="STOP")
    deltas, message = _stream_then_full(call, "<think>a</thi")
    assert message == {"role": "assistant", "content": None, "reasoning": "a</thi"}
    assert _joined(deltas, "reasoning") == "a</thi"


# ---- over a real engine ---------------------------------------------------------------------

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4, block_size=4)
OPEN = "{% for m in messages %}{{ m['content'] }};{% endfor %}A:<think>\n"  # the template opens it
CLOSED = "{% for m in messages %}{{ m['content'] }};{% endfor %}A:<think>\n\n</think>\n\n"
PLAIN = "{% for m in messages %}{{ m['content'] }};{% endfor %}A:"


@pytest.fixture(scope="module")
def engine(torch_one_thread):
    with in_process_client(**ENGINE) as client:
        yield client


def _chat(engine, parser, template: str, stream: bool = False, **fields):
    """The message (or the streamed deltas) of one greedy chat request under `template`."""
    ctx = ServerContext(
        engine,
        engine.tokenizer,
        ["tiny"],
        64,
        reasoning_parser=get_parser(parser),
        trust_request_chat_template=True,
    )
    fields = {"messages": MESSAGES, **fields}
    body = ChatCompletionRequest(chat_template=template, max_tokens=8, temperature=0, stream=stream, **fields)

    async def run():
        engine.start(asyncio.get_running_loop())
        result = await create_chat_completion(ctx, body, never)
        if not stream:
            return result["choices"][0]["message"]
        frames = [f async for f in result][:-1]  # [DONE] last
        return [json.loads(f[len("data: ") :])["choices"][0]["delta"] for f in frames]

    return asyncio.run(run())


def test_with_the_template_opening_the_thinking_the_whole_reply_is_reasoning(engine):
    text = _chat(engine, None, OPEN)["content"]
    assert END not in text  # a random model: the reply never closes its thinking
    assert _chat(engine, "qwen3", OPEN) == {"role": "assistant", "content": None, "reasoning": text}
    streamed = _chat(engine, "qwen3", OPEN, stream=True)
    assert _joined(streamed, "reasoning") == text and _joined(streamed, "content") is None


def test_with_the_template_closing_the_thinking_the_whole_reply_is_content(engine):
    text = _chat(engine, None, CLOSED)["content"]
    assert _chat(engine, "qwen3", CLOSED) == {"role": "assistant", "content": text, "reasoning": None}
    assert _joined(_chat(engine, "deepseek_r1", CLOSED, stream=True), "content") == text


def test_enable_thinking_false_makes_qwen3_replies_content(engine):
    text = _chat(engine, None, PLAIN)["content"]
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    assert _chat(engine, "qwen3", PLAIN, **off) == {"role": "assistant", "content": text, "reasoning": None}
    assert _chat(engine, "qwen3", PLAIN)["reasoning"] == text  # thinking on: the model's own <think> to come
    assert _chat(engine, "deepseek_r1", PLAIN, **off)["reasoning"] == text  # its parser ignores the key


# Qwen3's way with an agent loop's turns: an assistant turn keeps its thinking in the prompt
KEEPS = (
    "{% for m in messages %}{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m['content'] }};{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
)
TOOL_LOOP = [
    *MESSAGES,
    {"role": "assistant", "content": "", "reasoning": "ask the tool", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]},
    {"role": "tool", "tool_call_id": "c1", "content": "noon"},
]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_the_reply_after_a_tool_result_starts_in_its_thinking(engine, stream):
    """The second turn of a tool loop: the earlier turn's `</think>` in the prompt does not close
    the reply's thinking (it leaked into content, `<think>` tags and all, with a real model)."""
    text = _chat(engine, None, KEEPS, messages=TOOL_LOOP)["content"]
    assert END not in text  # a random model: the reply never closes its thinking
    got = _chat(engine, "qwen3", KEEPS, stream=stream, messages=TOOL_LOOP)
    if stream:
        assert _joined(got, "reasoning") == text and _joined(got, "content") is None
    else:
        assert got == {"role": "assistant", "content": None, "reasoning": text}


def test_continuing_an_answer_after_its_thinking_stays_content(engine):
    prefill = [*MESSAGES, {"role": "assistant", "content": "The answer is", "reasoning": "plan"}]
    fields = dict(messages=prefill, add_generation_prompt=False, continue_final_message=True)
    text = _chat(engine, None, KEEPS, **fields)["content"]
    assert _chat(engine, "qwen3", KEEPS, **fields) == {
        "role": "assistant",
        "content": text,
        "reasoning": None,
    }


def test_without_the_flag_messages_have_no_reasoning_field(engine):
    assert "reasoning" not in _chat(engine, None, OPEN, include_reasoning=False)


def test_the_serve_flag_is_vllms():
    assert _parser().parse_args(["serve", "m", "--reasoning-parser", "qwen3"]).reasoning_parser == "qwen3"
    assert _parser().parse_args(["serve", "m"]).reasoning_parser is None
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "m", "--reasoning-parser", "qwen"])


# reasoning_effort: the template shows which effort it was given (its own variable)
EFFORT = "{% for m in messages %}{{ m['content'] }};{% endfor %}[{{ reasoning_effort }}]A:"


def test_reasoning_effort_reaches_the_template_and_none_turns_thinking_off(engine):
    """OpenAI's reasoning_effort, as vLLM takes it: the template's reasoning_effort variable and
    enable_thinking (false for "none"), which qwen3's parser reads; chat_template_kwargs win."""
    text = _chat(engine, None, PLAIN)["content"]
    assert _chat(engine, "qwen3", PLAIN, reasoning_effort="none") == {
        "role": "assistant", "content": text, "reasoning": None,
    }  # fmt: skip
    assert _chat(engine, "qwen3", PLAIN, reasoning_effort="high")["reasoning"] == text
    explicit = {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}
    assert _chat(engine, "qwen3", PLAIN, **explicit)["reasoning"] == text
    ctx = ServerContext(engine, engine.tokenizer, ["tiny"], 64, trust_request_chat_template=True)
    body = ChatCompletionRequest(messages=MESSAGES, chat_template=EFFORT, reasoning_effort="low")
    assert render_chat(ctx, body) == "hi;[low]A:"
    with pytest.raises(ValueError, match="reasoning_effort"):
        ChatCompletionRequest(messages=MESSAGES, reasoning_effort="extreme")
