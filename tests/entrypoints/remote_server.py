"""A real `enginespec serve` subprocess on a free 127.0.0.1 port (vLLM's RemoteOpenAIServer
pattern): start it, poll /health, hand out official `openai` clients with max_retries=0, and
stop it with SIGTERM (returning the exit status)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

HOST = "127.0.0.1"
# The chat template tests use: the tiny tokenizer has none of its own.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }};{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class RemoteServer:
    """`python -m enginespec.entrypoints.cli serve MODEL ARGS` until terminate(); `popen`
    goes to subprocess.Popen (a stderr file to read the server's log, a session of its own).
    `ca_file`: the server serves HTTPS (its args give --ssl-certfile), verified against this file."""

    def __init__(
        self,
        model_dir: Path,
        args: list[str],
        *,
        api_key: str | None = None,
        timeout: float = 240.0,
        ca_file: str | None = None,
        **popen,
    ):
        self.port = free_port()
        self.api_key = api_key
        self.scheme, self.verify = (
            ("https", ssl.create_default_context(cafile=ca_file)) if ca_file else ("http", True)
        )
        cmd = [sys.executable, "-m", "enginespec.entrypoints.cli", "serve", str(model_dir)]
        cmd += ["--host", HOST, "--port", str(self.port), "--device", "cpu", *args]
        if api_key is not None:
            cmd += ["--api-key", api_key]
        popen.setdefault("env", dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1"))
        self.proc = subprocess.Popen(cmd, **popen)  # popen: stderr=, start_new_session=, env=
        self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode} before it was healthy")
            try:
                if httpx.get(self.url("/health"), timeout=1.0, verify=self.verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.terminate()
        raise RuntimeError(f"the server was not healthy within {timeout} s")

    def url(self, path: str) -> str:
        return f"{self.scheme}://{HOST}:{self.port}{path}"

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kwargs):
        import openai

        return openai.OpenAI(
            base_url=self.url("/v1"), api_key=self.api_key or "none", max_retries=0, **kwargs
        )

    def async_client(self, **kwargs):
        import openai

        return openai.AsyncOpenAI(
            base_url=self.url("/v1"), api_key=self.api_key or "none", max_retries=0, **kwargs
        )

    def post(self, path: str, body: dict, **kwargs) -> httpx.Response:
        return httpx.post(self.url(path), json=body, headers=self.headers, timeout=60.0, **kwargs)

    def state(self) -> dict:
        return httpx.get(self.url("/dev/state"), timeout=10.0).json()

    def metrics(self) -> dict[str, float]:
        """The unlabelled-by-reason samples of /metrics: name -> value."""
        out = {}
        for line in httpx.get(self.url("/metrics"), timeout=10.0).text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name.split("{", 1)[0] if "finished_reason" not in name else name] = float(value)
        return out

    def wait_idle(self, timeout: float = 30.0) -> dict:
        """Poll /dev/state until no request is unfinished; returns the state."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if state["num_unfinished"] == 0 and state["num_pending"] == 0 or time.monotonic() > deadline:
                return state
            time.sleep(0.05)

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
