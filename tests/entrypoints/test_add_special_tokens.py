"""vLLM's add_special_tokens body field: whether a text prompt is encoded with the tokenizer's
special tokens (its BOS here). vLLM's defaults: true for completions, false for chat (the
template writes them). The tiny tokenizers add nothing, so this one is given a BOS
post-processor; the handlers run over an in-process engine (the spawned one's loop and pipes,
on a thread)."""

from __future__ import annotations

import asyncio

import pytest

from enginespec.engine.engine_core import load_engine_tokenizer
from enginespec.engine_args import EngineArgs
from enginespec.entrypoints.openai.engine_client import EngineClient
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from enginespec.entrypoints.openai.serving import ServerContext, create_chat_completion, create_completion
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4, block_size=4)
TEMPLATE = "{% for m in messages %}{{ m['content'] }};{% endfor %}"
BOS = 2


@pytest.fixture(scope="module")
def served():
    from tokenizers.processors import TemplateProcessing

    args = EngineArgs.from_kwargs(str(tiny_model_dir("qwen3")), **ENGINE)
    tokenizer = load_engine_tokenizer(args)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", BOS)]
    )
    client = EngineClient(args, tokenizer, ServerMetrics("tiny"), in_process=True, max_waiting=16)
    info = client.launch(timeout=120)
    try:
        yield ServerContext(client, tokenizer, ["tiny"], info.max_model_len, TEMPLATE)
    finally:
        client.stop()


async def _never() -> None:
    await asyncio.Event().wait()


def _prompt_tokens(ctx, make, **fields) -> int:
    async def run():
        ctx.engine.start(asyncio.get_running_loop())
        return await make(ctx, **fields)

    return asyncio.run(run())["usage"]["prompt_tokens"]


def test_completions_add_special_tokens_unless_told_not_to(served):
    def make(ctx, **kw):
        return create_completion(
            ctx, CompletionRequest(model="tiny", prompt="abc", max_tokens=1, **kw), _never
        )

    assert served.tokenizer.encode("abc") == [BOS, 68, 69, 70]  # the processor bites
    assert _prompt_tokens(served, make) == 4
    assert _prompt_tokens(served, make, add_special_tokens=False) == 3


def test_chat_adds_no_special_tokens_unless_told_to(served):
    def make(ctx, **kw):
        messages = [{"role": "user", "content": "abc"}]
        return create_chat_completion(
            ctx, ChatCompletionRequest(messages=messages, max_tokens=1, **kw), _never
        )

    assert _prompt_tokens(served, make) == 4  # "abc;": the template's text alone
    assert _prompt_tokens(served, make, add_special_tokens=True) == 5
