"""`enginespec serve` end to end: a real server process, the official openai client (sync and
async, max_retries=0), every parameter, every error class, abort on disconnect, and a bounded
load test. Greedy outputs are compared token for token with LLM.generate on the same engine
settings. One server for the module (its start-up dominates the cost)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import openai
import pytest

from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.protocol import CompletionRequest
from enginespec.entrypoints.openai.serving import _check_request
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import EOS_ID, make_checkpoint
from enginespec.worker.loader import load_tokenizer
from tests.entrypoints.remote_server import CHAT_TEMPLATE, RemoteServer

MODEL = "tiny"
KEY = "sk-test"
ENGINE = dict(impl="fast", device="cpu", num_blocks=256, max_num_seqs=16)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("serve") / "qwen3")


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    """The server's --profiler-config.torch_profiler_dir (its /start_profile and /stop_profile
    exist; VLLM_TORCH_PROFILER_DIR's way: tests/api/test_async_llm.py, test_profile_routes.py)."""
    return tmp_path_factory.mktemp("profile")


@pytest.fixture(scope="module")
def server(model_dir, profile_dir):
    args = ["--served-model-name", MODEL, "--chat-template", CHAT_TEMPLATE, "--enable-dev-endpoints"]
    args += ["--enable-sleep-mode", "--profiler-config.profiler", "torch"]
    args += ["--profiler-config.torch_profiler_dir", str(profile_dir)]
    args += ["--impl", "fast", "--num-blocks", "256", "--max-num-seqs", "16", "--max-waiting-requests", "512"]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.pop("VLLM_TORCH_PROFILER_DIR", None)
    srv = RemoteServer(model_dir, args, api_key=KEY, env=env)
    yield srv
    assert srv.terminate() == 0


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), **ENGINE)


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def prompts(num: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 96) for _ in range(rng.randint(3, 20))] for _ in range(num)]


def offline(llm, prompt, **params) -> list[int]:
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(**params), use_tqdm=False)
    return out[0].outputs[0].token_ids


def greedy(client, prompt, max_tokens=12, **extra):
    return client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"return_token_ids": True, **extra},
    )


# ---- completions and chat -------------------------------------------------------------------------


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url("/health")).status_code == 200


def test_greedy_completions_equal_offline_token_for_token(client, llm):
    for prompt in prompts(6):
        resp = greedy(client, prompt, max_tokens=16)
        choice = resp.choices[0]
        assert choice.token_ids == offline(llm, prompt, max_tokens=16, temperature=0.0)
        assert choice.prompt_token_ids == prompt
        assert resp.usage.prompt_tokens == len(prompt)
        assert resp.usage.completion_tokens == len(choice.token_ids)


def test_text_prompt_batch_and_n(client, llm):
    resp = client.completions.create(
        model=MODEL,
        prompt=["hello", "world!"],
        max_tokens=5,
        n=2,
        temperature=0.0,
        extra_body={"return_token_ids": True},
    )
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    tok = llm.get_tokenizer()
    for i, text in enumerate(["hello", "world!"]):
        want = offline(llm, tok.encode(text), max_tokens=5, temperature=0.0)
        assert resp.choices[2 * i].token_ids == want == resp.choices[2 * i + 1].token_ids
    assert resp.usage.completion_tokens == sum(len(c.token_ids) for c in resp.choices)


def test_streaming_completion_equals_full_and_reports_usage(client):
    prompt = prompts(1, seed=3)[0]
    full = greedy(client, prompt, max_tokens=20).choices[0]
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ids = [t for c in chunks if c.choices for t in c.choices[0].token_ids]
    assert text == full.text and ids == full.token_ids
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_empty_stream_options_streams_without_usage(client):
    chunks = list(
        client.completions.create(model=MODEL, prompt="abc", max_tokens=4, stream=True, stream_options={})
    )
    assert chunks and all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_chat_uses_the_template_and_matches_completions(server, client):
    messages = [{"role": "user", "content": "hello"}]
    rendered = server.post("/tokenize", {"messages": messages}).json()["tokens"]
    want = greedy(client, rendered, max_tokens=10).choices[0]
    resp = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_completion_tokens=10,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == want.text
    assert resp.choices[0].token_ids == want.token_ids
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert chunks[-1].usage.prompt_tokens == len(rendered)
    assert chunks[0].prompt_token_ids == resp.prompt_token_ids == rendered  # the first chunk's, as vLLM's


def test_tokenize_detokenize_round_trip(server):
    tokens = server.post("/tokenize", {"prompt": "abc!"}).json()["tokens"]
    assert server.post("/detokenize", {"tokens": tokens}).json()["prompt"] == "abc!"


def test_async_client_concurrent_greedy(server, llm):
    async def run():
        async with server.async_client() as aclient:
            return await asyncio.gather(
                *(
                    aclient.completions.create(
                        model=MODEL,
                        prompt=p,
                        max_tokens=8,
                        temperature=0,
                        extra_body={"return_token_ids": True},
                    )
                    for p in prompts(8, seed=5)
                )
            )

    for prompt, resp in zip(prompts(8, seed=5), asyncio.run(run())):
        assert resp.choices[0].token_ids == offline(llm, prompt, max_tokens=8, temperature=0.0)


# ---- parameters -----------------------------------------------------------------------------------


def test_penalties_and_truncation_match_offline(client, llm):
    prompt = prompts(1, seed=7)[0]
    params = dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.7, min_tokens=3)
    resp = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        presence_penalty=0.5,
        frequency_penalty=0.7,
        user="u1",
        extra_body={"return_token_ids": True, "repetition_penalty": 1.3, "min_tokens": 3, "priority": 0},
    )
    assert resp.choices[0].token_ids == offline(llm, prompt, max_tokens=12, temperature=0.0, **params)
    # top_k=1 and min_p=1 keep only the argmax: sampling at temperature 1 is greedy.
    want = greedy(client, prompt).choices[0].token_ids
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        got = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=12,
            temperature=1.0,
            top_p=0.9,
            seed=1,
            extra_body={"return_token_ids": True, **extra},
        )
        assert got.choices[0].token_ids == want


def test_seed_logit_bias_and_n(client):
    kw = dict(
        model=MODEL,
        prompt="xyz",
        max_tokens=8,
        temperature=1.0,
        seed=11,
        extra_body={"return_token_ids": True},
    )
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].token_ids == b.choices[0].token_ids
    resp = client.completions.create(**{**kw, "n": 3})
    assert sorted(c.index for c in resp.choices) == [0, 1, 2]
    biased = client.completions.create(**{**kw, "logit_bias": {"42": 100}})
    assert biased.choices[0].token_ids == [42] * 8


def test_eos_ignore_eos_stop_token_ids_and_min_tokens(client):
    eos = {"logit_bias": {str(EOS_ID): 100}}
    stopped = client.completions.create(model=MODEL, prompt="ab", max_tokens=6, temperature=0, **eos)
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1
    kept = client.completions.create(
        model=MODEL, prompt="ab", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}, **eos
    )
    assert kept.choices[0].finish_reason == "length" and kept.usage.completion_tokens == 6
    prompt = prompts(1, seed=9)[0]
    ids = greedy(client, prompt).choices[0].token_ids
    stop_id = ids[2]
    first = ids.index(stop_id)
    cut = greedy(client, prompt, stop_token_ids=[stop_id]).choices[0]
    assert cut.token_ids == ids[: first + 1] and cut.finish_reason == "stop" and cut.stop_reason == stop_id
    late = greedy(client, prompt, stop_token_ids=[ids[0]], min_tokens=4).choices[0]
    assert len(late.token_ids) >= 4


def test_a_stop_tokens_text_shows_only_with_include_stop_str_in_output(client, model_dir):
    tokenizer = load_tokenizer(model_dir)
    prompt = prompts(1, seed=9)[0]
    full = greedy(client, prompt).choices[0]
    ids = full.token_ids
    at = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i] and tokenizer.decode([ids[i]]))
    upto = greedy(client, prompt, max_tokens=at + 1).choices[0].text  # the stop token's text included
    hidden = greedy(client, prompt, stop_token_ids=[full.token_ids[at]]).choices[0]
    shown = greedy(
        client, prompt, stop_token_ids=[full.token_ids[at]], include_stop_str_in_output=True
    ).choices[0]
    assert hidden.token_ids == shown.token_ids == full.token_ids[: at + 1]
    assert shown.text == upto and upto.startswith(hidden.text) and len(hidden.text) < len(upto)


def test_generation_config_defaults_fill_the_unset_fields_only(tmp_path_factory):
    """A checkpoint whose generation_config.json says temperature 0 and max_new_tokens 5: a chat
    request that sets neither is greedy and at most 5 tokens long; set fields are kept."""
    root = tmp_path_factory.mktemp("gencfg")
    ckpt = make_checkpoint("qwen3", root / "qwen3")
    cfg_file = ckpt / "generation_config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    cfg_file.write_text(json.dumps({**cfg, "temperature": 0.0, "max_new_tokens": 5}))
    srv = RemoteServer(
        ckpt, ["--served-model-name", MODEL, "--chat-template", CHAT_TEMPLATE, "--num-blocks", "64"]
    )
    try:
        client = srv.client()
        messages = [{"role": "user", "content": "abc"}]
        implicit = [client.chat.completions.create(model=MODEL, messages=messages) for _ in range(2)]
        explicit = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=5)
        texts = {r.choices[0].message.content for r in implicit + [explicit]}
        assert len(texts) == 1 and implicit[0].usage.completion_tokens <= 5
        longer = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=9, extra_body={"ignore_eos": True}
        )
        assert longer.usage.completion_tokens == 9
    finally:
        assert srv.terminate() == 0


def test_stop_strings_with_and_without_the_stop_in_the_output(client):
    prompt = prompts(1, seed=12)[0]
    text = greedy(client, prompt, max_tokens=20).choices[0].text
    stop = text[4:6]
    assert len(stop) == 2
    cut_at = text.find(stop)
    plain = greedy(client, prompt, max_tokens=20, stop=[stop]).choices[0]
    assert plain.text == text[:cut_at] and plain.finish_reason == "stop" and plain.stop_reason == stop
    kept = greedy(client, prompt, max_tokens=20, stop=[stop], include_stop_str_in_output=True).choices[0]
    assert kept.text == text[:cut_at] + stop
    chunks = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stop=[stop], stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == plain.text
    kept_chunks = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=20,
        temperature=0,
        stop=[stop],
        stream=True,
        extra_body={"include_stop_str_in_output": True},
    )
    assert "".join(c.choices[0].text for c in kept_chunks) == kept.text


def test_logprobs_and_prompt_logprobs(client):
    prompt = prompts(1, seed=13)[0]
    resp = greedy(client, prompt, max_tokens=6, prompt_logprobs=1)
    c = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 6
    assert all(x <= 0 for x in lp.token_logprobs) and all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    plp = resp.choices[0].prompt_logprobs
    assert plp[0] is None and len(plp) == len(prompt)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "q"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(e.top_logprobs) == 2 for e in content)


def test_prompt_logprobs_entries_are_vllm_logprobs_with_their_rank(server, llm):
    """vLLM serves each prompt_logprobs entry as its Logprob: {"logprob", "rank",
    "decoded_token"} under the token id (the rank was left out here). Values and ranks equal
    the engine's own; chat's list, at the response's top level, has the same fields."""
    prompt = prompts(1, seed=21)[0]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
    resp = server.post("/v1/completions", body)
    assert resp.status_code == 200, resp.text
    served = resp.json()["choices"][0]["prompt_logprobs"]
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2)
    want = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].prompt_logprobs
    assert served[0] is None and len(served) == len(want) == len(prompt)
    for got, entry in zip(served[1:], want[1:]):
        assert got == {
            str(t): {
                "logprob": pytest.approx(float(lp), abs=1e-5),
                "rank": lp.rank,
                "decoded_token": lp.decoded_token,
            }
            for t, lp in entry.items()
        }
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": 1,
        "prompt_logprobs": 1,
    }
    resp = server.post("/v1/chat/completions", chat)
    assert resp.status_code == 200, resp.text
    entries = [e for e in resp.json()["prompt_logprobs"] if e is not None]
    assert entries and all(
        set(v) == {"logprob", "rank", "decoded_token"} for e in entries for v in e.values()
    )


def test_top_logprobs_needs_logprobs_unless_it_is_zero(server):
    """As vLLM: top_logprobs > 0 without logprobs=true is a 400 naming it; 0 (or null) without
    it asks for nothing and is served without logprobs."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
    for logprobs in ({}, {"logprobs": False}):
        err = _error(server.post("/v1/chat/completions", {**chat, **logprobs, "top_logprobs": 2}), 400)
        assert err["param"] == "top_logprobs" and "logprobs" in err["message"]
        for top in (0, None):
            resp = server.post("/v1/chat/completions", {**chat, **logprobs, "top_logprobs": top})
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["logprobs"] is None


def test_logprobs_above_max_logprobs_are_400_naming_the_field(server):
    """The server runs the default max_logprobs (20), as vLLM: more is a 400 in vLLM's words,
    for completions logprobs, chat top_logprobs and prompt_logprobs alike; 20 is served."""
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 2}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
    for path, extra, param, kind in [
        ("/v1/completions", {"logprobs": 21}, "logprobs", "sample"),
        ("/v1/completions", {"prompt_logprobs": 21}, "prompt_logprobs", "prompt"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "sample"),
        ("/v1/chat/completions", {"prompt_logprobs": 96}, "prompt_logprobs", "prompt"),
    ]:
        err = _error(server.post(path, {**(chat if "chat" in path else body), **extra}), 400)
        assert err["param"] == param, err
        assert f"requested {kind} logprobs of" in err["message"] and "max allowed: 20" in err["message"]
    assert server.post("/v1/completions", {**body, "logprobs": 20, "prompt_logprobs": 20}).status_code == 200
    ok = server.post("/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 20})
    assert ok.status_code == 200
    assert server.state()["num_pending"] == 0


def test_cache_salt_separates_tenants_in_the_prefix_cache(server, client):
    """Same prompt: a second unsalted request hits the cache; a new salt misses it (its blocks
    hash apart) and hits only its own blocks on the next request; outputs are unchanged."""
    prompt = prompts(1, seed=14)[0] * 3 + [7] * 40
    want = greedy(client, prompt).choices[0].token_ids

    def hits_of(**extra) -> float:
        before = server.metrics()["vllm:prefix_cache_hits_total"]
        assert greedy(client, prompt, **extra).choices[0].token_ids == want
        return server.metrics()["vllm:prefix_cache_hits_total"] - before

    assert hits_of() > 0
    assert hits_of(cache_salt="tenant-a") == 0
    assert hits_of(cache_salt="tenant-a") > 0
    assert hits_of(cache_salt="tenant-b") == 0


def _stream_frames(server, body: dict) -> list[dict]:
    """The JSON chunks of a streamed /v1/completions answer, [DONE] left out."""
    frames = []
    with httpx.stream(
        "POST",
        server.url("/v1/completions"),
        json={**body, "stream": True},
        headers=server.headers,
        timeout=60,
    ) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                frames.append(json.loads(line[6:]))
    return frames


def test_streamed_text_offsets_equal_the_full_ones_when_text_is_held_back(server, client):
    """Every character of the greedy text could start a stop string that never matches, so each
    frame holds its last character back: the logprobs of held-back tokens go out before their
    text, and the offsets must still count their characters."""
    prompt = prompts(1, seed=15)[0]
    text = greedy(client, prompt, max_tokens=12, ignore_eos=True).choices[0].text
    stops = sorted({c + "\u2603" for c in text})
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 0}
    body.update(stop=stops, ignore_eos=True)
    full = server.post("/v1/completions", body).json()["choices"][0]
    frames = [f["choices"][0] for f in _stream_frames(server, body)]
    assert sum(1 for f in frames if f["logprobs"]) > 1  # the offsets of a later frame are checked
    streamed = {
        k: [x for f in frames if f["logprobs"] for x in f["logprobs"][k]] for k in ("tokens", "text_offset")
    }
    assert "".join(f["text"] for f in frames) == full["text"] == text
    assert streamed["tokens"] == full["logprobs"]["tokens"]
    assert streamed["text_offset"] == full["logprobs"]["text_offset"]


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(client):
    """As vLLM: with include_usage and continuous_usage_stats every chunk carries one choice and
    the usage of that choice so far (its prompt, its tokens); the usage chunk still ends it."""
    prompt = prompts(1, seed=16)[0]
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=6,
            n=2,
            temperature=0,
            stream=True,
            stream_options=options,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
    )
    *deltas, last = chunks
    sent = {0: 0, 1: 0}
    for chunk in deltas:
        assert len(chunk.choices) == 1
        choice = chunk.choices[0]
        sent[choice.index] += len(choice.token_ids)
        usage = chunk.usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), sent[choice.index])
        assert usage.total_tokens == len(prompt) + sent[choice.index]
    assert sent == {0: 6, 1: 6}
    assert last.choices == [] and last.usage.completion_tokens == 12
    chat = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options=options,
            extra_body={"ignore_eos": True},
        )
    )
    *deltas, last = chat
    assert all(c.usage.prompt_tokens == last.usage.prompt_tokens for c in deltas)
    assert deltas[-1].usage.completion_tokens == last.usage.completion_tokens == 4
    # continuous_usage_stats alone asks for nothing (vLLM needs include_usage too)
    plain = client.completions.create(
        model=MODEL, prompt="abc", max_tokens=3, stream=True, stream_options={"continuous_usage_stats": True}
    )
    assert all(c.usage is None for c in plain)


# ---- errors ---------------------------------------------------------------------------------------


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    return err


def test_bad_requests_are_400_with_the_engines_text(server, client):
    err = _error(server.post("/v1/completions", {"model": MODEL, "prompt": "a", "temperature": -1}), 400)
    assert "temperature" in err["message"] and err["param"] == "temperature"
    err = _error(server.post("/v1/completions", {"model": MODEL, "prompt": "a", "bogus_field": 1}), 400)
    assert "bogus_field" in err["message"]
    err = _error(server.post("/v1/completions", {"model": MODEL, "prompt": [5] * 250, "max_tokens": 50}), 400)
    assert "maximum context length is 256" in err["message"] and err["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="a", max_tokens=4, stream=True, top_p=0)
    for prompt, match in (([5, 96], "vocab"), ("", "empty")):  # the tiny model's vocabulary: 96
        err = _error(server.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2}), 400)
        assert match in err["message"] and err["param"] == "prompt", err


def test_a_prompt_id_outside_the_vocabulary_is_a_400_naming_prompt_not_a_500(server, client):
    """A token prompt whose id is negative, or past what a C long holds, is refused as an id
    beyond the vocabulary is (a 400 naming prompt, the engine's text), in a batch too and in a
    stream: the front end decoded the prompt (for streamed text) before the engine checked it,
    and the tokenizer's OverflowError came back as a 500. The server serves on."""
    for prompt in ([5, -1], [2**40], [[5, 6], [2**63]]):
        for stream in (False, True):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": stream}
            err = _error(server.post("/v1/completions", body), 400)
            assert err["param"] == "prompt" and "vocab_size" in err["message"], (prompt, err)
    assert greedy(client, [5, 6], max_tokens=2).choices[0].finish_reason == "length"


def test_a_lone_surrogate_in_a_json_string_is_a_400_naming_the_field_not_a_500(server):
    """JSON's "\ud800" escape (what a JavaScript client sends for a string cut inside a
    surrogate pair), or its raw CESU-8 bytes, decodes to a lone surrogate that no tokenizer or
    UTF-8 encoder takes: the prompt, a chat message, bad_words and the request_id were 500s
    (a tokenizer TypeError, a UnicodeEncodeError). It is a 400 naming the body's field; an
    escaped surrogate pair (an emoji, as json.dumps writes it) is text as any other."""
    cases = [
        ("/v1/completions", b'{"prompt": "a\\ud800", "max_tokens": 2}', "prompt"),
        ("/v1/completions", b'{"prompt": "a\xed\xa0\x80", "max_tokens": 2}', "prompt"),
        ("/v1/completions", b'{"prompt": ["ok", "\\udfff"], "max_tokens": 2}', "prompt"),
        ("/v1/completions", b'{"prompt": "a", "bad_words": ["\\ud800"], "max_tokens": 2}', "bad_words"),
        ("/v1/completions", b'{"prompt": "a", "request_id": "\\udc00", "max_tokens": 2}', "request_id"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages"),
    ]
    headers = {**server.headers, "Content-Type": "application/json"}
    for path, raw, param in cases:
        err = _error(httpx.post(server.url(path), content=raw, headers=headers, timeout=60.0), 400)
        assert err["param"] == param and "surrogate" in err["message"], (raw, err)
    pair = b'{"prompt": "a\\ud83d\\ude00", "max_tokens": 2}'
    resp = httpx.post(server.url("/v1/completions"), content=pair, headers=headers, timeout=60.0)
    assert resp.status_code == 200, resp.text


def test_a_wrong_type_is_a_400_naming_the_field_as_the_body_does(server):
    """param is the body's field, also for the union fields (prompt, stop), whose member types
    pydantic reports under labels that name no field ("prompt.str"); the message is that of the
    member the value matched furthest (a list whose item is wrong: that item)."""
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 2}
    cases = [
        ({"max_tokens": "x"}, "max_tokens", "max_tokens: Input should be a valid integer"),
        ({"stop": [1]}, "stop", "stop.list[str].0: Input should be a valid string"),
        ({"prompt": [[5, "a"]]}, "prompt", "prompt.list[list[int]].0.1: Input should be a valid integer"),
        ({"prompt": 5}, "prompt", "prompt.str: Input should be a valid string"),
        ({"logit_bias": {"5": "x"}}, "logit_bias", "logit_bias.5: Input should be a valid number"),
        (
            {"stream": True, "stream_options": {"include_usage": 2}},
            "stream_options",
            "stream_options.include",
        ),
    ]
    for extra, param, message in cases:
        err = _error(server.post("/v1/completions", {**body, **extra}), 400)
        assert err["param"] == param and err["message"].startswith(message), (extra, err)
    chat = {"model": MODEL, "messages": [1], "max_tokens": 2}
    assert _error(server.post("/v1/chat/completions", chat), 400)["param"] == "messages"


def test_the_context_rule_at_the_front_end(server):
    """A set max_tokens that does not fit beside the prompt is a 400 naming it (vLLM's and
    OpenAI's rule; max_completion_tokens by its own name), a prompt that fills the context a 400
    naming it; an unset one is lowered to the room left (a completion's default 16 here, where
    the engine would have refused prompt + 16 > max_model_len before)."""
    post = server.post
    err = _error(post("/v1/completions", {"model": MODEL, "prompt": [5] * 256, "max_tokens": 1}), 400)
    assert err["param"] == "prompt" and "256 input tokens" in err["message"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 10_000}
    err = _error(post("/v1/chat/completions", body), 400)
    assert err["param"] == "max_completion_tokens" and "too large: 10000" in err["message"]
    for value in (0, -3):  # below the bound: named as the client named it, too
        err = _error(post("/v1/chat/completions", {**body, "max_completion_tokens": value}), 400)
        assert err["param"] == "max_completion_tokens" and f"got {value}" in err["message"]
    resp = post("/v1/completions", {"model": MODEL, "prompt": [5] * 250, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert resp.json()["usage"]["completion_tokens"] == 6 and choice["finish_reason"] == "length"


def test_a_min_tokens_the_context_cannot_hold_is_400_when_max_tokens_is_unset(server):
    """An unset max_tokens is lowered to the room the prompt leaves (test above); a min_tokens
    above that room cannot be honoured, so it is a 400 naming min_tokens and the bound, as vLLM
    answers (its SamplingParams refuses min_tokens > the lowered max_tokens), for completions
    as for chat (a completion came back 200 with fewer tokens than min_tokens asked). A
    min_tokens that fits is served in full."""
    body = {"model": MODEL, "prompt": [5] * 250, "ignore_eos": True}
    for extra in ({"min_tokens": 10}, {"min_tokens": 10, "stream": True}):
        err = _error(server.post("/v1/completions", {**body, **extra}), 400)
        assert err["param"] == "min_tokens" and "10" in err["message"] and "6" in err["message"], err
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "a" * 240}], "min_tokens": 20}
    assert _error(server.post("/v1/chat/completions", chat), 400)["param"] == "min_tokens"
    resp = server.post("/v1/completions", {**body, "min_tokens": 6})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 6, resp.text


def test_skip_special_tokens_is_honoured(server, llm):
    """vLLM's extra field: false shows special tokens in the text, decoded in the front end (no
    stop strings) or in the engine (stop strings); true, the default, leaves them out."""
    body = {"model": MODEL, "prompt": "a", "max_tokens": 3, "temperature": 0, "logit_bias": {"2": 100}}
    for extra in ({}, {"stop": ["never"]}):
        texts = [
            server.post("/v1/completions", {**body, **extra, **flag}).json()["choices"][0]["text"]
            for flag in ({}, {"skip_special_tokens": False, "spaces_between_special_tokens": False})
        ]
        assert texts == ["", "<s><s><s>"], extra
    ids = offline(llm, [4], max_tokens=3, temperature=0.0, logit_bias={2: 100.0})
    assert ids == [2, 2, 2] and llm.get_tokenizer().convert_ids_to_tokens(2) == "<s>"


def test_chat_content_parts_text_joined_other_parts_refused(server, client):
    """Text parts are joined with "\n" (vLLM's separator; chat_utils, which LLM.chat uses too)."""
    plain = [{"role": "user", "content": "hel\nlo"}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}]

    def tokens(messages):
        return server.post("/tokenize", {"messages": messages}).json()["tokens"]

    assert tokens(parts) == tokens(plain) != tokens([{"role": "user", "content": "hello"}])
    kw = dict(model=MODEL, max_tokens=6, temperature=0)
    want = client.chat.completions.create(messages=plain, **kw).choices[0].message.content
    assert client.chat.completions.create(messages=parts, **kw).choices[0].message.content == want
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [image]}]}
    err = _error(server.post("/v1/chat/completions", body), 400)
    assert err["param"] == "messages" and "image_url" in err["message"]


def test_vllms_chat_template_fields_render_as_llm_chat(server, client, llm):
    """continue_final_message, add_generation_prompt and chat_template_kwargs (vLLM's extra
    fields) give the prompt and the greedy reply LLM.chat gives with the same keywords."""
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Yo"}]
    fields = {"add_generation_prompt": False, "continue_final_message": True}
    resp = client.chat.completions.create(
        model=MODEL,
        messages=conv,
        max_tokens=6,
        temperature=0,
        extra_body={**fields, "chat_template_kwargs": {"unused": 1}, "return_token_ids": True},
    )
    params = SamplingParams(max_tokens=6, temperature=0.0)
    want = llm.chat(conv, params, use_tqdm=False, chat_template=CHAT_TEMPLATE, **fields)[0]
    assert want.prompt == "u:hi;a:Yo"
    assert resp.prompt_token_ids == want.prompt_token_ids
    assert resp.choices[0].token_ids == want.outputs[0].token_ids
    assert server.post("/tokenize", {"messages": conv, **fields}).json()["tokens"] == want.prompt_token_ids
    body = {"model": MODEL, "max_tokens": 2, "messages": conv}
    err = _error(server.post("/v1/chat/completions", {**body, "continue_final_message": True}), 400)
    assert err["param"] == "continue_final_message" and "add_generation_prompt" in err["message"]
    err = _error(server.post("/v1/chat/completions", {**body, "chat_template": "{{ 1 }}"}), 400)
    assert err["param"] == "chat_template" and "--trust-request-chat-template" in err["message"]


def test_seed_outside_int64_is_400_naming_seed_and_the_bound(server):
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 2, "temperature": 1.0}
    for seed in (2**63, 2**64, -(2**63) - 1):
        err = _error(server.post("/v1/completions", {**body, "seed": seed}), 400)
        assert err["param"] == "seed" and "922337203685477580" in err["message"]
    for seed in (2**63 - 1, -(2**63)):
        assert server.post("/v1/completions", {**body, "seed": seed}).status_code == 200


def test_stream_options_without_stream_is_400(server):
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 2}
    for options in ({"include_usage": True}, {"include_usage": False}, {"continuous_usage_stats": True}):
        for stream in ({}, {"stream": False}):
            err = _error(server.post("/v1/completions", {**body, **stream, "stream_options": options}), 400)
            assert err["param"] == "stream_options" and "stream" in err["message"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
    err = _error(
        server.post("/v1/chat/completions", {**chat, "stream_options": {"include_usage": True}}), 400
    )
    assert err["param"] == "stream_options"
    # as vLLM: an empty or null stream_options sets nothing, so it is no error
    for options in ({}, None):
        assert server.post("/v1/completions", {**body, "stream_options": options}).status_code == 200


def test_prompt_logprobs_with_stream_is_400(server):
    """As vLLM: a stream has no place for prompt logprobs, so asking for them is refused (they
    were computed, the prefix cache skipped for them, and then dropped); 0 passes, as in vLLM."""
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 2, "stream": True}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 2, "stream": True}
    for path, base in (("/v1/completions", body), ("/v1/chat/completions", chat)):
        err = _error(server.post(path, {**base, "prompt_logprobs": 1}), 400)
        assert err["param"] == "prompt_logprobs" and "stream" in err["message"]
        assert server.post(path, {**base, "prompt_logprobs": 0}).status_code == 200
    assert server.state()["num_pending"] == 0


def test_priority_needs_priority_scheduling(server):
    """The server runs the default fcfs policy: a priority other than 0 would be ignored."""
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 2}
    for priority in (5, -1):
        err = _error(server.post("/v1/completions", {**body, "priority": priority}), 400)
        assert err["param"] == "priority" and "--scheduling-policy priority" in err["message"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 2, "priority": 1}
    assert _error(server.post("/v1/chat/completions", chat), 400)["param"] == "priority"
    assert server.post("/v1/completions", {**body, "priority": 0}).status_code == 200


def test_priority_is_taken_under_priority_scheduling():
    body = CompletionRequest(prompt="a", priority=5)
    _check_request(SimpleNamespace(engine=SimpleNamespace(priority_scheduling=True)), body)
    with pytest.raises(APIError) as info:
        _check_request(SimpleNamespace(engine=SimpleNamespace(priority_scheduling=False)), body)
    assert info.value.param == "priority"


def test_an_empty_cache_salt_is_refused_by_name():
    """vLLM refuses cache_salt "": taken, it named a tenant of its own, so a client sending it
    for "no salt" silently missed the prefix cache the unsalted requests share."""
    ctx = SimpleNamespace(engine=SimpleNamespace(priority_scheduling=False))
    _check_request(ctx, CompletionRequest(prompt="a", cache_salt="tenant-a"))
    _check_request(ctx, CompletionRequest(prompt="a"))
    with pytest.raises(APIError) as info:
        _check_request(ctx, CompletionRequest(prompt="a", cache_salt=""))
    assert info.value.status == 400 and info.value.param == "cache_salt"


def test_a_request_larger_than_the_admission_capacity_is_400_not_503(server):
    """Capacity is 16 running + 512 waiting samples: a request of more samples never fits, even
    on an idle server, so it is the client's error, not a busy server's (503 is retried)."""
    err = _error(
        server.post("/v1/completions", {"model": MODEL, "prompt": ["ab"] * 5, "n": 256, "max_tokens": 1}), 400
    )
    assert err["param"] == "n" and "1280" in err["message"] and "528" in err["message"]
    many = [[5, 6, 7]] * 529
    err = _error(server.post("/v1/completions", {"model": MODEL, "prompt": many, "max_tokens": 1}), 400)
    assert err["param"] == "prompt" and "529" in err["message"] and "528" in err["message"]
    assert server.state()["num_pending"] == 0


def test_null_is_unset_for_the_openai_fields(server):
    """OpenAI's schema marks these nullable: null means "unset" (n was a 400 'valid integer')."""
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    want = server.post("/v1/completions", body).json()["choices"][0]["token_ids"]
    nulls = ["n", "top_p", "stop", "logprobs", "seed", "presence_penalty", "frequency_penalty"]
    nulls += ["logit_bias", "user", "stream", "stream_options", "echo", "suffix", "best_of"]
    resp = server.post("/v1/completions", {**body, **dict.fromkeys(nulls)})
    assert resp.status_code == 200, resp.text
    assert [c["token_ids"] for c in resp.json()["choices"]] == [want]  # n null: one choice
    loose = server.post("/v1/completions", {**body, "temperature": None, "max_tokens": None})
    assert loose.status_code == 200 and len(loose.json()["choices"][0]["token_ids"]) <= 16
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "temperature": 0}
    nulls = ["n", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "response_format"]
    nulls += ["tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "store", "seed"]
    resp = server.post("/v1/chat/completions", {**chat, "max_tokens": 3, **dict.fromkeys(nulls)})
    assert resp.status_code == 200 and len(resp.json()["choices"]) == 1, resp.text


def test_vllms_sampling_extras_allowed_ids_bad_words_and_xargs(server, llm):
    """vLLM's extra fields (they were 400s "Extra inputs are not permitted"): allowed_token_ids
    and bad_words act as offline, vllm_xargs (SamplingParams.extra_args) is taken."""
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    free = server.post("/v1/completions", body).json()["choices"][0]["token_ids"]
    word = llm.get_tokenizer().decode(free[:1])
    for extra, params in (
        ({"allowed_token_ids": [40, 41]}, {"allowed_token_ids": [40, 41]}),
        ({"bad_words": [word]}, {"bad_words": [word]}),
    ):
        resp = server.post("/v1/completions", {**body, **extra, "vllm_xargs": {"plugin": [1, "a"]}})
        assert resp.status_code == 200, resp.text
        got = resp.json()["choices"][0]["token_ids"]
        assert got == offline(llm, [5, 6, 7], max_tokens=8, temperature=0.0, **params) != free
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 4}
    resp = server.post("/v1/chat/completions", {**chat, "bad_words": ["x"], "allowed_token_ids": [40]})
    assert resp.json()["choices"][0]["message"]["content"] == "EEEE", resp.text
    err = _error(server.post("/v1/completions", {**body, "bad_words": ["ok", ""]}), 400)
    assert err["param"] == "bad_words" and "non-empty" in err["message"]


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(server):
    """vLLM's truncate_prompt_tokens: k keeps the last k prompt tokens, -1 what max_tokens
    leaves of the context (256 here); k above that, 0 and below -1 are 400s naming it."""
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    prompt = list(range(4, 94)) * 4  # 360 tokens: more than the context
    cut = server.post("/v1/completions", {**body, "prompt": prompt, "truncate_prompt_tokens": 9}).json()
    tail = server.post("/v1/completions", {**body, "prompt": prompt[-9:]}).json()
    assert cut["usage"]["prompt_tokens"] == 9
    assert cut["choices"][0]["token_ids"] == tail["choices"][0]["token_ids"]
    most = server.post("/v1/completions", {**body, "prompt": prompt, "truncate_prompt_tokens": -1})
    assert most.json()["usage"]["prompt_tokens"] == 250, most.text
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "abcdef"}], "max_tokens": 2}
    resp = server.post("/v1/chat/completions", {**chat, "truncate_prompt_tokens": 3})
    assert resp.json()["usage"]["prompt_tokens"] == 3, resp.text
    for k in (251, 0, -2):
        err = _error(
            server.post("/v1/completions", {**body, "prompt": prompt, "truncate_prompt_tokens": k}), 400
        )
        assert err["param"] == "truncate_prompt_tokens", err


def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(server):
    """vLLM's return_tokens_as_token_ids: logprob tokens read "token_id:N" (completions'
    tokens and top_logprobs keys, chat's token fields); the text is unchanged."""
    body = {"model": MODEL, "prompt": [5, 6], "max_tokens": 3, "temperature": 0, "logprobs": 2}
    plain = server.post("/v1/completions", {**body, "return_token_ids": True}).json()["choices"][0]
    named = server.post("/v1/completions", {**body, "return_tokens_as_token_ids": True}).json()["choices"][0]
    assert named["logprobs"]["tokens"] == [f"token_id:{t}" for t in plain["token_ids"]]
    assert all(key.startswith("token_id:") for top in named["logprobs"]["top_logprobs"] for key in top)
    assert named["text"] == plain["text"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 2, "temperature": 0}
    chat.update(logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True, return_token_ids=True)
    choice = server.post("/v1/chat/completions", chat).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(e["top_logprobs"][0]["token"].startswith("token_id:") for e in content)


def test_an_empty_model_name_is_the_served_model(server):
    """As vLLM: "" (like an absent model) names the served model; an unknown name is a 404."""
    resp = server.post("/v1/completions", {"model": "", "prompt": "abc", "max_tokens": 2})
    assert resp.status_code == 200 and resp.json()["model"] == MODEL, resp.text
    chat = {"model": "", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
    assert server.post("/v1/chat/completions", chat).json()["model"] == MODEL
    assert server.post("/tokenize", {"model": "", "prompt": "ab"}).status_code == 200


def test_a_clients_request_id_names_the_response_and_may_be_shared(server):
    """As vLLM: the response id is "cmpl-" / "chatcmpl-" + the X-Request-Id header, else the
    body's request_id (vLLM's extra field), else a fresh uuid. The engine's request ids stay the
    server's own, so two requests in flight under one client id both run (none is refused as
    an id in use)."""
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 3}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 3}
    named = {**server.headers, "X-Request-Id": "trace-1"}
    assert server.post("/v1/completions", {**body, "request_id": "mine"}).json()["id"] == "cmpl-mine"
    resp = httpx.post(server.url("/v1/completions"), json={**body, "request_id": "mine"}, headers=named)
    assert resp.json()["id"] == "cmpl-trace-1"
    resp = httpx.post(server.url("/v1/chat/completions"), json=chat, headers=named)
    assert resp.json()["id"] == "chatcmpl-trace-1"
    streamed = _stream_frames(server, {**body, "request_id": "mine"})
    assert streamed and {f["id"] for f in streamed} == {"cmpl-mine"}
    httpx.post(server.url("/dev/pause"))
    try:
        with ThreadPoolExecutor(2) as pool:
            calls = [
                pool.submit(httpx.post, server.url("/v1/completions"), json=body, headers=named, timeout=60)
                for _ in range(2)
            ]
            deadline = time.monotonic() + 30
            while server.state()["num_pending"] < 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # both accepted: in flight together (the engine is paused)
            assert server.state()["num_pending"] == 2
            httpx.post(server.url("/dev/resume"))
            replies = [call.result() for call in calls]
    finally:
        httpx.post(server.url("/dev/resume"))
    assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
    assert [r.json()["id"] for r in replies] == ["cmpl-trace-1"] * 2


def test_version_route(server):
    from enginespec import __version__

    resp = httpx.get(server.url("/version"))  # no key needed, as /health
    assert resp.status_code == 200 and resp.json() == {"version": __version__}


def test_known_unsupported_openai_fields_are_refused_by_name_no_ops_are_taken(server, client):
    """Named ("`tools` is not supported by this server"), not "Extra inputs are not permitted",
    which reads like a typo; a value that asks nothing is served; an unknown field stays refused."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 2}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 2}
    refused = [
        (body, "suffix", "x"),
        (body, "best_of", 2),
        (chat, "functions", [{"name": "f"}]),
        (chat, "function_call", {"name": "f"}),
        (chat, "store", True),
    ]
    for base, name, value in refused:
        path = "/v1/chat/completions" if base is chat else "/v1/completions"
        err = _error(server.post(path, {**base, name: value}), 400)
        assert err["param"] == name and err["message"] == f"`{name}` is not supported by this server"
    # tools: "auto" (their default) needs the server's tool flags; a named function must be listed
    err = _error(server.post("/v1/chat/completions", {**chat, "tools": tools}), 400)
    assert (
        err["param"] == "tool_choice" and "--enable-auto-tool-choice and --tool-call-parser" in err["message"]
    )
    named = {"type": "function", "function": {"name": "g"}}
    err = _error(server.post("/v1/chat/completions", {**chat, "tools": tools, "tool_choice": named}), 400)
    assert err["param"] == "tool_choice" and "'g', which is not among the tools" in err["message"]
    err = _error(server.post("/v1/chat/completions", {**chat, "tools": [], "tool_choice": "auto"}), 400)
    assert err["param"] == "tools" and "must not be an empty array" in err["message"]  # vLLM's, OpenAI's
    for extra in ({"echo": False}, {"suffix": ""}, {"best_of": 1}, {"best_of": 2, "n": 2}):
        assert server.post("/v1/completions", {**body, **extra}).status_code == 200, extra
    no_ops = [
        {"response_format": {"type": "text"}},
        {"tool_choice": "none"},
        {"tools": tools, "tool_choice": "none"},  # shown to the template, no calls parsed (vLLM's default)
        {"tools": tools, "tool_choice": "none", "parallel_tool_calls": False},
        {"store": False},
    ]
    for extra in no_ops:
        assert server.post("/v1/chat/completions", {**chat, **extra}).status_code == 200, extra
    messages = [{"role": "user", "content": "hi"}]
    resp = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, response_format={"type": "text"}, tool_choice="none"
    )
    assert resp.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError, match="`suffix` is not supported"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, suffix="x")
    # vLLM's chat echo (not OpenAI's): taken; a final user message is not echoed
    resp = server.post("/v1/chat/completions", {**chat, "echo": True, "temperature": 0})
    assert resp.status_code == 200 and not resp.json()["choices"][0]["message"]["content"].startswith("q")


def test_response_format_json_schema_in_the_openai_client_s_shape(server, client):
    """The openai client's response_format reaches the engine as a JSON schema constraint:
    the tiny tokenizer has no "}", so the output is a cut-short prefix of an object."""
    pytest.importorskip("xgrammar")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "obj", "schema": schema, "strict": True}}
    messages = [{"role": "user", "content": "hi"}]
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, response_format=fmt)
    assert resp.choices[0].message.content == '{"a":' and resp.choices[0].finish_reason == "length"


def test_unknown_model_is_404_and_bad_key_is_401(server, client):
    _error(server.post("/v1/completions", {"model": "nope", "prompt": "a"}), 404)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="a")
    _error(httpx.post(server.url("/v1/completions"), json={"model": MODEL, "prompt": "a"}), 401)
    with pytest.raises(openai.AuthenticationError):
        server.client().with_options(api_key="wrong").models.list()


def test_engine_fault_is_500_then_an_error_frame_mid_stream(server):
    assert httpx.post(server.url("/dev/fail_next_step")).status_code == 200
    _error(server.post("/v1/completions", {"model": MODEL, "prompt": "abc", "max_tokens": 4}), 500)
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", server.url("/v1/completions"), json=body, headers=server.headers, timeout=60
    ) as resp:
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert '"choices"' in first
        httpx.post(server.url("/dev/fail_next_step"))
        rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]" and '"error"' in rest[-2] and '"code":500' in rest[-2]
    assert server.wait_idle()["num_free_blocks"] == server.state()["num_blocks"]
    assert httpx.get(server.url("/health")).status_code == 200  # the engine serves on


# ---- disconnects and load -------------------------------------------------------------------------


def test_disconnect_mid_stream_frees_the_blocks_before_another_step(server):
    body = {"model": MODEL, "prompt": "abcdef" * 6, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", server.url("/v1/completions"), json=body, headers=server.headers, timeout=60
    ) as resp:
        lines = resp.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data:"))
        httpx.post(server.url("/dev/pause"))
        paused = server.state()
        assert paused["num_unfinished"] == 1 and paused["num_free_blocks"] < paused["num_blocks"]
    try:
        state = server.wait_idle()
        assert state["num_steps"] == paused["num_steps"]  # freed without a single further step
        assert state["num_free_blocks"] == state["num_blocks"]
        metrics = server.metrics()
        assert metrics["vllm:kv_cache_usage_perc"] == 0 and metrics["vllm:num_requests_running"] == 0
    finally:
        httpx.post(server.url("/dev/resume"))


def test_a_client_leaving_a_queued_non_streaming_request_aborts_it(server):
    httpx.post(server.url("/dev/pause"))
    try:
        before = server.state()
        body = {"model": MODEL, "prompt": "abc", "max_tokens": 50}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url("/v1/completions"), json=body, headers=server.headers, timeout=0.5)
        state = server.wait_idle()
        assert state["num_unfinished"] == 0 and state["num_pending"] == 0
        assert state["num_steps"] == before["num_steps"]  # it never ran: the engine was paused
    finally:
        httpx.post(server.url("/dev/resume"))


def _successes(server, reason: str) -> float:
    return sum(
        v
        for k, v in server.metrics().items()
        if k.startswith("vllm:request_success_total") and f'finished_reason="{reason}"' in k
    )


def test_request_success_counts_an_abort_per_sample_like_a_finish(server):
    """vllm:request_success_total counts samples (vLLM V1 fans n > 1 out into child requests):
    n=4 adds 4 under its finish reason, and 4 under "abort" when the client leaves."""
    body = {"model": MODEL, "prompt": "abc", "n": 4, "ignore_eos": True}
    length = _successes(server, "length")
    assert server.post("/v1/completions", {**body, "max_tokens": 3}).status_code == 200
    assert _successes(server, "length") - length == 4
    aborted = _successes(server, "abort")
    with httpx.stream(
        "POST",
        server.url("/v1/completions"),
        json={**body, "max_tokens": 200, "stream": True},
        headers=server.headers,
        timeout=60,
    ) as resp:
        next(line for line in resp.iter_lines() if line.startswith("data:"))
        httpx.post(server.url("/dev/pause"))  # no sample can finish before the abort
    try:
        assert server.wait_idle()["num_pending"] == 0
        assert _successes(server, "abort") - aborted == 4
    finally:
        httpx.post(server.url("/dev/resume"))


def test_latency_histograms_count_samples_like_request_success(server):
    """vLLM V1 observes each child request of n > 1: n=3 adds 3 to request_success and 3 to the
    e2e, TTFT and queue-time histograms (they added 1), and a sample's inter-token latency is its
    own (the siblings' tokens of one step added zero-latency observations)."""
    names = ["e2e_request_latency", "time_to_first_token", "request_queue_time", "inter_token_latency"]
    keys = [f"vllm:{name}_seconds_count" for name in names]
    before, length = server.metrics(), _successes(server, "length")
    body = {"model": MODEL, "prompt": "abc", "n": 3, "max_tokens": 4, "ignore_eos": True, "temperature": 1}
    assert server.post("/v1/completions", body).status_code == 200
    after = server.metrics()
    e2e, ttft, queue, itl = (after[k] - before[k] for k in keys)
    assert _successes(server, "length") - length == 3
    assert (e2e, ttft, queue) == (3, 3, 3)
    assert itl <= 3 * 3  # at most one per later token of each sample


async def _load_client(server, rng: random.Random, prompt: list[int]):
    """One streaming client: a bad request, a disconnect after a few chunks, or a full greedy run."""
    kind = rng.choice(["full", "full", "disconnect", "bad"])
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
    }
    if kind == "bad":
        name, value = rng.choice([("temperature", -1.0), ("bogus_field", 1), ("top_p", 0.0), ("n", 0)])
        body[name] = value
    keep = rng.randint(1, 5)
    async with httpx.AsyncClient(timeout=60, headers=server.headers) as http:
        async with http.stream("POST", server.url("/v1/completions"), json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return kind, resp.status_code, None
            ids, seen = [], 0
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                seen += 1
                if kind == "disconnect" and seen >= keep:
                    return kind, 200, None
                ids.extend(httpx.Response(200, content=line[5:]).json()["choices"][0]["token_ids"])
            return kind, 200, ids


def test_load_64_streaming_clients_with_disconnects_and_bad_requests(server, llm):
    rng = random.Random(0)
    work = prompts(64, seed=21)

    async def run():
        return await asyncio.wait_for(
            asyncio.gather(*(_load_client(server, random.Random(rng.random()), p) for p in work)), 60
        )

    results = asyncio.run(run())
    state = server.wait_idle()
    assert state["num_free_blocks"] == state["num_blocks"] and state["num_unfinished"] == 0
    done = [(p, ids) for p, (kind, status, ids) in zip(work, results) if ids is not None]
    assert all(status == 400 for kind, status, _ in results if kind == "bad")
    assert done, "some clients must complete"
    want = llm.generate(
        [{"prompt_token_ids": p} for p, _ in done],
        SamplingParams(max_tokens=24, temperature=0.0),
        use_tqdm=False,
    )
    assert [ids for _, ids in done] == [out.outputs[0].token_ids for out in want]


def test_reset_prefix_cache_forgets_cached_prompts_and_refuses_while_blocks_are_held(server):
    """POST /reset_prefix_cache (vLLM's dev endpoint): a prompt served from the cache the second
    time is computed in full after it; while a request holds blocks the answer is a 409 and the
    cache stays."""
    body = {"model": MODEL, "prompt": list(range(10, 60)), "max_tokens": 2, "temperature": 0}

    def hits_of_one_request() -> int:
        before = server.wait_idle()["num_prefix_hits"]
        assert server.post("/v1/completions", body).status_code == 200
        return server.wait_idle()["num_prefix_hits"] - before

    hits_of_one_request()
    assert hits_of_one_request() >= 32  # two full blocks of 16 served from the cache
    reset = server.post("/reset_prefix_cache", {})
    assert reset.status_code == 200 and reset.json() == {"reset": True}
    assert hits_of_one_request() == 0
    long = {"model": MODEL, "prompt": "abcdef" * 6, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", server.url("/v1/completions"), json=long, headers=server.headers, timeout=60
    ) as resp:
        lines = resp.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        refused = server.post("/reset_prefix_cache", {})
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "ConflictError"
    assert hits_of_one_request() >= 32  # the refused reset left the cache as it was


def test_a_profile_traces_the_engine_process_and_calls_out_of_order_are_409s(server, profile_dir):
    """POST /start_profile, a completion, POST /stop_profile (vLLM's routes, there because the
    server started with --profiler-config, which was "unrecognized arguments", exit 2) write one
    gzipped trace (vLLM's default) whose events are the engine process's, its steps'
    `enginespec.` ranges among them. A stop with no profile running and a second start are
    409s, and the server serves on."""
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    refused = server.post("/stop_profile", {})
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "ConflictError"
    assert server.post("/start_profile", {}).status_code == 200
    again = server.post("/start_profile", {})
    assert again.status_code == 409 and "already running" in again.json()["error"]["message"]
    assert server.post("/v1/completions", body).json()["usage"]["completion_tokens"] == 3
    stopped = server.post("/stop_profile", {})
    assert stopped.status_code == 200 and stopped.content == b""
    (trace,) = profile_dir.glob("*.pt.trace.json.gz")
    with gzip.open(trace, "rt", errors="replace") as f:  # with_stack: pytorch/pytorch#64345
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    names = {e["name"] for e in events}
    assert {"enginespec.schedule", "enginespec.execute"} <= names
    assert {e["pid"] for e in events if e["name"].startswith("enginespec.")} == {server.state()["engine_pid"]}
    assert server.post("/v1/completions", body).status_code == 200


def test_sleep_and_wake_up_over_http_keep_greedy_outputs_and_refuse_requests_while_asleep(server):
    """vLLM's dev-mode sleep routes on a real server (--enable-sleep-mode): asleep, a completion
    is a 503 naming wake_up and nothing runs; a partial wake keeps it asleep; after a full wake
    the greedy output is the one before sleep, its prompt computed in full (the cache is gone)."""
    body = {"model": MODEL, "prompt": list(range(10, 60)), "max_tokens": 8, "temperature": 0}
    want = server.post("/v1/completions", body).json()["choices"][0]["text"]
    server.wait_idle()
    try:
        assert server.post("/sleep?level=1", {}).json() == {"is_sleeping": True}
        assert httpx.get(server.url("/is_sleeping"), timeout=10).json() == {"is_sleeping": True}
        refused = server.post("/v1/completions", body)
        assert refused.status_code == 503 and "wake_up()" in refused.json()["error"]["message"]
        assert server.post("/wake_up?tags=weights", {}).json() == {"is_sleeping": True}
    finally:
        woke = server.post("/wake_up", {})
    assert woke.status_code == 200 and woke.json() == {"is_sleeping": False}
    before = server.wait_idle()["num_prefix_hits"]
    assert server.post("/v1/completions", body).json()["choices"][0]["text"] == want
    assert server.wait_idle()["num_prefix_hits"] == before


def test_echo_scores_a_prompt_through_the_openai_client(client):
    """lm-evaluation-harness's log-likelihood call: echo, max_tokens 0, logprobs 1 (the parsed
    Completion types take a null first logprob and top entry)."""
    resp = client.completions.create(model=MODEL, prompt="hello", max_tokens=0, echo=True, logprobs=1)
    (choice,) = resp.choices
    lps = choice.logprobs
    assert choice.text == "hello" and choice.finish_reason == "length"
    assert lps.token_logprobs[0] is None and lps.top_logprobs[0] is None
    assert len(lps.tokens) == resp.usage.prompt_tokens and all(lp <= 0 for lp in lps.token_logprobs[1:])
    assert resp.usage.completion_tokens == 0
