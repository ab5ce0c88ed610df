"""LLM.beam_search and enginespec.beam_search, by vLLM V1's rules (api/beam_search.py's doc).

Two levels. The search loop (run_beam_search) on a synthetic model whose next-token
distribution is a fixed function of the history: against an exhaustive enumeration of every
sequence when the beam is wide enough to keep them all (EOS ends, length penalty, ignore_eos),
and, by Hypothesis, against a plain reference beam search written from the rules. Then
LLM.beam_search on a tiny random checkpoint: beam_width=1 is greedy decoding; the result equals
the reference search run on the model's full next-token distributions (logprobs=-1); with two
tokens, a brute force over all 96 x 96 continuations finds the same best sequence; EOS and
length_penalty as vLLM defines them; the beams' steps reuse the prefix cache; ValueErrors.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginespec.beam_search import (
    BeamSearchInstance,
    BeamSearchParams,
    BeamSearchSequence,
    finish,
    get_beam_search_score,
    run_beam_search,
)
from enginespec.engine.core_proc import engine_state
from enginespec.llm import LLM
from enginespec.outputs import Logprob
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import EOS_ID, VOCAB_SIZE, tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# ---- params and score ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(beam_width=0, max_tokens=4), ["beam_width", ">= 1"]),
        (dict(beam_width=2.0, max_tokens=4), ["beam_width", "an int"]),
        (dict(beam_width=True, max_tokens=4), ["beam_width", "an int"]),
        (dict(beam_width=2, max_tokens=0), ["max_tokens", ">= 1"]),
        (dict(beam_width=2, max_tokens=None), ["max_tokens", "an int"]),
        (dict(beam_width=2, max_tokens=4, temperature=-0.5), ["temperature", ">= 0"]),
        (dict(beam_width=2, max_tokens=4, temperature=math.nan), ["temperature", "finite"]),
        (dict(beam_width=2, max_tokens=4, length_penalty=math.inf), ["length_penalty", "finite"]),
        (dict(beam_width=2, max_tokens=4, length_penalty="1"), ["length_penalty", "a real number"]),
        (dict(beam_width=2, max_tokens=4, ignore_eos=1), ["ignore_eos", "a bool"]),
        (
            dict(beam_width=2, max_tokens=4, include_stop_str_in_output=None),
            ["include_stop_str_in_output", "a bool"],
        ),
    ],
)
def test_bad_params_are_value_errors_naming_field_and_bound(kwargs, words):
    with pytest.raises(ValueError) as info:
        BeamSearchParams(**kwargs)
    assert all(w in str(info.value) for w in ["BeamSearchParams.", *words]), str(info.value)


def test_params_defaults_are_vllms():
    p = BeamSearchParams(beam_width=3, max_tokens=5)
    assert (p.ignore_eos, p.temperature, p.length_penalty, p.include_stop_str_in_output) == (
        False,
        0.0,
        1.0,
        False,
    )
    assert isinstance(BeamSearchParams(beam_width=3, max_tokens=5, temperature=1).temperature, float)


def test_score_divides_by_the_length_prompt_included_less_an_ending_eos():
    assert get_beam_search_score([5, 6, 7], -6.0, 3) == -2.0  # 3 tokens, length_penalty 1
    assert get_beam_search_score([5, 6, 3], -6.0, 3) == -3.0  # EOS is not counted: 2 tokens
    assert get_beam_search_score([5, 6, 7], -6.0, 3, 0.0) == -6.0  # 0: cum_logprob alone
    assert get_beam_search_score([5, 6, 7, 8], -6.0, 3, 2.0) == -6.0 / 16
    assert get_beam_search_score([5, 6, 7, 8], -6.0, None, 0.5) == -3.0


def test_any_finite_length_penalty_scores_without_leaving_the_floats():
    """length ** length_penalty leaves the floats for a large |length_penalty| (30 ** 300
    overflows, 30 ** -300 underflows to 0.0): the score is then its limit (0 for a growing
    divisor, -inf for a vanishing one), never an OverflowError or a ZeroDivisionError, so every
    finite length_penalty that BeamSearchParams takes runs a search."""
    long = [5] * 30
    assert get_beam_search_score(long, -6.0, 3, 300.0) == 0.0
    assert get_beam_search_score(long, -math.inf, 3, 300.0) == -math.inf
    assert get_beam_search_score(long, -6.0, 3, -300.0) == -math.inf
    assert get_beam_search_score(long, 0.0, 3, -300.0) == 0.0
    assert get_beam_search_score(long, -6.0, 3, 200.0) == -6.0 / 30**200.0  # still a float: as before
    _, step_k = synthetic(4, seed=5)
    for lp in (300.0, -300.0, 1e308, -1e308):
        params = BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=lp)
        (out,) = search([[1] * 30], params, step_k(4))
        assert len(out.sequences) == 2


# ---- the loop, on a synthetic model --------------------------------------------------------------

EOS = 0


def synthetic(vocab: int, seed: int):
    """(dist, step): dist(tokens) is a fixed log-softmax over `vocab` tokens drawn from the
    history; step is a beam_search.StepFn that reports the top k of it, as the engine reports
    logprobs=k (ranks 1..k, best first)."""

    def dist(tokens) -> list[float]:
        rng = random.Random(hash((seed, tuple(tokens))))
        logits = [rng.gauss(0.0, 2.0) for _ in range(vocab)]
        top = max(logits)
        norm = top + math.log(sum(math.exp(x - top) for x in logits))
        return [x - norm for x in logits]

    def step_k(k: int):
        def step(batch):
            out = []
            for tokens, _salt in batch:
                d = dist(tokens)
                order = sorted(range(vocab), key=lambda t: -d[t])[:k]
                out.append({t: Logprob(d[t], rank=i + 1) for i, t in enumerate(order)})
            return out

        return step

    return dist, step_k


def search(prompts, params, step, eos=EOS, **kwargs):
    instances = [BeamSearchInstance(list(p), params.max_tokens) for p in prompts]
    run_beam_search(instances, step, params, eos, **kwargs)
    return [finish(inst, params, eos, None) for inst in instances]


def as_pairs(output) -> list[tuple[tuple[int, ...], float]]:
    return [(tuple(s.tokens), s.cum_logprob) for s in output.sequences]


def score(tokens, cum, lp, eos=EOS):
    return get_beam_search_score(list(tokens), cum, eos, lp)


def exhaustive(dist, prompt, max_tokens, lp, ignore_eos, vocab):
    """Every sequence a search that never prunes ends with: EOS-ended ones of any length (unless
    ignore_eos) and the max_tokens-long ones without a finishing EOS; best score first."""
    done, frontier = [], [(tuple(prompt), 0.0)]
    for _ in range(max_tokens):
        grown = []
        for tokens, cum in frontier:
            d = dist(tokens)
            for t in range(vocab):
                (done if t == EOS and not ignore_eos else grown).append((tokens + (t,), cum + d[t]))
        frontier = grown
    return sorted(done + frontier, key=lambda c: -score(*c, lp))


def assert_same(got, want, tol=1e-9):
    """The same sequences in the same order, cum_logprobs within tol (a batch of another shape
    may round the model's logprobs differently in the last bits)."""
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [c for _, c in got] == pytest.approx([c for _, c in want], abs=tol)


@pytest.mark.parametrize("ignore_eos", [False, True])
@pytest.mark.parametrize("lp", [0.0, 1.0, 2.5, -0.7])
def test_a_beam_that_keeps_everything_is_the_exhaustive_ranking(lp, ignore_eos):
    """vocab 4, 3 tokens: beam_width 64 >= every sequence, 2 * 64 >= the vocabulary, so
    nothing is pruned and the result must be every possible sequence ranked by vLLM's score."""
    vocab, prompt = 4, [1, 2]
    dist, step_k = synthetic(vocab, seed=11)
    params = BeamSearchParams(beam_width=64, max_tokens=3, length_penalty=lp, ignore_eos=ignore_eos)
    got = as_pairs(search([prompt], params, step_k(128))[0])
    want = exhaustive(dist, prompt, 3, lp, ignore_eos, vocab)
    assert_same(got, want[:64])
    eos_inside = any(EOS in t[2:-1] for t, _ in got)
    if ignore_eos:  # EOS is a token like any other
        assert eos_inside and {len(t) for t, _ in got} == {5}
    else:  # EOS-ended sequences of every length made it, and nothing grew past an EOS
        assert not eos_inside and {len(t) for t, _ in got if t[-1] == EOS} == {3, 4, 5}


def reference(dist, prompt, params, vocab, eos=EOS):
    """Beam search written from the rules: each beam's 2 * beam_width likeliest tokens are its
    candidates; EOS ones are done; the best beam_width others go on; done + last ranked."""
    lp, k = params.length_penalty, params.beam_width
    beams, done = [(tuple(prompt), 0.0)], []
    for _ in range(params.max_tokens):
        cands = []
        for tokens, cum in beams:
            d = dist(tokens)
            for t in sorted(range(vocab), key=lambda t: -d[t])[: 2 * k]:
                (done if t == eos and not params.ignore_eos else cands).append((tokens + (t,), cum + d[t]))
        beams = sorted(cands, key=lambda c: -score(*c, lp))[:k]
    return sorted(done + beams, key=lambda c: -score(*c, lp))[:k]


@settings(max_examples=60, deadline=None)
@given(
    vocab=st.integers(2, 6),
    seed=st.integers(0, 10_000),
    beam_width=st.integers(1, 4),
    max_tokens=st.integers(1, 4),
    lp=st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0]),
    ignore_eos=st.booleans(),
    prompts=st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=3), min_size=1, max_size=3),
    limit=st.sampled_from([None, 1, 2]),
)
def test_search_equals_the_reference_beam_search(
    vocab, seed, beam_width, max_tokens, lp, ignore_eos, prompts, limit
):
    dist, step_k = synthetic(vocab, seed)
    params = BeamSearchParams(beam_width, max_tokens, ignore_eos=ignore_eos, length_penalty=lp)
    outs = search(prompts, params, step_k(2 * beam_width), concurrency_limit=limit)
    for prompt, out in zip(prompts, outs):
        assert_same(as_pairs(out), reference(dist, prompt, params, vocab))
        scores = [score(s.tokens, s.cum_logprob, lp) for s in out.sequences]
        assert scores == sorted(scores, reverse=True)
        for s in out.sequences:  # cum_logprob is the sum of the chosen tokens' logprobs
            chosen = s.tokens[len(prompt) :]
            assert s.cum_logprob == pytest.approx(sum(d[t] for d, t in zip(s.logprobs, chosen)))
            assert s.finish_reason == ("stop" if chosen[-1] == EOS and not ignore_eos else "length")


def test_a_prompt_limited_to_fewer_steps_stops_there_and_the_others_go_on():
    dist, step_k = synthetic(5, seed=3)
    params = BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True)
    short, long = BeamSearchInstance([1], 2), BeamSearchInstance([2], 4)
    run_beam_search([short, long], step_k(4), params, EOS)
    assert {len(b.tokens) for b in short.beams} == {3} and {len(b.tokens) for b in long.beams} == {5}


def test_the_bar_follows_the_steps_as_they_run_one_group_at_a_time(monkeypatch):
    """run_beam_search's bar: max_tokens token steps per group, each counted once it ran (one
    `step` call batching every beam of the group), and a group that ends sooner (a prompt limited
    to 2 steps) fills the rest of its share at its end, so the bar ends full."""
    import enginespec.beam_search as beam_search

    events = []

    class Bar:
        def __init__(self, total, **kwargs):
            events.append(("total", total))

        def update(self, n=1):
            events.append(("update", n))

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            pass

    monkeypatch.setattr(beam_search, "tqdm", Bar)
    _, step_k = synthetic(5, seed=3)

    def step(batch):
        events.append(("step", len(batch)))
        return step_k(4)(batch)

    params = BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True)
    instances = [BeamSearchInstance([1], 2), BeamSearchInstance([2], 2), BeamSearchInstance([3], 2)]
    run_beam_search(instances, step, params, EOS, use_tqdm=True)
    # all three at once: a first step of one beam each, then two beams each; done after 2 of 4
    assert events == [("total", 4), ("step", 3), ("update", 1), ("step", 6), ("update", 1), ("update", 2)]
    events.clear()
    run_beam_search(instances[:2], step, params, EOS, use_tqdm=True, concurrency_limit=1)
    assert events[0] == ("total", 8) and sum(n for kind, n in events if kind == "update") == 8


def test_concurrency_limit_must_be_none_or_positive():
    _, step_k = synthetic(3, seed=0)
    params = BeamSearchParams(beam_width=1, max_tokens=1)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="concurrency_limit"):
            run_beam_search([BeamSearchInstance([1], 1)], step_k(2), params, EOS, concurrency_limit=bad)


def test_text_leaves_an_ending_eos_out_unless_include_stop_str_in_output():
    decode = lambda ids: ",".join(map(str, ids))  # noqa: E731
    for include, want in ((False, "1,2"), (True, "1,2,0")):
        inst = BeamSearchInstance(
            [1], 1, completed=[BeamSearchSequence([1, 2, 0], [], -1.0, finish_reason="stop")]
        )
        inst.beams = []
        params = BeamSearchParams(beam_width=1, max_tokens=1, include_stop_str_in_output=include)
        assert finish(inst, params, 0, decode).sequences[0].text == want


# ---- LLM.beam_search on a tiny random checkpoint -------------------------------------------------


@pytest.fixture(scope="module")
def llm():
    return LLM(str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", num_blocks=256, max_logprobs=-1)


def full_dists(llm, seqs) -> list[list[float]]:
    """The model's whole next-token distribution after each sequence (logprobs=-1)."""
    outs = llm.generate(
        [{"prompt_token_ids": list(s)} for s in seqs],
        SamplingParams(max_tokens=1, temperature=0, logprobs=-1),
        use_tqdm=False,
    )
    return [[float(o.outputs[0].logprobs[0][t]) for t in range(VOCAB_SIZE)] for o in outs]


def model_dist(llm):
    cache: dict = {}

    def dist(tokens):
        if tuple(tokens) not in cache:
            cache[tuple(tokens)] = full_dists(llm, [tokens])[0]
        return cache[tuple(tokens)]

    return dist


# EOS (id 3) is among the two likeliest first tokens after this prompt (checked in the tests).
EOS_PROMPT = [76, 25]
PROMPTS = [[5, 6, 7], [40, 41, 42, 43], EOS_PROMPT]


def test_beam_width_one_is_greedy_decoding(llm):
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=1)
    want = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy, use_tqdm=False)
    got = llm.beam_search(
        [{"prompt_token_ids": p} for p in PROMPTS],
        BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True),
    )
    for p, w, g in zip(PROMPTS, want, got):
        # no greedy EOS: vLLM's score would count an EOS-ended beam one token shorter
        assert EOS_ID not in w.outputs[0].token_ids
        (seq,) = g.sequences
        assert seq.tokens == p + w.outputs[0].token_ids
        assert seq.cum_logprob == pytest.approx(w.outputs[0].cumulative_logprob, abs=1e-4)


@pytest.mark.parametrize("ignore_eos", [False, True])
@pytest.mark.parametrize("lp", [0.0, 1.0, 3.0])
def test_search_equals_the_reference_on_the_models_full_distributions(llm, lp, ignore_eos):
    dist = model_dist(llm)
    first = dist(EOS_PROMPT)
    assert sorted(range(VOCAB_SIZE), key=lambda t: -first[t]).index(EOS_ID) < 2  # EOS is in play
    params = BeamSearchParams(beam_width=3, max_tokens=4, length_penalty=lp, ignore_eos=ignore_eos)
    outs = llm.beam_search(PROMPTS, params)
    tokenizer = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outs):
        want = reference(dist, prompt, params, VOCAB_SIZE, eos=EOS_ID)
        assert [tuple(s.tokens) for s in out.sequences] == [t for t, _ in want]
        assert [s.cum_logprob for s in out.sequences] == pytest.approx([c for _, c in want], abs=1e-4)
        scores = [get_beam_search_score(s.tokens, s.cum_logprob, EOS_ID, lp) for s in out.sequences]
        assert scores == sorted(scores, reverse=True)
        for s in out.sequences:
            ended = s.tokens[-1] == EOS_ID and not ignore_eos
            assert (s.finish_reason, s.stop_reason) == (("stop", EOS_ID) if ended else ("length", None))
            assert s.text == tokenizer.decode(s.tokens[:-1] if ended else s.tokens)
            assert len(s.logprobs) == len(s.tokens) - len(prompt)
            assert all(len(d) == 6 for d in s.logprobs)  # 2 * beam_width candidates each step
    finished = [s for s in outs[2].sequences if s.finish_reason == "stop"]
    assert bool(finished) == (not ignore_eos and lp < 3.0)  # at 3 the longer ones score higher


def test_two_tokens_brute_force_finds_the_best_sequence(llm):
    """Every one of the 96 x 96 two-token continuations, scored from the full distributions.
    The best one starts with the 6th likeliest first token, so greedy decoding (beam_width=1)
    misses it and a beam of 6 finds it; and the beam's best 6 are the best 6 continuations of
    the first tokens it kept. length_penalty 0 ranks by cum_logprob alone: at 1 a sequence
    ending in EOS would count one token less even under ignore_eos (vLLM's score), and EOS is
    the 3rd likeliest first token here."""
    prompt = [20, 30, 40, 50]
    first = full_dists(llm, [prompt])[0]
    seconds = full_dists(llm, [prompt + [a] for a in range(VOCAB_SIZE)])
    allpairs = {(a, b): first[a] + seconds[a][b] for a in range(VOCAB_SIZE) for b in range(VOCAB_SIZE)}
    best = max(allpairs, key=allpairs.get)
    by_first = sorted(range(VOCAB_SIZE), key=lambda a: -first[a])
    width = by_first.index(best[0]) + 1
    assert width == 6  # this checkpoint's: greedy's first token is not the best sequence's

    def top(beam_width):
        params = BeamSearchParams(beam_width=beam_width, max_tokens=2, ignore_eos=True, length_penalty=0.0)
        return [tuple(s.tokens[4:]) for s in llm.beam_search([prompt], params)[0].sequences]

    assert top(1)[0] != best and top(width - 1)[0] != best
    found = top(width)
    assert found[0] == best
    kept = set(by_first[:width])
    assert found == sorted((p for p in allpairs if p[0] in kept), key=lambda p: -allpairs[p])[:width]


def test_include_stop_str_in_output_keeps_the_eos_text(llm):
    params = BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=0.0, include_stop_str_in_output=True)
    seq = llm.beam_search([{"prompt_token_ids": EOS_PROMPT}], params)[0].sequences[0]
    assert seq.finish_reason == "stop" and seq.tokens == EOS_PROMPT + [EOS_ID]
    assert seq.text == llm.get_tokenizer().decode(seq.tokens)


def test_steps_reuse_the_prefix_cache(llm):
    """The prompt's two full blocks, cached by the first step, serve every later beam: 2 beams x
    2 later steps x 32 tokens (the block counters the server's /metrics shows)."""
    assert llm.reset_prefix_cache()
    before = engine_state(llm.engine, False).num_prefix_hits
    llm.beam_search([list(range(4, 44))], BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True))
    assert engine_state(llm.engine, False).num_prefix_hits - before == 2 * 2 * 32


def test_one_prompt_text_prompts_salts_concurrency_limit_and_tqdm(llm, capsys):
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    prompts = ["Hello", {"prompt": "Hi", "cache_salt": "tenant"}, [5, 6, 7]]
    together = llm.beam_search(prompts, params)
    one_by_one = llm.beam_search(prompts, params, concurrency_limit=1, use_tqdm=True)
    for a, b in zip(one_by_one, together, strict=True):
        assert_same(as_pairs(a), as_pairs(b), tol=1e-4)
    assert "Beam search" in capsys.readouterr().err
    single = llm.beam_search("Hello", params)
    assert len(single) == 1
    assert_same(as_pairs(single[0]), as_pairs(together[0]), tol=1e-4)
    assert together[0].sequences[0].text.startswith("Hello")  # the prompt's text too, as vLLM's LLM


def test_bad_calls_are_value_errors(llm):
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    with pytest.raises(ValueError, match=r"BeamSearchParams.beam_width must be <= 48"):
        llm.beam_search([[5, 6]], BeamSearchParams(beam_width=49, max_tokens=3))  # 98 > 96 logprobs
    with pytest.raises(ValueError, match="params must be a BeamSearchParams"):
        llm.beam_search([[5, 6]], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match="concurrency_limit"):
        llm.beam_search([[5, 6]], params, concurrency_limit=0)
    with pytest.raises(ValueError, match="prompt_token_ids must not be empty"):
        llm.beam_search([[5, 6], []], params)
    with pytest.raises(ValueError, match="vocab_size"):
        llm.beam_search([[5, VOCAB_SIZE]], params)
    assert not llm.engine.has_unfinished  # nothing left behind


def test_beam_width_is_bounded_by_the_vocabulary_under_a_larger_max_logprobs():
    """A max_logprobs above the vocabulary leaves the vocabulary the bound on 2 * beam_width, as
    max_logprobs=-1 does: a ValueError naming beam_width before any step (it was the first
    step's generate() failing on SamplingParams.logprobs, a field the caller never set)."""
    wide = LLM(str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", num_blocks=64, max_logprobs=1000)
    with pytest.raises(ValueError, match=r"BeamSearchParams.beam_width must be <= 48"):
        wide.beam_search([[5, 6]], BeamSearchParams(beam_width=49, max_tokens=2))
    assert not wide.engine.has_unfinished
    assert len(wide.beam_search([[5, 6]], BeamSearchParams(beam_width=48, max_tokens=1))[0].sequences) == 48


def test_beams_stop_at_max_model_len():
    small = LLM(str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", num_blocks=16, max_model_len=8)
    out = small.beam_search(
        [[5, 6, 7, 8, 9, 10]], BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True)
    )
    assert [len(s.tokens) for s in out[0].sequences] == [8, 8]
    assert {s.finish_reason for s in out[0].sequences} == {"length"}
    # a prompt of exactly max_model_len gets one step (the engine samples one token at its last
    # position, vLLM's rule); one over it is refused
    full = small.beam_search([list(range(4, 12))], BeamSearchParams(beam_width=2, max_tokens=5))
    assert [(len(s.tokens), s.finish_reason) for s in full[0].sequences] == [(9, "length")] * 2
    with pytest.raises(ValueError, match="max_model_len"):
        small.beam_search([list(range(4, 13))], BeamSearchParams(beam_width=2, max_tokens=5))
