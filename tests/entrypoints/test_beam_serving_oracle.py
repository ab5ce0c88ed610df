"""use_beam_search on the server against the independent oracle of
tests/api/test_beam_search_oracle.py (transformers' forward, a plain beam search written from
vLLM's rules): completions of several prompts of different lengths in one body, n = the beam
width 1 to 4 and length_penalty 0.5 / 1 / 2, EOS in play; chat from its rendered prompt; best_of
equal to n; prompts near max_model_len."""

from __future__ import annotations

import pytest

from enginespec.beam_search import BeamSearchParams
from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.serving import ServerContext
from enginespec.testing.checkpoints import EOS_ID, tiny_model_dir
from tests.api.test_beam_search_oracle import EOS_PROMPT, PROMPTS, Oracle
from tests.entrypoints.client_helpers import in_process_client, run_with_clients
from tests.entrypoints.remote_server import CHAT_TEMPLATE

pytestmark = pytest.mark.usefixtures("torch_one_thread")

MAX_MODEL_LEN = 24
ENGINE = dict(
    impl="fast", device="cpu", dtype="float32", num_blocks=256, max_num_seqs=3, max_model_len=MAX_MODEL_LEN
)


@pytest.fixture(scope="module")
def oracle():
    return Oracle(str(tiny_model_dir("qwen3")))


@pytest.fixture(scope="module")
def app():
    with in_process_client(**ENGINE) as engine:
        ctx = ServerContext(engine, engine.tokenizer, ["tiny"], MAX_MODEL_LEN, chat_template=CHAT_TEMPLATE)
        yield build_app(ctx, ServerMetrics("tiny")), engine


def serve(app, fn):
    """fn(openai client, httpx client) run against the app (client_helpers.run_with_clients)."""
    app, engine = app
    return run_with_clients(app, engine, fn)


def check_choices(choices, prompt, want, tokenizer, include_stop=False):
    """Choices in rank order, each the oracle's sequence as the server answers it: generated ids
    (an ending EOS only with include_stop_str_in_output), text without the EOS."""
    assert len(choices) == len(want)
    for choice, (tokens, _cum) in zip(choices, want):
        generated = list(tokens[len(prompt) :])
        ended = generated[-1] == EOS_ID
        shown = generated[:-1] if ended else generated
        assert choice.token_ids == (generated if include_stop else shown)
        text = getattr(choice, "text", None)
        text = choice.message.content if text is None else text
        assert text == tokenizer.decode(shown, skip_special_tokens=True)
        assert choice.finish_reason == ("stop" if ended else "length")


@pytest.mark.parametrize("lp", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_completions_are_the_oracles(app, oracle, n, lp):
    tokenizer = app[1].tokenizer
    body = dict(use_beam_search=True, length_penalty=lp, return_token_ids=True, temperature=0)

    async def fn(client, http):
        return await client.completions.create(
            model="tiny", prompt=PROMPTS, n=n, max_tokens=5, extra_body=body
        )

    resp = serve(app, fn)
    assert [c.index for c in resp.choices] == list(range(n * len(PROMPTS)))
    params = BeamSearchParams(n, max_tokens=5, length_penalty=lp)
    for i, prompt in enumerate(PROMPTS):
        check_choices(resp.choices[n * i : n * (i + 1)], prompt, oracle.search(prompt, params), tokenizer)
    assert resp.usage.prompt_tokens == sum(map(len, PROMPTS))
    assert resp.usage.completion_tokens == sum(len(c.token_ids) for c in resp.choices)


def test_best_of_equal_to_n_and_include_stop_str(app, oracle):
    tokenizer = app[1].tokenizer
    body = dict(use_beam_search=True, best_of=3, return_token_ids=True, include_stop_str_in_output=True)

    async def fn(client, http):
        return await client.completions.create(
            model="tiny", prompt=EOS_PROMPT, n=3, max_tokens=3, temperature=0, extra_body=body
        )

    resp = serve(app, fn)
    want = oracle.search(EOS_PROMPT, BeamSearchParams(3, max_tokens=3))
    assert any(t[-1] == EOS_ID for t, _ in want)
    check_choices(resp.choices, EOS_PROMPT, want, tokenizer, include_stop=True)


def test_chat_is_the_oracles_on_the_rendered_prompt(app, oracle):
    tokenizer = app[1].tokenizer
    messages = [{"role": "user", "content": "hi"}]

    async def fn(client, http):
        rendered = (await http.post("/tokenize", json={"messages": messages})).json()["tokens"]
        resp = await client.chat.completions.create(
            model="tiny",
            messages=messages,
            n=2,
            max_completion_tokens=4,
            temperature=0,
            extra_body={"use_beam_search": True, "return_token_ids": True, "length_penalty": 0.5},
        )
        return rendered, resp

    rendered, resp = serve(app, fn)
    want = oracle.search(rendered, BeamSearchParams(2, max_tokens=4, length_penalty=0.5))
    check_choices(resp.choices, rendered, want, tokenizer)


def test_prompts_near_max_model_len(app, oracle):
    """max_tokens unset: a completion's 16, lowered to each prompt's room (one step for a prompt
    of max_model_len - 1); chat's default is the room."""
    tokenizer = app[1].tokenizer
    prompts = [list(range(4, 4 + MAX_MODEL_LEN - 1)), list(range(30, 30 + MAX_MODEL_LEN - 3))]
    body = dict(use_beam_search=True, return_token_ids=True)

    async def fn(client, http):
        return await client.completions.create(
            model="tiny", prompt=prompts, n=2, temperature=0, extra_body=body
        )

    resp = serve(app, fn)
    params = BeamSearchParams(2, max_tokens=16)
    for i, prompt in enumerate(prompts):
        want = oracle.search(prompt, params, max_model_len=MAX_MODEL_LEN)
        check_choices(resp.choices[2 * i : 2 * i + 2], prompt, want, tokenizer)
