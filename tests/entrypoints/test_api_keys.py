"""API keys as vLLM takes them: --api-key KEY [KEY ...] (any one of the keys opens /v1/*), else
the VLLM_API_KEY environment variable's key; an empty key on the command line is a one-line
error. Only the ASGI app runs here (no lifespan, no engine: /v1/models needs none)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from enginespec.entrypoints.cli import _parser
from enginespec.entrypoints.openai.api_server import api_keys, build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.serving import ServerContext


def _keys(*flags: str) -> list[str]:
    return api_keys(_parser().parse_args(["serve", "m", *flags]))


def _status(keys: list[str], authorization) -> int:
    """The status of GET /v1/models with this Authorization header (None: no header)."""
    app = build_app(ServerContext(None, None, ["m"], 16), ServerMetrics("m"), api_key=keys)
    headers = {} if authorization is None else {"Authorization": authorization}

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return (await client.get("/v1/models", headers=headers)).status_code

    return asyncio.run(run())


def test_several_keys_each_open_v1(monkeypatch):
    """`vllm serve M --api-key a b` is vLLM's form for several keys (it was a usage error here,
    "unrecognized arguments: b")."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    keys = _keys("--api-key", "key-a", "key-b")
    assert keys == ["key-a", "key-b"]
    assert [_status(keys, f"Bearer {k}") for k in keys] == [200, 200]
    assert [_status(keys, h) for h in ("Bearer key-c", "Bearer key-a key-b", None)] == [401] * 3


def test_vllm_api_key_in_the_environment_guards_v1(monkeypatch):
    """A deployment that keys vLLM by VLLM_API_KEY stays keyed under this server (it was open:
    the variable was ignored); --api-key wins over it, as in vLLM; unset or empty: no key."""
    monkeypatch.setenv("VLLM_API_KEY", "env-key")
    keys = _keys()
    assert keys == ["env-key"]
    assert (_status(keys, None), _status(keys, "Bearer env-key")) == (401, 200)
    assert _keys("--api-key", "flag-key") == ["flag-key"]
    monkeypatch.setenv("VLLM_API_KEY", "")
    assert _keys() == [] and _status([], None) == 200


def test_an_empty_key_is_an_error_naming_the_flag(monkeypatch):
    with pytest.raises(ValueError, match="--api-key: a key must not be empty"):
        _keys("--api-key", "")


def test_the_bearer_scheme_is_case_insensitive(monkeypatch):
    """An HTTP auth scheme is case-insensitive (RFC 9110 11.1), and vLLM's guard reads it so:
    `Authorization: bearer KEY` (what some HTTP clients and hand-written curl lines send) was a
    401 here. The key itself stays exact, and nothing but one space separates it from the scheme."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    keys = ["Key-A"]
    opened = [_status(keys, f"{scheme} Key-A") for scheme in ("Bearer", "bearer", "BEARER")]
    assert opened == [200, 200, 200]
    refused = ("bearer key-a", "Basic Key-A", "Bearer  Key-A", "Key-A", "Bearer")
    assert [_status(keys, h) for h in refused] == [401] * len(refused)
