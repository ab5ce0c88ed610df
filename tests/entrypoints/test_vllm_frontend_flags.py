"""vLLM's frontend flags that `enginespec serve` answered with argparse's "unrecognized arguments"
(exit 2), so that a vLLM command line or deployment yaml carrying one failed:
--default-chat-template-kwargs (server-wide chat-template variables a request's own override key
by key), --exclude-tools-when-tool-choice-none (tool_choice "none" keeps the tools out of the
template), --enable-log-outputs (with --enable-log-requests, each choice's output logged, cut to
--max-log-len), --enable-tokenizer-info-endpoint (GET /tokenizer_info) and --log-error-stack (the
stack trace of each error answered). The handlers run over an in-process engine client;
test_chat_defaults' real server checks that the flags reach them."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
from pathlib import Path

import httpx
import pytest

from enginespec.entrypoints.cli import _parser, merge_dotted, vllm_spelling
from enginespec.entrypoints.openai import api_server
from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, ResponsesRequest
from enginespec.entrypoints.openai.reasoning import get_parser
from enginespec.entrypoints.openai.serving import (
    ServerContext,
    create_chat_completion,
    create_completion,
    render_chat,
)
from enginespec.entrypoints.openai.serving_responses import create_response
from tests.entrypoints.client_helpers import in_process_client, never
from tests.entrypoints.remote_server import CHAT_TEMPLATE

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4)
MESSAGES = [{"role": "user", "content": "hi"}]
SERVING_LOG = "enginespec.entrypoints.openai.serving"
SERVER_LOG = "enginespec.entrypoints.openai.api_server"
# Shows the template's variables a and b, and how many tools reached it (no spaces: the tiny
# tokenizer has none)
VARS_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }};{% endfor %}a={{ a }};b={{ b }}"
    "{% if tools %};tools={{ tools | length }}{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def client():
    with in_process_client(**ENGINE) as engine:
        yield engine


def _ctx(client, template=CHAT_TEMPLATE, **fields) -> ServerContext:
    return ServerContext(client, client.tokenizer, ["tiny"], 64, template, **fields)


def _run(ctx: ServerContext, make, body):
    """The handler's answer: a full body (dict), or a stream's frames decoded (until [DONE])."""

    async def run():
        ctx.engine.start(asyncio.get_running_loop())
        result = await make(ctx, body, never)
        if isinstance(result, dict):
            return result
        frames = [f async for f in result]
        assert frames[-1] == "data: [DONE]\n\n"
        return [json.loads(f[len("data: ") :]) for f in frames[:-1]]

    return asyncio.run(run())


def _chat(messages=MESSAGES, **fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="tiny", messages=messages, max_tokens=3, temperature=0, **fields)


def _serve(schema_ctx: ServerContext, requests):
    """[(method, path, json body)] against build_app over schema_ctx, in turn; the responses."""
    app = build_app(schema_ctx, ServerMetrics("tiny"))

    async def run():
        if schema_ctx.engine is not None:
            schema_ctx.engine.start(asyncio.get_running_loop())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as http:
            return [await http.request(method, path, json=body) for method, path, body in requests]

    return asyncio.run(run())


# ---- parsing -------------------------------------------------------------------------------------

FLAGS = [
    "--default-chat-template-kwargs",
    '{"enable_thinking": false}',
    "--exclude-tools-when-tool-choice-none",
    "--enable-log-outputs",
    "--enable-log-deltas",
    "--enable-tokenizer-info-endpoint",
    "--log-error-stack",
]


def test_the_flags_parse_as_vllms_and_reach_the_server_context(monkeypatch):
    from enginespec.entrypoints.openai.api_server import frontend_flags

    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    ns = _parser().parse_args(["serve", "m", *FLAGS])
    assert frontend_flags(ns) == dict(
        default_chat_template_kwargs={"enable_thinking": False},
        exclude_tools_when_tool_choice_none=True,
        log_outputs=True,
        log_deltas=True,
        enable_tokenizer_info_endpoint=True,
        log_error_stack=True,
    )
    assert frontend_flags(_parser().parse_args(["serve", "m"])) == dict(
        default_chat_template_kwargs=None,
        exclude_tools_when_tool_choice_none=False,
        log_outputs=False,
        log_deltas=True,  # vLLM's default: on, relevant only with --enable-log-outputs
        enable_tokenizer_info_endpoint=False,
        log_error_stack=False,
    )
    switches = [f for f in FLAGS if f.startswith("--") and f != "--default-chat-template-kwargs"]
    off = _parser().parse_args(["serve", "m", *switches, *["--no-" + f[2:] for f in switches]])
    assert not any(frontend_flags(off).values())  # vLLM's --no- forms, the last one winning


@pytest.mark.parametrize(
    "value, says",
    [
        ("{enable_thinking: false}", "must be JSON"),
        ("[1]", "a JSON object"),
        ('{"tools": []}', "sets itself"),
    ],
)
def test_default_chat_template_kwargs_that_are_no_usable_object_are_a_usage_error(capsys, value, says):
    """Bad JSON, JSON that is no object, or a name the chat call sets itself (which would make
    every chat request a 400 blaming the request): argparse's usage error naming the flag."""
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["serve", "m", "--default-chat-template-kwargs", value])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "--default-chat-template-kwargs" in err and says in err


def _dotted(argv: list[str]):
    """argv read as main reads it: vLLM's spellings, argparse, then the dotted keys merged."""
    parser = _parser()
    argv, dotted = vllm_spelling(argv)
    ns = parser.parse_args(argv)
    merge_dotted(parser, ns, dotted)
    return ns


def test_default_chat_template_kwargs_take_vllms_dotted_form_and_its_checks(capsys):
    """vLLM's `--default-chat-template-kwargs.enable_thinking false` (a serve line with it exited
    2): key by key, over the flag's JSON where both are given; a name the chat call sets itself
    is refused as in the JSON form."""
    key = ["--default-chat-template-kwargs.enable_thinking", "false"]
    assert _dotted(["serve", "m", *key]).default_chat_template_kwargs == {"enable_thinking": False}
    both = _dotted(["serve", "m", "--default-chat-template-kwargs", '{"a": 1}', *key])
    assert both.default_chat_template_kwargs == {"a": 1, "enable_thinking": False}
    with pytest.raises(SystemExit) as exited:
        _dotted(["serve", "m", "--default-chat-template-kwargs.tools", "[]"])
    assert exited.value.code == 2 and "sets itself" in capsys.readouterr().err


def test_enable_log_outputs_needs_enable_log_requests():
    """vLLM refuses --enable-log-outputs without --enable-log-requests before the model loads
    (it would log nothing); a one-line error naming both (exit 2)."""
    ns = _parser().parse_args(["serve", "m", "--enable-log-outputs"])
    with pytest.raises(ValueError, match="--enable-log-outputs needs --enable-log-requests"):
        api_server._check_request_log(ns)
    api_server._check_request_log(_parser().parse_args(["serve", "m", "--enable-log-requests", *FLAGS]))


# ---- --default-chat-template-kwargs --------------------------------------------------------------


def test_server_chat_template_kwargs_reach_the_template_and_a_request_overrides_them_key_by_key(client):
    def prompt(defaults, **fields) -> str:
        return render_chat(
            _ctx(client, VARS_TEMPLATE, default_chat_template_kwargs=defaults), _chat(**fields)
        )

    assert prompt(None) == "hi;a=;b="
    assert prompt({"a": 1, "b": 2}) == "hi;a=1;b=2"
    assert prompt({"a": 1, "b": 2}, chat_template_kwargs={"b": 3}) == "hi;a=1;b=3"
    # /tokenize's messages render the same way
    ctx = _ctx(client, VARS_TEMPLATE, default_chat_template_kwargs={"a": "x"})
    (tokens,) = _serve(ctx, [("POST", "/tokenize", {"model": "tiny", "messages": MESSAGES})])
    assert client.tokenizer.decode(tokens.json()["tokens"]) == "hi;a=x;b="


def test_a_server_default_enable_thinking_false_is_what_the_reasoning_split_reads(client):
    """Qwen3's '{"enable_thinking": false}' as the server's default: the qwen3 parser reads a
    reply as all content (it reads all of an unclosed reply as reasoning otherwise); a request's
    own enable_thinking true, or reasoning_effort, wins over the default."""
    qwen3 = get_parser("qwen3")

    def message(defaults, **fields) -> dict:
        ctx = _ctx(client, reasoning_parser=qwen3, default_chat_template_kwargs=defaults)
        return _run(ctx, create_chat_completion, _chat(**fields))["choices"][0]["message"]

    off = {"enable_thinking": False}
    assert message(None)["reasoning"] and message(None)["content"] is None
    assert message(off)["content"] and message(off).get("reasoning") is None
    on = message(off, chat_template_kwargs={"enable_thinking": True})
    assert on["reasoning"] and on["content"] is None
    effort = message(off, reasoning_effort="high")
    assert effort["reasoning"] and effort["content"] is None


# ---- --exclude-tools-when-tool-choice-none -------------------------------------------------------


def test_tool_choice_none_keeps_the_tools_out_of_the_template_with_the_flag(client):
    def prompt_ids(exclude: bool, **fields) -> list:
        ctx = _ctx(client, VARS_TEMPLATE, exclude_tools_when_tool_choice_none=exclude)
        return _run(ctx, create_chat_completion, _chat(return_token_ids=True, **fields))["prompt_token_ids"]

    def text(ids) -> str:
        return client.tokenizer.decode(ids)

    bare = prompt_ids(True)
    assert text(bare) == "hi;a=;b="
    assert prompt_ids(True, tools=TOOLS, tool_choice="none") == bare
    assert text(prompt_ids(False, tools=TOOLS, tool_choice="none")) == "hi;a=;b=;tools=1"
    # only "none": a forced choice still shows the tools
    forced = {"type": "function", "function": {"name": "f"}}
    assert text(prompt_ids(True, tools=TOOLS, tool_choice=forced)).endswith("tools=1")


# ---- --enable-log-outputs ------------------------------------------------------------------------


def _outputs_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Generated response ")]


def test_enable_log_outputs_logs_each_choices_output_cut_to_max_log_len(client, caplog):
    fields = dict(log_requests=True, log_outputs=True, max_log_len=2)
    # two prompts of n=2: choices 0-3, the second prompt's 2 and 3 (its index times n plus the choice's)
    body = CompletionRequest(model="tiny", prompt=[[5, 6, 7], [8, 9]], max_tokens=3, temperature=0, n=2)
    with caplog.at_level(logging.INFO, logger=SERVING_LOG):
        reply = _run(_ctx(client, **fields), create_completion, body)
        lines = _outputs_logged(caplog)
        assert len(lines) == 4 and all(f"(response {reply['id']}, choice " in line for line in lines)
        assert sorted(c["index"] for c in reply["choices"]) == [0, 1, 2, 3]
        for choice in reply["choices"]:
            (line,) = [x for x in lines if f"choice {choice['index']})" in x]
            assert f"choice {choice['index']}): output: {choice['text'][:2]!r}," in line  # no stream's marker
            assert "finish_reason: length" in line
            assert len(line.split("output_token_ids: [")[1].split("]")[0].split(",")) == 2
        caplog.clear()
        chunks = _run(_ctx(client, **fields), create_chat_completion, _chat(stream=True))
        (line,) = [x for x in _outputs_logged(caplog) if "(streaming delta)" not in x]
        assert f"(response {chunks[0]['id']}, choice 0) (streaming complete): output: " in line
        caplog.clear()
        reply = _run(_ctx(client, **fields), create_response, ResponsesRequest(model="tiny", input="hi"))
        (line,) = _outputs_logged(caplog)  # a Responses reply too (POST /v1/responses)
        assert f"(response {reply['id']}, choice 0): output: " in line
        caplog.clear()
        _run(_ctx(client, log_requests=True, max_log_len=2), create_completion, body)  # without the flag
        assert not _outputs_logged(caplog)


def _deltas_logged(caplog) -> list[str]:
    return [line for line in _outputs_logged(caplog) if "(streaming delta)" in line]


def test_enable_log_deltas_logs_each_streamed_delta_as_vllm_does(client, caplog):
    """vLLM's --enable-log-deltas (on by default; --no-enable-log-deltas turns it off): with
    --enable-log-outputs, each delta a stream sends is a "(streaming delta)" line at INFO,
    before the "(streaming complete)" one; the deltas' outputs make up the reply's text. A
    delta line was never logged here."""
    fields = dict(log_requests=True, log_outputs=True)
    with caplog.at_level(logging.INFO, logger=SERVING_LOG):
        chunks = _run(_ctx(client, **fields), create_chat_completion, _chat(stream=True))
        deltas = _deltas_logged(caplog)
        assert deltas and all(
            f"(response {chunks[0]['id']}, choice 0) (streaming delta): output: " in d for d in deltas
        )
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert (
            "".join(ast.literal_eval(d.split("output: ")[1].split(", output_token_ids: ")[0]) for d in deltas)
            == content
        )
        assert deltas[-1].endswith("finish_reason: length")
        assert "(streaming complete)" in _outputs_logged(caplog)[-1]
        caplog.clear()
        body = CompletionRequest(model="tiny", prompt=[5, 6, 7], max_tokens=3, temperature=0, stream=True)
        _run(_ctx(client, **fields), create_completion, body)
        assert len(_deltas_logged(caplog)) >= 1  # completions' streams too, as their outputs are logged
        caplog.clear()
        _run(_ctx(client, log_deltas=False, **fields), create_chat_completion, _chat(stream=True))
        assert not _deltas_logged(caplog) and len(_outputs_logged(caplog)) == 1
        caplog.clear()
        _run(_ctx(client, log_requests=True), create_chat_completion, _chat(stream=True))
        assert not _outputs_logged(caplog)  # relevant only with --enable-log-outputs


def test_enable_log_deltas_parses_as_vllms_switch():
    from enginespec.entrypoints.openai.api_server import frontend_flags

    def parsed(*flags):
        return frontend_flags(_parser().parse_args(["serve", "m", *flags]))["log_deltas"]

    assert parsed() is True and parsed("--enable-log-deltas") is True
    assert parsed("--no-enable-log-deltas") is False


# ---- --log-error-stack's default: VLLM_SERVER_DEV_MODE ---------------------------------------------


@pytest.mark.parametrize(
    "env, flags, want",
    [
        ("1", [], True),
        ("0", [], False),
        (None, [], False),
        ("1", ["--no-log-error-stack"], False),
        ("0", ["--log-error-stack"], True),
    ],
)
def test_log_error_stack_defaults_to_vllm_server_dev_mode(monkeypatch, env, flags, want):
    """vLLM's --log-error-stack defaults to VLLM_SERVER_DEV_MODE (here it was False whatever the
    variable said); the flag, either form, wins over the variable."""
    from enginespec.entrypoints.openai.api_server import frontend_flags

    if env is None:
        monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    else:
        monkeypatch.setenv("VLLM_SERVER_DEV_MODE", env)
    assert frontend_flags(_parser().parse_args(["serve", "m", *flags]))["log_error_stack"] is want


def test_a_server_dev_mode_that_is_no_integer_is_refused_naming_it(monkeypatch):
    from enginespec.entrypoints.openai.api_server import frontend_flags

    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "yes")
    with pytest.raises(ValueError, match="VLLM_SERVER_DEV_MODE"):
        frontend_flags(_parser().parse_args(["serve", "m"]))


# ---- --enable-tokenizer-info-endpoint ------------------------------------------------------------


def test_tokenizer_info_answers_the_tokenizers_configuration_only_with_the_flag(client):
    """vLLM's GET /tokenizer_info: the tokenizer's init configuration (tokenizer_config.json's
    keys; special tokens as their text; no local file paths), its class name, and the server's
    --chat-template where it has one. Without the flag the route is absent: a 404."""
    on = _ctx(client, VARS_TEMPLATE, enable_tokenizer_info_endpoint=True)
    (info,) = _serve(on, [("GET", "/tokenizer_info", None)])
    assert info.status_code == 200
    body = info.json()
    assert body["tokenizer_class"] == type(client.tokenizer).__name__
    assert body["chat_template"] == VARS_TEMPLATE
    assert body["bos_token"] == client.tokenizer.bos_token and body["eos_token"] == client.tokenizer.eos_token
    assert "vocab_file" not in body and "merges_file" not in body
    kwargs = client.tokenizer.init_kwargs.items()
    scalars = {
        k: v for k, v in kwargs if not k.endswith("_file") and (v is None or isinstance(v, (bool, int)))
    }
    assert scalars and all(body[k] == v for k, v in scalars.items())  # JSON's scalars as they are
    (absent,) = _serve(_ctx(client), [("GET", "/tokenizer_info", None)])
    assert absent.status_code == 404
    no_tokenizer = ServerContext(client, None, ["tiny"], 64, enable_tokenizer_info_endpoint=True)
    (refused,) = _serve(no_tokenizer, [("GET", "/tokenizer_info", None)])
    assert refused.status_code == 400


class _Token:
    """As transformers' AddedToken: the text in `content`."""

    def __init__(self, content: str):
        self.content = content


def test_tokenizer_info_values_are_json_as_vllm_writes_them():
    """A special token as its text, a tuple as a list, a dict's keys as str, JSON's scalars as they
    are, any other object as its str; no *_file path."""

    class Tokenizer:
        init_kwargs = {
            "vocab_file": "/x/vocab.json", "pad": _Token("<pad>"), "pair": ("a", 1), "ids": {7: None},
            "none": None, "flag": True, "max": 5, "scale": 0.5, "path": Path("/p"),
        }  # fmt: skip

    assert api_server.tokenizer_config(Tokenizer()) == {
        "pad": "<pad>", "pair": ["a", 1], "ids": {"7": None}, "none": None, "flag": True, "max": 5,
        "scale": 0.5, "path": "/p", "tokenizer_class": "Tokenizer",
    }  # fmt: skip


# ---- --log-error-stack ---------------------------------------------------------------------------


def _stacks_logged(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info and r.getMessage().startswith("error answered")]


def test_log_error_stack_logs_the_stack_of_each_error_answered(client, caplog):
    """vLLM's --log-error-stack: the stack trace of each error response, at ERROR: a refused
    request (here the 404 of an unknown model) and a stream's error frame (a step the engine
    failed, a 500). Without the flag, none."""
    unknown = ("POST", "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1})

    async def failing_stream(ctx):
        await ctx.engine.fail_next_step()
        body = CompletionRequest(model="tiny", prompt=[5, 6], max_tokens=2, stream=True)
        return [f async for f in await create_completion(ctx, body, never)]

    def stream_frames(ctx):
        async def run():
            ctx.engine.start(asyncio.get_running_loop())
            return await failing_stream(ctx)

        return asyncio.run(run())

    with caplog.at_level(logging.INFO):
        (refused,) = _serve(_ctx(client, log_error_stack=True), [unknown])
        assert refused.status_code == 404
        (record,) = _stacks_logged(caplog)
        assert record.levelno == logging.ERROR and "404" in record.getMessage()
        caplog.clear()
        frames = stream_frames(_ctx(client, log_error_stack=True))
        assert '"code":500' in frames[-2].replace(" ", "")
        (record,) = _stacks_logged(caplog)
        assert "500" in record.getMessage()
        assert record.exc_info[1].__cause__ is not None  # the engine's own error and its stack
        caplog.clear()
        _serve(_ctx(client), [unknown])
        stream_frames(_ctx(client))
        assert not _stacks_logged(caplog)
