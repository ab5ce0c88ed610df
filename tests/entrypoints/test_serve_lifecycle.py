"""`enginespec serve` at its limits: no chat template (400), a full queue (503 + Retry-After),
SIGTERM with a request in flight (exit 0, the engine process gone too), and the death of the
engine process (500s, an error frame mid-stream, exit 1, nothing left behind). Small servers of
their own: capacity is one running plus one waiting sample, and no --chat-template."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from enginespec.testing.checkpoints import make_checkpoint
from tests.entrypoints.remote_server import HOST, RemoteServer

ARGS = ["--max-num-seqs", "1", "--max-waiting-requests", "1", "--enable-dev-endpoints", "--num-blocks", "64"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_checkpoint("llama", tmp_path_factory.mktemp("serve-small") / "llama")


@pytest.fixture(scope="module")
def server(model_dir):
    srv = RemoteServer(model_dir, ARGS + ["--shutdown-timeout", "2"])
    yield srv
    srv.terminate()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_chat_without_a_template_is_a_clear_400(server):
    with pytest.raises(openai.BadRequestError, match="chat template"):
        server.client().chat.completions.create(
            model=str(server.proc.args[4]), messages=[{"role": "user", "content": "hi"}]
        )


@contextlib.contextmanager
def _queue_full(server, body: dict):
    """The server paused with its capacity (one running plus one waiting sample) taken by two
    requests of `body`; on exit it resumes and they are answered (into the list yielded)."""
    results = []
    httpx.post(server.url("/dev/pause"))
    threads = [
        threading.Thread(target=lambda: results.append(server.post("/v1/completions", body)))
        for _ in range(2)
    ]
    try:
        for t in threads:
            t.start()
        _wait_for(lambda: server.state()["num_pending"] == 2)
        yield results
    finally:
        httpx.post(server.url("/dev/resume"))
        for t in threads:
            if t.is_alive():
                t.join(60)


def test_full_queue_is_503_with_retry_after(server):
    body = {"prompt": "abc", "max_tokens": 8}
    with _queue_full(server, body) as results:
        full = server.post("/v1/completions", body)
        assert full.status_code == 503 and full.headers["Retry-After"] == "1"
        assert full.json()["error"]["code"] == 503 and "queue is full" in full.json()["error"]["message"]
        with pytest.raises(openai.InternalServerError) as info:
            server.client().completions.create(model=str(server.proc.args[4]), prompt="abc", max_tokens=4)
        assert info.value.status_code == 503
    assert [r.status_code for r in results] == [200, 200]
    assert server.wait_idle()["num_free_blocks"] == server.state()["num_blocks"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("logprobs", 21),  # over --max-logprobs (20), within the vocabulary
        ("logprobs", 1000),  # over the vocabulary
        ("logit_bias", {"99999": 1}),
        ("stop_token_ids", [99999]),
        ("allowed_token_ids", [99999]),
    ],
)
def test_a_request_that_can_never_run_is_a_400_on_a_full_queue_too(server, field, value):
    """A field the engine refuses against the model (a token id past the vocabulary, logprobs
    over max_logprobs) is the client's error however busy the server is: a 400 naming it, as
    on an idle server. It was the full queue's 503, which clients retry (the openai client
    twice) and which never named the field (the server soak's malformed requests under a
    small --max-waiting-requests)."""
    with _queue_full(server, {"prompt": "abc", "max_tokens": 8}):
        bad = server.post("/v1/completions", {"prompt": "abc", "max_tokens": 4, field: value})
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["param"] == field
    assert server.wait_idle()["num_free_blocks"] == server.state()["num_blocks"]


def test_sigterm_with_a_request_in_flight_exits_0(server):
    body = {"prompt": "abc", "max_tokens": 200, "ignore_eos": True, "stream": True}
    seen = []

    def stream():
        try:
            with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=60) as resp:
                for line in resp.iter_lines():
                    seen.append(line)
        except httpx.HTTPError as exc:  # cut off by the shutdown
            seen.append(repr(exc))

    reader = threading.Thread(target=stream)
    reader.start()
    _wait_for(lambda: any(line.startswith("data:") for line in seen))
    engine_pid = server.state()["engine_pid"]
    assert engine_pid != server.proc.pid and _alive(engine_pid)  # the engine has its own process
    httpx.post(server.url("/dev/pause"))  # the request cannot finish: shutdown must abort it
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0
    assert not _alive(engine_pid)  # reaped: no orphan
    reader.join(60)
    assert not reader.is_alive()
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.url("/health"), timeout=2)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_requests_that_outlive_the_shutdown_grace_end_with_a_503(model_dir, tmp_path, sig):
    """Ctrl-C (or SIGTERM) with requests still running when --shutdown-timeout runs out: each
    ends with vLLM's error shape, a JSON 503 saying the server is shutting down, or in a stream
    an error frame then [DONE], and the log has no traceback. uvicorn cancelled them instead:
    a plain-text "Internal Server Error", a stream cut mid-body (an incomplete chunked read),
    and an "Exception in ASGI application" traceback per request in the log."""
    log = tmp_path / "server.log"
    with open(log, "w") as err:
        srv = RemoteServer(model_dir, ARGS + ["--shutdown-timeout", "1"], stderr=err)
    try:
        httpx.post(srv.url("/dev/pause"))  # neither request can finish: the grace runs out
        answers = {}

        def plain():
            answers["plain"] = srv.post("/v1/completions", {"prompt": "abc", "max_tokens": 4})

        def stream():
            body = {"prompt": "abd", "max_tokens": 4, "stream": True}
            with httpx.stream("POST", srv.url("/v1/completions"), json=body, timeout=60) as resp:
                answers["stream"] = [line for line in resp.iter_lines() if line]

        threads = [threading.Thread(target=plain), threading.Thread(target=stream)]
        for t in threads:
            t.start()
        _wait_for(lambda: srv.state()["num_pending"] == 2)
        srv.proc.send_signal(sig)
        assert srv.proc.wait(60) == 0
        for t in threads:
            t.join(60)
    finally:
        srv.terminate()
    plain_answer = answers["plain"]
    assert plain_answer.status_code == 503, plain_answer.text
    error = plain_answer.json()["error"]
    assert error["code"] == 503 and error["type"] == "ServiceUnavailableError"
    assert "shutting down" in error["message"]
    *_, last_frame, done = answers["stream"]
    assert done == "data: [DONE]" and '"code":503' in last_frame and "shutting down" in last_frame
    text = log.read_text()
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text


def test_engine_process_death_fails_requests_and_ends_the_server(model_dir):
    srv = RemoteServer(model_dir, ARGS)
    try:
        engine_pid = srv.state()["engine_pid"]
        body = {"prompt": "abc", "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url("/v1/completions"), json=body, timeout=60) as resp:
            lines = resp.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            httpx.post(srv.url("/dev/pause"))  # the stream cannot end before the engine dies
            os.kill(engine_pid, signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data:")]
        assert rest[-1] == "data: [DONE]" and '"code":500' in rest[-2] and "engine process died" in rest[-2]
        try:  # the server is going down: /health refuses, or the port is already closed
            assert httpx.get(srv.url("/health"), timeout=2).status_code != 200
        except httpx.HTTPError:
            pass
        assert srv.proc.wait(60) == 1
        assert not _alive(engine_pid)
    finally:
        srv.terminate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_ends_the_server_without_re_raising_it(sig):
    """`enginespec serve`'s uvicorn server (api_server._server_class) stopped by SIGTERM or by
    Ctrl-C's SIGINT returns from run() after its graceful shutdown, so run_server returns 0, as
    vLLM's server exits; uvicorn re-raised SIGINT once stopped, so Ctrl-C ended the server with a
    KeyboardInterrupt traceback and death by the signal. In this process, over an app of nothing
    but a lifespan whose startup raises the signal: the server's handler takes it."""
    import uvicorn

    from enginespec.entrypoints.openai.api_server import _server_class

    async def app(scope, receive, send):
        assert scope["type"] == "lifespan"
        while (await receive())["type"] == "lifespan.startup":
            signal.raise_signal(sig)  # the server's handle_exit runs here, in the main thread
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})

    server = _server_class()(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    try:
        server.run()
    except KeyboardInterrupt:
        pytest.fail(f"the server re-raised {sig.name} after its shutdown")
    assert server.should_exit


# An impl whose module takes its time to import in the engine process (the only process that
# loads the impl): it writes that process's pid to LOADING, then sleeps as a large checkpoint's
# load would, so that a signal reliably lands while the engine is still starting.
SLOW_IMPL = """
import os, time
from pathlib import Path
Path(os.environ["LOADING"]).write_text(str(os.getpid()))
time.sleep(120)
from enginespec.spec import load_impl
IMPL = load_impl("reference")
"""


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie (exited, waiting for a parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _serve_slowly(model_dir, tmp_path, args: list[str], **popen) -> subprocess.Popen:
    """`enginespec serve` over SLOW_IMPL (its engine process writes tmp_path / "loading")."""
    (tmp_path / "slow_impl.py").write_text(SLOW_IMPL)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, LOADING=str(tmp_path / "loading"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "enginespec.entrypoints.cli", "serve", str(model_dir), "--device", "cpu"]
    return subprocess.Popen(cmd + ["--impl", "slow_impl:IMPL", *args], env=env, **popen)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_the_engine_starts_leaves_no_engine_behind(model_dir, tmp_path, sig):
    """SIGTERM or Ctrl-C while the engine process is still loading the model stops the server
    with status 0 and takes the engine process down with it. SIGTERM killed the server at once
    and left the engine loading on (holding its memory) as an orphan; SIGINT, which the engine
    ignores, left the server hung at exit, joining an engine that never ended."""
    loading = tmp_path / "loading"
    proc = _serve_slowly(model_dir, tmp_path, ["--port", "0"])
    engine_pid = None
    try:
        _wait_for(loading.exists, timeout=60)
        _wait_for(lambda: loading.read_text() != "")
        engine_pid = int(loading.read_text())
        proc.send_signal(sig)
        assert proc.wait(30) == 0
        assert _gone(engine_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if engine_pid is not None and not _gone(engine_pid):
            os.kill(engine_pid, signal.SIGKILL)


# The reference impl with every schedule() 50 ms longer: a request of 40 tokens runs for 2 s at
# least, so a signal sent at its first token lands while it runs.
SLOW_STEPS_IMPL = """
import time
from enginespec.spec import load_impl


class SlowSteps:
    name = "slow_steps"

    def __init__(self, base):
        self._base = base

    def __getattr__(self, attr):
        return getattr(self._base, attr)

    def new_scheduler(self, config, block_manager):
        scheduler = self._base.new_scheduler(config, block_manager)
        schedule = scheduler.schedule

        def slow_schedule():
            time.sleep(0.05)
            return schedule()

        scheduler.schedule = slow_schedule
        return scheduler


IMPL = SlowSteps(load_impl("reference"))
"""


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_a_sigterm_to_the_whole_process_group_drains_like_one_to_the_server(model_dir, tmp_path, tp):
    """`kill -TERM -- -PGID` (as systemd's control-group kill, and `docker stop` of a container
    whose process group the server leads, reach every process) with a request running: the
    request finishes and the server exits 0, as after a SIGTERM to the server alone. The engine
    process (and each tensor-parallel worker) exited on its own SIGTERM at once, so the request
    got a 500 "the engine process died (exit code 0)" (with -tp 2, a dead worker's) and the
    server exited 1."""
    (tmp_path / "slow_steps.py").write_text(SLOW_STEPS_IMPL)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    args = ["--impl", "slow_steps:IMPL", "--tensor-parallel-size", str(tp), "--dtype", "float32"]
    with open(tmp_path / "server.log", "w") as err:
        srv = RemoteServer(
            model_dir, [*ARGS, *args, "--shutdown-timeout", "60"], stderr=err, start_new_session=True,
            env=dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false"),
        )  # fmt: skip
    try:
        engine_pid = srv.state()["engine_pid"]
        body = {"prompt": "abc", "max_tokens": 40, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url("/v1/completions"), json=body, timeout=60) as resp:
            lines = resp.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            os.killpg(srv.proc.pid, signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data:")]
        assert srv.proc.wait(60) == 0, (tmp_path / "server.log").read_text()
    finally:
        if srv.proc.poll() is None:
            os.killpg(srv.proc.pid, signal.SIGKILL)
            srv.proc.wait()
    assert rest[-1] == "data: [DONE]", rest[-2:]
    assert '"finish_reason":"length"' in rest[-2], rest[-2]
    _wait_for(lambda: _gone(engine_pid), timeout=10)


def test_a_port_in_use_fails_before_the_engine_loads(model_dir, tmp_path):
    """`serve --port P` with P taken by another listener is the CLI's one-line usage error
    naming the address (exit 2) before any engine process starts, as vLLM binds its socket
    before it builds the engine. It was uvicorn's bind error (exit 3) after the whole model
    load: minutes, for a large checkpoint, to learn of a typo in --port."""
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _serve_slowly(
            model_dir, tmp_path, ["--host", HOST, "--port", str(port)], stderr=subprocess.PIPE
        )
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:  # the engine process holds stderr open too: it goes first
                if (tmp_path / "loading").exists():
                    os.kill(int((tmp_path / "loading").read_text()), signal.SIGKILL)
                proc.kill()
                proc.communicate()
    assert proc.returncode == 2
    assert f"{HOST}:{port}" in err.decode() and "in use" in err.decode()
    assert not (tmp_path / "loading").exists()  # no engine process was started


def test_serve_says_where_it_listens_at_the_default_log_level(model_dir):
    """With uvicorn at its default level here (warning: it says nothing), `serve` still writes
    one stderr line once the engine is up naming its address, and for --port 0 the port the
    kernel chose: a user could not otherwise learn it. The line's URL answers /health."""
    cmd = [sys.executable, "-m", "enginespec.entrypoints.cli", "serve", str(model_dir)]
    cmd += ["--host", HOST, "--port", "0", "--device", "cpu"]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        _wait_for(lambda: any("enginespec serve:" in line for line in lines), timeout=120)
        line = next(line for line in lines if "enginespec serve:" in line)
        url = line.split(" on ", 1)[1].split()[0]
        assert url.startswith(f"http://{HOST}:") and not url.endswith(":0"), line
        assert httpx.get(f"{url}/health", timeout=5.0).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0


def test_serve_listens_before_it_says_where(model_dir, monkeypatch):
    """The line naming the address is a promise that a client may connect now: the socket is
    listening when it is written (it was bound only, uvicorn's startup called listen() after,
    so a client that connected on reading it, as the test above does, was refused under load).
    In process: the line's socket is read for SO_ACCEPTCONN, and the server never runs."""
    from enginespec.entrypoints import cli
    from enginespec.entrypoints.openai import api_server

    seen, written = [], api_server.serving_line

    def line(sock, model, **kwargs):
        seen.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        return written(sock, model, **kwargs)

    class NotServing:
        def __init__(self, config):
            self.config = config

        def run(self, sockets):
            seen.append(sockets[0].getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))

    monkeypatch.setattr(api_server, "serving_line", line)
    monkeypatch.setattr(api_server, "_server_class", lambda: NotServing)
    argv = ["serve", str(model_dir), "--host", HOST, "--port", "0", "--device", "cpu", "--engine-in-process"]
    assert cli.main(argv) == 0
    assert seen == [1, 1]
