"""/v1/completions with echo=true (serving.py's "echo" section): each choice begins with its
prompt, and with logprobs the prompt's tokens' logprobs (the engine's prompt logprobs) come
first, the first one null; max_tokens 0 returns the prompt alone (how lm-evaluation-harness
scores a continuation's log-likelihood over an OpenAI-compatible server). Checked against the
same engine's offline prompt logprobs. The engine runs on a thread (in_process=True)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.metrics import ServerMetrics
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


def test_what_echo_cannot_do_is_a_400_naming_echo(ctx):
    with pytest.raises(APIError) as err:
        _run(ctx, prompt=PROMPT, max_tokens=2, echo=True, use_beam_search=True, n=2)
    assert err.value.status == 400 and err.value.param == "echo"


# ---- echo with logprobs in a stream, read by the openai client ------------------------------------


def _client_calls(ctx, fields: dict) -> tuple:
    """The full body and the stream's chunks of one completion call with these fields, both
    parsed by the official openai client over the app (vLLM's extra fields in extra_body)."""
    app = build_app(ctx, ServerMetrics("tiny"))
    extra = {k: fields.pop(k) for k in ("ignore_eos", "return_token_ids") if k in fields}

    async def run():
        ctx.engine.start(asyncio.get_running_loop())  # the lifespan's job (ASGITransport runs none)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as http:
            client = openai.AsyncOpenAI(
                base_url="http://test/v1", api_key="k", http_client=http, max_retries=0
            )
            full = await client.completions.create(model="tiny", extra_body=extra, **fields)
            stream = await client.completions.create(model="tiny", stream=True, extra_body=extra, **fields)
            return full, [chunk async for chunk in stream]

    return asyncio.run(run())


def _joined(chunks) -> dict:
    """choice index -> (its chunks in order, its text and logprobs lists concatenated)."""
    joined: dict = {}
    for chunk in chunks:
        (choice,) = chunk.choices  # one choice a chunk, as vLLM streams them
        parts, text, lps = joined.setdefault(choice.index, ([], [""], {}))
        parts.append(choice)
        text[0] += choice.text
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            lps.setdefault(key, []).extend(getattr(choice.logprobs, key))
    return joined


@pytest.mark.parametrize("n", [1, 2])
def test_an_echo_stream_with_logprobs_leads_each_choice_with_its_prompt_s(ctx, n):
    """vLLM streams echo with logprobs: each choice's first chunk carries its prompt's text and
    its prompt's logprobs (the first token's null), the generated tokens' follow; concatenated,
    a choice's chunks are the full body's choice. It was a 400 naming echo (the prompt's logprobs
    came with the final output only)."""
    prompts = [PROMPT, "ab"]
    fields = dict(prompt=prompts, max_tokens=4, ignore_eos=True, echo=True, logprobs=1, n=n, seed=0)
    full, chunks = _client_calls(ctx, {**fields, "temperature": 1.0})
    joined = _joined(chunks)
    assert sorted(joined) == list(range(len(prompts) * n))
    for choice in full.choices:
        parts, (text,), lps = joined[choice.index]
        prompt, prompt_ids = prompts[choice.index // n], ctx.tokenizer.encode(prompts[choice.index // n])
        first = parts[0]
        assert first.text.startswith(prompt) and first.logprobs.text_offset[0] == 0
        assert first.logprobs.tokens[: len(prompt_ids)] == [ctx.tokenizer.decode([t]) for t in prompt_ids]
        assert first.logprobs.token_logprobs[0] is None and first.logprobs.top_logprobs[0] is None
        assert first.logprobs.token_logprobs[1 : len(prompt_ids)] == pytest.approx(
            _offline_prompt_logprobs(ctx, prompt_ids, 1), abs=1e-5
        )
        assert text == choice.text and lps == choice.logprobs.model_dump()
        assert parts[-1].finish_reason == choice.finish_reason == "length"
        assert all(p.finish_reason is None for p in parts[:-1])
    assert ctx.engine.state.num_free_blocks == ctx.engine.state.num_blocks


def test_an_echo_stream_with_max_tokens_0_sends_each_prompt_s_logprobs_alone(ctx):
    """max_tokens 0 in a stream (a prompt's scoring): one chunk a prompt, its text and its
    logprobs the prompt's alone, equal to the full body's; finish_reason "length". It was a 400."""
    prompt_ids = ctx.tokenizer.encode(PROMPT)
    fields = dict(prompt=[prompt_ids, prompt_ids[:3]], max_tokens=0, echo=True, logprobs=1, temperature=0)
    full, chunks = _client_calls(ctx, fields)
    joined = _joined(chunks)
    assert sorted(joined) == [0, 1]
    for choice in full.choices:
        parts, (text,), lps = joined[choice.index]
        assert len(parts) == 1 and parts[0].finish_reason == "length"
        assert text == choice.text and lps == choice.logprobs.model_dump()
    assert len(joined[0][2]["tokens"]) == len(prompt_ids) and len(joined[1][2]["tokens"]) == 3
    assert joined[0][2]["token_logprobs"][0] is None


def test_max_tokens_0_without_echo_is_still_refused(ctx):
    with pytest.raises(APIError) as err:
        _run(ctx, prompt=PROMPT, max_tokens=0)
    assert err.value.status == 400 and "max_tokens" in err.value.message


def _scripted(sample_ids: list, prompt_logprobs, finished: bool):
    """A two-sample output of the prompt ids [1, 2] (text "p"): sample i's ids, each with a
    logprob entry, its text a character an id; finished: both end with "length"."""
    from types import SimpleNamespace

    from enginespec.outputs import Logprob

    samples = [
        SimpleNamespace(
            index=i, text="x" * len(ids), token_ids=list(ids), logprobs=[{t: Logprob(-1.0, 1)} for t in ids],
            finish_reason="length" if finished else None, stop_reason=None,
        )
        for i, ids in enumerate(sample_ids)
    ]  # fmt: skip
    return SimpleNamespace(
        request_id="r", outputs=samples, prompt_token_ids=[1, 2], prompt_logprobs=prompt_logprobs,
        finished=finished, num_cached_tokens=0,
    )  # fmt: skip


def test_an_echo_stream_choice_with_news_before_the_prompt_s_logprobs_waits_for_them():
    """The engine hands the prompt's logprobs with sample 0's first output ids: a sibling with
    ids before them (sample 1 here) holds its first chunk until they come, so that every
    choice's first chunk leads with its prompt's logprobs. Without the wait its first chunk went
    out with its own tokens' alone, and the concatenated chunks lacked the prompt's."""
    from enginespec.entrypoints.openai.serving import ServerContext, _Call, _full_body, _stream
    from enginespec.outputs import Logprob
    from tests.entrypoints.client_helpers import ScriptedGeneration

    body = CompletionRequest(prompt="p", n=2, stream=True, echo=True, logprobs=0, max_tokens=2)
    call = _Call("completion", "id-1", "m", body, [("p", [1, 2])], ())
    call.index_of["r"] = 0
    prompt_lps = [None, {2: Logprob(-0.5, 1)}]
    steps = [_scripted([[], [7]], None, False), _scripted([[5, 6], [7, 8]], prompt_lps, True)]
    ctx = ServerContext(None, None, ["m"], 64)

    async def frames():
        return [f async for f in _stream(ctx, call, ScriptedGeneration(steps))]

    chunks = [json.loads(f[len("data: ") :]) for f in asyncio.run(frames())[:-1]]
    firsts: dict = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        firsts.setdefault(choice["index"], choice)
    for index, choice in sorted(firsts.items()):
        assert choice["logprobs"]["token_logprobs"][:2] == [None, -0.5], index
        assert choice["text"].startswith("p")
    full = {c["index"]: c for c in _full_body(ctx, call)["choices"]}
    assert firsts[1]["logprobs"] == full[1]["logprobs"] and firsts[1]["text"] == full[1]["text"] == "pxx"


def test_an_echo_choice_of_an_output_without_prompt_logprobs_leads_with_null_entries():
    """A finished output that carries no prompt logprobs (an aborted request's: its prompt never
    ran in full) is not waited on: each choice goes out at once, its prompt's tokens with null
    logprobs, in the stream's first chunk as in the full body (_prompt_entries: one None a
    prompt token, never an error)."""
    from enginespec.entrypoints.openai.serving import ServerContext, _Call, _full_body, _stream
    from tests.entrypoints.client_helpers import ScriptedGeneration

    body = CompletionRequest(prompt="p", n=2, stream=True, echo=True, logprobs=0, max_tokens=2)
    call = _Call("completion", "id-1", "m", body, [("p", [1, 2])], ())
    call.index_of["r"] = 0
    ctx = ServerContext(None, None, ["m"], 64)

    async def frames():
        return [
            f async for f in _stream(ctx, call, ScriptedGeneration([_scripted([[5], [7, 8]], None, True)]))
        ]

    chunks = [json.loads(f[len("data: ") :]) for f in asyncio.run(frames())[:-1]]
    assert [c["index"] for chunk in chunks for c in chunk["choices"]] == [0, 1], chunks  # one chunk each
    choices = {c["index"]: c for chunk in chunks for c in chunk["choices"]}
    assert choices[0]["logprobs"]["token_logprobs"] == [None, None, -1.0]
    assert choices[1]["logprobs"]["token_logprobs"] == [None, None, -1.0, -1.0]
    assert choices[1]["logprobs"]["top_logprobs"][:2] == [None, None]
    full = {c["index"]: c for c in _full_body(ctx, call)["choices"]}
    for index in (0, 1):
        assert choices[index]["logprobs"] == full[index]["logprobs"], index
        assert choices[index]["text"] == full[index]["text"] == "p" + "x" * (index + 1)
