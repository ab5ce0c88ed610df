"""The FastAPI app and the server process (`enginespec serve`).

Routes: /health (and vLLM's /ping, its SageMaker form), /version, /v1/models (and OpenAI's
/v1/models/{model}), /v1/completions, /v1/chat/completions, /v1/responses (its GET by id a 404:
nothing is stored), vLLM's /invocations (SageMaker's: chat or completion by the body's shape),
/load (vLLM's: the generation requests in flight under --enable-server-load-tracking, else 0),
/tokenize, /detokenize, /metrics;
with --enable-dev-endpoints also /dev/state (pool and queue snapshot), /dev/pause,
/dev/resume and /dev/fail_next_step (tests drive backpressure, disconnects and faults with
them), and vLLM's dev-mode POST /reset_prefix_cache and its sleep-mode routes (POST
/sleep?level=1, POST /wake_up?tags=..., GET /is_sleeping; the engine needs
--enable-sleep-mode); with --profiler-config naming a profiler, or VLLM_TORCH_PROFILER_DIR set
when the app is built, vLLM's POST /start_profile and /stop_profile (a torch.profiler trace of
the engine's process into that directory; without either they are 404s, as in vLLM). --api-key KEY [KEY ...]
guards /v1/* and /invocations (a Bearer token, any one of the keys), as vLLM does; without the
flag, the VLLM_API_KEY environment variable's key does, as vLLM reads it (api_keys).
--enable-request-id-headers puts X-Request-Id on every response (vLLM's flag). Every error, a
route or method the server lacks included, is OpenAI's {"error": {"message", "type", "param",
"code"}} (errors.py).

Processes: the EngineCore runs in a spawned process of its own (engine/core_proc.py; with
--engine-in-process, on a thread of this one); this process keeps uvicorn, the tokenizer,
detokenization and SSE (entrypoints/openai/engine_client.py). The address is bound before the
engine starts (bind_socket), so a port in use is a one-line error (exit 2) before the model loads.

Shutdown: on SIGTERM (or SIGINT) uvicorn stops listening and lets in-flight responses finish
for up to --shutdown-timeout seconds; a request still running then is ended with a 503 ("the
server is shutting down"; an error frame then [DONE] in a stream) and aborted in the engine
(EngineClient.shed_pending), and its handler answers; SHED_WAIT_S later the connections still
open (clients that read nothing, whose handlers wait on a full socket) are reset, and their
handlers end as for a client that left; uvicorn cancels only what is left CUT_WAIT_S after that.
The engine process is told to exit and reaped, and this process exits 0. A SIGTERM to the whole
process group (systemd's control-group kill) drains the same way: the engine process and its
tensor-parallel workers leave it to this process (core_proc.TermSignal). Either signal while the
engine is still loading ends the engine process at once, and exits 0. If the engine process
dies, pending requests get 500s (an error frame mid-stream), /health fails, and the server
shuts down the same way, exiting 1.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib
import inspect
import json
import logging
import logging.config
import os
import re
import secrets
import signal
import socket
import ssl
import sys
import threading
import time
import uuid
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple, Optional, Sequence, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from enginespec import __version__
from enginespec.entrypoints.openai.engine_client import EngineClient, EngineRequestError
from enginespec.entrypoints.openai.errors import APIError, error_body
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ResponsesRequest,
    TokenizeRequest,
    legacy_field_hint,
)
from enginespec.entrypoints.openai.reasoning import get_parser
from enginespec.entrypoints.openai.serving import (
    ServerContext,
    checked_tools,
    create_chat_completion,
    create_completion,
    log_error_stack,
    render_chat,
)
from enginespec.entrypoints.openai.serving_responses import create_response
from enginespec.entrypoints.openai.sse import SSEResponse
from enginespec.profiler import ProfilerConfig, ProfilerStateError, profiling_enabled

log = logging.getLogger(__name__)


def _error_response(err: APIError) -> JSONResponse:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


async def _parse(request: Request, model: type[BaseModel]):
    """The JSON body as `model`; malformed JSON, JSON that is no object, JSON nested past the
    decoder's recursion, or a field error (unknown, wrong type) is a 400."""
    raw = await _json_object(request)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        param, error = _field_error(exc)
        where = ".".join(str(p) for p in error.get("loc", ()))
        hint = legacy_field_hint(where) if error.get("type") == "extra_forbidden" else None
        message = f"{where}: {error.get('msg')}" + (f": {hint}" if hint else "")
        raise APIError(400, f"{message} ({exc.error_count()} error(s))", param) from None


async def _json_object(request: Request) -> dict:
    """The JSON body, which must be an object with no lone surrogate in its strings (a 400
    otherwise). Starlette keeps the decoded body on the request: a second call decodes nothing."""
    try:
        raw = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # json's decoder recurses once a level
        raise APIError(400, "the body's JSON is nested deeper than this server reads") from None
    if not isinstance(raw, dict):  # pydantic's "valid dictionary or instance of ..." named nothing
        raise APIError(400, f"the body must be a JSON object, got {_json_kind(raw)}")
    if _MAY_HOLD_SURROGATE.search(await request.body()):  # the body is cached: no second read
        _refuse_lone_surrogates(raw)
    return raw


def _json_kind(value) -> str:
    """What a decoded JSON value is, in JSON's words (for a body that is no object)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = {list: "an array", str: "a string", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


SERVER_DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # vLLM's; --log-error-stack's default (server_dev_mode)

# What a lone UTF-16 surrogate looks like in a body's bytes: a \\uD800-\\uDFFF escape (a valid
# pair matches too, and passes the walk), or the CESU-8 bytes that json.loads's "surrogatepass"
# decoding takes. A body with neither holds no surrogate, and is not walked.
_MAY_HOLD_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _refuse_lone_surrogates(raw) -> None:
    """A 400 naming the body field that holds a string (or a key) with a lone surrogate. JSON
    lets a string say "\\ud800" (what a JavaScript client sends for a string cut inside a
    surrogate pair), and json.loads keeps it as a surrogate code point, which no tokenizer,
    UTF-8 encoder or log line takes: unchecked, it was a 500 wherever the text went first.
    Iterative: a body nested as deep as json reads would overflow a recursive walk."""
    stack = [((), raw)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                stack += [((*where, key), key), ((*where, key), item)]
        elif isinstance(value, list):
            stack += [((*where, i), item) for i, item in enumerate(value)]
        elif isinstance(value, str) and (found := _SURROGATE.search(value)):
            raise APIError(
                400,
                f"{'.'.join(map(str, where))}: a string holds a lone UTF-16 surrogate "
                f"({ascii(found[0])}), which is not Unicode text (a string cut inside a surrogate pair?)",
                str(where[0]) if where else None,
            )


def _field_error(exc: ValidationError) -> tuple[Optional[str], dict]:
    """(the body field at fault, the error to report) of a failed validation. A union field
    (prompt, stop) fails once per member type, each located under pydantic's member label
    ("prompt.str", "stop.list[str].0"), which names no field: the param is the body's own
    field, and the error reported is the one of the member that matched furthest (the deepest
    location; the first of those), so that `stop: [1]` is told a list item is not a string,
    not that the list is not a string."""
    errors = exc.errors()
    loc = errors[0].get("loc", ())
    if not loc:
        return None, errors[0]
    same_field = [e for e in errors if e.get("loc", ())[:1] == loc[:1]]
    return str(loc[0]), max(same_field, key=lambda e: len(e["loc"]))


def _route_path(scope) -> str:
    """The path routing matches (starlette's rule): the request's path less the app's root path
    (--root-path) where it begins with it, as a whole segment."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path


class _RootPath:
    """Plain ASGI middleware (--root-path): every request's scope names the proxy's prefix as its
    root_path, what FastAPI's (deprecated) root_path argument did and vLLM relies on: routing
    then matches a path with the prefix (a proxy that keeps it) or without (one that strips
    it), and the OpenAPI schema names the prefix as the server's URL."""

    def __init__(self, app, root_path: str):
        self.app = app
        self.root_path = root_path

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope["root_path"] = self.root_path
        await self.app(scope, receive, send)


def _needs_key(path: str) -> bool:
    """Whether the API key guards `path` (routing's, _route_path): the OpenAI API under /v1, and
    /invocations, SageMaker's door to the same generation (vLLM's server guards it too; its
    probes, /health, /ping, /load, /metrics and /version, stay open)."""
    return path.startswith("/v1") or path == "/invocations"


class _ApiKeyGuard:
    """Plain ASGI middleware: the paths _needs_key names (/v1/*, /invocations) need
    'Authorization: Bearer KEY' for one of the keys (401 otherwise), as vLLM's. The scheme is
    read case-insensitively (an HTTP auth scheme is: RFC 9110 11.1, and vLLM reads it so); one
    space, then the key, which must match exactly. Keys are compared as SHA-256 digests, every
    key each time, so that neither a key's length nor which key matched shows in the timing.
    The path is read as routing reads it, without the app's --root-path (a request through a
    proxy that keeps the prefix, /PREFIX/v1/..., is served: it is guarded too). Not
    starlette's BaseHTTPMiddleware, which wraps `receive` and hides client disconnects."""

    def __init__(self, app, api_keys: Sequence[str]):
        self.app = app
        self.expected = [hashlib.sha256(key.encode()).digest() for key in api_keys]

    def _authorized(self, scope) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, key = given.partition(b" ")
        digest = hashlib.sha256(key).digest()
        matches = [secrets.compare_digest(digest, e) for e in self.expected]  # every key: no early out
        return scheme.lower() == b"bearer" and any(matches)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and _needs_key(_route_path(scope)):
            if not self._authorized(scope):
                response = _error_response(APIError(401, "Unauthorized: a valid API key is required"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# scope key under which _RequestIdHeader leaves a request's X-Request-Id for the 500 handler
_REQUEST_ID_SCOPE_KEY = "enginespec.request_id"


class _RequestIdHeader:
    """Plain ASGI middleware (--enable-request-id-headers, vLLM's flag): every HTTP response
    carries X-Request-Id, the request's own X-Request-Id where it sent one, else a fresh uuid4
    hex, so that a client or a proxy can match a reply, an error included, to its log lines.
    An internal error's 500 is sent by starlette's outermost layer, outside this one: the id is
    also left in the scope (_REQUEST_ID_SCOPE_KEY), where build_app's 500 handler reads it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id")
        request_id = given if given else uuid.uuid4().hex.encode()
        scope[_REQUEST_ID_SCOPE_KEY] = request_id

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class ServerLoad:
    """--enable-server-load-tracking (vLLM's flag): what GET /load answers, `num_requests`, the
    generation requests in flight (completions, chat and Responses, through /v1 or /invocations;
    the routes vLLM counts that this server has). Invariant: a request counts once, from when its handler
    starts until its response has ended: a stream's last frame sent, or its client gone, or an
    error answered (a 400, a 500), never when its handler returns the stream. Without the flag
    nothing counts and /load answers 0, as vLLM's. Read and written on the event loop only."""

    def __init__(self) -> None:
        self.num_requests = 0


# scope key under which _LoadTracking leaves a request's _LoadTicket for its handler
_LOAD_SCOPE_KEY = "enginespec.load_ticket"


class _LoadTicket:
    """One request's share of the server load: counted (once) by its generation handler
    (count_load), released by _LoadTracking when the response has ended."""

    __slots__ = ("load", "counted")

    def __init__(self, load: ServerLoad):
        self.load, self.counted = load, False

    def count(self) -> None:
        if not self.counted:  # /invocations hands on to a route's handler: one request, one count
            self.counted = True
            self.load.num_requests += 1

    def release(self) -> None:
        if self.counted:
            self.counted = False
            self.load.num_requests -= 1


class _LoadTracking:
    """Plain ASGI middleware (--enable-server-load-tracking): every HTTP request carries a
    _LoadTicket, which a generation handler counts, and which is released once the app has
    answered: after the last byte of the response is sent (a stream's [DONE]), after a client
    that left ended its stream, after an error answer, or when an exception leaves the app (the
    500 is sent outside). Not starlette's BaseHTTPMiddleware, which hides client disconnects."""

    def __init__(self, app, load: ServerLoad):
        self.app, self.load = app, load

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ticket = scope[_LOAD_SCOPE_KEY] = _LoadTicket(self.load)
        try:
            await self.app(scope, receive, send)
        finally:
            ticket.release()


def count_load(request: Request) -> None:
    """A generation handler's first step: its request counts in /load until its response ends
    (_LoadTracking; nothing without --enable-server-load-tracking)."""
    ticket = request.scope.get(_LOAD_SCOPE_KEY)
    if ticket is not None:
        ticket.count()


class _HeaderCountLimit:
    """Plain ASGI middleware (--h11-max-header-count, vLLM's): a request that carries more header
    fields than max_header_count is answered 431 (Request Header Fields Too Large, OpenAI's
    error shape) and reaches no other layer or route. uvicorn reads no such setting (vLLM sets
    one on uvicorn's Config, where nothing reads it), so it is counted here, over whichever HTTP
    protocol uvicorn runs; the head's size is bounded before this, by h11
    (--h11-max-incomplete-event-size)."""

    def __init__(self, app, max_header_count: int):
        self.app = app
        self.max_header_count = max_header_count

    async def __call__(self, scope, receive, send) -> None:
        num_headers = len(scope["headers"]) if scope["type"] == "http" else 0
        if num_headers > self.max_header_count:
            message = (
                f"the request has {num_headers} header fields, more than the server takes "
                f"(--h11-max-header-count {self.max_header_count})"
            )
            await _error_response(APIError(431, message))(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _add_user_middleware(app: FastAPI, layer) -> None:
    """One of load_middleware's layers on the app, as vLLM adds them: a class with
    app.add_middleware (an ASGI middleware taking the app), an async function as an
    @app.middleware("http") function(request, call_next)."""
    if inspect.isclass(layer):
        app.add_middleware(layer)
    else:
        app.middleware("http")(layer)


def _disconnect_waiter(request: Request):
    """A coroutine function that returns once the client has gone (the body is already read, so
    every further message is http.disconnect)."""

    async def wait() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return wait


def build_app(
    ctx: ServerContext,
    metrics: ServerMetrics,
    api_key: Union[str, Sequence[str], None] = None,
    dev: bool = False,
    cors: Optional[dict] = None,
    request_id_headers: bool = False,
    app_options: Optional[dict] = None,
    server_load_tracking: bool = False,
    profiler_config: Optional[ProfilerConfig] = None,
) -> FastAPI:
    """The app over ctx. api_key: a key or a list of them (api_keys), any one of which /v1/*
    and /invocations take; None, an empty list or empty keys (as vLLM drops them): no key needed. `cors`
    (cors_options): starlette's CORSMiddleware with those options, outside the key guard, so a
    browser's preflight (OPTIONS, which carries no API key) is answered before it, as vLLM's
    server answers it; None: no CORS headers, preflights are 405s. `request_id_headers`: every
    response carries X-Request-Id (_RequestIdHeader, the outermost of these layers, so a 401 and
    a preflight do too; an internal error's 500 gets it from its handler). `app_options`:
    fastapi_options' (the root path, _RootPath's; the rest FastAPI's own: the docs routes).
    `profiler_config` (the engine's, EngineArgs': run_server passes it) naming a profiler, or
    VLLM_TORCH_PROFILER_DIR set (not empty) now, adds the profile routes (_add_profile_routes).
    `server_load_tracking`: GET /load counts the generation requests in flight (ServerLoad,
    app.state.server_load); without it /load answers 0."""
    options = dict(app_options or {})
    root_path = options.pop("root_path", "")
    middleware = options.pop("middleware", ())  # load_middleware's (--middleware)
    header_limit = options.pop("max_header_count", None)  # --h11-max-header-count
    app = FastAPI(title="enginespec", lifespan=_engine_lifespan(ctx), **options)
    _add_error_handlers(app, ctx)
    app.state.server_load = ServerLoad()
    _add_layers(
        app,
        api_key=api_key,
        cors=cors,
        request_id_headers=request_id_headers,
        server_load_tracking=server_load_tracking,
        middleware=middleware,
        header_limit=header_limit,
        root_path=root_path,
    )
    _add_openai_routes(app, ctx)
    _add_utility_routes(app, ctx, metrics)
    if ctx.enable_tokenizer_info_endpoint:
        _add_tokenizer_info_route(app, ctx)
    if dev:
        _add_dev_routes(app, ctx)
    if profiling_enabled(profiler_config):  # the variable read now, as vLLM's server reads it
        _add_profile_routes(app, ctx)
    return app


def _engine_lifespan(ctx: ServerContext):
    """The app's lifespan: the engine client starts on the server's event loop as the app starts
    up, and stops as it shuts down, however the serving ended."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        ctx.engine.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            ctx.engine.stop()

    return lifespan


def _add_error_handlers(app: FastAPI, ctx: ServerContext) -> None:
    """Every error the app answers is OpenAI's shape (errors.py): an APIError as raised (its
    stack logged under --log-error-stack), a client gone before its body was read a 400 to
    nobody, a missing route or method FastAPI's status with its headers, anything else a 500
    naming the exception (with X-Request-Id where the request had one)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        log_error_stack(ctx, exc)
        return _error_response(exc)

    @app.exception_handler(ClientDisconnect)
    async def _client_left(request: Request, exc: ClientDisconnect):
        """The client left before its body was read in full (a cancelled upload; or a request
        sent and dropped at once, whose buffered body uvicorn replaces by the disconnect):
        answered as a client leaving a queued request is (serving._collect), to nobody, where
        the exception was a 500 and an "Exception in ASGI application" traceback per client."""
        return _error_response(APIError(400, "client disconnected"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        """A route or method this server lacks (404, 405): OpenAI's error shape, as every other
        error here and as vLLM answers them, not FastAPI's {"detail": ...}; its headers kept
        (a 405's Allow)."""
        body = error_body(exc.status_code, str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        response = _error_response(APIError(500, f"{type(exc).__name__}: {exc}"))
        request_id = request.scope.get(_REQUEST_ID_SCOPE_KEY)
        if request_id is not None:  # sent from outside _RequestIdHeader: it adds no header here
            response.headers["x-request-id"] = request_id.decode("latin-1")
        return response


def _add_layers(
    app: FastAPI,
    *,
    api_key,
    cors: Optional[dict],
    request_id_headers: bool,
    server_load_tracking: bool,
    middleware: Sequence,
    header_limit: Optional[int],
    root_path: str,
) -> None:
    """build_app's middleware, added innermost first (each add_middleware wraps the ones before):
    the load count (a request the key guard refuses never counts), the key guard, CORS outside
    it (a preflight carries no key), X-Request-Id outside those (a 401 and a preflight have it
    too), the user's --middleware each outside the ones before (vLLM's order), the header-count
    limit outside all of those, and the root path outermost (every layer reads the path as
    routing does). app.state.server_load is set before this is called."""
    if server_load_tracking:  # the innermost layer: a request the key guard refuses never counts
        app.add_middleware(_LoadTracking, load=app.state.server_load)
    keys = [k for k in ([api_key] if isinstance(api_key, str) else api_key or ()) if k]  # "": no key
    if keys:
        app.add_middleware(_ApiKeyGuard, api_keys=keys)
    if cors is not None:  # outside the key guard: a preflight carries no key
        app.add_middleware(CORSMiddleware, **cors)
    if request_id_headers:  # added last: the outermost layer, so a preflight has the header too
        app.add_middleware(_RequestIdHeader)
    for layer in middleware:  # the user's, each outside the ones before it (vLLM's order)
        _add_user_middleware(app, layer)
    if header_limit is not None:  # outside every other layer but the root path's
        app.add_middleware(_HeaderCountLimit, max_header_count=header_limit)
    if root_path:  # outermost: every layer reads the path as routing does (_route_path)
        app.add_middleware(_RootPath, root_path=root_path)


def api_keys(ns) -> list[str]:
    """The keys that guard /v1/*, as vLLM takes them: --api-key's (one or more), else the
    VLLM_API_KEY environment variable's, where set and not empty (so that a deployment that
    keys vLLM by its environment stays keyed, not open, under this server); [] : no key. An
    empty key on the command line is a ValueError naming --api-key (every request would be
    refused, or under vLLM's rule none would be)."""
    if ns.api_key is None:
        key = os.environ.get("VLLM_API_KEY", "")
        return [key] if key else []
    if not all(ns.api_key):
        raise ValueError(f"--api-key: a key must not be empty, got {ns.api_key!r}")
    return list(ns.api_key)


def cors_options(ns) -> Optional[dict]:
    """CORSMiddleware's options from vLLM's flags, or None (no CORS) unless --allowed-origins is
    given: vLLM allows every origin by default, but a server on this machine's loopback that any
    web page the user opens may call is a choice to make, not a default. Methods and headers
    default to every one, as vLLM's."""
    if ns.allowed_origins is None:
        return None
    for name in ("allowed_origins", "allowed_methods", "allowed_headers"):
        value = getattr(ns, name)
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ValueError(f"--{name.replace('_', '-')} must be a JSON list of strings, got {value!r}")
    return dict(
        allow_origins=ns.allowed_origins,
        allow_methods=ns.allowed_methods,
        allow_headers=ns.allowed_headers,
        allow_credentials=ns.allow_credentials,
    )


def fastapi_options(ns) -> dict:
    """build_app's app_options from vLLM's flags. --root-path: the prefix a path-routing proxy
    serves the server under (_RootPath): a route answers with or without the prefix, and the
    OpenAPI schema names it as the server's URL; it must start with "/" (a trailing "/" is
    dropped: starlette would match no path under "/llm/"). --disable-fastapi-docs: no /docs,
    /redoc or /openapi.json."""
    options: dict = {}
    root = ns.root_path
    if root:
        if not root.startswith("/"):
            raise ValueError(
                f"--root-path must start with '/' (the proxy's path prefix, e.g. /llm), got {root!r}"
            )
        options["root_path"] = root.rstrip("/")
    if ns.disable_fastapi_docs:
        options.update(openapi_url=None, docs_url=None, redoc_url=None)
    return options


# Python's ssl.CERT_* values, what vLLM's --ssl-cert-reqs takes
_CERT_REQS = {
    int(ssl.CERT_NONE): "none",
    int(ssl.CERT_OPTIONAL): "optional",
    int(ssl.CERT_REQUIRED): "required",
}


def tls_options(ns) -> dict:
    """uvicorn's TLS settings from vLLM's flags ({}: plain HTTP), checked before the engine
    loads by building the SSL context uvicorn builds, so that a missing file or a key that is
    not the certificate's is a ValueError naming the flags, not uvicorn's traceback after the
    model's load. Refused, as they would serve other than asked: a key without a certificate,
    --ssl-ca-certs or --ssl-cert-reqs without TLS (nothing would be checked), client
    certificates asked (--ssl-cert-reqs 1 or 2) with no --ssl-ca-certs to check them against
    (every client would be turned away), --ssl-ciphers without TLS or naming no cipher OpenSSL
    knows (uvicorn's default "TLSv1" where not given, as vLLM's)."""
    from uvicorn.config import SSL_PROTOCOL_VERSION, create_ssl_context

    key, cert, ca, reqs = ns.ssl_keyfile, ns.ssl_certfile, ns.ssl_ca_certs, ns.ssl_cert_reqs
    ciphers = getattr(ns, "ssl_ciphers", None)
    if not (key or cert):
        if ca is not None or reqs is not None or ciphers is not None:
            raise ValueError(
                "--ssl-ca-certs, --ssl-cert-reqs and --ssl-ciphers need TLS: give --ssl-certfile "
                "(and --ssl-keyfile)"
            )
        return {}
    ciphers = ciphers or "TLSv1"
    try:
        ssl.create_default_context().set_ciphers(ciphers)
    except ssl.SSLError:
        raise ValueError(f"--ssl-ciphers: OpenSSL knows no cipher in {ciphers!r}") from None
    if not cert:
        raise ValueError("--ssl-keyfile needs --ssl-certfile (the certificate the key belongs to)")
    reqs = int(ssl.CERT_NONE) if reqs is None else reqs
    if reqs not in _CERT_REQS:
        raise ValueError(f"--ssl-cert-reqs must be one of {_CERT_REQS} (Python's ssl.CERT_*), got {reqs}")
    if reqs != ssl.CERT_NONE and not ca:
        raise ValueError(
            f"--ssl-cert-reqs {reqs} ({_CERT_REQS[reqs]}) needs --ssl-ca-certs to check client certificates"
        )
    try:
        create_ssl_context(cert, key or None, None, SSL_PROTOCOL_VERSION, reqs, ca or None, ciphers)
    except OSError as exc:  # ssl.SSLError is one: a key that is not the certificate's, a file that is no PEM
        raise ValueError(
            f"--ssl-certfile/--ssl-keyfile/--ssl-ca-certs: cannot build the TLS context: {exc}"
        ) from None
    return dict(
        ssl_keyfile=key or None,
        ssl_certfile=cert,
        ssl_ca_certs=ca or None,
        ssl_cert_reqs=reqs,
        ssl_ciphers=ciphers,
    )


def chat_defaults(ns) -> dict:
    """ServerContext's server-wide body defaults from vLLM's flags (--response-role,
    --return-tokens-as-token-ids, --enable-force-include-usage, --chat-template-content-format)."""
    return dict(
        response_role=ns.response_role,
        return_tokens_as_token_ids=ns.return_tokens_as_token_ids,
        force_include_usage=ns.enable_force_include_usage,
        chat_template_content_format=ns.chat_template_content_format,
    )


def frontend_flags(ns) -> dict:
    """ServerContext's fields from vLLM's frontend flags (--default-chat-template-kwargs,
    --exclude-tools-when-tool-choice-none, --enable-log-outputs, --enable-log-deltas,
    --enable-tokenizer-info-endpoint, --log-error-stack: given, either form, it wins; else
    server_dev_mode(), as vLLM defaults it)."""
    log_error_stack = ns.log_error_stack
    return dict(
        default_chat_template_kwargs=ns.default_chat_template_kwargs,
        exclude_tools_when_tool_choice_none=ns.exclude_tools_when_tool_choice_none,
        log_outputs=ns.enable_log_outputs,
        log_deltas=ns.enable_log_deltas,
        enable_tokenizer_info_endpoint=ns.enable_tokenizer_info_endpoint,
        log_error_stack=server_dev_mode() if log_error_stack is None else log_error_stack,
    )


def server_dev_mode() -> bool:
    """VLLM_SERVER_DEV_MODE as vLLM reads it, an integer (unset: 0), true when not 0; any other
    text is a ValueError naming the variable (a typo must not turn the stack traces off)."""
    raw = os.environ.get(SERVER_DEV_MODE_ENV, "0").strip() or "0"
    try:
        return bool(int(raw))
    except ValueError:
        raise ValueError(f"{SERVER_DEV_MODE_ENV} must be an integer (1: on, 0: off), got {raw!r}") from None


def _result(result):
    return result if isinstance(result, dict) else SSEResponse(result)


def _add_openai_routes(app: FastAPI, ctx: ServerContext) -> None:
    """OpenAI's routes, added in this order: the model list and cards (_add_model_routes),
    /v1/completions, /v1/chat/completions, the Responses API (_add_responses_routes) and vLLM's
    /invocations (either of the first two, by the body's shape)."""
    _add_model_routes(app, ctx)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve_completion(ctx, request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await _serve_chat(ctx, request)

    _add_responses_routes(app, ctx)

    @app.post("/invocations")
    async def invocations(request: Request):
        """vLLM's SageMaker entry point: the body goes, by its shape, to the handler of
        /v1/chat/completions ("messages") or of /v1/completions ("prompt"), which answers it as
        that route would (streaming, X-Request-Id, disconnects, errors); chat where it has both,
        as vLLM tries chat first. Neither is a 400 naming both."""
        raw = await _json_object(request)
        if "messages" in raw:
            return await _serve_chat(ctx, request)
        if "prompt" in raw:
            return await _serve_completion(ctx, request)
        raise APIError(
            400,
            'the body is neither a chat completion (it has no "messages") nor a completion '
            '(it has no "prompt"): /invocations expects one of the two',
        )


def _add_model_routes(app: FastAPI, ctx: ServerContext) -> None:
    """GET /v1/models and /v1/models/{model}: each served name's card, the same on every request
    (its "created" and its permission are made once, here)."""
    # A served model's card is the same on every request: "created" is when the routes were made
    # (the server's start), so a list and a retrieve a second apart agree (they took the clock
    # at each request before, and a client comparing them saw the card change).
    created = int(time.time())
    permissions = {name: _model_permission(created) for name in ctx.model_names}

    def card(name: str) -> dict:
        """vLLM's ModelCard: `root` the loaded checkpoint (the served name where unknown),
        `parent` null (a base model: this server serves no adapters)."""
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "enginespec",
            "root": ctx.model_path or name,
            "parent": None,
            "max_model_len": ctx.max_model_len,
            "permission": [permissions[name]],
        }

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card(name) for name in ctx.model_names]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        """OpenAI's retrieve: a served name's card (a name may hold slashes, as an HF id does);
        "/v1/models/", which this route matches with an empty name, is the list."""
        if not model:
            return await models()
        if model not in ctx.model_names:
            raise APIError(404, f"The model `{model}` does not exist.", "model")
        return card(model)


def _add_responses_routes(app: FastAPI, ctx: ServerContext) -> None:
    """POST /v1/responses (counted in /load, as vLLM counts it) and GET /v1/responses/{id}, a 404
    for every id: nothing is stored."""

    @app.post("/v1/responses")
    async def responses(request: Request):
        count_load(request)  # vLLM counts its Responses route in /load too
        body = await _parse(request, ResponsesRequest)
        header_id = request.headers.get("x-request-id")
        return _result(await create_response(ctx, body, _disconnect_waiter(request), header_id))

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str):
        """OpenAI's retrieve: this server stores no response (serving_responses.py), as vLLM's
        default, so every id is unknown."""
        raise APIError(
            404,
            f"Response with id '{response_id}' not found: this server does not store responses",
            "response_id",
        )


async def _serve_completion(ctx: ServerContext, request: Request):
    """/v1/completions' handler (/invocations' too): a full body, or an SSE stream."""
    count_load(request)
    body = await _parse(request, CompletionRequest)
    header_id = request.headers.get("x-request-id")
    return _result(await create_completion(ctx, body, _disconnect_waiter(request), header_id))


async def _serve_chat(ctx: ServerContext, request: Request):
    """/v1/chat/completions' handler (/invocations' too): a full body, or an SSE stream."""
    count_load(request)
    body = await _parse(request, ChatCompletionRequest)
    header_id = request.headers.get("x-request-id")
    return _result(await create_chat_completion(ctx, body, _disconnect_waiter(request), header_id))


def _model_permission(created: int) -> dict:
    """vLLM's ModelPermission with its defaults (sampling and logprobs allowed, nothing else),
    made once a served name so that its card is the same on every request."""
    return {
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


def _add_utility_routes(app: FastAPI, ctx: ServerContext, metrics: ServerMetrics) -> None:
    """/health (a 503 once the engine is dead) and vLLM's /ping, /load, /version, /metrics, then
    /tokenize and /detokenize (_add_tokenize_routes), added in that order."""

    @app.get("/health")
    async def health():
        if not ctx.engine.alive:  # vLLM's answer to a dead engine: 503, which probes read as down
            raise APIError(503, f"the engine is not running: {ctx.engine.fatal!r}")
        return Response(status_code=200)

    @app.get("/ping")
    @app.post("/ping")  # one route per method: one route for both gave both one operation id
    async def ping():  # vLLM's SageMaker health check: /health's answer
        return await health()

    @app.get("/load")
    async def load():
        """vLLM's load probe (for a load balancer): {"server_load": N}, the generation requests
        in flight under --enable-server-load-tracking (ServerLoad), else 0."""
        return {"server_load": app.state.server_load.num_requests}

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics_route():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    _add_tokenize_routes(app, ctx)


def _add_tokenize_routes(app: FastAPI, ctx: ServerContext) -> None:
    """vLLM's POST /tokenize (a prompt, or chat messages through the template) and /detokenize;
    each a 400 on a server without a tokenizer, once its body and model name are checked."""

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await _parse(request, TokenizeRequest)
        ctx.check_model(body.model)
        if ctx.tokenizer is None:
            raise APIError(400, "this server has no tokenizer")
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", "prompt")
        if body.tools is not None and body.messages is None:
            raise APIError(400, "tools need messages (the chat template shows them)", "tools")
        if body.messages is not None:  # vLLM's chat default: no special tokens beyond the template's
            text = render_chat(ctx, body, checked_tools(body.tools))
            special = body.add_special_tokens if "add_special_tokens" in body.model_fields_set else False
            tokens = list(ctx.tokenizer.encode(text, add_special_tokens=special))
        else:
            tokens = list(ctx.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens))
        strs = ctx.tokenizer.convert_ids_to_tokens(tokens) if body.return_token_strs else None
        return {
            "count": len(tokens),
            "max_model_len": ctx.max_model_len,
            "tokens": tokens,
            "token_strs": strs,
        }

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await _parse(request, DetokenizeRequest)
        ctx.check_model(body.model)
        if ctx.tokenizer is None:
            raise APIError(400, "this server has no tokenizer")
        vocab = ctx.engine.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"tokens must be in [0, vocab_size={vocab}), got {bad[:5]}", "tokens")
        return {"prompt": ctx.tokenizer.decode(body.tokens)}


def _add_tokenizer_info_route(app: FastAPI, ctx: ServerContext) -> None:
    """vLLM's GET /tokenizer_info (--enable-tokenizer-info-endpoint; it may show the chat template
    and special tokens, so it is off by default)."""

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        if ctx.tokenizer is None:
            raise APIError(400, "this server has no tokenizer")
        return tokenizer_config(ctx.tokenizer, ctx.chat_template)


def tokenizer_config(tokenizer, chat_template: Optional[str] = None) -> dict:
    """/tokenizer_info's body, as vLLM's: the tokenizer's init configuration (tokenizer_config.json's
    keys as transformers read them) less the local paths of its files (vocab_file, merges_file,
    and any other *_file), every value JSON's (a special token as its text, any other object
    that is not JSON as its str); tokenizer_class, the tokenizer's class name; chat_template, the
    server's --chat-template where it has one."""
    config = {
        k: v
        for k, v in dict(getattr(tokenizer, "init_kwargs", None) or {}).items()
        if not k.endswith("_file")
    }
    body = {str(k): _as_json(v) for k, v in config.items()}
    body["tokenizer_class"] = type(tokenizer).__name__
    if chat_template:
        body["chat_template"] = chat_template
    return body


def _as_json(value):
    """A tokenizer configuration value as JSON: an AddedToken (anything with a str `content`) as
    its text, containers item by item (keys as str), JSON's scalars as they are, the rest as str."""
    if isinstance(getattr(value, "content", None), str):
        return value.content
    if isinstance(value, dict):
        return {str(k): _as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _add_dev_routes(app: FastAPI, ctx: ServerContext) -> None:
    @app.get("/dev/state")
    async def state():
        snap = ctx.engine.state
        return {**asdict(snap), "num_pending": ctx.engine._num_pending, "engine_pid": ctx.engine.engine_pid}

    @app.post("/dev/pause")
    async def pause():
        await ctx.engine.pause()
        return {"paused": True}

    @app.post("/dev/resume")
    async def resume():
        await ctx.engine.resume()
        return {"paused": False}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        """vLLM's dev endpoint (behind its VLLM_SERVER_DEV_MODE; here --enable-dev-endpoints):
        forget the cached prefix blocks between two steps, so that later prompts are computed in
        full (what a benchmark does between runs to time cold prefills). A 409 with nothing
        changed while a request holds blocks, where vLLM answers 200 and only logs it."""
        if not await ctx.engine.reset_prefix_cache():
            raise APIError(
                409, "the prefix cache was not reset: requests hold blocks (finish or abort them first)"
            )
        return {"reset": True}

    _add_sleep_routes(app, ctx)

    @app.post("/dev/fail_next_step")
    async def fail_next_step():
        await ctx.engine.fail_next_step()
        return {"armed": True}


def _add_profile_routes(app: FastAPI, ctx: ServerContext) -> None:
    """vLLM's POST /start_profile and /stop_profile: a torch.profiler trace of the engine's
    process (where the model runs) between the two, one `*.pt.trace.json[.gz]` in
    --profiler-config's torch_profiler_dir or VLLM_TORCH_PROFILER_DIR, written when
    /stop_profile answers (api/profiler.py). 200 with an empty body, as vLLM's. A second start,
    or a stop with none running, is a 409 that changes nothing (vLLM's workers log a warning and
    answer 200); the server serves on either way."""
    log.warning(
        "profiling is on: POST /start_profile and /stop_profile trace the engine (for development only)"
    )

    @app.post("/start_profile")
    async def start_profile():
        try:
            await ctx.engine.start_profile()
        except ProfilerStateError:
            raise APIError(409, "a profile is already running: POST /stop_profile first") from None
        return Response(status_code=200)

    @app.post("/stop_profile")
    async def stop_profile():
        try:
            await ctx.engine.stop_profile()
        except ProfilerStateError:
            raise APIError(409, "no profile is running: POST /start_profile first") from None
        return Response(status_code=200)


def _add_sleep_routes(app: FastAPI, ctx: ServerContext) -> None:
    """vLLM's dev-mode sleep routes (here behind --enable-dev-endpoints), over the engine's
    sleep mode (worker/sleep.py): POST /sleep?level=1 (or 2), POST /wake_up
    [?tags=weights&tags=kv_cache], GET /is_sleeping, each answering {"is_sleeping": bool}; and
    POST /reload_weights[?weights_path=DIR] (worker/weight_update.py), which fills the weights
    after a level-2 sleep. A 400 without --enable-sleep-mode or for a bad level or tag (naming
    it), a 409 with nothing changed while requests are unfinished; while asleep a completion or
    chat request is a 503."""

    @app.post("/sleep")
    async def sleep(request: Request):
        _check_sleep_mode(ctx)
        raw = request.query_params.get("level", "1")
        try:
            level = int(raw)
        except ValueError:
            raise APIError(400, f"level must be an int, got {raw!r}", "level") from None
        await _engine_call("level", ctx.engine.sleep, level)
        return {"is_sleeping": True}

    @app.post("/wake_up")
    async def wake_up(request: Request):
        _check_sleep_mode(ctx)
        tags = request.query_params.getlist("tags") or None
        await _engine_call("tags", ctx.engine.wake_up, tags)
        return {"is_sleeping": await ctx.engine.is_sleeping()}

    @app.get("/is_sleeping")
    async def is_sleeping():
        return {"is_sleeping": await ctx.engine.is_sleeping()}

    @app.post("/reload_weights")
    async def reload_weights(request: Request):
        """vLLM's reload_weights (SGLang's /update_weights_from_disk): the checkpoint directory
        `weights_path` (default: the served model's) read again and copied in; after a level-2
        sleep this is how the weights are filled. Answers {"num_tensors": n}."""
        path = request.query_params.get("weights_path")
        count = await _engine_call("weights_path", ctx.engine.reload_weights, path)
        return {"num_tensors": count}


def _check_sleep_mode(ctx: ServerContext) -> None:
    """A 400 unless the engine runs with --enable-sleep-mode (what /sleep and /wake_up need)."""
    if not ctx.engine.args.enable_sleep_mode:
        raise APIError(400, "sleep mode is off: start the server with --enable-sleep-mode")


async def _engine_call(param: str, call, *args):
    """call(*args) on the engine, and its result; its ValueError a 400 naming `param`, a refusal
    (EngineRequestError: requests unfinished) a 409."""
    try:
        return await call(*args)
    except ValueError as exc:
        raise APIError(400, str(exc), param) from None
    except EngineRequestError as exc:
        raise APIError(409, str(exc)) from None


def load_chat_template(value: Optional[str]) -> Optional[str]:
    """--chat-template: a file path, else the template text itself (as vLLM accepts both)."""
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        return path.read_text()
    if any(c in value for c in "{}%"):
        return value
    raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")


def _check_request_log(ns) -> None:
    """vLLM's request-log flags: one of --enable-log-requests and --disable-log-requests (the
    latter the default here, kept for vLLM's command lines), --max-log-len >= 0."""
    if ns.enable_log_requests and ns.disable_log_requests:
        raise ValueError("give one of --enable-log-requests and --disable-log-requests, not both")
    if ns.max_log_len is not None and ns.max_log_len < 0:
        raise ValueError(f"--max-log-len must be >= 0, got {ns.max_log_len}")
    if getattr(ns, "enable_log_outputs", False) and not ns.enable_log_requests:  # vLLM's check
        raise ValueError(
            "--enable-log-outputs needs --enable-log-requests (outputs are logged beside their requests)"
        )


def _log_to_stderr(uvicorn_level: str) -> None:
    """enginespec's own log lines (the request log, the checkpoint's sampling defaults) to
    stderr at the server's log level, in uvicorn's look, as vLLM's server shows its own: without
    a handler Python prints only warnings. Left alone where the embedding program has given the
    `enginespec` logger a handler."""
    logger = logging.getLogger("enginespec")
    if logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(getattr(logging, uvicorn_level.upper(), logging.DEBUG))  # uvicorn's trace: debug


# How long the handlers of the requests ended at the end of the shutdown grace (shed_pending) get
# to send their 503s before the connections still open are reset (Server.cut_connections).
SHED_WAIT_S = 5.0

# How long the handlers of the connections reset then get to end before uvicorn cancels what is
# left (a cancelled handler's client gets a plain-text 500 or a cut stream, and the log a
# traceback): a handler whose connection is gone ends at its next await, so this is only the
# last resort.
CUT_WAIT_S = 5.0

# The signals that stop the server cleanly (exit status 0): not re-raised once it has stopped.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _ShutdownGrace:
    """uvicorn.Server's graceful shutdown bounded by the server's --shutdown-timeout (grace_s):
    what is still running then is ended (on_grace_expired) and answers, and the connections
    still open SHED_WAIT_S later are reset (cut_connections), so that uvicorn cancels no
    handler. A mixin for _server_class's Server (before uvicorn.Server in its bases)."""

    grace_s: Optional[float] = None
    on_grace_expired = None

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's shutdown, with on_grace_expired called grace_s seconds into it (the
        server's --shutdown-timeout): it ends the requests still running, which then answer;
        SHED_WAIT_S later the connections still open are reset (cut_connections), within
        uvicorn's own timeout (set SHED_WAIT_S + CUT_WAIT_S longer), so that uvicorn cancels
        no handler. Requests that finish within the grace are not touched."""
        loop = asyncio.get_running_loop()
        timers = []
        if self.grace_s is not None:
            if self.on_grace_expired is not None:
                timers.append(loop.call_later(self.grace_s, self.on_grace_expired))
            timers.append(loop.call_later(self.grace_s + SHED_WAIT_S, self.cut_connections))
        try:
            await super().shutdown(sockets)
        finally:
            for timer in timers:
                timer.cancel()

    def cut_connections(self) -> None:
        """Reset (abort: RST, no flush) every connection still open. What is left this late
        is a client that reads nothing while holding its socket: its handler waits for the
        socket to drain, so it never took its 503, and closing would wait for the same drain.
        Reset, the connection is lost at once, and its handler sees a disconnect and ends as
        for any client that left (the engine request aborted, no traceback), where uvicorn
        cancelled it with an "Exception in ASGI application" traceback."""
        open_now = [c for c in self.server_state.connections if getattr(c, "transport", None)]
        if open_now:
            log.warning(
                "resetting %d connection(s) still open %g s after the shutdown grace "
                "(clients that stopped reading)",
                len(open_now),
                SHED_WAIT_S,
            )
        for connection in open_now:
            connection.transport.abort()


class _CleanStop:
    """uvicorn.Server's stop on SIGTERM or SIGINT, ending in exit status 0: the signal is not
    re-raised once the server has stopped, and on_exit (the client's close_admission: new
    requests get 503) is called at each one, the first included. A mixin for _server_class's Server (before
    uvicorn.Server in its bases)."""

    on_exit = None

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        captured = getattr(self, "_captured_signals", None)
        if sig in _STOP_SIGNALS and captured and captured[-1] == sig:
            captured.pop()
        if self.on_exit is not None:
            self.on_exit()


def _server_class():
    import uvicorn

    class Server(_CleanStop, _ShutdownGrace, uvicorn.Server):
        """uvicorn's server, except that SIGTERM and SIGINT (Ctrl-C), the ordinary ways to stop
        a server, end in exit status 0 after the graceful shutdown, as vLLM's server ends
        (uvicorn re-raises the signal, so the process would die of it: of SIGINT with a
        KeyboardInterrupt traceback), and that it closes admission at once (new requests get
        503 meanwhile). A second Ctrl-C still cuts the graceful shutdown short (uvicorn's
        force_exit). Over sockets bound beforehand (bind_socket), uvicorn logs no address: its
        "Uvicorn running on" line is logged here instead."""

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started and sockets:
                host, port = self.config.host, sockets[0].getsockname()[1]
                where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                scheme = "https" if self.config.is_ssl else "http"
                logging.getLogger("uvicorn.error").info(
                    "Uvicorn running on %s://%s (Press CTRL+C to quit)", scheme, where
                )

    return Server


class _StopDuringStartup(Exception):
    """A stop signal (SIGTERM, SIGINT) arrived before the server was serving."""


@contextmanager
def _stop_signals_raise():
    """Within: SIGTERM and SIGINT raise _StopDuringStartup (in the main thread, where Python
    runs signal handlers), so that a stop while the engine is still loading unwinds through
    run_server's cleanup, which reaps the engine process; the previous handlers come back on
    exit. Off the main thread (an embedding program's) nothing changes: signals are not ours."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(sig, frame):
        raise _StopDuringStartup(signal.Signals(sig).name)

    previous = {sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def bind_socket(host: str, port: int, send_timeout: float = 0.0) -> socket.socket:
    """The server's address, bound (not yet listening) before the engine loads, as vLLM binds
    its own: a port in use, or a host that is not this machine's, is a ValueError naming
    --host and --port in seconds rather than uvicorn's bind error after the model's load. An
    IPv6 host (one with a colon) gets an IPv6 socket; uvicorn listens on this very socket.
    send_timeout > 0: every connection it accepts has that send timeout (set_send_timeout)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's: past TIME_WAIT
    set_send_timeout(sock, send_timeout)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(
            f"--host/--port: cannot listen on {_address(host, port)}: {exc.strerror or exc}"
        ) from None
    return sock


def set_send_timeout(sock: socket.socket, seconds: float) -> bool:
    """--send-timeout: Linux's TCP_USER_TIMEOUT on the listening socket (the sockets it accepts
    inherit it). The kernel then drops a connection that, with bytes waiting for its client,
    made too little progress for `seconds`: nothing sent was acknowledged, or the client's
    window stayed too narrow for the next queued segment (up to 64 KB) that long, as when a
    client stops reading and holds its socket, acknowledging a zero window forever. Its handler
    then sees a disconnect, as for a client that left: a stream's engine request is aborted
    (its blocks freed, counted under request_success "abort") and the handler ends. Without
    it, TCP never gives up on such a peer: the request ran to max_tokens and its handler then
    waited on the full socket for as long as the client held it. A client that falls behind
    must take about 64 KB within `seconds` to stay (measured on loopback, 1 s: a reader of
    128 KB/s stays, one of 64 KB/s is cut), so the default (60) cuts only readers slower than
    about 1 KB/s with data waiting. 0: no timeout (TCP's). Returns whether it was set: False
    for 0, and where the platform has no TCP_USER_TIMEOUT."""
    if seconds <= 0:
        return False
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None:
        log.info("--send-timeout is not applied: this platform has no TCP_USER_TIMEOUT")
        return False
    sock.setsockopt(socket.IPPROTO_TCP, option, max(1, round(seconds * 1000)))
    return True


def serving_line(sock: socket.socket, model: str, tls: bool = False) -> str:
    """The one line `serve` writes to stderr once the engine is up and `sock` listens, whatever
    the log level (uvicorn's default here is warning, which says nothing): where it listens,
    the port the kernel chose for --port 0 included, as an https:// URL under TLS."""
    host, port = sock.getsockname()[:2]
    scheme = "https" if tls else "http"
    return (
        f"enginespec serve: {model} on {scheme}://{_address(host, port)} (OpenAI API under /v1; Ctrl-C stops)"
    )


def apply_http_options(config, ns, tls: dict) -> None:
    """vLLM's uvicorn flags onto the server's uvicorn Config: the TLS files (tls_options' checked
    settings, which uvicorn reads when the server starts, Config.load) and the access log, off
    here unless --no-disable-uvicorn-access-log (Config's constructor set up its logging with the
    access log off; it is set up again with it on)."""
    for name, value in tls.items():
        setattr(config, name, value)
    if ns.disable_uvicorn_access_log is False:
        config.access_log = True
        config.configure_logging()
    quiet = getattr(ns, "disable_access_log_for_endpoints", None)
    access = logging.getLogger("uvicorn.access")
    for old in [f for f in access.filters if isinstance(f, QuietEndpoints)]:  # a server's before
        access.removeFilter(old)
    if quiet:
        access.addFilter(QuietEndpoints(quiet, getattr(ns, "root_path", None)))


class QuietEndpoints(logging.Filter):
    """uvicorn's access log without the requests to some paths (vLLM's
    --disable-access-log-for-endpoints: health probes and metric scrapes drown the rest). A
    record's path is its third argument (uvicorn's access line: client, method, path with its
    query, HTTP version, status); the query is ignored, and under a root path both the bare and
    the prefixed path are left out, as the routes answer both."""

    def __init__(self, paths: str, root_path: Optional[str] = None):
        super().__init__()
        bare = {p.strip() for p in paths.split(",") if p.strip()}
        root = (root_path or "").rstrip("/")
        self.paths = frozenset(bare | {root + p for p in bare} if root else bare)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) < 3 or not isinstance(args[2], str):
            return True
        return args[2].split("?", 1)[0] not in self.paths


# vLLM's defaults of its request-header limits (--h11-max-incomplete-event-size, --h11-max-header-count)
H11_MAX_INCOMPLETE_EVENT_SIZE_DEFAULT = 4 * 1024 * 1024
H11_MAX_HEADER_COUNT_DEFAULT = 256


def h11_options(ns) -> dict:
    """uvicorn Config settings from --h11-max-incomplete-event-size (vLLM's): the most bytes h11
    holds of a request's head (request line and headers) still incomplete; past it uvicorn answers
    400 "Invalid HTTP request received." and closes the connection. Not given, vLLM's default, 4
    MB (h11's own is 16 KB: a head of a large cookie or token vLLM takes would be refused).
    Given, uvicorn's h11 protocol is chosen outright: its "auto" picks httptools where that is
    installed, which reads no h11 setting, and the limit asked for would not hold."""
    size = getattr(ns, "h11_max_incomplete_event_size", None)
    if size is None:
        return {"h11_max_incomplete_event_size": H11_MAX_INCOMPLETE_EVENT_SIZE_DEFAULT}
    return {"h11_max_incomplete_event_size": size, "http": "h11"}


def max_header_count(ns) -> int:
    """--h11-max-header-count (vLLM's; default 256): the most header fields a request may carry
    (_HeaderCountLimit answers more with a 431)."""
    count = getattr(ns, "h11_max_header_count", None)
    return H11_MAX_HEADER_COUNT_DEFAULT if count is None else count


def load_middleware(paths: Sequence[str]) -> list:
    """--middleware's import paths (vLLM's flag), each MODULE.NAME, imported before the engine
    loads: a class (an ASGI middleware) or an async function (an @app.middleware("http") one),
    in the order given (build_app adds each outside those before it). A path without a dot, a
    module that does not import (or raises on import), a name it lacks, or an object of
    another kind is a ValueError naming the flag and the path."""
    layers = []
    for path in paths or ():
        module_name, _, name = path.rpartition(".")
        if not module_name or not name:
            raise ValueError(f"--middleware {path!r}: must be an import path, MODULE.NAME")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # ImportError, or whatever the module raises as it runs
            raise ValueError(
                f"--middleware {path!r}: cannot import {module_name}: {type(exc).__name__}: {exc}"
            ) from None
        if not hasattr(module, name):
            raise ValueError(f"--middleware {path!r}: {module_name} has no {name}")
        layer = getattr(module, name)
        if not (inspect.isclass(layer) or inspect.iscoroutinefunction(layer)):
            raise ValueError(
                f"--middleware {path!r}: must name an ASGI middleware class or an async function, "
                f"got {type(layer).__name__}"
            )
        layers.append(layer)
    return layers


def apply_log_config(ns) -> Optional[dict]:
    """--log-config-file (vLLM's; not given, the VLLM_LOGGING_CONFIG_PATH environment variable's
    file, as vLLM's default): a JSON object of logging.config.dictConfig's schema, for every
    logger it names (uvicorn's, enginespec's, the root). Applied here, before the model loads,
    so that a file that is missing, not JSON, not an object, or that dictConfig refuses (no
    version, a handler class that does not import) is a ValueError naming the flag (or the
    variable) and the path, and the loading's own log lines follow it. Returned: uvicorn's
    log_config, which it applies again in place of its default configuration as the server
    starts (as vLLM hands it over); None where no file is named (uvicorn's default then)."""
    flag, path = "--log-config-file", getattr(ns, "log_config_file", None)
    if not path:
        flag, path = "VLLM_LOGGING_CONFIG_PATH", os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    if not path:
        return None
    where = f"{flag} {path!r}"
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except OSError as exc:
        raise ValueError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{where}: is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(
            f"{where}: must be a JSON object (logging.config.dictConfig's schema), got {_json_kind(config)}"
        )
    try:
        logging.config.dictConfig(copy.deepcopy(config))  # dictConfig may edit what it is given
    except Exception as exc:  # ValueError mostly; TypeError, AttributeError, ImportError too
        raise ValueError(f"{where}: logging.config.dictConfig refused it: {exc}") from None
    return config


def _address(host: str, port: int) -> str:
    """host:port, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _ServeOptions(NamedTuple):
    """The serve line's options, checked and turned into the server's settings (_serve_options)."""

    chat_template: Optional[str]
    cors: Optional[dict]
    api_keys: list
    app_options: dict
    tls: dict
    uvicorn_options: dict
    frontend: dict


def _serve_options(ns) -> _ServeOptions:
    """The serve line's options read and checked, in this order, before anything is loaded: every
    refusal here (a ValueError naming the flag or the variable) happens before the engine
    arguments are built, the tokenizer loads, the address is bound or the engine launches. The
    log configuration (_configure_logging) is applied here too, so the loading's own log lines
    follow it; the tool-choice check comes after it, as it always has."""
    template = load_chat_template(ns.chat_template)
    if ns.max_waiting_requests < 0:
        raise ValueError(f"--max-waiting-requests must be >= 0, got {ns.max_waiting_requests}")
    cors = cors_options(ns)
    keys = api_keys(ns)
    app_options, tls = fastapi_options(ns), tls_options(ns)
    app_options.update(
        middleware=load_middleware(getattr(ns, "middleware", ())), max_header_count=max_header_count(ns)
    )
    uvicorn_options = h11_options(ns)
    _check_request_log(ns)
    flags = frontend_flags(ns)  # VLLM_SERVER_DEV_MODE's refusal before the model loads
    _configure_logging(ns, uvicorn_options)
    if ns.enable_auto_tool_choice and ns.tool_call_parser is None:
        raise ValueError(
            "--enable-auto-tool-choice needs --tool-call-parser (the format of the model's tool calls)"
        )
    return _ServeOptions(template, cors, keys, app_options, tls, uvicorn_options, flags)


def _configure_logging(ns, uvicorn_options: dict) -> None:
    """--log-config-file's configuration applied now (apply_log_config), and handed to uvicorn
    through uvicorn_options' log_config; without one, enginespec's own lines go to stderr at the
    server's log level (_log_to_stderr). A file configures enginespec's loggers itself."""
    log_config = apply_log_config(ns)
    if log_config is None:
        _log_to_stderr(ns.uvicorn_log_level)
    else:
        uvicorn_options["log_config"] = log_config


def _server_context(
    ns, args, client: EngineClient, tokenizer, names, options: _ServeOptions
) -> ServerContext:
    """Launch the engine (client.launch: the model loads here), then the ServerContext over it:
    the checkpoint's sampling defaults (generation_config.json, logged where there are some),
    the engine's max_model_len, and the serve line's settings. Called within
    _stop_signals_raise, so a stop during the load unwinds run_server. (An unknown
    --reasoning-parser, which argparse's choices refuse first, is get_parser's ValueError here,
    after the launch, as it was.)"""
    from enginespec.engine.generation_config import GenerationDefaults

    info = client.launch()
    defaults = GenerationDefaults.load(
        args.model_dir(), args.generation_config, args.override_generation_config
    ).sampling
    if defaults:
        log.info("default sampling parameters from the checkpoint's generation_config.json: %s", defaults)
    return ServerContext(
        client,
        tokenizer,
        list(names),
        info.max_model_len,
        options.chat_template,
        defaults,
        trust_request_chat_template=ns.trust_request_chat_template,
        enable_prompt_tokens_details=ns.enable_prompt_tokens_details,
        reasoning_parser=get_parser(ns.reasoning_parser),
        enable_auto_tool_choice=ns.enable_auto_tool_choice,
        tool_call_parser=ns.tool_call_parser,
        log_requests=ns.enable_log_requests,
        max_log_len=ns.max_log_len,
        model_path=args.model,
        **chat_defaults(ns),
        **options.frontend,
    )


def _uvicorn_server(ns, app: FastAPI, client: EngineClient, options: _ServeOptions) -> tuple:
    """The uvicorn server over app (_server_class's, not yet running), with its shutdown hooks:
    a stop signal closes the client's admission at once (on_exit); --shutdown-timeout seconds
    into the graceful shutdown the requests still running are shed with a 503
    (on_grace_expired); uvicorn's own timeout is the last resort SHED_WAIT_S + CUT_WAIT_S
    later; and an engine that dies makes the server exit (client.on_death). Returned with its
    uvicorn Config (the server class need not keep it: a test's stand-in does not)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=ns.host,
        port=ns.port,
        log_level=ns.uvicorn_log_level,
        timeout_graceful_shutdown=ns.shutdown_timeout + SHED_WAIT_S + CUT_WAIT_S,  # the last resort
        access_log=False,
        **options.uvicorn_options,  # h11_options', and apply_log_config's log_config
    )
    apply_http_options(config, ns, options.tls)
    server = _server_class()(config)
    server.on_exit = client.close_admission
    server.grace_s = ns.shutdown_timeout
    server.on_grace_expired = lambda: client.shed_pending(
        f"the server is shutting down: the request did not finish within "
        f"--shutdown-timeout ({ns.shutdown_timeout:g} s)"
    )
    client.on_death = lambda: setattr(server, "should_exit", True)
    return server, config


def run_server(ns) -> int:
    """Start the engine, then serve until SIGTERM/SIGINT; returns 0 after a clean shutdown, 1
    when the engine process died. In order: the options checked and the logging set up
    (_serve_options), the engine arguments built and the tokenizer loaded, the address bound
    (bind_socket), the engine launched and the app and server built (_server_context,
    build_app, _uvicorn_server; a stop signal meanwhile unwinds here and exits 0), then the
    socket listens, the serving line is written and uvicorn serves. The engine is stopped and the socket closed however it ends."""
    import uvicorn  # noqa: F401 -- first, as ever: a server without uvicorn fails before any check

    from enginespec.engine.engine_core import load_engine_tokenizer
    from enginespec.engine_args import EngineArgs
    from enginespec.entrypoints.cli import _engine_kwargs

    options = _serve_options(ns)
    args = EngineArgs.from_kwargs(ns.model, impl=ns.impl, seed=ns.seed, **_engine_kwargs(ns))
    tokenizer = load_engine_tokenizer(args)
    names = ns.served_model_name or [ns.model]
    metrics = ServerMetrics(names[0])
    sock = bind_socket(ns.host, ns.port, ns.send_timeout)
    client = EngineClient(
        args, tokenizer, metrics, max_waiting=ns.max_waiting_requests, in_process=ns.engine_in_process
    )
    try:
        with _stop_signals_raise():  # until uvicorn's own handlers take over in server.run()
            ctx = _server_context(ns, args, client, tokenizer, names, options)
            app = build_app(
                ctx,
                metrics,
                api_key=options.api_keys,
                dev=ns.enable_dev_endpoints,
                cors=options.cors,
                request_id_headers=ns.enable_request_id_headers,
                app_options=options.app_options,
                server_load_tracking=ns.enable_server_load_tracking,
                profiler_config=args.profiler_config,
            )
            server, config = _uvicorn_server(ns, app, client, options)
        # listening before the line names the address: a client that connects on reading it is
        # queued by the kernel until uvicorn accepts (it was refused while uvicorn started up)
        sock.listen(config.backlog)
        print(serving_line(sock, names[0], tls=bool(options.tls)), file=sys.stderr, flush=True)
        server.run(sockets=[sock])
    except _StopDuringStartup as stopped:  # the engine is reaped below; a stop is exit 0
        log.info("stopped by %s before the server was serving", stopped)
    finally:
        client.stop()
        sock.close()
    return 1 if client.fatal is not None else 0
