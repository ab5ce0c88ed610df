"""/v1/completions with echo=true (serving.py's "echo" section): each choice begins with its
prompt, and with logprobs the prompt's tokens' logprobs (the engine's prompt logprobs) come
first, the first one null; max_tokens 0 returns the prompt alone (how lm-evaluation-harness
scores a continuation's log-likelihood over an OpenAI-compatible server). Checked against the
same engine's offline prompt logprobs. The engine runs on a thread (in_process=True)."""

from __future__ import annotations

import asyncio
import json

import pytest

from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.protocol import CompletionRequest
from enginespec.entrypoints.openai.serving import ServerContext, create_completion
from enginespec.spec import SamplingParams
from tests.entrypoints.client_helpers import in_process_client, never

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=128, max_num_seqs=8, block_size=4)
PROMPT = "hello world"


@pytest.fixture(scope="module")
def ctx():
    with in_process_client(**ENGINE) as client:
        yield ServerContext(client, client.tokenizer, ["tiny"], client.info.max_model_len, None)


def _run(ctx, **fields):
    """The body (a dict) or the stream's data frames (a list) of one completion call."""
    body = CompletionRequest(**{"model": "tiny", "temperature": 0, **fields})

    async def run():
        ctx.engine.start(asyncio.get_running_loop())
        out = await create_completion(ctx, body, never)
        if isinstance(out, dict):
            return out
        return [f[len("data: ") :].strip() async for f in out]

    return asyncio.run(run())


def _offline_prompt_logprobs(ctx, prompt_ids, k):
    """The engine's own logprobs of each prompt token after the first (SamplingParams.prompt_logprobs)."""

    async def run():
        from enginespec.engine.core_messages import NewRequest
        from tests.entrypoints.client_helpers import final_output

        ctx.engine.start(asyncio.get_running_loop())
        params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=k)
        return await final_output(await ctx.engine.submit([NewRequest("ref", None, prompt_ids, params)]))

    out = asyncio.run(run())
    return [float(entry[tok]) for tok, entry in zip(prompt_ids[1:], out.prompt_logprobs[1:])]


def test_echo_puts_the_prompt_before_the_text_and_changes_nothing_else(ctx):
    plain = _run(ctx, prompt=PROMPT, max_tokens=5, ignore_eos=True)
    echoed = _run(ctx, prompt=PROMPT, max_tokens=5, ignore_eos=True, echo=True)
    assert echoed["choices"][0]["text"] == PROMPT + plain["choices"][0]["text"]
    assert echoed["usage"] == plain["usage"] and echoed["choices"][0]["finish_reason"] == "length"


def test_echo_logprobs_lead_with_the_prompt_s_own(ctx):
    prompt_ids = ctx.tokenizer.encode(PROMPT)
    plain = _run(ctx, prompt=PROMPT, max_tokens=3, ignore_eos=True, logprobs=2)["choices"][0]["logprobs"]
    lps = _run(ctx, prompt=PROMPT, max_tokens=3, ignore_eos=True, logprobs=2, echo=True)["choices"][0][
        "logprobs"
    ]
    n = len(prompt_ids)
    assert lps["tokens"][:n] == [ctx.tokenizer.decode([t]) for t in prompt_ids]
    assert lps["token_logprobs"][0] is None and lps["top_logprobs"][0] is None
    assert lps["token_logprobs"][1:n] == pytest.approx(_offline_prompt_logprobs(ctx, prompt_ids, 2), abs=1e-5)
    assert all(1 <= len(top) <= 3 for top in lps["top_logprobs"][1:n])  # k best, and the prompt's own
    assert lps["tokens"][n:] == plain["tokens"] and lps["token_logprobs"][n:] == plain["token_logprobs"]
    offsets = lps["text_offset"]
    assert offsets[0] == 0 and all(
        offsets[i + 1] == offsets[i] + len(lps["tokens"][i]) for i in range(len(offsets) - 1)
    )


def test_echo_with_max_tokens_0_scores_the_prompt_alone(ctx):
    prompt_ids = ctx.tokenizer.encode(PROMPT)
    body = _run(ctx, prompt=[prompt_ids, prompt_ids[:3]], max_tokens=0, logprobs=1, echo=True)
    first, second = body["choices"]
    assert first["text"] == ctx.tokenizer.decode(prompt_ids) and first["finish_reason"] == "length"
    assert first["logprobs"]["tokens"] == [ctx.tokenizer.decode([t]) for t in prompt_ids]
    assert first["logprobs"]["token_logprobs"][1:] == pytest.approx(
        _offline_prompt_logprobs(ctx, prompt_ids, 1), abs=1e-5
    )
    assert second["index"] == 1 and len(second["logprobs"]["tokens"]) == 3
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids) + 3,
        "completion_tokens": 0,
        "total_tokens": len(prompt_ids) + 3,
    }
    assert ctx.engine.state.num_free_blocks == ctx.engine.state.num_blocks


def test_an_echo_stream_sends_the_prompt_first(ctx):
    fields = dict(prompt=PROMPT, max_tokens=6, ignore_eos=True, echo=True, n=2, seed=0, temperature=1.0)
    full, frames = _run(ctx, **fields), _run(ctx, **fields, stream=True)
    assert frames[-1] == "[DONE]"
    texts = {0: "", 1: ""}
    for f in frames[:-1]:
        for choice in json.loads(f)["choices"]:
            texts[choice["index"]] += choice["text"]
    assert [texts[0], texts[1]] == [c["text"] for c in full["choices"]]
    assert all(t.startswith(PROMPT) for t in texts.values())
    only = _run(
        ctx, prompt=PROMPT, max_tokens=0, echo=True, stream=True, stream_options={"include_usage": True}
    )
    (choice,) = json.loads(only[0])["choices"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert json.loads(only[1])["usage"]["completion_tokens"] == 0 and only[2] == "[DONE]"


@pytest.mark.parametrize(
    "fields",
    [dict(stream=True, logprobs=1), dict(use_beam_search=True, n=2)],
    ids=["stream-logprobs", "beam"],
)
def test_what_echo_cannot_do_is_a_400_naming_echo(ctx, fields):
    with pytest.raises(APIError) as err:
        _run(ctx, prompt=PROMPT, max_tokens=2, echo=True, **fields)
    assert err.value.status == 400 and err.value.param == "echo"


def test_max_tokens_0_without_echo_is_still_refused(ctx):
    with pytest.raises(APIError) as err:
        _run(ctx, prompt=PROMPT, max_tokens=0)
    assert err.value.status == 400 and "max_tokens" in err.value.message
