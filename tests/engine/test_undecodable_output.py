"""A tokenizer that raises decoding one request's ids fails that request alone.

A slow SentencePiece tokenizer raises on an id of a padded vocabulary, a tiktoken one on an id
it never had. Decoding happens after the step's forward and sampling succeeded, so every other
request's tokens are right: the request whose text cannot be decoded ends with finish_reason
"error" (its tokens kept, the tokenizer's error in CompletionOutput.error), every other request
gets a fault-free engine's output, no step counts as failed, and the pool ends idle. The four
places the engine decodes are each reached: a stop-string sample's text as tokens arrive, the
decoded_token of its logprobs and of its prompt logprobs, and the text of any other sample when
its output is built.
"""

from __future__ import annotations

import pytest

from enginespec.engine.engine_core import EngineCore, load_engine_tokenizer
from enginespec.engine_args import EngineArgs
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ODD_ID = 70  # the id the tokenizer below refuses to decode (no fault-free output here has it)
PROMPTS = [
    {"prompt_token_ids": [5, 6, 7]},
    {"prompt_token_ids": [8, 9]},
    {"prompt_token_ids": [10, 11, 12, 13]},
]


class RefusingTokenizer:
    """A tokenizer, except that decoding odd_id raises (as a slow SentencePiece tokenizer does
    for an id of a padded vocabulary, or tiktoken for one it never had). No backend: the
    detokenizer goes through decode(). The server's fault tests use it too."""

    backend_tokenizer = None

    def __init__(self, tokenizer, odd_id: int = ODD_ID):
        self._tokenizer = tokenizer
        self._odd_id = odd_id

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def decode(self, ids, **kwargs):
        if self._odd_id in list(ids):
            raise KeyError(f"no token for id {self._odd_id}")
        return self._tokenizer.decode(ids, **kwargs)


def make_llm(async_scheduling: bool, refusing: bool) -> LLM:
    args = EngineArgs.from_kwargs(
        str(tiny_model_dir("qwen3")),
        impl="fast",
        device="cpu",
        dtype="float32",
        num_blocks=64,
        block_size=4,
        async_scheduling=async_scheduling,
    )
    tokenizer = load_engine_tokenizer(args)
    return LLM.from_engine(
        EngineCore(args, tokenizer=RefusingTokenizer(tokenizer) if refusing else tokenizer)
    )


def summary(out) -> tuple:
    c = out.outputs[0]
    return c.token_ids, c.text, c.finish_reason, c.error


@pytest.mark.parametrize(
    "extra",
    [{}, {"stop": ["zzz"]}, {"logprobs": 1}],
    ids=["text-at-output", "stop-string", "logprob-names"],
)
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_an_undecodable_id_fails_only_its_request(async_scheduling, extra):
    odd = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, allowed_token_ids=[ODD_ID], **extra)
    fine = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, **extra)
    expected = make_llm(async_scheduling, refusing=False).generate(PROMPTS[1:], fine, use_tqdm=False)
    assert all(ODD_ID not in o.outputs[0].token_ids for o in expected), "pick another ODD_ID"
    llm = make_llm(async_scheduling, refusing=True)
    outs = llm.generate(PROMPTS, [odd, fine, fine], use_tqdm=False)
    tokens, text, finish, error = summary(outs[0])
    assert finish == "error" and f"no token for id {ODD_ID}" in error
    assert text == "" and set(tokens) <= {ODD_ID}
    assert [summary(o) for o in outs[1:]] == [summary(o) for o in expected]
    engine = llm.engine
    assert engine.stats.num_failed_steps == 0, "decoding one request's ids failed the whole step"
    assert not engine.has_unfinished and engine.block_manager.num_free == engine.runner.num_blocks
    again = llm.generate(PROMPTS[1:], fine, use_tqdm=False)  # the engine serves on
    assert [summary(o) for o in again] == [summary(o) for o in expected]


def stream_outputs(engine: EngineCore, params: SamplingParams) -> list:
    """Every output of one request stepped to the end, as (finish_reason, token_ids, error) per
    sample."""
    engine.add_request("a", PROMPTS[0]["prompt_token_ids"], params)
    seen = []
    while engine.has_unfinished:
        seen.extend(
            [(c.finish_reason, tuple(c.token_ids), c.error) for c in o.outputs] for o in engine.step()
        )
    return seen


def test_a_failed_sample_shows_no_token_after_its_error():
    """n > 1, streamed (each step's outputs): a sibling whose ids cannot be decoded ends "error"
    with the tokens it had, and its siblings end "error" with it (the request failed; they
    name its error), and no later output shows any of them another token. With async
    scheduling the step after the failure was already in flight with them: that step's token
    came in after the error and showed (a finished sample's token_ids grew, unlike the serial
    run)."""
    params = SamplingParams(
        n=3,
        max_tokens=10,
        temperature=1.0,
        seed=3,
        ignore_eos=True,
        allowed_token_ids=[ODD_ID, *range(20, 28)],
    )
    runs = [stream_outputs(make_llm(a, refusing=True).engine, params) for a in (False, True)]
    finals = [run[-1] for run in runs]
    errors = [error for _, _, error in finals[0]]
    undecodable = [i for i, error in enumerate(errors) if error.startswith("the tokenizer failed")]
    assert len(undecodable) == 1 and f"no token for id {ODD_ID}" in errors[undecodable[0]]
    assert [reason for reason, _, _ in finals[0]] == ["error"] * 3
    for index, error in enumerate(errors):
        if index not in undecodable:
            assert error == f"sample {undecodable[0]} of this request failed: {errors[undecodable[0]]}"
            assert ODD_ID not in finals[0][index][1]
    for run in runs:
        for index in range(params.n):
            shown = [out[index] for out in run]
            done = [s for s in shown if s[0] is not None]
            assert all(s == done[0] for s in done), f"sample {index} changed after it finished: {done}"
    assert finals[1] == finals[0], "async scheduling shows what the serial engine shows"


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_undecodable_prompt_logprobs_fail_only_their_request(async_scheduling, n):
    """Naming a request's prompt logprobs (the decoded_token of each entry) raised inside the
    step, which failed every request of the batch. The prompt holds ODD_ID at position 1, so its
    first entry names it (and lies outside the prompt's last ids, the detokenizer's context):
    that request ends "error" (each of its samples: the prompt logprobs are every sample's),
    the others get a fault-free engine's output, and no step fails."""
    prompt = {"prompt_token_ids": [10, ODD_ID, *range(11, 18)]}
    odd = SamplingParams(n=n, max_tokens=5, temperature=0, ignore_eos=True, prompt_logprobs=1)
    fine = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    expected = make_llm(async_scheduling, refusing=False).generate(PROMPTS[1:], fine, use_tqdm=False)
    llm = make_llm(async_scheduling, refusing=True)
    outs = llm.generate([prompt, *PROMPTS[1:]], [odd, fine, fine], use_tqdm=False)
    assert [c.finish_reason for c in outs[0].outputs] == ["error"] * n
    assert all(f"no token for id {ODD_ID}" in c.error for c in outs[0].outputs)
    assert [summary(o) for o in outs[1:]] == [summary(o) for o in expected]
    engine = llm.engine
    assert engine.stats.num_failed_steps == 0, "naming one request's prompt logprobs failed the step"
    assert not engine.has_unfinished and engine.block_manager.num_free == engine.runner.num_blocks


@pytest.mark.parametrize("extra", [{}, {"stop": ["zzz"]}], ids=["text-at-output", "stop-string"])
def test_a_prompt_ending_in_an_undecodable_id_is_served(extra):
    """The detokenizer decodes the prompt's last ids as the left context of the output's text
    (a leading space); a tokenizer that raised on one of them made add_request raise its
    KeyError, so generate() failed the whole batch with an error naming no field. The context
    is only a nicety: without it the request is served, with a fault-free engine's output."""
    prompts = [{"prompt_token_ids": [5, 6, ODD_ID]}, *PROMPTS[1:]]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, **extra)
    expected = make_llm(False, refusing=False).generate(prompts, params, use_tqdm=False)
    assert all(ODD_ID not in o.outputs[0].token_ids for o in expected), "pick another ODD_ID"
    outs = make_llm(False, refusing=True).generate(prompts, params, use_tqdm=False)
    assert [summary(o) for o in outs] == [summary(o) for o in expected]
