"""vLLM's POST /start_profile and /stop_profile over the ASGI app alone (no engine: a stand-in
that records the calls): the routes exist only when VLLM_TORCH_PROFILER_DIR is set as the app is
built (a 404 in OpenAI's error shape otherwise, as vLLM's server lacks them then), answer 200
with an empty body, and a start or stop out of order is a 409. The real trace, taken in the
engine's process of a real server, is test_serve.py's."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.serving import ServerContext
from enginespec.profiler import ProfilerStateError

PATHS = ("/start_profile", "/stop_profile")


class RecordingEngine:
    """The engine client's profile calls, recorded; with `refuse`, each raises
    ProfilerStateError, as the engine's Profiler does for a call out of order."""

    def __init__(self, refuse: bool = False):
        self.calls: list[str] = []
        self.refuse = refuse

    async def start_profile(self, profile_prefix=None) -> None:
        self._record("start")

    async def stop_profile(self) -> None:
        self._record("stop")

    def _record(self, name: str) -> None:
        self.calls.append(name)
        if self.refuse:
            raise ProfilerStateError(f"{name} out of order")


def _post_each(engine: RecordingEngine) -> list[httpx.Response]:
    """POST each profile path, in order, to an app built now (the environment as it is)."""
    app = build_app(ServerContext(engine, None, ["m"], 16), ServerMetrics("m"))

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.post(path) for path in PATHS]

    return asyncio.run(run())


@pytest.mark.parametrize("unset", ["absent", "empty"])
def test_without_the_profiler_directory_the_routes_are_404s(monkeypatch, unset):
    if unset == "absent":
        monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    else:
        monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", "")
    engine = RecordingEngine()
    for resp in _post_each(engine):
        assert resp.status_code == 404
        assert resp.json()["error"]["type"] == "NotFoundError"
    assert engine.calls == []


def test_with_the_profiler_directory_start_and_stop_reach_the_engine(monkeypatch, tmp_path):
    """Both were 404s with the variable set (the server had no such routes)."""
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))
    engine = RecordingEngine()
    responses = _post_each(engine)
    assert [(r.status_code, r.content) for r in responses] == [(200, b""), (200, b"")]
    assert engine.calls == ["start", "stop"]


def test_a_start_or_stop_out_of_order_is_a_409_saying_what_to_post(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))
    start, stop = _post_each(RecordingEngine(refuse=True))
    assert start.status_code == stop.status_code == 409
    assert start.json()["error"]["type"] == "ConflictError"
    assert "already running" in start.json()["error"]["message"]
    assert "POST /start_profile" in stop.json()["error"]["message"]
