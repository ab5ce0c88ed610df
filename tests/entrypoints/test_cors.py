"""CORS (vLLM's --allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials): a
browser's preflight is answered before the API key guard, and responses name the allowed
origin; without --allowed-origins there are no CORS headers. Only the ASGI app runs here (no
lifespan, no engine: a preflight and /version reach no handler that needs one)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from enginespec.entrypoints.cli import _parser
from enginespec.entrypoints.openai.api_server import build_app, cors_options
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.serving import ServerContext

ORIGIN = "http://localhost:3000"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization",
}


def _serve_args(*flags: str):
    return _parser().parse_args(["serve", "m", *flags])


def _ask(cors, method: str, path: str, headers: dict) -> httpx.Response:
    app = build_app(ServerContext(None, None, ["m"], 16), ServerMetrics("m"), api_key="k", cors=cors)

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, headers=headers)

    return asyncio.run(run())


def test_a_preflight_is_answered_before_the_api_key():
    cors = cors_options(_serve_args("--allowed-origins", f'["{ORIGIN}"]'))
    resp = _ask(cors, "OPTIONS", "/v1/chat/completions", PREFLIGHT)
    assert resp.status_code == 200, resp.text
    assert resp.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in resp.headers["access-control-allow-methods"]
    version = _ask(cors, "GET", "/version", {"Origin": ORIGIN})
    assert version.status_code == 200 and version.headers["access-control-allow-origin"] == ORIGIN
    other = _ask(cors, "OPTIONS", "/v1/chat/completions", {**PREFLIGHT, "Origin": "http://evil.example"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_without_allowed_origins_there_is_no_cors():
    assert cors_options(_serve_args()) is None
    resp = _ask(None, "OPTIONS", "/v1/chat/completions", PREFLIGHT)
    assert resp.status_code in (401, 405) and "access-control-allow-origin" not in resp.headers


def test_the_flags_take_vllms_json_lists():
    ns = _serve_args(
        "--allowed-origins", '["*"]', "--allowed-methods", '["GET", "POST"]', "--allow-credentials"
    )
    assert cors_options(ns) == dict(
        allow_origins=["*"], allow_methods=["GET", "POST"], allow_headers=["*"], allow_credentials=True
    )
    with pytest.raises(ValueError, match="--allowed-origins must be a JSON list of strings"):
        cors_options(_serve_args("--allowed-origins", '"*"'))
    with pytest.raises(SystemExit):
        _serve_args("--allowed-origins", "[not json")
