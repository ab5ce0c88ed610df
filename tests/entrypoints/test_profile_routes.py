"""vLLM's POST /start_profile and /stop_profile over the ASGI app alone (no engine: a stand-in
that records the calls): the routes exist only when VLLM_TORCH_PROFILER_DIR is set as the app is
built (a 404 in OpenAI's error shape otherwise, as vLLM's server lacks them then), answer 200
with an empty body, and a start or stop out of order is a 409. The real trace, taken in the
engine's process of a real server, is test_serve.py's."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from enginespec.entrypoints import cli
from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.serving import ServerContext
from enginespec.profiler import ProfilerConfig, ProfilerStateError
from tests.entrypoints.test_vllm_engine_flags import _engine_args as _serve_args

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


def _post_each(engine: RecordingEngine, profiler_config=None) -> list[httpx.Response]:
    """POST each profile path, in order, to an app built now (the environment as it is; the
    engine's profiler_config as run_server passes it)."""
    ctx = ServerContext(engine, None, ["m"], 16)
    app = build_app(ctx, ServerMetrics("m"), profiler_config=ProfilerConfig.of(profiler_config))

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


# ---- --profiler-config (vLLM's newer switch; the variable keeps working) -------------------------


def test_a_profiler_config_adds_the_routes_without_the_variable(monkeypatch, tmp_path):
    """They were 404s: only the variable added them."""
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    engine = RecordingEngine()
    on = {"profiler": "torch", "torch_profiler_dir": str(tmp_path)}
    assert [r.status_code for r in _post_each(engine, on)] == [200, 200]
    assert engine.calls == ["start", "stop"]
    off = RecordingEngine()
    assert [r.status_code for r in _post_each(off, {})] == [404, 404]  # profiler None: vLLM's default, off


@pytest.mark.parametrize("form", ["json", "dotted", "underscores"])
def test_the_flag_takes_vllms_json_and_dotted_forms(form, tmp_path):
    trace_dir = str(tmp_path / "t")
    flags = {
        "json": ["--profiler-config", json.dumps({"profiler": "torch", "torch_profiler_dir": trace_dir})],
        "dotted": ["--profiler-config.profiler", "torch", "--profiler-config.torch_profiler_dir", trace_dir],
        "underscores": [
            "--profiler_config.profiler=torch",
            f"--profiler_config.torch_profiler_dir={trace_dir}",
        ],
    }[form]
    config = _serve_args([*flags, "--profiler-config.torch_profiler_with_stack", "false"]).profiler_config
    assert (config.profiler, config.torch_profiler_dir, config.torch_profiler_with_stack) == (
        "torch",
        trace_dir,
        False,
    )
    assert _serve_args([]).profiler_config is None


@pytest.mark.parametrize(
    "flags, field",
    [
        (["--profiler-config", '{"profiler": "cuda"}'], "profiler"),
        (["--profiler-config.profiler", "torch"], "torch_profiler_dir"),
        (
            ["--profiler-config", '{"profiler": "torch", "torch_profiler_dir": "/t", "max_iterations": 4}'],
            "max_iterations",
        ),
        (
            [
                "--profiler-config.torch_profiler_dir",
                "/t",
                "--profiler-config.profiler",
                "torch",
                "--profiler-config.bogus",
                "1",
            ],
            "bogus",
        ),
        (["--profiler-config", "[1]"], "profiler_config"),
    ],
)
def test_a_field_that_cannot_be_honoured_exits_2_naming_it(flags, field, capsys):
    """Before the model loads (the path does not exist, and the error is not that)."""
    assert cli.main(["serve", "/nonexistent/model", *flags]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("enginespec serve: error: ") and "\n" not in err and field in err
    assert "does not exist" not in err
