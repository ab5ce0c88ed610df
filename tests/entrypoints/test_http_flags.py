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
import logging
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
    configs = []

    class NotServing:
        def __init__(self, config):
            configs.append(config)

        def run(self, sockets):
            pass

    monkeypatch.setattr(api_server, "_server_class", lambda: NotServing)
    argv = ["serve", str(tiny_model_dir("qwen3")), "--host", HOST, "--port", "0", "--device", "cpu"]
    assert cli.main([*argv, "--engine-in-process", *flags]) == 0
    config = configs[0]
    assert config.access_log is bool(flags)
    assert (config.ssl_certfile, config.ssl_keyfile) == ((cert, key) if flags else (None, None))


def test_a_server_serves_https_under_its_root_path(tmp_path):
    key, cert = _self_signed(tmp_path)
    args = ["--ssl-keyfile", key, "--ssl-certfile", cert, "--root-path", "/llm", "--disable-fastapi-docs"]
    args += ["--no-disable-uvicorn-access-log", "--uvicorn-log-level", "info", "--served-model-name", "tiny"]
    with open(tmp_path / "log", "w+") as out:  # uvicorn's access log goes to stdout, ours to stderr
        srv = RemoteServer(tiny_model_dir("qwen3"), args, ca_file=cert, stdout=out, stderr=subprocess.STDOUT)
        try:
            with httpx.Client(verify=srv.verify) as http:
                client = openai.OpenAI(
                    base_url=srv.url("/llm/v1"), api_key="none", max_retries=0, http_client=http
                )
                assert [m.id for m in client.models.list()] == ["tiny"]
                assert http.get(srv.url("/v1/models")).json()["data"][0]["id"] == "tiny"
                assert http.get(srv.url("/llm/docs")).status_code == 404
            with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port is no answer
                httpx.get(f"http://{HOST}:{srv.port}/v1/models", timeout=5.0)
        finally:
            assert srv.terminate() == 0
        out.seek(0)
        log = out.read()
    assert f"enginespec serve: tiny on https://{HOST}:{srv.port}" in log
    assert '"GET /llm/v1/models HTTP/1.1" 200' in log  # the access log, asked for by its --no- form


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

    class NotServing:
        def __init__(self, config):
            self.config = config

        def run(self, sockets):
            pass

    monkeypatch.setattr(api_server, "_server_class", lambda: NotServing)
    argv = [
        "serve",
        str(tiny_model_dir("qwen3")),
        "--host",
        HOST,
        "--port",
        "0",
        "--device",
        "cpu",
        "--engine-in-process",
    ]
    access = logging.getLogger("uvicorn.access")
    flags = ["--no-disable-uvicorn-access-log", "--disable-access-log-for-endpoints", "/health,/ping"]
    for _ in range(2):
        assert cli.main([*argv, *flags]) == 0
        quiet = [f for f in access.filters if isinstance(f, api_server.QuietEndpoints)]
        assert len(quiet) == 1 and quiet[0].paths == {"/health", "/ping"}
        assert not quiet[0].filter(_access_record("/ping")) and quiet[0].filter(_access_record("/v1/models"))
    assert cli.main(argv) == 0
    assert not [f for f in access.filters if isinstance(f, api_server.QuietEndpoints)]
