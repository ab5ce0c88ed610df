"""One request, three doors, one answer: LLM.generate / LLM.chat, AsyncLLM.generate and the
OpenAI server (completions and chat, full body and stream) give the same text, token ids,
logprobs (values, decoded tokens, the top entries), finish_reason, stop_reason, usage and
prompt logprobs for the same SamplingParams, greedy and seeded.

LLM.generate's output is the reference; each other door's answer is read into the same
vocabulary (`_Answer`) by the rules vLLM's server follows: a completion's top_logprobs are
every entry of the position ({text: logprob}, the sampled token among them), a chat position's
the k best by rank, best first; a stream's choice is the concatenation of its frames. The
cases cover the fields the doors treat apart: stop strings (multi-token, overlapping, kept),
stop token ids and EOS with include_stop_str_in_output, skip_special_tokens and
spaces_between_special_tokens, min_tokens, the three penalties, truncate_prompt_tokens,
prompt_logprobs, and chat templates with add_generation_prompt / continue_final_message."""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass
from typing import Optional

import httpx
import pytest

from enginespec import AsyncLLM
from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.serving import ServerContext
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir
from tests.entrypoints.client_helpers import in_process_client

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=128, max_num_seqs=8, block_size=16)
# "u:hi;A:" with a generation prompt; continue_final_message ends inside the last message
TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}{% if not loop.last %};{% endif %}"
    "{% endfor %}{% if add_generation_prompt %};A:{% endif %}"
)
_ids = itertools.count()

# The tiny qwen3's greedy replies (a character a token): "ABC" -> "sPsPs=T=T=Tsssss...",
# "hello" -> "=Ps=sss..." (86 is "s"), "q" -> "DGUv(Uc<s>lclc..." (2 is <s>), "*S" -> <s> X EOS.
COMPLETIONS = [
    ("greedy-logprobs", "abcdef", dict(max_tokens=12, temperature=0, logprobs=3)),
    ("seeded-n2", "hello", dict(max_tokens=10, temperature=0.8, top_p=0.9, seed=7, n=2, logprobs=2)),
    ("stop-overlapping", "ABC", dict(max_tokens=20, temperature=0, stop=["T=T", "=T=T", "Ps="])),
    (
        "stop-kept",
        "ABC",
        dict(max_tokens=20, temperature=0, stop=["=T=", "PsP"], include_stop_str_in_output=True, logprobs=1),
    ),
    ("stop-at-length", "ABC", dict(max_tokens=8, temperature=0, stop=["=T="])),
    (
        "special-kept",
        "q",
        dict(
            max_tokens=12,
            temperature=0,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            logprobs=2,
        ),
    ),
    ("special-skipped", "q", dict(max_tokens=12, temperature=0, stop=["lcl"])),
    (
        "min-tokens",
        "hello",
        dict(max_tokens=12, temperature=0, min_tokens=4, stop=["s"], stop_token_ids=[86]),
    ),
    ("stop-token", "hello", dict(max_tokens=12, temperature=0, stop_token_ids=[86], logprobs=1)),
    ("eos-special-kept", "*S", dict(max_tokens=12, temperature=0, skip_special_tokens=False)),
    (
        "stop-token-kept",
        "hello",
        dict(max_tokens=12, temperature=0, stop_token_ids=[86], include_stop_str_in_output=True),
    ),
    (
        "eos-kept",
        "*S",
        dict(max_tokens=12, temperature=0, skip_special_tokens=False, include_stop_str_in_output=True),
    ),
    (
        "penalties",
        "xyz",
        dict(
            max_tokens=16,
            temperature=1.0,
            seed=3,
            presence_penalty=-0.5,
            frequency_penalty=0.3,
            repetition_penalty=0.8,
            logprobs=1,
        ),
    ),
    ("truncated", "abcdefghij", dict(max_tokens=8, temperature=0, truncate_prompt_tokens=3)),
    ("prompt-logprobs", "abcdef", dict(max_tokens=4, temperature=0, prompt_logprobs=2, logprobs=0)),
]
USER = [{"role": "user", "content": "hi"}]
CHATS = [
    ("chat-logprobs", USER, dict(), dict(max_tokens=10, temperature=0, logprobs=2)),
    (
        "chat-no-generation-prompt",
        USER,
        dict(add_generation_prompt=False),
        dict(max_tokens=10, temperature=0),
    ),
    (
        "chat-continue",
        USER + [{"role": "assistant", "content": "Ok"}],
        dict(add_generation_prompt=False, continue_final_message=True),
        dict(max_tokens=10, temperature=0, stop=["s"]),
    ),
    ("chat-seeded-n2", USER, dict(), dict(max_tokens=10, temperature=0.7, seed=11, n=2, logprobs=1)),
    ("chat-prompt-logprobs", USER, dict(), dict(max_tokens=5, temperature=0, prompt_logprobs=1)),
]


@dataclass
class _Answer:
    """One door's answer in one vocabulary: per choice (text, ids, finish, stop, logprobs), where
    logprobs is per position (token text, logprob, sorted top entries); usage as (prompt,
    completion) tokens; prompt logprobs per position sorted (id, logprob, rank, text)."""

    choices: list
    usage: tuple
    prompt_ids: list
    prompt_logprobs: Optional[list] = None


def _r(value) -> Optional[float]:
    return None if value is None else round(float(value), 4)


def _offline(out, params: SamplingParams, chat: bool = False) -> _Answer:
    """A RequestOutput as the server would render it (module doc)."""
    choices = []
    for c in out.outputs:
        lps = None
        if c.logprobs is not None:
            lps = []
            for token, entry in zip(c.token_ids, c.logprobs):
                top = [
                    (lp.decoded_token, _r(lp))
                    for lp in entry.values()
                    if not chat or lp.rank <= params.logprobs
                ]
                lps.append((entry[token].decoded_token, _r(entry[token]), sorted(top)))
        choices.append((c.text, list(c.token_ids), c.finish_reason, c.stop_reason, lps))
    prompt_lps = None
    if out.prompt_logprobs is not None:
        prompt_lps = [
            None if e is None else sorted((t, _r(lp), lp.rank, lp.decoded_token) for t, lp in e.items())
            for e in out.prompt_logprobs
        ]
    usage = (len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs))
    return _Answer(choices, usage, list(out.prompt_token_ids), prompt_lps)


def _served_logprobs(kind: str, logprobs: Optional[dict]) -> Optional[list]:
    if logprobs is None:
        return None
    if kind == "completion":
        return [
            (tok, _r(lp), sorted((t, _r(v)) for t, v in top.items()))
            for tok, lp, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"])
        ]
    out = []
    for e in logprobs["content"]:
        top = [(t["token"], _r(t["logprob"])) for t in e["top_logprobs"]]
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True), "top_logprobs best first"
        out.append((e["token"], _r(e["logprob"]), sorted(top)))
    return out


def _served(body: dict, kind: str) -> _Answer:
    """A full response body (or a stream folded into one, _fold) as an _Answer."""
    choices = []
    for ch in sorted(body["choices"], key=lambda c: c["index"]):
        text = ch["text"] if kind == "completion" else ch["message"]["content"]
        lps = _served_logprobs(kind, ch["logprobs"])
        choices.append((text, ch["token_ids"], ch["finish_reason"], ch["stop_reason"], lps))
    prompt_lps = body.get("prompt_logprobs") or body["choices"][0].get("prompt_logprobs")
    if prompt_lps is not None:
        prompt_lps = [
            None
            if e is None
            else sorted((int(t), _r(v["logprob"]), v["rank"], v["decoded_token"]) for t, v in e.items())
            for e in prompt_lps
        ]
    usage = (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])
    prompt_ids = body.get("prompt_token_ids") or body["choices"][0].get("prompt_token_ids")
    return _Answer(choices, usage, prompt_ids, prompt_lps)


def _fold(frames: list[dict], kind: str) -> dict:
    """Stream frames as one full body: each choice's text, ids and logprobs concatenated, its
    last finish, the prompt ids of its first frame (chat: the chunk's), the usage chunk's usage."""
    choices: dict = {}
    body: dict = {"choices": [], "usage": None}
    for f in frames:
        body["usage"] = f.get("usage") or body["usage"]
        if "prompt_token_ids" in f:
            body["prompt_token_ids"] = f["prompt_token_ids"]
        for ch in f["choices"]:
            c = choices.setdefault(
                ch["index"], {"index": ch["index"], "text": "", "token_ids": [], "logprobs": None}
            )
            c["text"] += ch["text"] if kind == "completion" else ch["delta"].get("content") or ""
            c["token_ids"] += ch["token_ids"]
            if ch.get("prompt_token_ids") is not None:
                c["prompt_token_ids"] = ch["prompt_token_ids"]
            if ch["logprobs"] is not None:
                lps = c["logprobs"] = c["logprobs"] or {}
                for key, value in ch["logprobs"].items():
                    lps[key] = lps.get(key, []) + value
            if ch["finish_reason"] is not None:
                c["finish_reason"], c["stop_reason"] = ch["finish_reason"], ch["stop_reason"]
    for c in choices.values():
        if kind == "chat":
            c["message"] = {"content": c.pop("text")}
        body["choices"].append(c)
    return body


def _body(kind: str, params: SamplingParams) -> dict:
    """The request body of these params (every field set, so no server default applies)."""
    body = dict(
        model="tiny", max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
        seed=params.seed, n=params.n, stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None, min_tokens=params.min_tokens,
        include_stop_str_in_output=params.include_stop_str_in_output,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
        presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty, return_token_ids=True,
        truncate_prompt_tokens=params.truncate_prompt_tokens, prompt_logprobs=params.prompt_logprobs,
    )  # fmt: skip
    if params.logprobs is not None and kind == "completion":
        body["logprobs"] = params.logprobs
    elif params.logprobs is not None:
        body.update(logprobs=True, top_logprobs=params.logprobs)
    return body


async def _serve(http, kind: str, body: dict, stream: bool) -> _Answer:
    path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
    if not stream:
        resp = await http.post(path, json=body)
        assert resp.status_code == 200, resp.text
        return _served(resp.json(), kind)
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    frames = []
    async with http.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                frames.append(json.loads(line[len("data: ") :]))
    assert not any("error" in f for f in frames), frames
    return _served(_fold(frames, kind), kind)


@pytest.fixture(scope="module")
def doors():
    """(LLM, AsyncLLM, the server's ASGI app and its engine client), one engine each."""
    model = str(tiny_model_dir("qwen3"))
    llm = LLM(model, **ENGINE)
    async_llm = AsyncLLM(model, in_process=True, start_timeout=120, **ENGINE)
    try:
        with in_process_client(model, **ENGINE) as engine:
            ctx = ServerContext(
                engine, engine.tokenizer, ["tiny"], engine.info.max_model_len, chat_template=TEMPLATE
            )
            yield llm, async_llm, build_app(ctx, ServerMetrics("tiny")), engine
    finally:
        async_llm.shutdown()


def _over_http(doors, fn):
    """fn(http client) against the app, the engine client read on this loop."""
    _, _, app, engine = doors

    async def run():
        engine.start(asyncio.get_running_loop())  # the lifespan's job (ASGITransport runs none)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=120
        ) as http:
            return await fn(http)

    return asyncio.run(run())


def _assert_same(want: _Answer, got: dict[str, _Answer]) -> None:
    for door, answer in got.items():
        if door.endswith("stream"):  # a stream has no prompt logprobs (refused with stream=true)
            answer.prompt_logprobs = want.prompt_logprobs
        assert answer == want, door


@pytest.mark.parametrize("name, prompt, kwargs", COMPLETIONS, ids=[c[0] for c in COMPLETIONS])
def test_completion_doors_agree(doors, name, prompt, kwargs):
    llm, async_llm, _, _ = doors
    params = SamplingParams(**kwargs)
    want = _offline(llm.generate([prompt], params, use_tqdm=False)[0], params)

    async def asked():
        return [out async for out in async_llm.generate(prompt, params, request_id=f"p{next(_ids)}")][-1]

    got = {"AsyncLLM": _offline(asyncio.run(asked()), params)}
    body = {**_body("completion", params), "prompt": prompt}
    got["completions"] = _over_http(doors, lambda http: _serve(http, "completion", body, False))
    if params.prompt_logprobs is None:
        got["completions stream"] = _over_http(doors, lambda http: _serve(http, "completion", body, True))
    _assert_same(want, got)


@pytest.mark.parametrize("name, messages, options, kwargs", CHATS, ids=[c[0] for c in CHATS])
def test_chat_doors_agree(doors, name, messages, options, kwargs):
    llm = doors[0]
    params = SamplingParams(**kwargs)
    out = llm.chat(messages, params, use_tqdm=False, chat_template=TEMPLATE, **options)[0]
    want = _offline(out, params, chat=True)
    body = {**_body("chat", params), "messages": messages, **options}
    got = {"chat": _over_http(doors, lambda http: _serve(http, "chat", body, False))}
    if params.prompt_logprobs is None:
        got["chat stream"] = _over_http(doors, lambda http: _serve(http, "chat", body, True))
    _assert_same(want, got)
