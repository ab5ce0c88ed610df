"""The server's routes as a plain HTTP client meets them, over the ASGI app alone (no lifespan,
no engine): what a route or method the server lacks answers, the X-Request-Id header, and
OpenAI's chat fields the server lacks."""

from __future__ import annotations

import asyncio
import re
import warnings

import httpx
import pytest

from enginespec.entrypoints.cli import _parser
from enginespec.entrypoints.openai.api_server import api_keys, build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest
from enginespec.entrypoints.openai.serving import ServerContext


def _request(method: str, path: str, keys=()) -> httpx.Response:
    app = build_app(ServerContext(None, None, ["m"], 16), ServerMetrics("m"), api_key=list(keys))

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path)

    return asyncio.run(run())


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/v1/no/such/route", 404),
        ("GET", "/no/such/route", 404),
        ("POST", "/v1/models", 405),
        ("GET", "/tokenize", 405),
    ],
)
def test_an_unknown_route_or_method_answers_in_the_openai_error_shape(method, path, status):
    """A route or method the server lacks was FastAPI's {"detail": "Not Found"}, the one error
    body not in OpenAI's shape (a client reading error.message found none); vLLM answers these
    in its error shape too. A 405 keeps its Allow header."""
    resp = _request(method, path)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert error["code"] == status and error["message"] and error["param"] is None
    assert error["type"] == {404: "NotFoundError", 405: "MethodNotAllowedError"}[status]
    if status == 405:
        assert resp.headers["allow"]


def _get(path: str, headers: dict, ctx=None, **app_options) -> httpx.Response:
    ctx = ctx if ctx is not None else ServerContext(None, None, ["m"], 16)
    app = build_app(ctx, ServerMetrics("m"), **app_options)

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get(path, headers=headers)

    return asyncio.run(run())


def _gets(paths: list, ctx: ServerContext) -> list:
    """GETs of `paths` in turn, on one app (one server's life)."""
    app = build_app(ctx, ServerMetrics("m"))

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.get(path) for path in paths]

    return asyncio.run(run())


def test_enable_request_id_headers_puts_x_request_id_on_every_response(monkeypatch):
    """vLLM's --enable-request-id-headers (`vllm serve M --enable-request-id-headers` was a
    usage error here): every response carries X-Request-Id, the request's own where it sent one,
    else a fresh uuid4 hex; a refused key's 401 and a 404 too. Without the flag, none."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    ns = _parser().parse_args(["serve", "m", "--enable-request-id-headers", "--api-key", "k"])
    assert ns.enable_request_id_headers is True
    assert _parser().parse_args(["serve", "m"]).enable_request_id_headers is False
    on = dict(api_key=api_keys(ns), request_id_headers=True)
    keyed = {"Authorization": "Bearer k"}
    assert _get("/v1/models", {**keyed, "X-Request-Id": "trace-7"}, **on).headers["x-request-id"] == "trace-7"
    fresh = [
        _get(path, headers, **on)
        for path, headers in [("/v1/models", keyed), ("/v1/models", {}), ("/nope", {})]
    ]
    assert [r.status_code for r in fresh] == [200, 401, 404]
    ids = [r.headers["x-request-id"] for r in fresh]
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids) and len(set(ids)) == 3
    assert "x-request-id" not in _get("/v1/models", {"X-Request-Id": "t"}).headers


class _BrokenEngine:
    """An engine client whose every attribute raises: a route that reads it fails with a 500."""

    def __getattr__(self, name):
        raise RuntimeError(f"broken engine client ({name})")


def test_x_request_id_is_on_a_500_and_a_cors_preflight_too():
    """--enable-request-id-headers puts X-Request-Id on every response: an internal error's 500
    (answered by the outermost error layer, outside the header's middleware) went out without
    it, as did a CORS preflight (answered by CORSMiddleware, outside it too); the 500 is the
    reply a client most needs to match to the server's log."""
    broken = ServerContext(_BrokenEngine(), None, ["m"], 16)
    cors = dict(allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])
    app = build_app(broken, ServerMetrics("m"), request_id_headers=True, cors=cors)

    async def run():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            failed = await client.get("/health", headers={"X-Request-Id": "trace-9"})
            preflight = await client.options(
                "/v1/completions",
                headers={
                    "Origin": "http://x",
                    "Access-Control-Request-Method": "POST",
                    "X-Request-Id": "p-1",
                },
            )
            return failed, preflight

    failed, preflight = asyncio.run(run())
    assert failed.status_code == 500 and failed.json()["error"]["code"] == 500
    assert failed.headers.get("x-request-id") == "trace-9"
    assert preflight.status_code == 200 and preflight.headers.get("x-request-id") == "p-1"


def test_a_models_card_is_the_same_on_every_request(monkeypatch):
    """The card's "created" is the server's start, not each request's clock: a list and a
    retrieve taken seconds apart give the same card (each request read the clock before, so a
    second boundary between them made the cards differ)."""
    from enginespec.entrypoints.openai import api_server

    clock = iter(range(1_000, 2_000, 7))  # seven seconds pass at every read of the clock
    monkeypatch.setattr(api_server.time, "time", lambda: float(next(clock)))
    first, retrieved, again = _gets(
        ["/v1/models", "/v1/models/tiny", "/v1/models"], ServerContext(None, None, ["tiny"], 16)
    )
    listed = first.json()["data"][0]
    assert retrieved.json() == listed == again.json()["data"][0]


def test_a_model_is_retrieved_by_its_served_name():
    """OpenAI's GET /v1/models/{model} (the openai client's models.retrieve) was a 404 for every
    name: each served name answers its card, as /v1/models lists it, a name with a slash (an HF
    id as --served-model-name gives it) included; an unknown one is a 404 naming `model`."""
    names = ["org/tiny", "alias"]
    app_names = dict(ctx=ServerContext(None, None, names, 16))
    listing, *cards = _gets(["/v1/models"] + [f"/v1/models/{name}" for name in names], app_names["ctx"])
    listed = {card["id"]: card for card in listing.json()["data"]}
    for name, card in zip(names, cards):
        assert card.status_code == 200 and card.json() == listed[name]
    missing = _get("/v1/models/nope", {}, **app_names)
    assert missing.status_code == 404
    assert missing.json()["error"]["param"] == "model" and "nope" in missing.json()["error"]["message"]
    slash = _get("/v1/models/", {}, **app_names)  # the list, as before the retrieve route
    assert slash.status_code == 200 and [card["id"] for card in slash.json()["data"]] == names


def _post_raw(path: str, content: bytes) -> httpx.Response:
    app = build_app(ServerContext(None, None, ["m"], 16), ServerMetrics("m"))

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            headers = {"content-type": "application/json"}
            return await client.post(path, content=content, headers=headers)

    return asyncio.run(run())


@pytest.mark.parametrize(
    "path",
    ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/invocations", "/tokenize", "/detokenize"],
)
@pytest.mark.parametrize(
    "content, says",
    [
        (b"{bad", "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"prompt": "x"', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, got an array"),
        (b"null", "must be a JSON object, got null"),
        (b'"prompt"', "must be a JSON object, got a string"),
        (b"7", "must be a JSON object, got a number"),
    ],
)
def test_a_body_that_is_no_json_object_is_a_400_in_the_openai_shape(path, content, says):
    """Malformed JSON, or JSON that is no object, is a 400 in OpenAI's error shape on every POST
    route (not FastAPI's 422, not a 500). A body that parsed but was no object read
    ": Input should be a valid dictionary or instance of CompletionRequest", naming no field and
    nothing a client sent: it now says what the body is."""
    resp = _post_raw(path, content)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert says in error["message"] and error["type"] == "BadRequestError" and error["code"] == 400


def test_a_models_card_has_vllms_fields_root_parent_and_permission():
    """vLLM's model card: `root` is the checkpoint the server loaded (what a client reads to load
    the same tokenizer), `parent` null for a base model, `permission` one model_permission
    object; the card lacked all three (the SDK's `model.root` raised AttributeError). The card
    stays the same on every request."""
    ctx = ServerContext(None, None, ["tiny", "alias"], 16, model_path="/ckpt/qwen3")
    listing, retrieved = _gets(["/v1/models", "/v1/models/alias"], ctx)
    cards = listing.json()["data"]
    assert [c["root"] for c in cards] == ["/ckpt/qwen3"] * 2 and [c["parent"] for c in cards] == [None] * 2
    (permission,) = cards[1]["permission"]
    assert permission["object"] == "model_permission" and permission["id"].startswith("modelperm-")
    assert permission["allow_sampling"] and permission["allow_logprobs"] and permission["organization"] == "*"
    assert retrieved.json() == cards[1]


CHAT = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 2}

# The openai client's chat fields this server does not do, each with a value that asks for
# something (refused by name) and, where there is one, a value that asks for nothing (taken).
NEWER_CHAT_FIELDS = [
    ("audio", {"voice": "alloy", "format": "mp3"}, None),
    ("modalities", ["text", "audio"], ["text"]),
    ("prediction", {"type": "content", "content": "x"}, None),
    ("service_tier", "flex", "auto"),
    ("verbosity", "low", "medium"),
    ("web_search_options", {}, None),
    ("prompt_cache_retention", "24h", "in_memory"),
    ("moderation", {"model": "omni-moderation-latest"}, None),
    ("prompt_cache_options", {"ttl": "1h"}, None),
]


@pytest.mark.parametrize("name, asks, no_op", NEWER_CHAT_FIELDS)
def test_openai_chat_fields_the_server_lacks_are_refused_by_name(name, asks, no_op):
    """OpenAI's chat fields newer than this server's list were "Extra inputs are not permitted",
    which reads like a typo of the client's: each is refused by name, as suffix or functions
    are, unless its value asks for nothing (then taken, as null is)."""
    app = build_app(ServerContext(None, None, ["m"], 16), ServerMetrics("m"))

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/chat/completions", json={**CHAT, name: asks})

    error = asyncio.run(run()).json()["error"]
    assert (error["code"], error["param"]) == (400, name)
    assert error["message"] == f"`{name}` is not supported by this server"
    for value in [None] if no_op is None else [None, no_op]:
        assert ChatCompletionRequest.model_validate({**CHAT, name: value}).unsupported_field() is None


def test_openai_chat_fields_that_change_nothing_here_are_taken():
    """safety_identifier (OpenAI's successor of `user`), prompt_cache_key (a cache routing hint:
    the prefix cache needs none) and metadata (tags of a stored completion: store is refused)
    were 400s "Extra inputs are not permitted"; each is taken, as `user` is."""
    body = {**CHAT, "safety_identifier": "u-1", "prompt_cache_key": "k", "metadata": {"team": "a"}}
    assert ChatCompletionRequest.model_validate(body).unsupported_field() is None


def _call_with_a_client_that_leaves(path: str, body_sent: bytes) -> list:
    """One raw ASGI call of `path` whose client sent `body_sent` of a longer JSON body and then
    left (uvicorn's receive gives the part, then http.disconnect, as when the connection drops
    mid-upload, or when it drops before the handler first reads: the body is then lost); the
    messages the app sent. An exception out of the app is what uvicorn logs with a traceback."""
    app = build_app(ServerContext(None, None, ["m"], 16), ServerMetrics("m"))
    incoming = [{"type": "http.request", "body": body_sent, "more_body": True}]
    sent = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 9),
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"64")],
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    return sent


@pytest.mark.parametrize(
    "path",
    ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/invocations", "/tokenize", "/detokenize"],
)
@pytest.mark.parametrize("body_sent", [b"", b'{"model": "m", "pro'])
def test_a_client_that_leaves_before_its_body_is_read_is_no_server_error(path, body_sent):
    """A client whose connection drops before the server has read its whole body (a cancelled
    upload, or a request sent and abandoned at once: uvicorn then hands the handler a disconnect
    in place of the buffered body) raised starlette's ClientDisconnect out of the body read: a
    500 to nobody and an "Exception in ASGI application" traceback in the server's log, one per
    such client (a churn of abandoning clients filled the log). It is now answered like a
    client that leaves a queued request: 400 "client disconnected", nothing logged."""
    sent = _call_with_a_client_that_leaves(path, body_sent)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 400
    assert b"client disconnected" in b"".join(m.get("body", b"") for m in sent[1:])


def test_the_openapi_schema_has_one_operation_id_per_route_and_ping_answers_get_and_post():
    """/ping (vLLM's SageMaker health check) answers GET and POST. One route for both methods
    gave both operations one id, and app.openapi() warned "Duplicate Operation ID" (a client
    generated from the schema gets one of the two). Every operation id is unique, no warning."""
    from types import SimpleNamespace

    engine = SimpleNamespace(alive=True, fatal=None)
    app = build_app(ServerContext(engine, None, ["m"], 16), ServerMetrics("m"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schema = app.openapi()
    assert [str(w.message) for w in caught] == []
    ids = [op["operationId"] for ops in schema["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    assert set(schema["paths"]["/ping"]) == {"get", "post"}

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.get("/ping"), await client.post("/ping")]

    assert [r.status_code for r in asyncio.run(run())] == [200, 200]


# ---- SageMaker's /invocations and the load balancer's /load ---------------------------------------


def _calls(app, calls: list) -> list:
    """(method, path, json body or None, headers) requests in turn on one app, its exceptions
    answered as uvicorn's outermost layer answers them (a 500)."""

    async def run():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [
                await client.request(method, path, json=body, headers=headers or {})
                for method, path, body, headers in calls
            ]

    return asyncio.run(run())


def test_invocations_refuses_a_body_that_is_neither_chat_nor_completion():
    """vLLM's SageMaker entry point, POST /invocations, was a 404. A JSON object with neither
    "messages" (a chat completion) nor "prompt" (a completion) is a 400 in OpenAI's shape that
    names both, as vLLM's names the request types it expected."""
    app = build_app(ServerContext(None, None, ["m"], 16), ServerMetrics("m"))
    (resp,) = _calls(app, [("POST", "/invocations", {"input": "hi", "max_tokens": 2}, None)])
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert '"messages"' in error["message"] and '"prompt"' in error["message"]


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/chat/completions", {**CHAT, "bogus": 1}),
        ("/v1/completions", {"prompt": "q", "bogus": 1}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "many"}),
        ("/v1/completions", {"prompt": 7}),
        ("/v1/chat/completions", {**CHAT, "prompt": "q"}),  # both: chat's, as vLLM tries chat first
    ],
)
def test_invocations_answers_a_bad_body_as_the_route_its_shape_names(route, body):
    """/invocations hands a body with "messages" to the chat route's handler and one with "prompt"
    to the completion route's (one with both to chat's): a field error is that route's 400, word
    for word, not vLLM's "Cannot find suitable handler" (vLLM tries each request type and names
    none of the fields)."""
    app = build_app(ServerContext(None, None, ["m"], 16), ServerMetrics("m"))
    direct, invoked = _calls(app, [("POST", route, body, None), ("POST", "/invocations", body, None)])
    assert direct.status_code == 400 and invoked.status_code == 400
    assert invoked.json() == direct.json()


def test_the_api_key_guards_invocations_and_leaves_load_open(monkeypatch):
    """/invocations generates as /v1/* does: --api-key guards it (vLLM guards every route but its
    probes); /load, a probe a load balancer polls, stays open, as vLLM's."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    app = build_app(ServerContext(None, None, ["m"], 16), ServerMetrics("m"), api_key="k")
    bad = {"input": "x"}
    refused, taken, load = _calls(
        app,
        [
            ("POST", "/invocations", bad, None),
            ("POST", "/invocations", bad, {"Authorization": "Bearer k"}),
            ("GET", "/load", None, None),
        ],
    )
    assert refused.status_code == 401 and taken.status_code == 400
    assert load.status_code == 200 and load.json() == {"server_load": 0}


# a completion of token ids: it reaches the engine client (a _BrokenEngine's raises: a 500)
IDS = {"prompt": [1, 2], "max_tokens": 2}


def test_enable_server_load_tracking_parses_and_load_answers_zero_without_it():
    """vLLM's --enable-server-load-tracking (default off) was a usage error here, and GET /load a
    404. Without the flag /load answers {"server_load": 0} whatever runs, as vLLM's (its counter
    is never moved)."""
    assert _parser().parse_args(["serve", "m", "--enable-server-load-tracking"]).enable_server_load_tracking
    assert _parser().parse_args(["serve", "m"]).enable_server_load_tracking is False
    app = build_app(ServerContext(_BrokenEngine(), None, ["m"], 16), ServerMetrics("m"))
    failed, load = _calls(app, [("POST", "/v1/completions", IDS, None), ("GET", "/load", None, None)])
    assert failed.status_code == 500
    assert load.json() == {"server_load": 0}


def test_server_load_drops_back_after_an_error_answer():
    """With --enable-server-load-tracking a request counts until its response has ended: a 400
    (a field error, on /invocations too) and an internal error's 500 end it as an answer does,
    so /load is back to 0 after them, not left counting requests that are gone."""
    app = build_app(
        ServerContext(_BrokenEngine(), None, ["m"], 16), ServerMetrics("m"), server_load_tracking=True
    )
    *answers, load = _calls(
        app,
        [
            ("POST", "/v1/completions", IDS, None),
            ("POST", "/invocations", {**IDS, "stream": True}, None),
            ("POST", "/v1/chat/completions", CHAT, None),
            ("POST", "/invocations", {"prompt": "x", "bogus": 1}, None),
            ("POST", "/invocations", {"input": "x"}, None),
            ("GET", "/load", None, None),
        ],
    )
    assert [a.status_code for a in answers] == [500, 500, 400, 400, 400]
    assert load.json() == {"server_load": 0}


# ---- vLLM's dev-mode sleep routes --------------------------------------------------------------


class _SleepyEngine:
    """An engine client's sleep-mode calls, recorded; `busy` refuses a sleep as the engine does
    while requests are unfinished."""

    def __init__(self, enabled: bool = True):
        from types import SimpleNamespace

        self.args = SimpleNamespace(enable_sleep_mode=enabled)
        self.alive, self.fatal = True, None
        self.calls: list = []
        self.asleep: set = set()
        self.busy = False

    async def sleep(self, level):
        from enginespec.entrypoints.openai.engine_client import EngineRequestError
        from enginespec.worker.sleep import check_level

        tags = check_level(level)
        if self.busy:
            raise EngineRequestError("RuntimeError: sleep: 1 unfinished request(s)")
        self.calls.append(("sleep", level))
        self.asleep |= set(tags)

    async def wake_up(self, tags):
        from enginespec.worker.sleep import check_tags

        woken = check_tags(tags)
        self.calls.append(("wake_up", tags))
        self.asleep -= set(woken)

    async def is_sleeping(self):
        return bool(self.asleep)

    async def reload_weights(self, path):
        from enginespec.entrypoints.openai.engine_client import EngineRequestError

        if path == "/not/a/checkpoint":
            raise ValueError("checkpoint directory /not/a/checkpoint does not exist")
        if self.busy:
            raise EngineRequestError("RuntimeError: reload_weights: 1 unfinished request(s)")
        self.calls.append(("reload_weights", path))
        return 25


def _requests(engine, calls: list, dev: bool = True) -> list:
    app = build_app(ServerContext(engine, None, ["m"], 16), ServerMetrics("m"), dev=dev)

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.request(method, path) for method, path in calls]

    return asyncio.run(run())


def test_the_sleep_routes_pass_level_and_tags_and_answer_is_sleeping():
    """vLLM's dev-mode sleep routes: POST /sleep?level=1, POST /wake_up with repeated tags
    (partial), GET /is_sleeping; each answers {"is_sleeping": bool}."""
    engine = _SleepyEngine()
    calls = [
        ("POST", "/sleep?level=1"),
        ("GET", "/is_sleeping"),
        ("POST", "/wake_up?tags=weights"),
        ("POST", "/wake_up"),
        ("POST", "/sleep"),  # level 1 by default
        ("POST", "/wake_up?tags=weights&tags=kv_cache"),
    ]
    got = [(r.status_code, r.json()) for r in _requests(engine, calls)]
    sleeping = [{"is_sleeping": b} for b in (True, True, True, False, True, False)]
    assert got == [(200, body) for body in sleeping]
    assert engine.calls == [
        ("sleep", 1),
        ("wake_up", ["weights"]),
        ("wake_up", None),
        ("sleep", 1),
        ("wake_up", ["weights", "kv_cache"]),
    ]


def test_the_sleep_routes_refuse_by_name_and_exist_only_in_dev_mode():
    engine = _SleepyEngine()
    bad = ["/sleep?level=3", "/sleep?level=one", "/wake_up?tags=kv"]
    got = _requests(engine, [("POST", path) for path in bad])
    assert [(r.status_code, r.json()["error"]["param"]) for r in got] == [(400, "level")] * 2 + [
        (400, "tags")
    ]
    assert "level must be one of [1, 2]" in got[0].json()["error"]["message"]
    engine.busy = True
    (refused,) = _requests(engine, [("POST", "/sleep")])
    assert refused.status_code == 409 and "unfinished" in refused.json()["error"]["message"]
    (off,) = _requests(_SleepyEngine(enabled=False), [("POST", "/sleep")])
    assert off.status_code == 400 and "--enable-sleep-mode" in off.json()["error"]["message"]
    gone = _requests(_SleepyEngine(), [("POST", "/sleep"), ("GET", "/is_sleeping")], dev=False)
    assert [r.status_code for r in gone] == [404, 404]
    assert engine.calls == [] and not engine.asleep


def test_the_reload_weights_route_passes_the_path_and_refuses_by_name():
    """POST /reload_weights[?weights_path=DIR] (dev mode): the engine's reload_weights, its count
    answered; a bad path a 400 naming weights_path, a busy engine a 409."""
    engine = _SleepyEngine()
    calls = [("POST", "/reload_weights"), ("POST", "/reload_weights?weights_path=/ckpt/b")]
    calls.append(("POST", "/reload_weights?weights_path=/not/a/checkpoint"))
    got = _requests(engine, calls)
    assert [(r.status_code, r.json()) for r in got[:2]] == [(200, {"num_tensors": 25})] * 2
    assert engine.calls == [("reload_weights", None), ("reload_weights", "/ckpt/b")]
    assert (got[2].status_code, got[2].json()["error"]["param"]) == (400, "weights_path")
    engine.busy = True
    (refused,) = _requests(engine, [("POST", "/reload_weights")])
    assert refused.status_code == 409 and "unfinished" in refused.json()["error"]["message"]
    (absent,) = _requests(engine, [("POST", "/reload_weights")], dev=False)
    assert absent.status_code == 404


class _AsleepEngine:
    """An engine client that sleeps: every submit refused with EngineAsleep."""

    async def submit(self, subs, prompt_only=False):
        from enginespec.entrypoints.openai.engine_client import EngineAsleep

        raise EngineAsleep("the engine is asleep: POST /wake_up first")


def test_a_request_while_the_engine_sleeps_is_a_503_saying_to_wake_it():
    """Sleep mode refuses a request whole until wake_up: a 503 (the server is up, the engine is
    not serving now), not a 400 that blames the request or a 500."""
    app = build_app(ServerContext(_AsleepEngine(), None, ["m"], 16), ServerMetrics("m"))
    (resp,) = _calls(app, [("POST", "/v1/completions", IDS, None)])
    assert resp.status_code == 503 and "wake_up" in resp.json()["error"]["message"]
