"""vLLM's request-log flags on `enginespec serve`: --enable-log-requests logs each request as it
is submitted (its ids, prompt and params, cut to --max-log-len), --disable-log-requests is
accepted (not logging is the default), and the server shows enginespec's own INFO lines."""

from __future__ import annotations

import asyncio
import logging

import pytest

from enginespec.entrypoints.openai import api_server
from enginespec.entrypoints.openai.protocol import CompletionRequest
from enginespec.entrypoints.openai.serving import ServerContext, create_completion
from tests.entrypoints.client_helpers import in_process_client, never
from tests.entrypoints.test_cli import run_cli

LOGGER = "enginespec.entrypoints.openai.serving"


def _complete(client, prompt, **ctx_fields) -> dict:
    ctx = ServerContext(client, client.tokenizer, ["tiny"], 128, **ctx_fields)
    body = CompletionRequest(model="tiny", prompt=prompt, max_tokens=2, temperature=0.0)

    async def run():
        client.start(asyncio.get_running_loop())
        return await create_completion(ctx, body, never)

    return asyncio.run(run())


def test_enable_log_requests_logs_each_request_cut_to_max_log_len(caplog):
    prompt = list(range(5, 25))
    with in_process_client() as client, caplog.at_level(logging.INFO, logger=LOGGER):
        reply = _complete(client, prompt, log_requests=True, max_log_len=4)
        (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert line.startswith("Received request ") and f"(response {reply['id']})" in line
        assert "prompt_token_ids: [5, 6, 7, 8]" in line and "max_tokens=2" in line
        caplog.clear()
        _complete(client, prompt)  # the default: nothing logged
        assert not [r for r in caplog.records if r.name == LOGGER]


def test_the_request_log_flags_reach_the_server_and_a_clash_is_one_line(capsys, monkeypatch):
    seen = []
    monkeypatch.setattr(api_server, "run_server", lambda ns: seen.append(ns) or 0)
    assert run_cli(["serve", "/m", "--disable-log-requests"], capsys)[0] == 0
    assert run_cli(["serve", "/m", "--enable-log-requests", "--max-log-len", "8"], capsys)[0] == 0
    assert (seen[0].disable_log_requests, seen[1].enable_log_requests, seen[1].max_log_len) == (True, True, 8)
    for ns, match in (
        (dict(enable_log_requests=True, disable_log_requests=True, max_log_len=None), "not both"),
        (dict(enable_log_requests=True, disable_log_requests=False, max_log_len=-1), "--max-log-len"),
    ):
        with pytest.raises(ValueError, match=match):
            api_server._check_request_log(type("NS", (), ns))


def test_enginespecs_info_lines_reach_stderr_at_the_servers_level(capsys):
    logger = logging.getLogger("enginespec")
    saved_handlers, saved_level = logger.handlers[:], logger.level
    logger.handlers.clear()
    try:
        api_server._log_to_stderr("info")
        logging.getLogger(LOGGER).info("shown")
        logging.getLogger(LOGGER).debug("not shown")
        api_server._log_to_stderr("debug")  # a handler is there already: left as it is
        assert len(logger.handlers) == 1
    finally:
        logger.handlers[:] = saved_handlers
        logger.setLevel(saved_level)
    err = capsys.readouterr().err
    assert "INFO:     shown" in err and "not shown" not in err
