"""vLLM's server-wide body defaults: --response-role (a chat reply's role after a generation
prompt), --return-tokens-as-token-ids (logprob tokens as "token_id:N" where the body leaves the
field unset), --enable-force-include-usage (a usage chunk ends every stream) and
--chat-template-content-format (message content as a string or as OpenAI's parts). Each was
argparse's "unrecognized arguments" (exit 2) before. The handlers run over an in-process engine
client; one real server checks that the flags reach them."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from enginespec.entrypoints.cli import _parser
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from enginespec.entrypoints.openai.serving import (
    ServerContext,
    create_chat_completion,
    create_completion,
    render_chat,
)
from enginespec.testing.checkpoints import tiny_model_dir
from tests.entrypoints.client_helpers import in_process_client, never
from tests.entrypoints.remote_server import CHAT_TEMPLATE, RemoteServer

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4)
MESSAGES = [{"role": "user", "content": "hi"}]
# Shows how content reached it: S for a string, L and the first part's text for a list of parts
# (it loops over nothing, so "auto" detects the string form); then its variable x (unset: "").
PARTS_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{% if m['content'] is string %}S{{ m['content'] }}"
    "{% else %}L{{ m['content'][0]['text'] }}{% endif %};{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    "{{ x }}"
)


@pytest.fixture(scope="module")
def client():
    with in_process_client(**ENGINE) as engine:
        yield engine


def _run(client, ctx_fields: dict, make, body):
    """The handler's answer: a full body (dict), or a stream's frames decoded (until [DONE])."""
    ctx = ServerContext(client, client.tokenizer, ["tiny"], 64, CHAT_TEMPLATE, **ctx_fields)

    async def run():
        client.start(asyncio.get_running_loop())
        result = await make(ctx, body, never)
        if isinstance(result, dict):
            return result
        frames = [f async for f in result]
        assert frames[-1] == "data: [DONE]\n\n"
        return [json.loads(f[len("data: ") :]) for f in frames[:-1]]

    return asyncio.run(run())


def _chat(messages=MESSAGES, **fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="tiny", messages=messages, max_tokens=3, temperature=0, **fields)


def _completion(**fields) -> CompletionRequest:
    return CompletionRequest(model="tiny", prompt=[5, 6, 7], max_tokens=3, temperature=0, **fields)


def test_the_flags_parse_as_vllms():
    ns = _parser().parse_args(
        [
            "serve",
            "m",
            "--response-role",
            "bot",
            "--return-tokens-as-token-ids",
            "--enable-force-include-usage",
        ]
        + ["--chat-template-content-format", "openai"]
    )
    assert (ns.response_role, ns.return_tokens_as_token_ids, ns.enable_force_include_usage) == (
        "bot",
        True,
        True,
    )
    assert ns.chat_template_content_format == "openai"
    defaults = _parser().parse_args(["serve", "m"])
    assert (defaults.response_role, defaults.chat_template_content_format) == ("assistant", "auto")
    for bad in (["--response-role", " "], ["--chat-template-content-format", "xml"]):
        with pytest.raises(SystemExit):
            _parser().parse_args(["serve", "m", *bad])


def test_a_reply_to_a_generation_prompt_has_the_response_role(client):
    role = {"response_role": "bot"}
    assert _run(client, role, create_chat_completion, _chat())["choices"][0]["message"]["role"] == "bot"
    first = _run(client, role, create_chat_completion, _chat(stream=True))[0]
    assert first["choices"][0]["delta"]["role"] == "bot"
    # a reply that continues the client's final (assistant) message stays the assistant's
    continued = [*MESSAGES, {"role": "assistant", "content": "ok"}]
    cont = _chat(continued, add_generation_prompt=False, continue_final_message=True, echo=True)
    message = _run(client, role, create_chat_completion, cont)["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"].startswith("ok")
    assert _run(client, {}, create_chat_completion, _chat())["choices"][0]["message"]["role"] == "assistant"
    # no generation prompt: the final message's role, whoever sent it (vLLM's get_chat_request_role)
    for last in ("user", "tool", "assistant"):
        messages = [
            *MESSAGES[:-1],
            {"role": last, "content": "go on", **({"tool_call_id": "t"} if last == "tool" else {})},
        ]
        body = _chat(messages, add_generation_prompt=False)
        assert _run(client, role, create_chat_completion, body)["choices"][0]["message"]["role"] == last, last
        first = _run(
            client, role, create_chat_completion, _chat(messages, add_generation_prompt=False, stream=True)
        )[0]
        assert first["choices"][0]["delta"]["role"] == last, last


def test_logprob_tokens_are_ids_unless_the_body_says_otherwise(client):
    on = {"return_tokens_as_token_ids": True}

    def tokens(ctx_fields, **fields):
        return _run(client, ctx_fields, create_completion, _completion(logprobs=1, **fields))["choices"][0][
            "logprobs"
        ]["tokens"]

    assert all(t.startswith("token_id:") for t in tokens(on)) and len(tokens(on)) == 3
    assert not any(t.startswith("token_id:") for t in tokens(on, return_tokens_as_token_ids=False))
    assert not any(t.startswith("token_id:") for t in tokens({}))
    chat = _run(client, on, create_chat_completion, _chat(logprobs=True, top_logprobs=1))
    assert all(e["token"].startswith("token_id:") for e in chat["choices"][0]["logprobs"]["content"])


def test_forced_usage_ends_every_stream(client):
    force = {"force_include_usage": True}
    chunks = _run(client, force, create_completion, _completion(stream=True))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all("usage" not in c for c in chunks[:-1])  # no continuous usage unless asked
    continuous = _run(
        client,
        force,
        create_chat_completion,
        _chat(stream=True, stream_options={"continuous_usage_stats": True}),
    )
    assert all("usage" in c for c in continuous) and continuous[-1]["usage"]["total_tokens"] > 3
    plain = _run(client, {}, create_completion, _completion(stream=True))
    assert all("usage" not in c for c in plain)


def test_the_content_format_is_the_servers_choice(client):
    def prompt(content_format: str) -> str:
        ctx = ServerContext(
            None, client.tokenizer, ["tiny"], 64, PARTS_TEMPLATE, chat_template_content_format=content_format
        )
        return render_chat(ctx, _chat())

    assert prompt("auto") == prompt("string") == "u:Shi;A:"
    assert prompt("openai") == "u:Lhi;A:"


def test_a_server_takes_the_flags(tmp_path):
    """These flags and test_vllm_frontend_flags' (--default-chat-template-kwargs, ...) reach the
    handlers of a real server."""
    args = ["--served-model-name", "tiny", "--chat-template", PARTS_TEMPLATE, "--response-role", "bot"]
    args += ["--return-tokens-as-token-ids", "--enable-force-include-usage"]
    args += ["--chat-template-content-format", "openai", "--num-blocks", "64"]
    args += ["--default-chat-template-kwargs", '{"x": "Q"}', "--exclude-tools-when-tool-choice-none"]
    args += ["--enable-tokenizer-info-endpoint", "--log-error-stack", "--uvicorn-log-level", "info"]
    args += ["--enable-log-requests", "--enable-log-outputs"]
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log_file:
        srv = RemoteServer(tiny_model_dir("qwen3"), args, stderr=log_file)
    try:
        client = srv.client()
        reply = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=2, temperature=0, logprobs=True
        )
        assert reply.choices[0].message.role == "bot"
        assert all(e.token.startswith("token_id:") for e in reply.choices[0].logprobs.content)
        chunks = list(client.completions.create(model="tiny", prompt=[5, 6], max_tokens=2, stream=True))
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
        ids = srv.post("/tokenize", {"model": "tiny", "messages": MESSAGES}).json()["tokens"]
        assert srv.post("/detokenize", {"model": "tiny", "tokens": ids}).json()["prompt"] == "u:Lhi;A:Q"
        info = httpx.get(srv.url("/tokenizer_info"), timeout=30)
        assert info.status_code == 200 and info.json()["chat_template"] == PARTS_TEMPLATE
        assert srv.post("/v1/completions", {"model": "nope", "prompt": "x"}).status_code == 404
    finally:
        assert srv.terminate() == 0
    log = log_path.read_text()
    assert "Generated response " in log and "error answered 404" in log and "Traceback" in log


def test_echo_leads_with_the_last_message_only_when_it_has_the_replys_role(client):
    """echo true: after a generation prompt a user's last message is not the reply's (no echo);
    an assistant's final message that the reply continues leads it, and so does a user's where
    no generation prompt makes the reply the user's (vLLM's rule). Without echo nothing leads."""
    asked = [{"role": "user", "content": "zq"}]
    plain = _run(client, {}, create_chat_completion, _chat(asked))["choices"][0]["message"]["content"]
    echoed = _run(client, {}, create_chat_completion, _chat(asked, echo=True))["choices"][0]["message"]
    assert echoed["content"] == plain and not plain.startswith("zq")
    continued = [*asked, {"role": "assistant", "content": "ok"}]
    fields = dict(add_generation_prompt=False, continue_final_message=True)
    bare = _run(client, {}, create_chat_completion, _chat(continued, **fields))["choices"][0]["message"]
    led = _run(client, {}, create_chat_completion, _chat(continued, echo=True, **fields))["choices"][0][
        "message"
    ]
    assert led["content"] == "ok" + bare["content"] and not bare["content"].startswith("ok")
    # no generation prompt after a user's message: the reply is the user's, so echo leads with it
    users = _run(client, {}, create_chat_completion, _chat(asked, echo=True, add_generation_prompt=False))
    assert users["choices"][0]["message"]["role"] == "user"
    assert users["choices"][0]["message"]["content"].startswith("zq")
