"""Beam search against an independent oracle: a plain beam search, written here from vLLM's
documented rules, over the full next-token distributions of transformers' own forward of the
tiny checkpoint (float32, CPU), never the engine's. tests/api/test_beam_search.py checks the
loop against the engine's logprobs; this file checks every user path end to end (LLM,
AsyncLLM, the server's use_beam_search) against a model run that shares no code with the
engine.

The rules the oracle encodes (vLLM's LLM.beam_search and vllm/beam_search.py):
- each beam's candidates are its 2 * beam_width likeliest next tokens (greedy: temperature 0);
- a candidate ending in the tokenizer's EOS is finished (unless ignore_eos) and kept, uncapped;
  the best beam_width of the others are the next beams;
- score = cum_logprob / L ** length_penalty, L the prompt and generated tokens, less an ending EOS;
- after max_tokens steps (fewer where max_model_len stops the beams), finished plus live beams
  are ranked by score and the best beam_width come back, best first.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from enginespec.async_llm import AsyncLLM
from enginespec.beam_search import BeamSearchParams
from enginespec.llm import LLM
from enginespec.testing.checkpoints import EOS_ID, VOCAB_SIZE, tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# EOS is the second likeliest first token after [76, 25] on this checkpoint (checked below), so
# every beam width meets it; the other prompts differ in length, searched in one call.
EOS_PROMPT = [76, 25]
PROMPTS = [EOS_PROMPT, [5, 6, 7], [40, 41, 42, 43, 44, 45, 46, 47, 48], [9]]


class Oracle:
    """transformers' forward of the checkpoint, its log-softmax per history (cached, float64)."""

    def __init__(self, model_dir: str) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.cache: dict[tuple[int, ...], list[float]] = {}

    def dist(self, tokens) -> list[float]:
        key = tuple(tokens)
        if key not in self.cache:
            with torch.no_grad():
                logits = self.model(torch.tensor([list(key)])).logits[0, -1]
            self.cache[key] = torch.log_softmax(logits.double(), -1).tolist()
        return self.cache[key]

    def top(self, tokens, k: int) -> list[int]:
        d = self.dist(tokens)
        return sorted(range(VOCAB_SIZE), key=lambda t: -d[t])[:k]

    def search(self, prompt, params: BeamSearchParams, max_model_len: int = 10**9):
        """[(tokens, cum_logprob)] best first, by the module doc's rules."""
        k, lp = params.beam_width, params.length_penalty

        def score(c):
            tokens, cum = c
            n = len(tokens) - (tokens[-1] == EOS_ID)
            return cum / n**lp

        beams, done = [(tuple(prompt), 0.0)], []
        for _ in range(min(params.max_tokens, max_model_len - len(prompt))):
            grown = []
            for tokens, cum in beams:
                d = self.dist(tokens)
                for t in self.top(tokens, 2 * k):
                    ended = t == EOS_ID and not params.ignore_eos
                    (done if ended else grown).append((tokens + (t,), cum + d[t]))
            beams = sorted(grown, key=score, reverse=True)[:k]
        return sorted(done + beams, key=score, reverse=True)[:k]


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(tiny_model_dir("qwen3"))


@pytest.fixture(scope="module")
def oracle(model_dir) -> Oracle:
    oracle = Oracle(model_dir)
    assert oracle.top(EOS_PROMPT, 2)[1] == EOS_ID  # EOS is in play for every beam width
    return oracle


ENGINE = dict(dtype="float32", device="cpu", num_blocks=256, max_num_seqs=3)


@pytest.fixture(scope="module", params=["reference", "fast"])
def llm(request, model_dir):
    return LLM(model_dir, impl=request.param, **ENGINE)


def check_sequences(seqs, want, prompt, params, tokenizer, oracle):
    """The engine's sequences are the oracle's, in order, with vLLM's fields."""
    assert [tuple(s.tokens) for s in seqs] == [t for t, _ in want]
    assert [s.cum_logprob for s in seqs] == pytest.approx([c for _, c in want], abs=1e-4)
    for s in seqs:
        ended = s.tokens[-1] == EOS_ID and not params.ignore_eos
        assert (s.finish_reason, s.stop_reason) == (("stop", EOS_ID) if ended else ("length", None))
        shown = s.tokens[:-1] if ended and not params.include_stop_str_in_output else s.tokens
        assert s.text == tokenizer.decode(shown)
        generated = s.tokens[len(prompt) :]
        assert len(s.logprobs) == len(generated)
        for i, (step, token) in enumerate(zip(s.logprobs, generated)):
            history = s.tokens[: len(prompt) + i]
            assert set(step) == set(oracle.top(history, 2 * params.beam_width))  # the candidates
            assert float(step[token]) == pytest.approx(oracle.dist(history)[token], abs=1e-4)


@pytest.mark.parametrize("lp", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("beam_width", [1, 2, 3, 4])
def test_llm_beam_search_is_the_oracles(llm, oracle, beam_width, lp):
    """Prompts of 1 to 9 tokens in one call, EOS in play and ignored; beam_width 4 runs 16 beams a
    step over max_num_seqs 3."""
    tokenizer = llm.get_tokenizer()
    eos_kept = []
    for ignore_eos in (False, True):
        params = BeamSearchParams(beam_width, max_tokens=5, length_penalty=lp, ignore_eos=ignore_eos)
        outs = llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS], params)
        assert len(outs) == len(PROMPTS)
        for prompt, out in zip(PROMPTS, outs):
            want = oracle.search(prompt, params)
            check_sequences(out.sequences, want, prompt, params, tokenizer, oracle)
        eos_kept.append(any(s.finish_reason == "stop" for s in outs[0].sequences))
    assert eos_kept == [lp < 2.0, False]  # at 2 the longer beams outscore the EOS-ended one


@pytest.mark.parametrize("include_stop", [False, True])
def test_max_tokens_1_and_include_stop_str(llm, oracle, include_stop):
    params = BeamSearchParams(3, max_tokens=1, length_penalty=0.5, include_stop_str_in_output=include_stop)
    (out,) = llm.beam_search([EOS_PROMPT], params)
    want = oracle.search(EOS_PROMPT, params)
    assert any(t[-1] == EOS_ID for t, _ in want)  # the EOS-ended one is among the best 3
    check_sequences(out.sequences, want, EOS_PROMPT, params, llm.get_tokenizer(), oracle)


def test_every_token_a_candidate(model_dir, oracle):
    """beam_width 48: 2 * 48 = the whole vocabulary each step (max_logprobs -1 lifts the cap to
    it), 48 beams a step over max_num_seqs 3; 49 is a ValueError naming the bound."""
    llm = LLM(model_dir, **ENGINE, max_logprobs=-1)
    params = BeamSearchParams(48, max_tokens=2, length_penalty=0.5)
    (out,) = llm.beam_search([[5, 6, 7]], params)
    check_sequences(
        out.sequences, oracle.search([5, 6, 7], params), [5, 6, 7], params, llm.get_tokenizer(), oracle
    )
    with pytest.raises(ValueError, match="beam_width must be <= 48"):
        llm.beam_search([[5, 6, 7]], BeamSearchParams(49, max_tokens=2))
    assert not llm.engine.has_unfinished


def test_prompts_near_max_model_len(model_dir, oracle):
    """max_model_len 12: a prompt of 11 tokens gets one step, one of 9 three, a short one all
    five, in one call; a prompt of 13 is a ValueError naming max_model_len (one of 12 gets one
    step, vLLM's rule: test_beam_search.test_beams_stop_at_max_model_len)."""
    llm = LLM(model_dir, **ENGINE, max_model_len=12)
    prompts = [list(range(4, 15)), list(range(20, 29)), [5, 6]]
    params = BeamSearchParams(2, max_tokens=5, length_penalty=1.0)
    outs = llm.beam_search(prompts, params)
    tokenizer = llm.get_tokenizer()
    for prompt, out in zip(prompts, outs):
        want = oracle.search(prompt, params, max_model_len=12)
        check_sequences(out.sequences, want, prompt, params, tokenizer, oracle)
    assert [len(s.tokens) for s in outs[0].sequences if s.finish_reason == "length"] == [12, 12]
    with pytest.raises(ValueError, match="max_model_len"):
        llm.beam_search([list(range(4, 17))], params)
    assert not llm.engine.has_unfinished


def test_async_llm_beam_search_is_the_oracles(model_dir, oracle):
    engine = AsyncLLM(model_dir, in_process=True, start_timeout=120, impl="fast", **ENGINE)
    tokenizer = engine.tokenizer

    async def run(prompt, params, rid):
        return [out async for out in engine.beam_search({"prompt_token_ids": prompt}, rid, params)]

    try:
        for i, (prompt, params) in enumerate(
            [
                (EOS_PROMPT, BeamSearchParams(3, max_tokens=4, length_penalty=0.5)),
                (EOS_PROMPT, BeamSearchParams(4, max_tokens=3, include_stop_str_in_output=True)),
                (PROMPTS[2], BeamSearchParams(2, max_tokens=5, length_penalty=2.0)),
            ]
        ):
            (out,) = asyncio.run(run(prompt, params, f"b{i}"))
            want = oracle.search(prompt, params)
            assert out.finished and out.prompt_token_ids == prompt
            assert [s.index for s in out.outputs] == list(range(len(want)))
            for sample, (tokens, cum) in zip(out.outputs, want, strict=True):
                generated = list(tokens[len(prompt) :])
                ended = generated[-1] == EOS_ID
                shown = generated[:-1] if ended else generated
                assert sample.token_ids == (generated if params.include_stop_str_in_output else shown)
                assert sample.text == tokenizer.decode(shown)
                assert sample.cumulative_logprob == pytest.approx(cum, abs=1e-4)
                assert sample.finish_reason == ("stop" if ended else "length")
        assert engine.num_unfinished_requests == 0
    finally:
        engine.shutdown()


def test_temperature_draws_a_candidate_and_reports_raw_logprobs(model_dir, oracle):
    """temperature 2: each step's candidates are the raw distribution's top 2 * beam_width plus
    the drawn token when it is not among them, their logprobs the raw (unscaled) ones, and each
    sequence's cum_logprob the sum of its tokens' raw logprobs."""
    llm = LLM(model_dir, **ENGINE, seed=1)
    params = BeamSearchParams(2, max_tokens=6, temperature=2.0)
    drawn = 0
    for prompt, out in zip(PROMPTS[1:3], llm.beam_search(PROMPTS[1:3], params)):
        assert len(out.sequences) == 2
        for s in out.sequences:
            cum = 0.0
            for i, (step, token) in enumerate(zip(s.logprobs, s.tokens[len(prompt) :])):
                history, dist = s.tokens[: len(prompt) + i], oracle.dist(s.tokens[: len(prompt) + i])
                assert set(oracle.top(history, 4)) <= set(step) and len(step) <= 5
                drawn += len(step) - 4
                assert {t: float(v) for t, v in step.items()} == pytest.approx(
                    {t: dist[t] for t in step}, abs=1e-4
                )
                cum += dist[token]
            assert s.cum_logprob == pytest.approx(cum, abs=1e-4)
    assert drawn > 0  # some step drew a token outside the top 4: it joined the candidates


@pytest.mark.parametrize("family", ["mistral", "llama"])
def test_other_families_with_small_blocks(family):
    """Beams share their prefix through the prefix cache block by block (block_size 4); the
    mistral prompt crosses its sliding window of 8."""
    model_dir = str(tiny_model_dir(family))
    oracle = Oracle(model_dir)
    llm = LLM(model_dir, **{**ENGINE, "block_size": 4})
    prompts = [list(range(10, 30)), [5, 6, 7]]
    params = BeamSearchParams(3, max_tokens=8, length_penalty=0.5)
    for prompt, out in zip(prompts, llm.beam_search(prompts, params)):
        check_sequences(
            out.sequences, oracle.search(prompt, params), prompt, params, llm.get_tokenizer(), oracle
        )
