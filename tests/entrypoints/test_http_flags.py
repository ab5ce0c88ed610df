"""vLLM's HTTP-layer serve flags: --root-path (a path-routing proxy's prefix; the API key
guards the prefixed paths too), --disable-fastapi-docs, TLS (--ssl-keyfile, --ssl-certfile,
--ssl-ca-certs, --ssl-cert-reqs: checked before the engine loads, then uvicorn's), and the
access log (--disable-uvicorn-access-log: off, this server's default; its --no- form: on). Each
was argparse's "unrecognized arguments" (exit 2) before. The app-level checks run the ASGI app
alone; one real server serves HTTPS under a root path."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import logging
import os
import socket
import ssl
import subprocess

import httpx
import openai
import pytest

from enginespec.entrypoints import cli
from enginespec.entrypoints.openai import api_server
from enginespec.entrypoints.openai.api_server import build_app, fastapi_options, tls_options
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.serving import ServerContext
from enginespec.testing.checkpoints import tiny_model_dir
from tests.entrypoints.remote_server import HOST, RemoteServer


def _serve_args(*flags: str):
    return cli._parser().parse_args(["serve", "m", *flags])


def _get(app_options: dict, path: str, key: str | None = "k") -> httpx.Response:
    """GET path from the ASGI app (API key "k"), with `key` as the bearer token (None: none)."""
    app = build_app(
        ServerContext(None, None, ["m"], 16), ServerMetrics("m"), api_key="k", app_options=app_options
    )
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get(path, headers=headers)

    return asyncio.run(run())


def _self_signed(tmp_path, name: str = "server") -> tuple[str, str]:
    """(key file, certificate file) of a self-signed certificate for 127.0.0.1, which is its own
    CA (a client verifies the server against the certificate file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_file, cert_file = tmp_path / f"{name}.key", tmp_path / f"{name}.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_file), str(cert_file)


def test_the_http_flags_parse_as_vllms():
    ns = _serve_args(
        "--disable-uvicorn-access-log",
        "--root-path",
        "/llm",
        "--ssl-keyfile",
        "k.pem",
        "--ssl-certfile",
        "c.pem",
        "--ssl-ca-certs",
        "ca.pem",
        "--ssl-cert-reqs",
        "2",
        "--disable-fastapi-docs",
    )
    assert (ns.disable_uvicorn_access_log, ns.root_path, ns.disable_fastapi_docs) == (True, "/llm", True)
    assert (ns.ssl_keyfile, ns.ssl_certfile, ns.ssl_ca_certs, ns.ssl_cert_reqs) == (
        "k.pem",
        "c.pem",
        "ca.pem",
        2,
    )
    assert _serve_args("--no-disable-uvicorn-access-log").disable_uvicorn_access_log is False
    assert _serve_args().disable_uvicorn_access_log is None


def test_a_root_path_serves_both_paths_and_the_key_guards_both():
    options = fastapi_options(_serve_args("--root-path", "/llm/"))
    assert options == {"root_path": "/llm"}
    for path in ("/llm/v1/models", "/v1/models"):
        assert _get(options, path).json()["data"][0]["id"] == "m"
        assert _get(options, path, key=None).status_code == 401, path  # no way around the key
        assert _get(options, path, key="wrong").status_code == 401, path
    assert _get(options, "/llm/openapi.json").json()["servers"] == [{"url": "/llm"}]
    with pytest.raises(ValueError, match="--root-path must start with '/'"):
        fastapi_options(_serve_args("--root-path", "llm"))


def test_a_root_path_that_begins_v1_strips_only_as_a_whole_segment():
    """--root-path /v: /v1/models is not under it (the prefix is a path segment, as starlette
    routes), so the route is /v1/models as sent, and the key guards it. Stripped as a string,
    the guard read "1/models" and served the models without a key."""
    options = fastapi_options(_serve_args("--root-path", "/v"))
    assert _get(options, "/v1/models").json()["data"][0]["id"] == "m"
    assert _get(options, "/v1/models", key=None).status_code == 401
    assert _get(options, "/v/v1/models", key=None).status_code == 401
    assert _get(options, "/v/v1/models").json()["data"][0]["id"] == "m"
    for path in ("/version", "/v/version"):  # only /v1/* needs the key, as vLLM's
        assert _get(options, path, key=None).status_code == 200, path


def test_the_docs_routes_go_with_disable_fastapi_docs():
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert _get(fastapi_options(_serve_args()), path).status_code == 200, path
        gone = _get(fastapi_options(_serve_args("--disable-fastapi-docs")), path)
        assert gone.status_code == 404 and "error" in gone.json(), path
    assert _get(fastapi_options(_serve_args("--disable-fastapi-docs")), "/version").status_code == 200


def test_tls_flags_are_checked_before_the_engine_loads(tmp_path):
    key, cert = _self_signed(tmp_path)
    other_key, _ = _self_signed(tmp_path, "other")
    assert tls_options(_serve_args()) == {}
    assert tls_options(_serve_args("--ssl-keyfile", key, "--ssl-certfile", cert)) == dict(
        ssl_keyfile=key,
        ssl_certfile=cert,
        ssl_ca_certs=None,
        ssl_cert_reqs=int(ssl.CERT_NONE),
        ssl_ciphers="TLSv1",
    )
    chosen = tls_options(
        _serve_args("--ssl-keyfile", key, "--ssl-certfile", cert, "--ssl-ciphers", "ECDHE+AESGCM")
    )
    assert chosen["ssl_ciphers"] == "ECDHE+AESGCM"
    required = tls_options(
        _serve_args(
            "--ssl-keyfile", key, "--ssl-certfile", cert, "--ssl-ca-certs", cert, "--ssl-cert-reqs", "2"
        )
    )
    assert required["ssl_cert_reqs"] == ssl.CERT_REQUIRED and required["ssl_ca_certs"] == cert
    refused = {
        "--ssl-keyfile needs --ssl-certfile": ["--ssl-keyfile", key],
        "--ssl-ca-certs, --ssl-cert-reqs and --ssl-ciphers need TLS": ["--ssl-ca-certs", cert],
        "--ssl-ciphers need TLS": ["--ssl-ciphers", "ECDHE+AESGCM"],
        "--ssl-ciphers: OpenSSL knows no cipher in 'NO-SUCH-CIPHER'": [
            *("--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-ciphers", "NO-SUCH-CIPHER")
        ],
        r"--ssl-cert-reqs must be one of": [
            "--ssl-certfile",
            cert,
            "--ssl-keyfile",
            key,
            "--ssl-cert-reqs",
            "3",
        ],
        r"--ssl-cert-reqs 2 \(required\) needs --ssl-ca-certs": [
            *("--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-cert-reqs", "2")
        ],
        "cannot build the TLS context": ["--ssl-certfile", cert, "--ssl-keyfile", other_key],
        "cannot build the TLS context: .*No such file": ["--ssl-certfile", str(tmp_path / "missing.pem")],
        r"cannot build the TLS context: \[Errno 2\]": [  # a CA file that is not there
            *("--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-cert-reqs", "2"),
            *("--ssl-ca-certs", str(tmp_path / "missing-ca.pem")),
        ],
    }
    for message, flags in refused.items():
        with pytest.raises(ValueError, match=message):
            tls_options(_serve_args(*flags))


@pytest.mark.parametrize(
    "flags", [[], ["--no-disable-uvicorn-access-log", "--ssl-certfile", "C", "--ssl-keyfile", "K"]]
)
def test_uvicorn_gets_the_tls_files_and_the_access_log_switch(tmp_path, monkeypatch, flags):
    """In process: the uvicorn Config run_server builds (the server never runs)."""
    key, cert = _self_signed(tmp_path)
    flags = [{"C": cert, "K": key}.get(f, f) for f in flags]
    config = _serve_in_process(flags, monkeypatch)
    assert config.access_log is bool(flags)
    assert (config.ssl_certfile, config.ssl_keyfile) == ((cert, key) if flags else (None, None))


def test_a_server_serves_https_under_its_root_path(tmp_path):
    key, cert = _self_signed(tmp_path)
    args = ["--ssl-keyfile", key, "--ssl-certfile", cert, "--root-path", "/llm", "--disable-fastapi-docs"]
    args += ["--no-disable-uvicorn-access-log", "--uvicorn-log-level", "info", "--served-model-name", "tiny"]
    (tmp_path / "user_layers.py").write_text(_LAYERS)
    (tmp_path / "log.json").write_text(json.dumps(_log_config({"class": "logging.StreamHandler"})))
    args += ["--middleware", "user_layers.Mark", "--log-config-file", str(tmp_path / "log.json")]
    args += ["--h11-max-incomplete-event-size", "8192", "--h11-max-header-count", "32"]
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", PYTHONPATH=path)
    with open(tmp_path / "log", "w+") as out:  # uvicorn's access log goes to stdout, ours to stderr
        srv = RemoteServer(
            tiny_model_dir("qwen3"), args, ca_file=cert, stdout=out, stderr=subprocess.STDOUT, env=env
        )
        try:
            with httpx.Client(verify=srv.verify) as http:
                client = openai.OpenAI(
                    base_url=srv.url("/llm/v1"), api_key="none", max_retries=0, http_client=http
                )
                assert [m.id for m in client.models.list()] == ["tiny"]
                assert http.get(srv.url("/v1/models")).json()["data"][0]["id"] == "tiny"
                assert http.get(srv.url("/llm/docs")).status_code == 404
                assert http.get(srv.url("/version")).headers["x-layer"] == "class"  # --middleware's
                many = {f"x-h{i}": "v" for i in range(40)}
                assert http.get(srv.url("/version"), headers=many).status_code == 431
            with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port is no answer
                httpx.get(f"http://{HOST}:{srv.port}/v1/models", timeout=5.0)
        finally:
            assert srv.terminate() == 0
        out.seek(0)
        log = out.read()
    assert f"enginespec serve: tiny on https://{HOST}:{srv.port}" in log
    assert '"GET /llm/v1/models HTTP/1.1" 200' in log  # the access log, asked for by its --no- form
    assert 'custom-access 127.0.0.1:' in log  # formatted as --log-config-file says


def test_the_send_timeout_is_tcp_user_timeout_in_milliseconds_on_the_accepted_sockets():
    """--send-timeout S sets TCP_USER_TIMEOUT (milliseconds, at least 1) on the listening
    socket, which the connections it accepts inherit; 0 sets nothing (TCP's own: no timeout).
    A 0 taken as a timeout would cut every client whose data waits a millisecond."""
    option = socket.TCP_USER_TIMEOUT  # Linux's, where the server runs
    for seconds, millis in ((0, 0), (0.0001, 1), (1.5, 1500), (60, 60000)):
        listener = api_server.bind_socket(HOST, 0, seconds)
        try:
            assert listener.getsockopt(socket.IPPROTO_TCP, option) == millis, seconds
            listener.listen(1)
            with socket.create_connection(listener.getsockname()):
                accepted, _ = listener.accept()
                with accepted:
                    assert accepted.getsockopt(socket.IPPROTO_TCP, option) == millis, seconds
        finally:
            listener.close()
    with socket.socket() as sock:
        assert api_server.set_send_timeout(sock, 0) is False
        assert api_server.set_send_timeout(sock, 2) is True


def test_the_serving_lines_scheme_is_its_urls_whatever_the_model_name_says():
    """Under TLS the serving line's URL says https://; a served model name that itself holds
    " on http://" stays as given (the URL was made https by replacing the line's first such
    words: "x on https://y on http://HOST:PORT")."""
    import socket

    from enginespec.entrypoints.openai.api_server import serving_line

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        plain = serving_line(sock, "x on http://y")
        assert plain.startswith(f"enginespec serve: x on http://y on http://127.0.0.1:{port} ")
        assert serving_line(sock, "x on http://y", tls=True) == plain.replace(
            f"on http://127.0.0.1:{port}", f"on https://127.0.0.1:{port}"
        )


def _access_record(path: str) -> logging.LogRecord:
    """A record as uvicorn's access logger makes it: client, method, path with query, HTTP
    version, status."""
    args = ("127.0.0.1:5000", "GET", path, "1.1", 200)
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', args, None
    )


def test_the_access_log_leaves_out_the_named_endpoints():
    """--disable-access-log-for-endpoints (vLLM's): a request to a named path leaves no access
    line, its query ignored, under a root path with or without the prefix; others stay."""
    ns = _serve_args("--disable-access-log-for-endpoints", " /health, /metrics ,")
    assert ns.disable_access_log_for_endpoints == " /health, /metrics ,"
    assert _serve_args().disable_access_log_for_endpoints is None
    quiet = api_server.QuietEndpoints(ns.disable_access_log_for_endpoints, "/llm/")
    kept = {
        p: quiet.filter(_access_record(p))
        for p in ("/health", "/metrics?x=1", "/llm/health", "/v1/models", "/healthz", "/")
    }
    assert kept == {
        "/health": False,
        "/metrics?x=1": False,
        "/llm/health": False,
        "/v1/models": True,
        "/healthz": True,
        "/": True,
    }
    other = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "no args", None, None)
    assert quiet.filter(other)  # a record of another shape is never dropped


def test_the_server_puts_the_endpoint_filter_on_uvicorns_access_logger(tmp_path, monkeypatch):
    """In process: run_server's Config gets the access log on and uvicorn.access the filter, once
    however many servers a process starts; without the flag no filter is left behind."""
    access = logging.getLogger("uvicorn.access")
    flags = ["--no-disable-uvicorn-access-log", "--disable-access-log-for-endpoints", "/health,/ping"]
    for _ in range(2):
        _serve_in_process(flags, monkeypatch)
        quiet = [f for f in access.filters if isinstance(f, api_server.QuietEndpoints)]
        assert len(quiet) == 1 and quiet[0].paths == {"/health", "/ping"}
        assert not quiet[0].filter(_access_record("/ping")) and quiet[0].filter(_access_record("/v1/models"))
    _serve_in_process([], monkeypatch)
    assert not [f for f in access.filters if isinstance(f, api_server.QuietEndpoints)]


# A module of the user's middleware, for --middleware: a class (an ASGI middleware) and an async
# function (an @app.middleware("http") one), each marking the responses it passes.
_LAYERS = """
class Mark:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def marked(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"x-layer", b"class")]}
            await send(message)

        await self.app(scope, receive, marked)


async def stamp(request, call_next):
    response = await call_next(request)
    response.headers["x-stamp"] = "function"
    return response


NOT_A_LAYER = 3
"""


def _serve_in_process(flags: list[str], monkeypatch):
    """The uvicorn Config run_server builds for `flags` (in process; the server never runs)."""
    configs = []

    class NotServing:
        def __init__(self, config):
            configs.append(config)

        def run(self, sockets):
            pass

    monkeypatch.setattr(api_server, "_server_class", lambda: NotServing)
    argv = ["serve", str(tiny_model_dir("qwen3")), "--host", HOST, "--port", "0", "--device", "cpu"]
    assert cli.main([*argv, "--engine-in-process", *flags]) == 0
    return configs[0]


def _refused_before_the_model_loads(flags: list[str], capsys) -> str:
    """serve's one-line error for `flags` over a model that is not there: the flag is checked
    first, or the error would be the missing model's."""
    assert cli.main(["serve", "/no/such/model", "--device", "cpu", *flags]) == 2
    return capsys.readouterr().err


def test_the_server_extension_flags_parse_as_vllms(capsys):
    """--h11-max-incomplete-event-size, --h11-max-header-count, --middleware (repeatable; one
    flag may also name several), --log-config-file: argparse's "unrecognized arguments" before."""
    ns = _serve_args(
        *("--h11-max-incomplete-event-size", "65536", "--h11-max-header-count", "64"),
        *("--middleware", "a.B", "--middleware", "c.d", "e.F", "--log-config-file", "log.json"),
    )
    assert (ns.h11_max_incomplete_event_size, ns.h11_max_header_count) == (65536, 64)
    assert (ns.middleware, ns.log_config_file) == (["a.B", "c.d", "e.F"], "log.json")
    ns = _serve_args()
    assert (ns.h11_max_incomplete_event_size, ns.h11_max_header_count) == (None, None)
    assert (ns.middleware, ns.log_config_file) == ([], None)
    for flag in ("--h11-max-incomplete-event-size", "--h11-max-header-count"):
        for bad in ("0", "-1", "4k", "x"):
            with pytest.raises(SystemExit) as exit_:
                _serve_args(flag, bad)
            assert exit_.value.code == 2
            assert f"argument {flag}: must be a whole number >= 1, got {bad!r}" in capsys.readouterr().err


def _h11_answer(config, *reads: bytes) -> bytes:
    """What uvicorn's h11 protocol, under `config`, writes back to a client whose request comes
    in `reads`, each one read of the socket."""
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.server import ServerState

    class Socket(asyncio.Transport):
        def __init__(self):
            super().__init__()
            self.sent, self.closed = bytearray(), False

        def get_extra_info(self, name, default=None):
            return {"sockname": (HOST, 8000), "peername": (HOST, 5000)}.get(name, default)

        def write(self, data) -> None:
            self.sent += data

        def is_closing(self) -> bool:
            return self.closed

        def close(self) -> None:
            self.closed = True

    async def run() -> bytes:
        state, sock = ServerState(), Socket()
        protocol = H11Protocol(config, state, {}, _loop=asyncio.get_running_loop())
        protocol.connection_made(sock)
        for data in reads:
            protocol.data_received(data)
        while state.tasks:
            await asyncio.sleep(0.001)
        return bytes(sock.sent)

    return asyncio.run(run())


def test_h11_holds_at_most_the_limit_of_an_unfinished_request_head(monkeypatch):
    """--h11-max-incomplete-event-size BYTES: uvicorn's h11 protocol answers 400 once it holds
    more than BYTES of a request head that is not yet complete (h11's rule: a head that comes in
    one read is not measured), and serves a head below it. Not given, vLLM's 4 MB: a 20 KB head
    that h11's own 16 KB refuses is served."""
    ok = b"GET /version HTTP/1.1\r\nhost: x\r\n\r\n"
    head = b"GET /version HTTP/1.1\r\nhost: x\r\nx-big: " + b"b" * 20000
    limited = _serve_in_process(["--h11-max-incomplete-event-size", "8192"], monkeypatch)
    assert _h11_answer(limited, ok).startswith(b"HTTP/1.1 200 OK")
    refused = _h11_answer(limited, head[:9000])
    assert refused.startswith(b"HTTP/1.1 400 Bad Request") and refused.endswith(
        b"Invalid HTTP request received."
    )
    served = _h11_answer(_serve_in_process([], monkeypatch), head[:9000], head[9000:], b"\r\n\r\n")
    assert served.startswith(b"HTTP/1.1 200 OK")


def test_uvicorn_gets_the_h11_limit_and_the_app_counts_headers(monkeypatch):
    """Not given: vLLM's defaults (4 MB of a request's head for h11, 256 header fields) and
    uvicorn's own choice of protocol; given, the size runs uvicorn's h11 protocol (the limit is
    h11's), and a request with more header fields than the count is a 431 before any route."""

    def get(app, num_headers: int) -> httpx.Response:
        headers = {f"x-h{i}": "v" for i in range(num_headers - 5)}  # httpx adds host, accept, ... (5)

        async def run():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return await client.get("/version", headers=headers)

        return asyncio.run(run())

    config = _serve_in_process([], monkeypatch)
    assert (config.h11_max_incomplete_event_size, config.http) == (4 * 1024 * 1024, "auto")
    assert get(config.app, 256).status_code == 200
    assert get(config.app, 257).status_code == 431
    flags = ["--h11-max-incomplete-event-size", "8192", "--h11-max-header-count", "8"]
    config = _serve_in_process(flags, monkeypatch)
    assert (config.h11_max_incomplete_event_size, config.http) == (8192, "h11")
    assert get(config.app, 8).json() == {"version": api_server.__version__}
    refused = get(config.app, 9)
    assert refused.status_code == 431
    assert refused.json()["error"]["message"] == (
        "the request has 9 header fields, more than the server takes (--h11-max-header-count 8)"
    )


def test_middleware_layers_wrap_the_app_in_the_order_given(tmp_path, monkeypatch, capsys):
    """--middleware MODULE.NAME (vLLM's): a class is added as an ASGI middleware, an async
    function as an @app.middleware("http") one, each outside those before it (its headers are
    added last); an import path that does not import, or names no such class or function, is
    a one-line error naming the flag and the path before the model loads."""
    (tmp_path / "user_layers.py").write_text(_LAYERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    flags = ["--middleware", "user_layers.Mark", "--middleware", "user_layers.stamp"]
    app = _serve_in_process(flags, monkeypatch).app

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/version")

    response = asyncio.run(run())
    assert (response.headers["x-layer"], response.headers["x-stamp"]) == ("class", "function")
    assert list(response.headers).index("x-layer") < list(response.headers).index("x-stamp")
    refused = {
        "nodots": "must be an import path, MODULE.NAME",
        "no_such_module_here.Layer": "cannot import no_such_module_here: ModuleNotFoundError",
        "user_layers.Missing": "user_layers has no Missing",
        "user_layers.NOT_A_LAYER": "must name an ASGI middleware class or an async function, got int",
    }
    for path, why in refused.items():
        err = _refused_before_the_model_loads(
            ["--middleware", "user_layers.Mark", "--middleware", path], capsys
        )
        assert f"enginespec serve: error: --middleware {path!r}: {why}" in err, err


def _log_config(handler: dict) -> dict:
    """A dictConfig that sends uvicorn's access lines to `handler`, formatted "custom-access ...",
    other loggers left as they are."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"custom": {"format": "custom-access %(message)s"}},
        "handlers": {"access": {**handler, "formatter": "custom"}},
        "loggers": {"uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False}},
    }


def test_the_log_config_file_configures_uvicorns_loggers(tmp_path, monkeypatch, capsys):
    """--log-config-file (vLLM's; default VLLM_LOGGING_CONFIG_PATH's): the JSON dictConfig goes
    to uvicorn as its log_config, in place of uvicorn's default, and its access lines follow it;
    a file that is missing, not JSON, not a JSON object, or that dictConfig refuses is a one-line
    error naming the flag (or the variable) before the model loads."""
    out = tmp_path / "access.log"
    path = tmp_path / "log.json"
    path.write_text(json.dumps(_log_config({"class": "logging.FileHandler", "filename": str(out)})))
    config = _serve_in_process(
        ["--log-config-file", str(path), "--no-disable-uvicorn-access-log"], monkeypatch
    )
    access = logging.getLogger("uvicorn.access")
    try:
        assert config.log_config == json.loads(path.read_text())
        access.handle(_access_record("/v1/models"))
        assert out.read_text() == 'custom-access 127.0.0.1:5000 - "GET /v1/models HTTP/1.1" 200\n'
    finally:  # the test's file handler off uvicorn's access logger
        for handler in access.handlers[:]:
            access.removeHandler(handler)
            handler.close()
    assert _serve_in_process([], monkeypatch).log_config == uvicorn_default_log_config()
    (tmp_path / "list.json").write_text("[]")
    (tmp_path / "bad.json").write_text("{version: 1")
    (tmp_path / "no_class.json").write_text(json.dumps(_log_config({"class": "no_such.Handler"})))
    refused = {
        "missing.json": "cannot read it",
        "list.json": "must be a JSON object (logging.config.dictConfig's schema), got an array",
        "bad.json": "is not JSON",
        "no_class.json": "logging.config.dictConfig refused it: Unable to configure handler 'access'",
    }
    for name, why in refused.items():
        err = _refused_before_the_model_loads(["--log-config-file", str(tmp_path / name)], capsys)
        assert f"enginespec serve: error: --log-config-file {str(tmp_path / name)!r}: {why}" in err, err
    monkeypatch.setenv("VLLM_LOGGING_CONFIG_PATH", str(tmp_path / "list.json"))
    err = _refused_before_the_model_loads([], capsys)
    assert f"VLLM_LOGGING_CONFIG_PATH {str(tmp_path / 'list.json')!r}: must be a JSON object" in err, err


def uvicorn_default_log_config() -> dict:
    from uvicorn.config import LOGGING_CONFIG

    return LOGGING_CONFIG
