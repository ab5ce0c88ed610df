"""/tokenize's vLLM fields: return_token_strs (the tokens as the tokenizer's own strings, in
token_strs; null when not asked). Only the ASGI app runs (no engine: /tokenize needs only the
tokenizer)."""

from __future__ import annotations

import asyncio

import httpx

from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.serving import ServerContext
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker.loader import load_tokenizer

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


def _post(path: str, body: dict, tokenizer=None, template: str = TEMPLATE) -> httpx.Response:
    """POST body to the app (no engine behind it) over ASGI; the tiny tokenizer by default."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(tiny_model_dir("qwen3"))
    app = build_app(ServerContext(None, tokenizer, ["m"], 16, chat_template=template), ServerMetrics("m"))

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(path, json=body)

    return asyncio.run(run())


def _tokenize(tokenizer, body: dict) -> httpx.Response:
    return _post("/tokenize", body, tokenizer)


def test_return_token_strs_gives_the_tokens_strings():
    """vLLM's return_token_strs was a 400 ("extra inputs are not permitted")."""
    tokenizer = load_tokenizer(tiny_model_dir("qwen3"))
    asked = _tokenize(tokenizer, {"prompt": "abc", "return_token_strs": True})
    assert asked.status_code == 200, asked.text
    body = asked.json()
    assert body["tokens"] == list(tokenizer.encode("abc"))
    assert body["token_strs"] == tokenizer.convert_ids_to_tokens(body["tokens"])
    plain = _tokenize(tokenizer, {"prompt": "abc"}).json()
    assert plain["tokens"] == body["tokens"] and plain["token_strs"] is None


class _Spy:
    """A tokenizer that records each encode's add_special_tokens (the tiny tokenizer adds no
    special token, so the ids alone could not tell)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.special: list[bool] = []

    def encode(self, text, add_special_tokens=True):
        self.special.append(add_special_tokens)
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_add_special_tokens_takes_vllms_default_per_kind_and_a_given_value():
    """vLLM's defaults: True for a prompt, False for messages (the chat template adds what the
    model wants); a value the body gives is honoured for messages too (it was ignored)."""
    spy = _Spy(load_tokenizer(tiny_model_dir("qwen3")))
    chat = [{"role": "user", "content": "hi"}]
    for body in (
        {"prompt": "abc"},
        {"prompt": "abc", "add_special_tokens": False},
        {"messages": chat},
        {"messages": chat, "add_special_tokens": True},
    ):
        assert _tokenize(spy, body).status_code == 200
    assert spy.special == [True, False, False, True]


def test_vllms_removed_guided_fields_are_400s_that_name_their_replacement():
    """vLLM 0.12 removed guided_json & co. and its server ignores them (unconstrained output);
    here they are unknown fields, a 400 before the engine is asked (this app has none), whose
    message says which structured_outputs key replaced each."""
    for path, base in (
        ("/v1/completions", {"model": "m", "prompt": "abc"}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ):
        for field, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice")):
            resp = _post(path, {**base, field: {"type": "object"} if key == "json" else "a|b"})
            assert resp.status_code == 400, resp.text
            err = resp.json()["error"]
            assert err["param"] == field and f'"structured_outputs": {{"{key}": ...}}' in err["message"]
        err = _post(path, {**base, "guided_decoding_backend": "xgrammar"}).json()["error"]
        assert "structured_outputs" in err["message"] and err["param"] == "guided_decoding_backend"
        err = _post(path, {**base, "no_such_field": 1}).json()["error"]
        assert "Extra inputs" in err["message"] and "structured_outputs" not in err["message"]


def test_a_removed_guided_field_s_hint_never_names_a_key_this_server_refuses():
    """Each hint's structured_outputs key is one this server takes (StructuredOutputsParams'
    fields): guided_whitespace_pattern's successor, structured_outputs.whitespace_pattern, is
    not one, so following a hint that named it got a second 400 (unknown field); its hint says
    so instead and names disable_any_whitespace, what this server has for whitespace."""
    import re

    from enginespec.entrypoints.openai.protocol import LEGACY_GUIDED
    from enginespec.spec import StructuredOutputsParams

    base = {"model": "m", "prompt": "abc"}
    for field in LEGACY_GUIDED:
        err = _post("/v1/completions", {**base, field: "x"}).json()["error"]
        assert err["param"] == field
        for key in re.findall(r'"structured_outputs": \{"(\w+)"', err["message"]):
            assert key in StructuredOutputsParams.__dataclass_fields__, (field, err["message"])
    err = _post("/v1/completions", {**base, "guided_whitespace_pattern": " "}).json()["error"]
    assert "not supported" in err["message"] and "disable_any_whitespace" in err["message"]


# Deeper than json.loads recurses on every Python we run: about 1,000 levels on 3.11, several
# thousand on 3.12 (its C recursion limit; 5,000 levels parsed there).
DEEP = 100_000


def test_a_body_nested_deeper_than_the_json_parser_recurses_is_a_400():
    """A body nested past json's recursion limit (about 1000 levels) is a 400 like other bodies
    that are no JSON the server can read; the RecursionError was a 500."""
    tokenizer = load_tokenizer(tiny_model_dir("qwen3"))
    app = build_app(ServerContext(None, tokenizer, ["m"], 16, chat_template=TEMPLATE), ServerMetrics("m"))
    deep = '{"model": "m", "prompt": ' + "[" * DEEP + "]" * DEEP + "}"

    async def run(path):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(path, content=deep, headers={"content-type": "application/json"})

    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize"):
        reply = asyncio.run(run(path))
        assert reply.status_code == 400, (path, reply.text)
        assert "nested" in reply.json()["error"]["message"]


def test_health_and_ping_are_503_once_the_engine_is_dead():
    """vLLM's /health answers 503 when its engine is dead (a 500 read as a server bug, not as
    an instance to take out of rotation)."""
    from types import SimpleNamespace

    from enginespec.entrypoints.openai.engine_client import EngineDead

    tokenizer = load_tokenizer(tiny_model_dir("qwen3"))
    for alive, status in ((True, 200), (False, 503)):
        engine = SimpleNamespace(alive=alive, fatal=None if alive else EngineDead("the engine process died"))
        app = build_app(
            ServerContext(engine, tokenizer, ["m"], 16, chat_template=TEMPLATE), ServerMetrics("m")
        )

        async def run(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return [await client.get("/health"), await client.get("/ping"), await client.post("/ping")]

        assert [r.status_code for r in asyncio.run(run(app))] == [status] * 3  # /ping: vLLM's SageMaker form


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TOOLS_TEMPLATE = "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}" + TEMPLATE


def test_tokenize_renders_messages_with_their_tools():
    """vLLM's /tokenize takes a chat request's tools: the count a client budgets with is the
    prompt the chat request would send (the template shows the tools), not one without them."""
    tokenizer = load_tokenizer(tiny_model_dir("qwen3"))

    def post(body):
        return _post("/tokenize", body, tokenizer, TOOLS_TEMPLATE)

    messages = [{"role": "user", "content": "hi"}]
    with_tools = post({"messages": messages, "tools": [TOOL]})
    assert with_tools.status_code == 200, with_tools.text
    assert with_tools.json()["tokens"] == list(
        tokenizer.encode("[get_weather]<user>hi", add_special_tokens=False)
    )
    for body, message in (
        ({"prompt": "hi", "tools": [TOOL]}, "need messages"),
        ({"messages": messages, "tools": []}, "empty"),
    ):
        resp = post(body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "tools", resp.text
        assert message in resp.json()["error"]["message"]
