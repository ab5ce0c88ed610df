"""/v1/completions' max_tokens when the body leaves it unset: vLLM's default of 16, lowered to
the checkpoint's generation_config.json max_new_tokens where that is smaller (vLLM takes the
least of the two and the context's room); a max_tokens the body sets is kept. The handler runs
over an in-process engine client (the same loop and pipes as the spawned engine process)."""

from __future__ import annotations

import asyncio

import pytest

from enginespec.entrypoints.openai.protocol import CompletionRequest
from enginespec.entrypoints.openai.serving import ServerContext, create_completion
from tests.entrypoints.client_helpers import in_process_client, never

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4)


@pytest.fixture(scope="module")
def client():
    with in_process_client(**ENGINE) as engine:
        yield engine


def _completion_tokens(client, max_new_tokens, **body) -> int:
    """usage.completion_tokens of a completion that ignores EOS, on a server whose
    generation_config.json says max_new_tokens (None: the file says nothing)."""
    defaults = {} if max_new_tokens is None else {"max_tokens": max_new_tokens}
    ctx = ServerContext(client, client.tokenizer, ["tiny"], 256, sampling_defaults=defaults)
    request = CompletionRequest(model="tiny", prompt=[5, 6, 7], temperature=0, ignore_eos=True, **body)

    async def run():
        client.start(asyncio.get_running_loop())
        return (await create_completion(ctx, request, never))["usage"]["completion_tokens"]

    return asyncio.run(run())


def test_unset_max_tokens_is_16_or_the_checkpoints_smaller_max_new_tokens(client):
    assert _completion_tokens(client, None) == 16
    assert _completion_tokens(client, 50) == 16
    assert _completion_tokens(client, 5) == 5
    assert _completion_tokens(client, 5, max_tokens=None) == 5  # null is unset
    assert _completion_tokens(client, 5, max_tokens=9) == 9  # a set field is kept
