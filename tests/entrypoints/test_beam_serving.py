"""use_beam_search on /v1/completions and /v1/chat/completions (entrypoints/openai/serving_beam.py
states the rules, vLLM's server's): the app over an in-process engine, driven by the official
openai client (and httpx for the error bodies), against LLM.beam_search on the same checkpoint
and engine settings. n=1 is greedy decoding; n=3 gives the offline search's best 3 sequences as
the choices, in order, with their finish_reason (EOS in play); chat searches from the rendered
prompt; logprobs come from the step that chose each token; a stream is a frame a whole
choice; fields a beam search cannot honour are 400s naming them; a client that leaves ends the
search."""

from __future__ import annotations

import asyncio

import pytest

from enginespec.beam_search import BeamSearchParams
from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.protocol import CompletionRequest
from enginespec.entrypoints.openai.serving import ServerContext, create_completion
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import EOS_ID, tiny_model_dir
from tests.entrypoints.client_helpers import in_process_client, run_with_clients
from tests.entrypoints.remote_server import CHAT_TEMPLATE

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=256, max_num_seqs=16)
# EOS is among the two likeliest first tokens after [76, 25] (tests/api/test_beam_search.py): a
# beam of 3 sets an EOS-ended sequence aside at the first step
EOS_PROMPT = [76, 25]
PROMPTS = [[5, 6, 7], [40, 41, 42, 43], EOS_PROMPT]


@pytest.fixture(scope="module")
def llm():
    return LLM(str(tiny_model_dir("qwen3")), **ENGINE)


@pytest.fixture(scope="module")
def app():
    with in_process_client(**ENGINE) as engine:
        ctx = ServerContext(
            engine, engine.tokenizer, ["tiny"], engine.info.max_model_len, chat_template=CHAT_TEMPLATE
        )
        yield build_app(ctx, ServerMetrics("tiny")), engine, ctx


def serve(app, fn):
    """fn(openai client, httpx client) run against the app (client_helpers.run_with_clients)."""
    app, engine, _ = app
    return run_with_clients(app, engine, fn)


def beam_completions(app, prompt, **extra):
    async def fn(client, http):
        return await client.completions.create(model="tiny", prompt=prompt, extra_body=extra)

    return serve(app, fn)


def expected(llm, prompt, seq, include_stop: bool = False):
    """(text, token_ids) of an offline sequence as the server answers it: generated ids only, the
    ending EOS in the ids with include_stop_str_in_output, never in the text."""
    generated = seq.tokens[len(prompt) :]
    shown = generated[:-1] if seq.finish_reason == "stop" else generated
    return llm.get_tokenizer().decode(shown, skip_special_tokens=True), generated if include_stop else shown


def test_n_1_is_greedy_decoding(app, llm):
    for prompt in PROMPTS[:2]:
        greedy = llm.generate(
            [{"prompt_token_ids": prompt}], SamplingParams(max_tokens=6, temperature=0), use_tqdm=False
        )
        assert EOS_ID not in greedy[0].outputs[0].token_ids  # an EOS would end greedy, not the beam
        body = dict(use_beam_search=True, n=1, max_tokens=6, temperature=0, return_token_ids=True)
        resp = beam_completions(app, prompt, **body)
        (choice,) = resp.choices
        assert choice.text == greedy[0].outputs[0].text
        assert choice.token_ids == greedy[0].outputs[0].token_ids
        assert choice.finish_reason == "length"


@pytest.mark.parametrize("length_penalty, include_stop", [(1.0, False), (0.0, True)])
def test_n_3_choices_are_the_offline_search_in_order(app, llm, length_penalty, include_stop):
    params = BeamSearchParams(
        beam_width=3, max_tokens=4, length_penalty=length_penalty, include_stop_str_in_output=include_stop
    )
    want = llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS], params)
    resp = beam_completions(
        app,
        PROMPTS,
        use_beam_search=True,
        n=3,
        max_tokens=4,
        temperature=0,
        length_penalty=length_penalty,
        include_stop_str_in_output=include_stop,
        return_token_ids=True,
    )
    assert [c.index for c in resp.choices] == list(range(9))
    for i, (prompt, out) in enumerate(zip(PROMPTS, want)):
        for choice, seq in zip(resp.choices[3 * i : 3 * i + 3], out.sequences, strict=True):
            assert (choice.text, choice.token_ids) == expected(llm, prompt, seq, include_stop)
            assert (choice.finish_reason, choice.stop_reason) == (seq.finish_reason, seq.stop_reason)
            assert choice.prompt_token_ids == prompt
    ended = [c for c in resp.choices[6:] if c.finish_reason == "stop"]
    assert ended and all(c.stop_reason == EOS_ID for c in ended)
    assert all((c.token_ids[-1:] == [EOS_ID]) == include_stop for c in ended)
    assert resp.usage.prompt_tokens == sum(len(p) for p in PROMPTS)  # once each, not once a step
    assert resp.usage.completion_tokens == sum(len(c.token_ids) for c in resp.choices)


def test_chat_searches_from_the_rendered_prompt(app, llm):
    messages = [{"role": "user", "content": "hello"}]

    async def fn(client, http):
        rendered = (await http.post("/tokenize", json={"messages": messages})).json()["tokens"]
        resp = await client.chat.completions.create(
            model="tiny",
            messages=messages,
            n=3,
            max_completion_tokens=5,
            temperature=0,
            extra_body={"use_beam_search": True, "return_token_ids": True},
        )
        return rendered, resp

    rendered, resp = serve(app, fn)
    want = llm.beam_search([rendered], BeamSearchParams(beam_width=3, max_tokens=5))[0]
    for choice, seq in zip(resp.choices, want.sequences, strict=True):
        text, ids = expected(llm, rendered, seq)
        assert choice.message.role == "assistant" and choice.message.content == text
        assert choice.token_ids == ids and choice.finish_reason == seq.finish_reason
    assert resp.usage.prompt_tokens == len(rendered)


def test_logprobs_come_from_the_step_that_chose_each_token(app, llm):
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    want = llm.beam_search([{"prompt_token_ids": PROMPTS[1]}], params)[0]
    body = dict(use_beam_search=True, n=2, max_tokens=3, temperature=0, ignore_eos=True, logprobs=2)
    resp = beam_completions(app, PROMPTS[1], **body)
    tokenizer = llm.get_tokenizer()
    for choice, seq in zip(resp.choices, want.sequences, strict=True):
        lps = choice.logprobs
        chosen = seq.tokens[len(PROMPTS[1]) :]
        assert lps.tokens == [tokenizer.decode([t]) for t in chosen]
        assert lps.token_logprobs == pytest.approx(
            [seq.logprobs[i][t] for i, t in enumerate(chosen)], abs=1e-4
        )
        assert sum(lps.token_logprobs) == pytest.approx(seq.cum_logprob, abs=1e-4)
        for top, step in zip(lps.top_logprobs, seq.logprobs):
            best2 = sorted(step.values(), reverse=True)[:2]
            assert len(top) in (2, 3) and sorted(top.values(), reverse=True)[:2] == pytest.approx(
                best2, abs=1e-4
            )


def test_a_stream_is_a_frame_a_whole_choice_then_usage(app):
    """A beam's text is known only at the end: the stream has each choice whole, one a frame (as
    every stream sends its choices), then the usage."""
    base = dict(n=2, max_tokens=4, temperature=0, extra_body={"use_beam_search": True})

    async def fn(client, http):
        full = await client.completions.create(model="tiny", prompt=EOS_PROMPT, **base)
        stream = await client.completions.create(
            model="tiny", prompt=EOS_PROMPT, stream=True, stream_options={"include_usage": True}, **base
        )
        chunks = [c async for c in stream]
        messages = [{"role": "user", "content": "hi"}]
        chat_full = await client.chat.completions.create(model="tiny", messages=messages, **base)
        chat = await client.chat.completions.create(model="tiny", messages=messages, stream=True, **base)
        return full, chunks, chat_full, [c async for c in chat]

    full, chunks, chat_full, chat_chunks = serve(app, fn)
    assert len(chunks) == 3 and chunks[2].choices == [] and chunks[2].usage == full.usage
    assert [len(c.choices) for c in chunks[:2] + chat_chunks] == [1] * 4
    got = [(c.choices[0].index, c.choices[0].text, c.choices[0].finish_reason) for c in chunks[:2]]
    assert got == [(c.index, c.text, c.finish_reason) for c in full.choices]
    assert [c.choices[0].delta.role for c in chat_chunks] == ["assistant"] * 2
    got = [(c.choices[0].delta.content, c.choices[0].finish_reason) for c in chat_chunks]
    assert got == [(c.message.content, c.finish_reason) for c in chat_full.choices]


REFUSALS = [
    ("top_p", 0.5),
    ("top_k", 5),
    ("min_p", 0.1),
    ("presence_penalty", 0.5),
    ("frequency_penalty", 0.5),
    ("repetition_penalty", 1.2),
    ("logit_bias", {"5": 1.0}),
    ("bad_words", ["a"]),
    ("stop", ["x"]),
    ("stop_token_ids", [5]),
    ("min_tokens", 2),
    ("allowed_token_ids", [5, 6]),
    ("prompt_logprobs", 1),
    ("response_format", {"type": "json_object"}),
    ("structured_outputs", {"choice": ["a", "b"]}),
    ("logprobs", 7),  # more than the 2 * n = 6 candidates a step asks for
    ("n", 11),  # 2 * 11 logprobs a step, over the engine's max_logprobs of 20
    ("n", 0),
]


async def _post(http, path: str, body: dict):
    resp = await http.post(path, json=body)
    return resp.status_code, resp.json()


def test_fields_beam_search_cannot_honour_are_400s_naming_them(app):
    base = dict(model="tiny", prompt=[5, 6, 7], max_tokens=2, n=3, use_beam_search=True)
    chat = dict(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, use_beam_search=True
    )
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

    async def fn(client, http):
        got = [await _post(http, "/v1/completions", {**base, name: value}) for name, value in REFUSALS]
        got.append(await _post(http, "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 3}))
        got.append(
            await _post(http, "/v1/chat/completions", {**chat, "tools": [tool], "tool_choice": "required"})
        )
        no_beam = {**base, "use_beam_search": False, "length_penalty": 2.0}
        got.append(await _post(http, "/v1/completions", no_beam))
        no_ops = dict(
            top_p=1.0, top_k=-1, stop=[], logit_bias={}, min_tokens=0, response_format={"type": "text"}
        )
        ok = await _post(http, "/v1/completions", {**base, **no_ops})
        return got, ok

    got, (status, body) = serve(app, fn)
    names = [name for name, _ in REFUSALS] + ["top_logprobs", "tool_choice", "length_penalty"]
    assert [(s, b["error"]["param"]) for s, b in got] == [(400, name) for name in names]
    assert status == 200 and len(body["choices"]) == 3


def test_a_client_that_leaves_mid_search_ends_it_and_frees_its_step(app):
    _, engine, ctx = app

    async def gone() -> None:  # the client has left by the first step
        return None

    async def run():
        engine.start(asyncio.get_running_loop())
        body = CompletionRequest(prompt=PROMPTS[0], n=3, max_tokens=8, use_beam_search=True)
        # paused, the engine cannot finish the first step's requests before the disconnect is
        # seen (running, a fast step could win that race, and the search go on)
        await engine.pause()
        try:
            with pytest.raises(APIError, match="client disconnected"):
                await asyncio.wait_for(create_completion(ctx, body, gone), 60)  # a hang fails
            assert engine.num_pending_requests == 0
        finally:
            await engine.resume()

    asyncio.run(run())


def test_without_a_tokenizer_the_models_eos_ends_a_beam_as_offline(tmp_path):
    """A checkpoint with no tokenizer: LLM.beam_search ends beams at the model's EOS (config.json),
    and so must the server, as its plain requests stop there too."""
    model = tmp_path / "no-tokenizer"
    model.mkdir()
    for f in tiny_model_dir("qwen3").iterdir():
        if f.is_file() and not f.name.startswith(("tokenizer", "special_tokens")):
            (model / f.name).write_bytes(f.read_bytes())
    offline = LLM(str(model), **ENGINE)
    assert offline.get_tokenizer() is None
    params = BeamSearchParams(beam_width=3, max_tokens=4)
    want = offline.beam_search([{"prompt_token_ids": EOS_PROMPT}], params)[0].sequences
    assert any(seq.finish_reason == "stop" for seq in want)
    with in_process_client(model, **ENGINE) as engine:
        ctx = ServerContext(engine, engine.tokenizer, ["tiny"], engine.info.max_model_len)
        body = dict(use_beam_search=True, n=3, max_tokens=4, temperature=0, return_token_ids=True)
        resp = beam_completions((build_app(ctx, ServerMetrics("tiny")), engine, ctx), EOS_PROMPT, **body)
    got = [(c.token_ids, c.finish_reason, c.stop_reason) for c in resp.choices]
    shown = [seq.tokens[len(EOS_PROMPT) :] for seq in want]
    shown = [ids[:-1] if seq.finish_reason == "stop" else ids for ids, seq in zip(shown, want)]
    assert got == [(ids, seq.finish_reason, seq.stop_reason) for ids, seq in zip(shown, want)]


class _DecodeLog:
    """The engine's tokenizer, recording each decode's skip_special_tokens."""

    def __init__(self, tokenizer):
        self._tokenizer, self.skips = tokenizer, []

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def decode(self, ids, skip_special_tokens=False, **kwargs):
        self.skips.append(skip_special_tokens)
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, **kwargs)


@pytest.mark.parametrize("tools", [True, False])
def test_a_beam_searched_reply_the_tool_parser_reads_keeps_special_tokens(app, tools):
    """As a sampled reply (_tool_params): where the hermes parser reads it, a beam's text is
    decoded with special tokens, or checkpoints that mark `<tool_call>` special (Hermes-2-Pro,
    Hermes-3) would lose their calls' tags into plain content; elsewhere skip_special_tokens."""
    _, engine, _ = app
    tokenizer = _DecodeLog(engine.tokenizer)
    ctx = ServerContext(
        engine, tokenizer, ["tiny"], engine.info.max_model_len, chat_template=CHAT_TEMPLATE,
        enable_auto_tool_choice=True, tool_call_parser="hermes",
    )  # fmt: skip
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    chat = dict(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2, use_beam_search=True
    )

    async def fn(client, http):
        return await _post(http, "/v1/chat/completions", {**chat, **({"tools": [tool]} if tools else {})})

    status, body = serve((build_app(ctx, ServerMetrics("tiny")), engine, ctx), fn)
    assert status == 200 and len(body["choices"]) == 2
    assert tokenizer.skips and set(tokenizer.skips) == {not tools}


def test_n_is_bounded_by_the_vocabulary_under_a_larger_max_logprobs():
    """--max-logprobs above the vocabulary leaves the vocabulary the bound on 2 * n: a 400 naming
    n before any step (it was the first step's refusal naming `logprobs`, a field the body never
    set); n = vocabulary / 2 is served."""
    with in_process_client(**{**ENGINE, "max_logprobs": 1000, "max_num_seqs": 48}) as engine:
        ctx = ServerContext(engine, engine.tokenizer, ["tiny"], engine.info.max_model_len)
        vocab = engine.info.vocab_size
        base = dict(model="tiny", prompt=[5, 6, 7], max_tokens=1, use_beam_search=True)

        async def fn(client, http):
            return [
                await _post(http, "/v1/completions", {**base, "n": n}) for n in (vocab // 2 + 1, vocab // 2)
            ]

        (status, body), (ok, served) = serve((build_app(ctx, ServerMetrics("tiny")), engine, ctx), fn)
    assert (status, body["error"]["param"]) == (400, "n"), body
    assert f"n must be <= {vocab // 2}" in body["error"]["message"]
    assert ok == 200 and len(served["choices"]) == vocab // 2
