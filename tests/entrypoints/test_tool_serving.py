"""Tool calls in `enginespec serve` (`--enable-auto-tool-choice --tool-call-parser hermes`, vLLM's
flags): the request rules, the tools reaching the template, and replies' calls in the full body
and the stream alike. The choice builders run over scripted outputs (a random model writes no
calls), a character a step as the tiny character tokenizer streams; the rules and the template
over a real in-process engine."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from enginespec import LLM, SamplingParams
from enginespec.chat_utils import render_chat
from enginespec.entrypoints.cli import _parser
from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest
from enginespec.entrypoints.openai.reasoning import get_parser
from enginespec.entrypoints.openai.request_stream import RequestStream
from enginespec.entrypoints.openai.serving import (
    ServerContext,
    _Call,
    _stream,
    create_chat_completion,
)
from enginespec.testing.checkpoints import tiny_model_dir
from tests.entrypoints.client_helpers import (
    ScriptedGeneration,
    in_process_client,
    never,
    scripted_output,
    stream_then_full,
)

MESSAGES = [{"role": "user", "content": "weather?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'


def _call(reasoning: bool = False, parallel=None) -> _Call:
    body = ChatCompletionRequest(messages=MESSAGES, tools=TOOLS, parallel_tool_calls=parallel)
    call = _Call("chat", "chatcmpl-1", "m", body, [("p", [1])], ())
    call.reasoning = get_parser("qwen3") if reasoning else None
    call.starts_in_reasoning = reasoning
    call.tool_mode, call.single_tool_call = "auto", parallel is False
    call.index_of["r"] = 0
    return call


def _streamed_calls(choices: list[dict]) -> list[dict]:
    calls = [c for choice in choices for c in choice["delta"].get("tool_calls", [])]
    assert [c["index"] for c in calls] == list(range(len(calls)))
    return [c["function"] for c in calls]


def test_calls_after_thinking_and_a_sentence_in_the_body_and_the_stream():
    text = f"<think>need weather</think>\n\nChecking.\n{CALL}\n{CALL}"
    choices, full = stream_then_full(_call(reasoning=True), text)
    message = full["message"]
    assert message["reasoning"] == "need weather" and message["content"] == "\n\nChecking."
    assert [c["function"] for c in message["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Zürich"}'}
    ] * 2
    ids = [c["id"] for c in message["tool_calls"]]
    assert all(i.startswith("chatcmpl-tool-") for i in ids) and len(set(ids)) == 2
    assert full["finish_reason"] == choices[-1]["finish_reason"] == "tool_calls"
    assert _streamed_calls(choices) == [c["function"] for c in message["tool_calls"]]
    assert "".join(c["delta"].get("content", "") for c in choices) == message["content"]
    assert "<tool_call>" not in json.dumps(choices)


def test_parallel_tool_calls_false_keeps_the_first_call():
    choices, full = stream_then_full(_call(parallel=False), CALL + CALL)
    assert len(full["message"]["tool_calls"]) == 1 and len(_streamed_calls(choices)) == 1


def test_a_reply_without_calls_keeps_its_finish_reason_and_has_no_tool_calls():
    """No `tool_calls: []` (vLLM leaves it out too): the SDK's message.tool_calls is then None,
    which agent loops read as "answered"."""
    choices, full = stream_then_full(_call(), "no tools needed")
    assert full["message"] == {"role": "assistant", "content": "no tools needed"}
    assert full["finish_reason"] == choices[-1]["finish_reason"] == "stop"


def _forced(name=None) -> _Call:
    call = _call()
    call.tool_mode, call.forced_name = ("named", name) if name else ("required", None)
    return call


def test_a_named_functions_reply_is_its_arguments():
    choices, full = stream_then_full(_forced("get_weather"), '{"city": "Bern"}')
    (call,) = full["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Bern"}'}
    assert full["message"]["content"] is None and full["finish_reason"] == "stop"  # OpenAI's, vLLM's
    assert _streamed_calls(choices) == [call["function"]] and choices[-1]["finish_reason"] == "stop"


def test_a_required_reply_is_an_array_of_calls():
    text = '[{"name": "get_weather", "parameters": {"city": "Zürich"}}, {"name": "now", "parameters": {}}]'
    choices, full = stream_then_full(_forced(), text)
    functions = [c["function"] for c in full["message"]["tool_calls"]]
    assert functions == [
        {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
        {"name": "now", "arguments": "{}"},
    ]
    assert full["finish_reason"] == choices[-1]["finish_reason"] == "tool_calls"
    assert _streamed_calls(choices) == functions


def test_a_required_reply_cut_off_is_content():
    choices, full = stream_then_full(_forced(), '[{"name": "now", "param')
    assert full["message"] == {"role": "assistant", "content": '[{"name": "now", "param'}
    assert "".join(c["delta"].get("content", "") for c in choices) == '[{"name": "now", "param'


_PIECES = st.sampled_from([CALL, "<tool_call>{bad}</tool_call>", "\n", " hi", "<think>", "</think>", "<tool"])


@settings(max_examples=100)
@given(pieces=st.lists(_PIECES, min_size=1, max_size=6), reasoning=st.booleans())
def test_the_stream_carries_the_full_bodys_content_and_calls(pieces, reasoning):
    choices, full = stream_then_full(_call(reasoning=reasoning), "".join(pieces))
    message = full["message"]
    assert _streamed_calls(choices) == [c["function"] for c in message.get("tool_calls", [])]
    assert ("".join(c["delta"].get("content", "") for c in choices) or None) == message["content"]
    assert choices[-1]["finish_reason"] == full["finish_reason"]


@pytest.mark.parametrize("continuous", [False, True])
def test_the_sdks_stream_helper_closes_a_call_that_comes_with_the_finish(continuous):
    """The openai SDK's ChatCompletionStreamState (what client.chat.completions.stream runs)
    fires `tool_calls.function.arguments.done` for every call, the last one included, when that
    call arrives in the same engine output as the finish (here the whole second call)."""
    options = {"include_usage": True, "continuous_usage_stats": continuous}
    call = _call()
    call.body = ChatCompletionRequest(messages=MESSAGES, tools=TOOLS, stream=True, stream_options=options)
    outputs = [scripted_output(CALL), scripted_output(CALL + CALL, "stop")]
    for out in outputs:
        out.finished = out.outputs[0].finish_reason is not None

    async def frames():
        return [
            f async for f in _stream(ServerContext(None, None, ["m"], 64), call, ScriptedGeneration(outputs))
        ]

    state = ChatCompletionStreamState(input_tools=TOOLS)
    done = []
    for raw in asyncio.run(frames())[:-1]:  # the last is [DONE]
        for event in state.handle_chunk(ChatCompletionChunk.model_validate(json.loads(raw[len("data: ") :]))):
            if event.type == "tool_calls.function.arguments.done":
                done.append((event.index, event.name))
    assert done == [(0, "get_weather"), (1, "get_weather")]
    choice = state.get_final_completion().choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 2


# ---- over a real engine ---------------------------------------------------------------------

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4, block_size=4)
# lists the tools and writes an assistant's calls with their arguments through tojson, as Qwen's do
TEMPLATE = (
    "{% if tools %}T:{% for t in tools %}{{ t.function.name }},{% endfor %};{% endif %}"
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}"
    "{% for c in m.tool_calls or [] %}C:{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %};"
    "{% endfor %}A:"
)


@pytest.fixture(scope="module")
def engine(torch_one_thread):
    with in_process_client(**ENGINE) as client:
        yield client


def _chat(engine, auto: bool = True, **fields) -> dict:
    """The body of one greedy chat request to a server with (auto) or without the tool flags."""
    ctx = ServerContext(
        engine, engine.tokenizer, ["tiny"], 200, chat_template=TEMPLATE,
        enable_auto_tool_choice=auto, tool_call_parser="hermes" if auto else None,
    )  # fmt: skip
    body = ChatCompletionRequest(
        **{"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "return_token_ids": True, **fields}
    )

    async def run():
        engine.start(asyncio.get_running_loop())
        return await create_chat_completion(ctx, body, never)

    return asyncio.run(run())


def _prompt(engine, body: dict) -> str:
    return engine.tokenizer.decode(body["prompt_token_ids"])


def test_the_tools_reach_the_template_and_auto_parses_the_reply(engine):
    sampled = dict(temperature=1.0, seed=3)  # greedy, the tiny model writes only an empty special token
    body = _chat(engine, tools=TOOLS, **sampled)
    assert _prompt(engine, body).startswith("T:get_weather,;")
    message = body["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"]  # a random model calls nothing
    plain = _chat(engine, tools=TOOLS, tool_choice="none", **sampled)["choices"][0]["message"]
    assert plain == {"role": "assistant", "content": message["content"]}  # shown, not parsed


def test_an_assistant_calls_arguments_reach_the_template_as_an_object(engine):
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Bern"}'},
    }
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]  # fmt: skip
    prompt = render_chat(engine.tokenizer, history, chat_template=TEMPLATE, tools=TOOLS)
    assert prompt.endswith('u:weather?;a:C:get_weather{"city": "Bern"};t:sunny;A:')
    assert _chat(engine, messages=history, tools=TOOLS)["prompt_token_ids"] == engine.tokenizer.encode(
        prompt, add_special_tokens=False
    )
    bad = [
        *MESSAGES,
        {"role": "assistant", "tool_calls": [{**call, "function": {"name": "f", "arguments": "{x"}}]},
    ]
    with pytest.raises(
        APIError, match=r"messages\[1\].tool_calls\[0\].function.arguments must be a JSON object"
    ):
        _chat(engine, messages=bad)


def _tool(parameters) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


@pytest.mark.parametrize(
    "fields, param, message",
    [
        (
            dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
            "tool_choice",
            "'nope', which is not among the tools",
        ),  # noqa: E501
        (dict(tools=TOOLS, tool_choice={"type": "function"}), "tool_choice", "a named tool_choice is"),
        (
            dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
            "tool_choice",
            "cannot be combined with response_format",
        ),
        (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice", "must be"),
        (dict(tools=[{"type": "function", "function": {}}]), "tools", r"tools\[0\] must be"),
        (dict(tools=TOOLS, parallel_tool_calls="yes"), "parallel_tool_calls", "must be a bool"),
        # a function's parameters, when given, are a JSON schema object (vLLM's FunctionDefinition);
        # a forced choice compiles them (a number was a 500, a JSON text string taken as a schema)
        *[
            (
                dict(tools=[_tool(params)], tool_choice=choice),
                "tools",
                r"tools\[0\].function.parameters must be",
            )
            for params in (5, "{}", [])
            for choice in ("auto", "required", {"type": "function", "function": {"name": "f"}})
        ],
        # vLLM's (and OpenAI's): no empty tools, no tool_choice but "none" without tools
        (dict(tools=[]), "tools", "must not be an empty array"),
        (dict(tools=[], tool_choice="none"), "tools", "must not be an empty array"),
        (dict(tool_choice="auto"), "tool_choice", "`tools` must be set"),
        (dict(tool_choice="required"), "tool_choice", "`tools` must be set"),
    ],
)
def test_bad_tool_requests_are_400s_naming_the_field(engine, fields, param, message):
    with pytest.raises(APIError, match=message) as err:
        _chat(engine, **fields)
    assert err.value.status == 400 and err.value.param == param


def test_auto_without_the_server_flags_is_vllms_400(engine):
    with pytest.raises(APIError, match="--enable-auto-tool-choice and --tool-call-parser") as err:
        _chat(engine, auto=False, tools=TOOLS)
    assert err.value.param == "tool_choice"
    assert (
        "tool_calls"
        not in _chat(engine, auto=False, tools=TOOLS, tool_choice="none")["choices"][0]["message"]
    )


def test_offline_chat_takes_tools_for_the_template():
    llm = LLM(
        str(tiny_model_dir("qwen3")), impl="fast", device="cpu", dtype="float32", num_blocks=32, block_size=4
    )
    out = llm.chat(
        MESSAGES, SamplingParams(max_tokens=1), chat_template=TEMPLATE, tools=TOOLS, use_tqdm=False
    )
    assert out[0].prompt.startswith("T:get_weather,;")


def test_the_serve_flags_are_vllms():
    ns = _parser().parse_args(["serve", "m", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    assert ns.enable_auto_tool_choice and ns.tool_call_parser == "hermes"
    for name in ("llama3_json", "mistral"):
        assert _parser().parse_args(["serve", "m", "--tool-call-parser", name]).tool_call_parser == name
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "m", "--tool-call-parser", "pythonic"])


# ---- tags the tokenizer marks special (Hermes-2-Pro's and Hermes-3's <tool_call>) ----------------


def _tag_tokenizer():
    """A character tokenizer for MESSAGES' and CALL's text whose `<tool_call>` and `</tool_call>`
    are special tokens, one id each, as in the Hermes checkpoints vLLM's parser names."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(CALL + TEMPLATE + "weather?ut;:AT,get_"))
    vocab = {t: i for i, t in enumerate(["<unk>", "</s>", *chars])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    return tok


class _Replying:
    """An engine client that answers every request with `reply` (token ids, then EOS), decoded
    as the real client decodes it (RequestStream, with the request's params)."""

    def __init__(self, tokenizer, reply: list[int]):
        self.tokenizer, self.reply = tokenizer, reply

    async def submit(self, subs, prompt_only=False):
        (sub,) = subs
        stream = RequestStream(sub, None, self.tokenizer, 0.0)
        ids = [*self.reply, self.tokenizer.eos_token_id]
        stream.apply((sub.request_id, 0, ids, None, None, "stop", None, None, None, None))
        return ScriptedGeneration([stream.output])


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_reads_tags_the_tokenizer_marks_special(stream):
    """vLLM's hermes parser decodes special tokens for requests with tools (unless tool_choice
    is "none"): with skip_special_tokens the tags vanished and the call came out as content."""
    tok = _tag_tokenizer()
    ctx = ServerContext(
        _Replying(tok, tok.encode(CALL, add_special_tokens=False)), tok, ["m"], 200,
        chat_template=TEMPLATE, enable_auto_tool_choice=True, tool_call_parser="hermes",
    )  # fmt: skip

    async def run(**fields):
        body = ChatCompletionRequest(messages=MESSAGES, tools=TOOLS, stream=stream, **fields)
        out = await create_chat_completion(ctx, body, never)
        if not stream:
            return out["choices"][0]
        return [json.loads(f[len("data: ") :])["choices"][0] async for f in out if f != "data: [DONE]\n\n"]

    calls = asyncio.run(run())
    if stream:
        calls = [c for choice in calls for c in choice["delta"].get("tool_calls", [])]
    else:
        calls = calls["message"]["tool_calls"]
    assert [c["function"] for c in calls] == [{"name": "get_weather", "arguments": '{"city": "Zürich"}'}]
    none = asyncio.run(run(tool_choice="none"))  # the request's skip_special_tokens stands
    text = none["message"]["content"] if not stream else "".join(c["delta"].get("content", "") for c in none)
    assert "tool_call" not in text and "get_weather" in text


# ---- the llama3_json and mistral formats (openai/tool_parsers.py) -------------------------------

REPLIES = {
    "llama3_json": 'Checking.\n<|python_tag|>{"name": "get_weather", "parameters": {"city": "Zürich"}}; '
    '{"name": "get_weather", "arguments": {"city": "Bern"}}',
    "mistral": 'Checking.\n[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Zürich"}}, '
    '{"name": "get_weather", "arguments": {"city": "Bern"}}]',
}
FUNCTIONS = [
    {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
    {"name": "get_weather", "arguments": '{"city": "Bern"}'},
]


def _special_tokenizer():
    """A character tokenizer for MESSAGES' and REPLIES' text whose `<|python_tag|>` and
    `[TOOL_CALLS]` are special tokens, one id each, as in Llama 3.1's and Mistral's tokenizers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("".join(REPLIES.values()) + TEMPLATE + "weather?ut;:AT,get_"))
    vocab = {t: i for i, t in enumerate(["<unk>", "</s>", *chars])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")
    tok.add_special_tokens({"additional_special_tokens": ["<|python_tag|>", "[TOOL_CALLS]"]})
    return tok


def _check_id(parser: str, call_id: str) -> None:
    if parser == "mistral":  # what Mistral's templates take back: 9 letters and digits, as vLLM's
        assert len(call_id) == 9 and call_id.isalnum() and call_id.isascii(), call_id
    else:
        assert call_id.startswith("chatcmpl-tool-"), call_id


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("parser", sorted(REPLIES))
def test_llama3_json_and_mistral_calls_through_the_chat_path(parser, stream):
    """`--tool-call-parser llama3_json` / `mistral`: the reply's calls come back as tool_calls,
    its text before them as content, with special tokens decoded (the tags are special)."""
    tok = _special_tokenizer()
    ctx = ServerContext(
        _Replying(tok, tok.encode(REPLIES[parser], add_special_tokens=False)), tok, ["m"], 200,
        chat_template=TEMPLATE, enable_auto_tool_choice=True, tool_call_parser=parser,
    )  # fmt: skip

    async def run():
        body = ChatCompletionRequest(messages=MESSAGES, tools=TOOLS, stream=stream)
        out = await create_chat_completion(ctx, body, never)
        if not stream:
            return out["choices"][0]
        return [json.loads(f[len("data: ") :])["choices"][0] async for f in out if f != "data: [DONE]\n\n"]

    out = asyncio.run(run())
    if stream:
        calls = [c for choice in out for c in choice["delta"].get("tool_calls", [])]
        content = "".join(c["delta"].get("content", "") for c in out)
        finish = out[-1]["finish_reason"]
    else:
        calls, content, finish = out["message"]["tool_calls"], out["message"]["content"], out["finish_reason"]
    assert [c["function"] for c in calls] == FUNCTIONS
    assert content == "Checking." and finish == "tool_calls"
    for c in calls:
        _check_id(parser, c["id"])


@pytest.mark.parametrize("parser", sorted(REPLIES))
def test_llama3_json_and_mistral_streams_a_character_a_step_as_the_full_body(parser):
    call = _call()
    call.tool_parser = parser
    choices, full = stream_then_full(call, REPLIES[parser])
    assert [c["function"] for c in full["message"]["tool_calls"]] == _streamed_calls(choices) == FUNCTIONS
    assert (
        "".join(c["delta"].get("content", "") for c in choices) == full["message"]["content"] == "Checking."
    )
    assert full["finish_reason"] == choices[-1]["finish_reason"] == "tool_calls"
    bad = REPLIES[parser].replace('"Bern"}', '"Bern"')  # a cut-off JSON: the calls part is content
    call = _call()  # a fresh one: the stream's progress lives on the call
    call.tool_parser = parser
    choices, full = stream_then_full(call, bad)
    assert "".join(c["delta"].get("content", "") for c in choices) == full["message"]["content"]
    assert _streamed_calls(choices) == [c["function"] for c in full["message"].get("tool_calls", [])]


@pytest.mark.parametrize("parser", sorted(REPLIES))
def test_forced_calls_take_the_parsers_id_form(parser):
    """tool_choice "required" reads the reply as with hermes (forced_calls); only the ids
    follow the server's parser, so a Mistral template takes the calls back."""
    call = _forced()
    call.tool_parser = parser
    choices, full = stream_then_full(call, '[{"name": "get_weather", "parameters": {"city": "Zürich"}}]')
    (called,) = full["message"]["tool_calls"]
    assert called["function"] == FUNCTIONS[0] and full["finish_reason"] == "tool_calls"
    _check_id(parser, called["id"])
    _check_id(parser, choices[-1]["delta"]["tool_calls"][0]["id"])


# a string escape of half a surrogate pair: valid JSON text, but no UTF-8 body can carry its value
LONE = '{"city": "\\ud83d"}'
LONE_REPLIES = {
    "hermes": f'<tool_call>{{"name": "get_weather", "arguments": {LONE}}}</tool_call>',
    "llama3_json": f'{{"name": "get_weather", "parameters": {LONE}}}',
    "mistral": f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {LONE}}}]',
    "required": f'[{{"name": "get_weather", "parameters": {LONE}}}]',
}


@pytest.mark.parametrize("parser", sorted(LONE_REPLIES))
def test_a_call_holding_a_lone_surrogate_is_content_and_the_body_renders(parser):
    """A reply whose call JSON escapes half a surrogate pair (`"\\ud83d"`) was read as a call
    whose arguments held that lone surrogate: the full body then failed to encode as UTF-8 (a
    500 after the whole generation). Such JSON is no call (I-JSON's rule): the reply is content
    as written, the same in the stream."""
    from starlette.responses import JSONResponse

    call = _forced() if parser == "required" else _call()
    call.tool_parser = "hermes" if parser == "required" else parser
    choices, full = stream_then_full(call, LONE_REPLIES[parser])
    assert JSONResponse({"choices": [full]}).body  # renders (the old code raised here)
    assert full["message"] == {"role": "assistant", "content": LONE_REPLIES[parser]}
    assert "".join(c["delta"].get("content", "") for c in choices) == LONE_REPLIES[parser]
    assert _streamed_calls(choices) == [] and full["finish_reason"] == "stop"
