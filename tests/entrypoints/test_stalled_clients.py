"""Clients that stop reading a response and hold their socket open, against a real `enginespec
serve` (its log in a file) and a raw socket client with a small receive buffer, so that the
server's writes fill the client's TCP window within a few hundred tokens.

Such a client used to keep its engine request running to max_tokens (its KV blocks and its
admission slot held all along, counted as a "length" finish), its handler stuck in a write
until TCP gave up (never, for a peer that keeps acknowledging a zero window), and at shutdown
uvicorn cancelled that handler with a traceback. --send-timeout drops such a connection (and
aborts its request); the shutdown resets what is left once its grace is over."""

from __future__ import annotations

import json
import signal
import socket
import time

import httpx
import pytest

from enginespec.testing.checkpoints import make_checkpoint
from tests.entrypoints.remote_server import CHAT_TEMPLATE, HOST, RemoteServer

# n=16 samples of 1000 tokens with 20 logprobs a token: ~12 KB of frames a step, so that the
# server's socket buffer (Linux caps it at 4 MB by default, tcp_wmem) fills within a few hundred
# steps and its writes block; the request runs far longer than that
N, MAX_TOKENS = 16, 1000
ARGS = ["--enable-dev-endpoints", "--chat-template", CHAT_TEMPLATE, "--num-blocks", "1100"]
ARGS += ["--max-num-seqs", str(N), "--max-waiting-requests", "0"]  # capacity: one such request
BODIES = {
    "/v1/completions": {"prompt": "hello", "logprobs": 20},
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "hello"}],
        "logprobs": True,
        "top_logprobs": 20,
    },
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny qwen3 with room for MAX_TOKENS (its own holds 256 positions)."""
    return make_checkpoint(
        "qwen3", tmp_path_factory.mktemp("stalled") / "qwen3", max_position_embeddings=4096
    )


def _stalled_stream(srv: RemoteServer, path: str, num_tokens: int) -> socket.socket:
    """A streaming request sent on a socket whose owner reads nothing, returned open once the
    engine has generated num_tokens (or aborted a request: the send timeout may come first)."""
    before, aborted = srv.state()["num_generated_tokens"], _aborted(srv)
    body = {**BODIES[path], "n": N, "temperature": 1.0, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    body = json.dumps({**body, "stream": True})
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    sock.connect((HOST, srv.port))
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
    sock.sendall(f"{head}\r\n\r\n{body}".encode())
    _wait_for(
        lambda: srv.state()["num_generated_tokens"] - before >= num_tokens or _aborted(srv) > aborted, 120
    )
    return sock


def _wait_for(predicate, timeout: float = 60.0) -> None:
    """A deadline, not a speed: the condition is expected long before it."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def _aborted(srv: RemoteServer) -> float:
    """Samples counted under vllm:request_success_total{finished_reason="abort"}."""
    metrics = srv.metrics().items()
    return sum(v for k, v in metrics if k.startswith("vllm:request_success_total") and '"abort"' in k)


def _quiet(log) -> None:
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]


@pytest.fixture(scope="module")
def cutting_server(model_dir, tmp_path_factory):
    """One server with --send-timeout 1 (its log in a file) for both paths' cut-off test: each
    leaves it idle with its slot free, as it must. Its exit status (0) and its log (no
    traceback) are checked once both have run."""
    log = tmp_path_factory.mktemp("cutting") / "server.log"
    with open(log, "w") as err:
        srv = RemoteServer(model_dir, [*ARGS, "--send-timeout", "1"], stderr=err)
    try:
        yield srv, log
    finally:
        assert srv.terminate() == 0
    _quiet(log)


@pytest.mark.parametrize("path", list(BODIES), ids=["completions", "chat"])
def test_a_client_that_stops_reading_is_cut_off_and_its_request_aborted(cutting_server, path):
    """The engine is paused once the window is full, so the request cannot finish on its own:
    it must end by the send timeout (1 s), aborted in the engine (every block free, counted
    under "abort"), its admission slot back (the capacity is one request), with no traceback.
    Before --send-timeout it ran on while the client held the socket (here: forever)."""
    srv, log = cutting_server
    aborted = _aborted(srv)
    sock = _stalled_stream(srv, path, 300)  # more than the client's 4 KB window takes
    try:
        httpx.post(srv.url("/dev/pause"))
        _wait_for(lambda: srv.state()["num_pending"] == 0)
        state = srv.wait_idle()
        assert state["num_unfinished"] == 0 and state["num_free_blocks"] == state["num_blocks"]
        assert _aborted(srv) - aborted == N  # samples
        httpx.post(srv.url("/dev/resume"))
        probe = srv.post(path, {**BODIES[path], "max_tokens": 3})  # the slot is free again
        assert probe.status_code == 200, probe.text
    finally:
        httpx.post(srv.url("/dev/resume"))
        sock.close()
    _quiet(log)


def test_a_client_that_stops_reading_does_not_stall_the_shutdown(model_dir, tmp_path):
    """SIGTERM with a stalled stream connected (--send-timeout 0: none, as a timeout longer than
    the grace): the server exits 0 with no traceback. Its handler, stuck writing to the full window,
    never took the shutdown's 503; uvicorn cancelled it SHED_WAIT_S after the grace, logging
    "Exception in ASGI application" and a CancelledError traceback."""
    log = tmp_path / "server.log"
    with open(log, "w") as err:
        srv = RemoteServer(model_dir, [*ARGS, "--shutdown-timeout", "1", "--send-timeout", "0"], stderr=err)
    try:
        sock = _stalled_stream(srv, "/v1/completions", 8000)  # ~6 MB of frames: the writes block
        assert srv.state()["num_pending"] == N  # samples
        httpx.post(srv.url("/dev/pause"))  # the request is still running at the grace's end
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(60) == 0
        sock.close()
    finally:
        srv.terminate()
    _quiet(log)
