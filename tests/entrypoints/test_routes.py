"""The server's routes as a plain HTTP client meets them, over the ASGI app alone (no lifespan,
no engine): what a route or method the server lacks answers."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
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
        ("GET", "/v1/models/m", 404),
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
