"""usage.prompt_tokens_details.cached_tokens (vLLM's --enable-prompt-tokens-details): the prompt
tokens the prefix cache served, in the full body and in a stream's usage chunk; absent without
the flag. The handlers run over an in-process engine client (the same loop and pipes as the
spawned engine process)."""

from __future__ import annotations

import asyncio
import json

import pytest

from enginespec.entrypoints.cli import _parser
from enginespec.entrypoints.openai.protocol import CompletionRequest
from enginespec.entrypoints.openai.serving import ServerContext, create_completion
from tests.entrypoints.client_helpers import in_process_client, never

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=128, max_num_seqs=8, block_size=4)
PROMPT = list(range(5, 23))  # 18 ids: four full blocks of 4 (16 tokens) cached for a second request


@pytest.fixture(scope="module")
def client():
    with in_process_client(**ENGINE) as engine:
        yield engine


def _usages(client, details: bool) -> list[dict]:
    """Usage of the same prompt three times: full body, full body, stream's usage chunk."""
    ctx = ServerContext(client, client.tokenizer, ["tiny"], 64, enable_prompt_tokens_details=details)

    def request(**extra):
        body = CompletionRequest(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, **extra)
        return create_completion(ctx, body, never)

    async def run():
        client.start(asyncio.get_running_loop())
        usages = [(await request())["usage"], (await request())["usage"]]
        frames = [f async for f in await request(stream=True, stream_options={"include_usage": True})]
        usages.append(json.loads(frames[-2][len("data: ") :])["usage"])
        return usages

    return asyncio.run(run())


def test_cached_tokens_are_reported_with_the_flag(client):
    first, second, streamed = _usages(client, details=True)
    assert first["prompt_tokens"] == second["prompt_tokens"] == len(PROMPT)
    assert second["prompt_tokens_details"] == streamed["prompt_tokens_details"] == {"cached_tokens": 16}
    assert first["prompt_tokens_details"]["cached_tokens"] in (0, 16)  # 16 if an earlier test ran it


def test_no_details_without_the_flag(client):
    assert all("prompt_tokens_details" not in usage for usage in _usages(client, details=False))


def test_the_serve_flag_is_vllms():
    assert _parser().parse_args(["serve", "m", "--enable-prompt-tokens-details"]).enable_prompt_tokens_details
    assert not _parser().parse_args(["serve", "m"]).enable_prompt_tokens_details
