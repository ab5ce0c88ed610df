"""The server's chat rendering (serving.render_chat) on its own, no server process: vLLM's chat
fields in the request bodies, chat_utils' rules as 400s naming the field, and
--trust-request-chat-template. test_serve.py runs the same fields through a real server."""

from __future__ import annotations

import pytest

from enginespec.chat_utils import render_chat as offline_render
from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, TokenizeRequest
from enginespec.entrypoints.openai.serving import ServerContext, render_chat
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker.loader import load_tokenizer
from tests.entrypoints.remote_server import CHAT_TEMPLATE

CONVERSATION = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Yo"}]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(tiny_model_dir("qwen3"))


def _ctx(tokenizer, template=CHAT_TEMPLATE, trust=False) -> ServerContext:
    return ServerContext(None, tokenizer, ["m"], 256, template, trust_request_chat_template=trust)


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": CONVERSATION, **fields})


def _bad(ctx, body, param: str, match: str) -> None:
    with pytest.raises(APIError, match=match) as info:
        render_chat(ctx, body)
    assert info.value.status == 400 and info.value.param == param


def test_the_server_renders_as_llm_chat_does(tokenizer):
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    for fields in ({}, {"messages": parts}, {"add_generation_prompt": False, "continue_final_message": True}):
        body = _chat(**fields)
        want = offline_render(
            tokenizer,
            body.messages,
            chat_template=CHAT_TEMPLATE,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
        )
        assert render_chat(_ctx(tokenizer), body) == want
    assert render_chat(_ctx(tokenizer), _chat(messages=parts)) == "u:a\nb;A:"
    cont = _chat(add_generation_prompt=False, continue_final_message=True)
    assert render_chat(_ctx(tokenizer), cont) == "u:hi;a:Yo"
    tok = TokenizeRequest.model_validate(
        {
            "messages": CONVERSATION,
            **cont.model_dump(include={"add_generation_prompt", "continue_final_message"}),
        }
    )
    assert render_chat(_ctx(tokenizer), tok) == "u:hi;a:Yo"


def test_chat_errors_are_400s_naming_the_field(tokenizer):
    ctx = _ctx(tokenizer)
    _bad(ctx, _chat(continue_final_message=True), "continue_final_message", "Cannot set both")
    user_last = CONVERSATION + [{"role": "user", "content": "q"}]
    body = _chat(messages=user_last, continue_final_message=True, add_generation_prompt=False)
    _bad(ctx, body, "continue_final_message", "assistant's")
    _bad(
        ctx,
        _chat(chat_template_kwargs={"tokenize": True}),
        "chat_template_kwargs",
        "unexpected chat template kwargs",
    )
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    _bad(ctx, _chat(messages=[{"role": "user", "content": [image]}]), "messages", "'image_url' part")
    _bad(_ctx(tokenizer, template=None), _chat(), "chat_template", "--chat-template")


def test_chat_template_kwargs_reach_the_template(tokenizer):
    ctx = _ctx(tokenizer, template="{{ greeting }}" + CHAT_TEMPLATE)
    assert render_chat(ctx, _chat(chat_template_kwargs={"greeting": "G"})) == "Gu:hi;a:Yo;A:"


def test_a_requests_chat_template_needs_the_trust_flag(tokenizer):
    body = _chat(chat_template="{{ messages[1]['content'] }}")
    _bad(_ctx(tokenizer), body, "chat_template", "--trust-request-chat-template is not set")
    assert render_chat(_ctx(tokenizer, trust=True), body) == "Yo"
    assert render_chat(_ctx(tokenizer, template=None, trust=True), body) == "Yo"
    _bad(_ctx(tokenizer, trust=True), _chat(chat_template="{% if %}"), "chat_template", "not a valid Jinja")


@pytest.mark.parametrize("calls", [5, True, "f", {"function": {"name": "f"}}])
def test_an_assistants_tool_calls_that_are_no_list_are_a_400_naming_them(tokenizer, calls):
    """OpenAI's tool_calls is a list (null and [] are no calls): anything else was a TypeError
    (a 500) or, for a str or an object, a 400 about its characters or keys as if they were calls."""
    messages = [CONVERSATION[0], {"role": "assistant", "content": "x", "tool_calls": calls}]
    _bad(_ctx(tokenizer), _chat(messages=messages), "messages", r"messages\[1\].tool_calls must be a list")


def test_refusal_and_input_text_parts_are_text_as_in_vllm(tokenizer):
    """OpenAI's assistant content parts are text and refusal ({"type": "refusal", "refusal":
    ...}); vLLM also takes the Responses API's input_text. Each is its text (a null one is
    skipped, as a null text), joined as text parts are; they were 400s."""
    refusal = {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}
    parts = [
        {"type": "input_text", "text": "a"},
        {"type": "text", "text": "b"},
        {"type": "refusal", "refusal": None},
    ]
    messages = [{"role": "user", "content": parts}, refusal]
    assert render_chat(_ctx(tokenizer), _chat(messages=messages)) == "u:a\nb;a:No.;A:"
    bad = [{"role": "assistant", "content": [{"type": "refusal", "refusal": 5}]}]
    _bad(_ctx(tokenizer), _chat(messages=bad), "messages", "a refusal part's refusal must be a string")


# Deeper than json.loads recurses on every Python we run: about 1,000 levels on 3.11, several
# thousand on 3.12 (its C recursion limit; 5,000 levels parsed there).
DEEP = 100_000


def test_tool_call_arguments_nested_past_the_decoders_depth_are_a_400(tokenizer):
    """json.loads recurses about 1000 levels deep: deeper arguments raised its RecursionError (a
    500); they are refused as any arguments that are no JSON object."""
    deep = "[" * DEEP + "]" * DEEP
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": ' + deep + "}"}}
    messages = [CONVERSATION[0], {"role": "assistant", "content": None, "tool_calls": [call]}]
    match = r"messages\[1\].tool_calls\[0\].function.arguments must be a JSON object"
    _bad(_ctx(tokenizer), _chat(messages=messages), "messages", match)


def test_no_chat_template_is_vllms_400_naming_chat_template(tokenizer):
    """A tokenizer without a chat template and no --chat-template: /v1/chat/completions and
    /tokenize with messages answer vLLM's 400 message (clients that switch a base model to
    /v1/completions match on it), the field named chat_template, the server's remedy after it."""
    from tests.api.test_chat_utils import VLLM_NO_TEMPLATE

    for body in (_chat(), TokenizeRequest.model_validate({"messages": CONVERSATION})):
        with pytest.raises(APIError) as info:
            render_chat(_ctx(tokenizer, template=None), body)
        err = info.value
        assert err.status == 400 and err.param == "chat_template", (err.status, err.param)
        assert str(err.message).startswith(VLLM_NO_TEMPLATE) and "--chat-template" in err.message, err.message
