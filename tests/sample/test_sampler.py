"""The batched sampler against exact distributions and plain per-row Python references.

Statistical tests draw N samples with a fixed seed and run a chi-square goodness-of-fit test at
ALPHA = 1e-3: were the sampler exactly right, a given seed would fail with probability 1e-3
(the seeds are fixed, so the suite is deterministic; a failure means the distribution is off or
this seed is the unlucky 0.1%). Tokens the exact distribution gives zero mass must never appear.
Requests come from the implementation under test (`impl.new_request`), as in the engine.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import random
import weakref

import pytest
import torch

from enginespec.sample.rng import row_key, seeded_uniform
from enginespec.sample.sampler import SPEC_CACHE_CALLS, Sampler, edit_logits, prompt_logprobs
from enginespec.spec import SamplingParams
from enginespec.testing.stats import chi2_sf, gamma_q

ALPHA = 1e-3
N_DRAWS = 20000
LOGITS6 = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0])
EOS = 5


# ---------------------------------------------------------------- chi-square without scipy


def _pool(expected: torch.Tensor, observed: torch.Tensor, minimum: float = 5.0):
    """Merge neighbouring cells (in token order) until each bin expects >= `minimum` draws,
    so wide supports keep their power instead of collapsing into one bin."""
    bins_e, bins_o, acc_e, acc_o = [], [], 0.0, 0.0
    for e, o in zip(expected.tolist(), observed.tolist()):
        acc_e, acc_o = acc_e + e, acc_o + o
        if acc_e >= minimum:
            bins_e.append(acc_e)
            bins_o.append(acc_o)
            acc_e, acc_o = 0.0, 0.0
    if acc_e > 0 and bins_e:
        bins_e[-1] += acc_e
        bins_o[-1] += acc_o
    elif acc_e > 0:
        bins_e, bins_o = [acc_e], [acc_o]
    return torch.tensor(bins_e, dtype=torch.float64), torch.tensor(bins_o, dtype=torch.float64)


def assert_matches(counts: torch.Tensor, probs: torch.Tensor) -> None:
    """Chi-square goodness of fit of `counts` to `probs`; neighbouring cells are pooled until
    each expects >= 5 draws; zero-probability cells must be empty."""
    counts, probs = counts.double(), probs.double()
    n = counts.sum().item()
    assert counts[probs == 0].sum().item() == 0, f"drew zero-probability tokens: {counts.tolist()}"
    support = probs > 0
    expected, observed = _pool(probs[support] * n, counts[support])
    dof = expected.numel() - 1
    if dof == 0:
        return  # a single possible outcome: the zero-mass check above is the whole test
    stat = (((observed - expected) ** 2) / expected).sum().item()
    p = chi2_sf(stat, dof)
    assert p > ALPHA, (
        f"chi2={stat:.1f} dof={dof} p={p:.2e}; first counts {counts[:16].tolist()}, "
        f"first probs {probs[:16].tolist()}"
    )


def test_chi2_sf_matches_known_values():
    # chi2.sf(x, k) for k=2 is exp(-x/2) exactly; k=1 is erfc(sqrt(x/2)).
    for x in (0.1, 1.0, 5.0, 20.0):
        assert math.isclose(gamma_q(1.0, x / 2), math.exp(-x / 2), rel_tol=1e-9)
        assert math.isclose(gamma_q(0.5, x / 2), math.erfc(math.sqrt(x / 2)), rel_tol=1e-9)
    assert math.isclose(gamma_q(5.0, 4.0), 0.6288369351798734, rel_tol=1e-9)


def test_chi2_check_rejects_a_wrong_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    with pytest.raises(AssertionError):
        assert_matches(torch.tensor([4000, 3000, 3000]), probs)
    with pytest.raises(AssertionError):
        assert_matches(torch.tensor([5000, 3000, 1999, 1]), torch.tensor([0.5, 0.3, 0.2, 0.0]))


# ---------------------------------------------------------------- per-row Python references


def reference_edit(logits: torch.Tensor, req) -> torch.Tensor:
    """allowed ids -> bad words -> min_tokens -> bias -> penalties, one token at a time, float64."""
    p = req.params
    x = [float(v) for v in logits.double()]
    if p.allowed_token_ids is not None:
        x = [v if t in p.allowed_token_ids else -math.inf for t, v in enumerate(x)]
    history = list(req.output_token_ids)
    for word in p.bad_words_token_ids:  # banned where the output ends with the word's other tokens
        *head, last = word
        if len(head) <= len(history) and history[len(history) - len(head) :] == head:
            x[last] = -math.inf
    if req.num_output_tokens < p.min_tokens:  # the EOS too, under ignore_eos (vLLM's rule)
        stops = set(p.stop_token_ids) | {req.eos_token_id}
        x = [-math.inf if t in stops else v for t, v in enumerate(x)]
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    out = list(req.output_token_ids)
    for t in range(len(x)):
        if t in out or t in req.prompt_token_ids:
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        n = out.count(t)
        x[t] -= p.frequency_penalty * n + (p.presence_penalty if n else 0.0)
    return torch.tensor(x, dtype=torch.float64)


def reference_probs(logits: torch.Tensor, req) -> torch.Tensor:
    """The exact distribution the sampler must draw from, by the textbook definitions."""
    p = req.params
    x = reference_edit(logits, req)
    if p.temperature == 0:
        return torch.nn.functional.one_hot(x.argmax(), x.numel()).double()
    probs = torch.softmax(x / p.temperature, dim=0)
    keep = probs >= p.min_p * probs.max()
    if 0 < p.top_k < x.numel():
        kth = sorted(x.tolist(), reverse=True)[p.top_k - 1]
        keep &= x >= kth
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    probs = probs / probs.sum()
    if p.top_p < 1.0:
        order = sorted(range(x.numel()), key=lambda t: -probs[t].item())
        mass, kept = 0.0, set()
        for t in order:
            if mass >= p.top_p:
                break
            kept.add(t)
            mass += probs[t].item()
        probs = torch.tensor([probs[t].item() if t in kept else 0.0 for t in range(x.numel())])
    return probs / probs.sum()


def make_request(impl, params, prompt=(1, 2, 3), outputs=(), rid="r"):
    req = impl.new_request(rid, list(prompt), params, eos_token_id=EOS)
    for t in outputs:
        req.append(t)
    return req


def draw_counts(sampler, logits_row, reqs) -> torch.Tensor:
    out = sampler(logits_row.expand(len(reqs), -1).contiguous(), reqs)
    return torch.bincount(torch.tensor(out.token_ids), minlength=logits_row.numel())


# ---------------------------------------------------------------- distributions

MODES = {
    "temperature1": SamplingParams(temperature=1.0),
    "temperature0.5": SamplingParams(temperature=0.5),
    "temperature2": SamplingParams(temperature=2.0),
    "top_k3": SamplingParams(top_k=3),
    "top_p0.7": SamplingParams(top_p=0.7),
    "min_p0.2": SamplingParams(min_p=0.2),
    "combined": SamplingParams(temperature=0.8, top_k=4, top_p=0.9, min_p=0.05),
    "top_k_off_top_p_min_p": SamplingParams(top_k=-1, top_p=0.7, min_p=0.1),
    "penalties_bias": SamplingParams(
        repetition_penalty=1.5, frequency_penalty=0.4, presence_penalty=0.3, logit_bias={5: 1.5, 0: -0.5}
    ),
    "allowed": SamplingParams(allowed_token_ids=(1, 3, 4)),
    "min_tokens": SamplingParams(min_tokens=4, stop_token_ids=(0,)),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_distribution_matches_exact(impl, mode):
    req = make_request(impl, MODES[mode], prompt=(0, 2), outputs=(1, 1, 4))
    probs = reference_probs(LOGITS6, req)
    assert (probs > 0).sum() >= 2, "the mode must leave a real choice for the test to mean anything"
    sampler = Sampler(6, seed=1234)
    assert_matches(draw_counts(sampler, LOGITS6, [req] * N_DRAWS), probs)


@pytest.mark.parametrize("temperature", [1e30, 1e39, 1e300])
@pytest.mark.parametrize("extra", [{}, {"top_k": 3}], ids=["plain", "top_k"])
def test_temperatures_past_float32_draw_uniformly(impl, temperature, extra):
    """1 / T underflows float32 past ~1e38 (a GPU flushes earlier): a zero scale drew the last
    vocabulary id every time. Such a row draws as T = MAX_TEMPERATURE: uniform over its keep."""
    req = make_request(impl, SamplingParams(temperature=temperature, **extra))
    probs = reference_probs(LOGITS6, req)
    assert (probs > 0).sum() >= 3
    assert_matches(draw_counts(Sampler(6, seed=7), LOGITS6, [req] * 6000), probs)


@pytest.mark.parametrize("extra", [{}, {"min_p": 0.1}], ids=["top_p", "top_p_min_p"])
def test_every_top_k_off_value_keeps_top_p(impl, extra):
    """top_k -1 and 0 (vLLM's two spellings of "off") and a top_k at or above the vocabulary
    leave top-p (and min-p) in force. -1 used to reach the torch cuts as it was, where it
    counted as a top-k that asked for no candidates: top-p was dropped, so `probs` (speculative
    decoding's target) and a seeded draw with min-p kept the whole tail, and the draw changed
    with the rows beside it in the batch."""
    rows = {}
    for k in (-1, 0, 6, 9):
        params = SamplingParams(temperature=1.0, top_k=k, top_p=0.7, seed=11, **extra)
        req = make_request(impl, params, prompt=(0, 2), rid=f"k{k}")
        probs = Sampler(6, seed=0).probs(LOGITS6.view(1, -1), [req])[0]
        draws = []
        for _ in range(40):  # successive seeded draws: the output index keys each one
            draws.append(Sampler(6, seed=0)(LOGITS6.view(1, -1), [req]).token_ids[0])
            req.append(draws[-1])
        rows[k] = (probs, draws)
    exact = reference_probs(LOGITS6, make_request(impl, SamplingParams(top_p=0.7, **extra)))
    assert int((exact > 0).sum()) == 3, "top-p must cut the tail for the test to mean anything"
    for k, (probs, draws) in rows.items():
        torch.testing.assert_close(probs.double(), exact.double(), atol=1e-6, rtol=1e-5, msg=f"top_k={k}")
        assert draws == rows[0][1], f"top_k={k} drew other tokens than top_k=0"
        assert max(draws) <= 2, f"top_k={k} drew a token top-p cuts"


def test_seeded_rows_match_exact_distribution(impl):
    """Hash-derived noise (one seed per row) draws from the right distribution too."""
    params = [SamplingParams(temperature=0.7, top_p=0.95, seed=s) for s in range(N_DRAWS)]
    reqs = [make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)]
    probs = reference_probs(LOGITS6, reqs[0])
    assert_matches(draw_counts(Sampler(6), LOGITS6, reqs), probs)


def test_seeded_draws_across_output_index_match_exact_distribution(impl):
    """One seed, successive output indices: the draws must be a fair sequence."""
    params = SamplingParams(temperature=1.0, seed=99)
    req = make_request(impl, params, prompt=(1,))
    sampler, tokens = Sampler(6), []
    for _ in range(3000):
        tokens.append(sampler(LOGITS6.view(1, -1), [req]).token_ids[0])
        req.append(0)  # the token appended does not matter: draws key on the output index
    probs = torch.softmax(LOGITS6.double(), 0)
    assert_matches(torch.bincount(torch.tensor(tokens), minlength=6), probs)


def test_seeded_uniform_is_uniform():
    u = seeded_uniform([row_key(s, i) for s in range(8) for i in range(4)], 4096, "cpu")
    assert u.min() > 0 and u.max() < 1
    counts = torch.histc(u.flatten(), bins=32, min=0.0, max=1.0)
    assert_matches(counts, torch.full((32,), 1 / 32))


# ---------------------------------------------------------------- greedy and mixed batches


def test_greedy_rows_take_argmax_in_mixed_batch(impl):
    torch.manual_seed(0)
    logits = torch.randn(12, 50)
    params = [
        SamplingParams(temperature=0.0) if i % 3 == 0 else SamplingParams(temperature=1.5, seed=i)
        for i in range(12)
    ]
    reqs = [make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)]
    out = Sampler(50, seed=0)(logits, reqs)
    greedy = [i for i in range(12) if i % 3 == 0]
    assert [out.token_ids[i] for i in greedy] == logits[greedy].argmax(1).tolist()
    assert out.logprobs == [None] * 12
    random_rows = [out.token_ids[i] for i in range(12) if i % 3]
    assert random_rows != logits[[i for i in range(12) if i % 3]].argmax(1).tolist()


def test_padded_vocab_columns_are_never_sampled(impl):
    logits = torch.zeros(64, 10)
    logits[:, 8:] = 50.0  # columns past vocab_size=8 (padding) dominate
    reqs = [
        make_request(impl, SamplingParams(temperature=t), rid=f"r{i}") for i, t in enumerate([0.0, 1.0] * 32)
    ]
    assert max(Sampler(8, seed=0)(logits, reqs).token_ids) < 8


@pytest.mark.parametrize("top_p", [1e-46, 1e-300, 5e-324])
def test_a_top_p_below_float32_keeps_the_top_token(impl, top_p):
    """A top_p in (0, 1] that rounds to 0 in float32 (below ~7e-46; vLLM's bound takes it)
    keeps the top token alone, as any tiny top_p does (vLLM's float32 top-p keeps it too). The
    rejection draw read it as 0, where even the top token's mass above (0) is not below it: every
    row ran its MAX_ROUNDS rounds (about 10 s a call on a 6-token row, so one such request
    stalled a server's steps) and then returned whatever its last round drew, not the argmax."""
    params = [SamplingParams(top_p=top_p, seed=s if s % 2 else None) for s in range(8)]
    reqs = [make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)]
    top = 2  # not id 0, which an exhausted draw's fallback returns
    logits = LOGITS6[[2, 3, 0, 4, 1, 5]].expand(len(reqs), -1).contiguous()
    sampler = Sampler(6, seed=0)
    assert sampler(logits, reqs).token_ids == [top] * len(reqs)
    deferred = sampler.sample_deferred(logits, reqs)
    assert deferred.token_ids.tolist() == [top] * len(reqs)
    torch.testing.assert_close(sampler.probs(logits, reqs), torch.eye(6)[[top] * len(reqs)])


# ---------------------------------------------------------------- seeds


def test_seeded_draw_independent_of_batch_and_position(impl):
    rng = random.Random(0)
    torch.manual_seed(0)
    logits = torch.randn(1, 40)
    draws = set()
    for seed in range(30):
        params = SamplingParams(temperature=1.0, top_k=30, seed=seed)
        req = make_request(impl, params, outputs=[7] * (seed % 5), rid="seeded")
        alone = Sampler(40, seed=1)(logits, [req]).token_ids[0]
        size, pos = rng.randint(2, 9), None
        pos = rng.randrange(size)
        others = [
            make_request(
                impl,
                SamplingParams(temperature=rng.choice([0.0, 1.0]), seed=rng.choice([None, 5])),
                rid=f"o{j}",
            )
            for j in range(size - 1)
        ]
        batch = others[:pos] + [req] + others[pos:]
        mixed = torch.randn(size, 40)
        mixed[pos] = logits[0]
        assert Sampler(40, seed=2)(mixed, batch).token_ids[pos] == alone
        draws.add(alone)
    assert len(draws) > 3, "different seeds must give different draws"


def test_unseeded_rows_follow_sampler_seed(impl):
    logits = torch.randn(16, 30, generator=torch.Generator().manual_seed(3))
    reqs = [make_request(impl, SamplingParams(), rid=f"r{i}") for i in range(2 * SPEC_CACHE_CALLS)]
    a, b, c = (
        Sampler(30, seed=7)(logits, reqs),
        Sampler(30, seed=7)(logits, reqs),
        Sampler(30, seed=8)(logits, reqs),
    )
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


# ---------------------------------------------------------------- edits against Python


def _random_params(rng: random.Random, vocab: int) -> SamplingParams:
    return SamplingParams(
        temperature=0.0,
        repetition_penalty=rng.choice([1.0, 0.5, 1.3, 2.0]),
        frequency_penalty=rng.choice([0.0, -0.7, 0.5, 2.0]),
        presence_penalty=rng.choice([0.0, 1.0, -1.5]),
        logit_bias=rng.choice([None, {rng.randrange(vocab): rng.uniform(-5, 5) for _ in range(3)}]),
        allowed_token_ids=rng.choice([None, tuple(rng.sample(range(vocab), 4))]),
        min_tokens=rng.choice([0, 2, 6]),
        max_tokens=16,
        stop_token_ids=tuple(rng.sample(range(vocab), rng.randint(0, 2))),
        ignore_eos=rng.choice([False, True]),
    )


def _random_requests(impl, rng, vocab: int, count: int, *, max_prompt: int, max_output: int) -> list:
    """`count` requests with random params (_random_params), prompts and output histories."""
    reqs = []
    for i in range(count):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, max_prompt))]
        outputs = [rng.randrange(vocab) for _ in range(rng.randint(0, max_output))]
        params = dataclasses.replace(
            _random_params(rng, vocab), bad_words_token_ids=_random_bans(rng, outputs, vocab)
        )
        reqs.append(make_request(impl, params, prompt, outputs, rid=f"r{i}"))
    return reqs


def _random_bans(rng: random.Random, outputs: list, vocab: int) -> list:
    """None, or bad-word sequences: a one-token word, a word that completes the output's last
    two tokens, one that follows a prefix the output does not end with."""
    if rng.random() < 0.4:
        return []
    tail = outputs[-2:]
    return [[rng.randrange(vocab)], tail + [rng.randrange(vocab)], [rng.randrange(vocab) for _ in range(3)]]


@pytest.mark.parametrize("case", range(4))
def test_edits_match_python_reference(impl, case):
    rng, vocab = random.Random(case), 24
    reqs = _random_requests(impl, rng, vocab, 8, max_prompt=6, max_output=8)
    logits = torch.randn(8, vocab, generator=torch.Generator().manual_seed(case)) * 3
    got = edit_logits(logits, reqs)
    for i, req in enumerate(reqs):
        want = reference_edit(logits[i], req).float()
        assert torch.equal(torch.isinf(got[i]), torch.isinf(want)), i
        finite = torch.isfinite(want)
        torch.testing.assert_close(got[i][finite], want[finite], rtol=1e-5, atol=1e-5)
    out = Sampler(vocab, seed=0)(logits, reqs)
    assert out.token_ids == [reference_edit(logits[i], r).argmax().item() for i, r in enumerate(reqs)]


def test_edit_logits_leaves_input_untouched(impl):
    logits = torch.randn(2, 10)
    before = logits.clone()
    reqs = [
        make_request(impl, SamplingParams(logit_bias={1: 3.0}, repetition_penalty=2.0), rid=f"r{i}")
        for i in range(2)
    ]
    edit_logits(logits, reqs)
    assert torch.equal(logits, before)


# ---------------------------------------------------------------- min_tokens, allowed ids


def test_min_tokens_masks_eos_and_stop_ids_until_reached(impl):
    logits = torch.tensor([[0.0, 9.0, 1.0, 0.0, 0.0, 10.0]])  # EOS=5 best, stop id 1 second
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(1,))
    sampler = Sampler(6)
    for n_out, want in ((0, 2), (2, 2), (3, 5)):
        req = make_request(impl, params, outputs=[4] * n_out)
        assert sampler(logits, [req]).token_ids == [want], n_out


@pytest.mark.parametrize("path", ["serial", "deferred"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "random"])
def test_min_tokens_masks_eos_under_ignore_eos_too(impl, path, temperature):
    """vLLM's min_tokens bans the EOS until min_tokens are out whether or not it stops the
    request: its MinTokensLogitsProcessor masks all_stop_token_ids, to which the engine adds
    every request's EOS. Under ignore_eos the EOS was left free and drawn there (here it is the
    likeliest token: greedy rows took it, random rows drew it half the time), on both paths."""
    logits = torch.tensor([0.0, 9.0, 1.0, 0.0, 0.0, 10.0])  # EOS=5 best, stop id 1 second
    params = SamplingParams(temperature=temperature, min_tokens=3, ignore_eos=True, stop_token_ids=(1,))
    sampler, draws = Sampler(6, seed=0), 200
    for n_out in (0, 2, 3):
        reqs = [make_request(impl, params, outputs=[4] * n_out, rid=f"r{i}") for i in range(draws)]
        rows = logits.expand(draws, -1).contiguous()
        if path == "serial":
            drawn = set(sampler(rows, reqs).token_ids)
        else:
            drawn = set(sampler.sample_deferred(rows, reqs).token_ids.tolist())
        if n_out < 3:
            assert not drawn & {1, 5}, f"{n_out} tokens out: drew {drawn}"
        else:
            assert 5 in drawn, f"min_tokens reached: the EOS is free again, drew {drawn}"


@pytest.mark.parametrize("path", ["serial", "deferred"])
def test_min_tokens_edges_on_both_paths(impl, path):
    """The edges of the min_tokens mask, the same on the serial and the device path: min_tokens 1
    bans the EOS for the first token; a request without an EOS id has its stop ids banned and
    nothing else; a stop id past the rows' width (no logit to mask) is skipped, not an error."""
    logits = torch.tensor([[0.0, 9.0, 1.0, 0.0, 0.0, 10.0]])  # EOS=5 best, stop id 1 second
    sampler = Sampler(6, seed=0)

    def greedy(params, outputs=(), eos=EOS) -> int:
        req = impl.new_request("r", [1, 2, 3], params, eos_token_id=eos)
        for t in outputs:
            req.append(t)
        if path == "serial":
            return sampler(logits, [req]).token_ids[0]
        return int(sampler.sample_deferred(logits, [req]).token_ids[0])

    assert greedy(SamplingParams(temperature=0.0, min_tokens=1)) == 1
    assert greedy(SamplingParams(temperature=0.0, min_tokens=1), outputs=[4]) == 5
    no_eos = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(5,))
    assert greedy(no_eos, eos=None) == 1
    assert greedy(SamplingParams(temperature=0.0, min_tokens=2), eos=None) == 5
    assert greedy(SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(6,))) == 1


@pytest.mark.parametrize("path", ["serial", "deferred"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "random"])
def test_min_tokens_yields_where_hard_constraints_leave_only_stop_ids(impl, path, temperature):
    """allowed_token_ids and bad words outrank min_tokens: where bad words of several tokens
    have banned every allowed id but the stop ids, the min_tokens ban of those yields for that
    row and step, and the row draws an allowed stop id. It drew token 0, never allowed, from an
    all -inf row. Where a non-stop id survives the ban holds; rows without those constraints,
    and the same constrained row after another output, are unaffected."""
    logits = torch.tensor([0.0, 9.0, 1.0, 0.0, 0.0, 10.0, 3.0, 2.0])  # EOS=5 best, stop id 1 second
    words = [[2, 3], [2, 2]]  # after a 2: 2 and 3 banned
    cases = [
        (SamplingParams(allowed_token_ids=[EOS, 2, 3], bad_words_token_ids=words), (2,), {EOS}),
        (
            SamplingParams(allowed_token_ids=[1, 2, 3], bad_words_token_ids=words, stop_token_ids=[1]),
            (2,),
            {1},
        ),
        (SamplingParams(allowed_token_ids=[EOS, 2, 3], bad_words_token_ids=words), (3,), {2, 3}),
        (SamplingParams(allowed_token_ids=[EOS, 2, 3, 6], bad_words_token_ids=words), (2,), {6}),
        (SamplingParams(), (2,), {0, 1, 2, 3, 4, 6, 7}),  # only the EOS held
        # allowed ids alone that are all stop ids (the engine refuses these on add; the
        # sampler's rule stands on its own): a hard constraint without bad words
        (SamplingParams(allowed_token_ids=[EOS, 1], stop_token_ids=[1]), (2,), {EOS, 1}),
    ]
    sampler, draws = Sampler(8, seed=0), 100
    reqs, want = [], []
    for i, (params, outputs, allowed) in enumerate(cases):
        params = dataclasses.replace(params, temperature=temperature, min_tokens=3)
        reqs += [make_request(impl, params, outputs=outputs, rid=f"r{i}.{j}") for j in range(draws)]
        want.append(allowed)
    rows = logits.expand(len(reqs), -1).contiguous()
    if path == "serial":
        drawn = sampler(rows, reqs).token_ids
    else:
        drawn = sampler.sample_deferred(rows, reqs, resolved=True).token_ids.tolist()
    for i, allowed in enumerate(want):
        got = set(drawn[i * draws : (i + 1) * draws])
        assert got <= allowed, f"case {i}: drew {got}, allowed {allowed}"
        assert temperature > 0 or len(got) == 1, got


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "random"])
def test_a_constrained_row_under_min_tokens_draws_on_the_device_as_on_the_host(impl, temperature):
    """A structured-outputs row below min_tokens whose grammar's mask left only the EOS keeps
    it (the grammar outranks min_tokens) on the device path too (EditPlan's guard), so such a
    step draws there (async scheduling keeps its overlap) instead of being handed back to the
    serial sampler; a row whose mask leaves another token still has the EOS banned."""
    from enginespec.spec import StructuredOutputsParams

    grammar = StructuredOutputsParams(choice=["ab"])
    params = SamplingParams(temperature=temperature, seed=7, min_tokens=3, structured_outputs=grammar)
    complete = torch.full((8,), float("-inf"))
    complete[EOS] = 0.0
    open_ = complete.clone()
    open_[6] = -2.0
    reqs = [make_request(impl, params, outputs=(2,), rid=f"r{i}") for i in range(2)]
    x = torch.stack([complete, open_])
    drawn = Sampler(8, seed=0).sample_deferred(x, reqs, resolved=True)
    assert drawn is not None, "handed back to the serial sampler"
    assert drawn.token_ids.tolist() == [EOS, 6] == Sampler(8, seed=0)(x, reqs).token_ids


def test_allowed_token_ids_restrict_random_and_greedy(impl):
    logits = torch.randn(1, 32, generator=torch.Generator().manual_seed(5))
    allowed = (3, 17, 30)
    reqs = [
        make_request(impl, SamplingParams(temperature=2.0, allowed_token_ids=allowed), rid=f"r{i}")
        for i in range(500)
    ]
    drawn = set(Sampler(32, seed=0)(logits.expand(500, -1), reqs).token_ids)
    assert drawn == set(allowed)
    greedy = make_request(impl, SamplingParams(temperature=0.0, allowed_token_ids=allowed))
    best = max(allowed, key=lambda t: logits[0, t].item())
    assert Sampler(32)(logits, [greedy]).token_ids == [best]


def test_bad_words_ban_a_word_s_last_token_after_its_prefix(impl):
    """vLLM's rule: a one-token word is banned always; a longer word's last token only where
    the output (never the prompt) ends with the rest of it."""
    logits = torch.arange(8, dtype=torch.float32).view(1, 8)  # token 7 best, then 6, 5, ...
    params = SamplingParams(temperature=0.0, bad_words_token_ids=[[7], [2, 3, 6], [4, 5]])
    sampler = Sampler(8)
    for outputs, want in (((), 6), ((2,), 6), ((2, 3), 5), ((1, 2, 3), 5), ((4,), 6), ((2, 3, 1), 6)):
        req = make_request(impl, params, prompt=(2, 3), outputs=outputs)
        assert sampler(logits, [req]).token_ids == [want], outputs
    free = make_request(impl, SamplingParams(temperature=0.0), outputs=(2, 3))
    banned = make_request(impl, params, outputs=(2, 3), rid="b")
    assert sampler(logits.expand(2, -1), [free, banned]).token_ids == [7, 5]  # per row


def test_bad_words_take_the_device_path_once_resolved(impl):
    """sample_deferred declines a batch with bad words unless the caller says the requests'
    tokens are resolved (their bans read the newest output token, which may be a placeholder
    of a step still in flight); resolved, it draws what the serial sampler draws: the bans of
    the host's rule (the table of test_bad_words_ban_a_word_s_last_token_after_its_prefix),
    greedy and seeded rows, beside rows without bans."""
    logits = torch.arange(8, dtype=torch.float32).view(1, 8)  # token 7 best, then 6, 5, ...
    words = [[7], [2, 3, 6], [4, 5]]
    cases = [(), (2,), (2, 3), (1, 2, 3), (4,), (2, 3, 1)]
    reqs = [
        make_request(impl, SamplingParams(temperature=0.0, bad_words_token_ids=words), outputs=o, rid=f"g{i}")
        for i, o in enumerate(cases)
    ]
    reqs += [make_request(impl, SamplingParams(temperature=0.0), outputs=(2, 3), rid="free")]
    reqs += [
        make_request(
            impl, SamplingParams(temperature=1.5, seed=i, bad_words_token_ids=words), outputs=o, rid=f"s{i}"
        )
        for i, o in enumerate(cases)
    ]
    x = logits.expand(len(reqs), -1).contiguous()
    assert Sampler(8).sample_deferred(x, reqs) is None
    drawn = Sampler(8, seed=0).sample_deferred(x, reqs, resolved=True)
    assert drawn is not None
    serial = Sampler(8, seed=0)(x, reqs).token_ids
    assert drawn.token_ids.tolist() == serial
    assert serial[: len(cases) + 1] == [6, 6, 5, 5, 6, 6, 7]
    plain = [make_request(impl, SamplingParams(temperature=0.0), rid=f"p{i}") for i in range(2)]
    assert Sampler(8).sample_deferred(logits.expand(2, -1), plain) is not None


def test_one_token_bad_words_take_the_device_path_unresolved(impl):
    """One-token words ban whatever came before (penalties.bans_read_outputs), so a batch whose
    bad words are all one token draws on the device without resolved=True, over rows whose
    newest token is still a placeholder, and draws what the serial sampler draws; one word of
    two tokens in the batch makes it decline again."""
    from enginespec.sample.penalties import bans_read_outputs

    assert not bans_read_outputs([[7], [3]]) and bans_read_outputs([[7], [2, 3]])
    logits = torch.arange(8, dtype=torch.float32).view(1, 8)  # token 7 best, then 6, 5, ...
    placeholder = 8  # the vocabulary's size: what the engine puts in for a token in flight
    reqs = [
        make_request(
            impl,
            SamplingParams(temperature=0.0, bad_words_token_ids=[[7], [6]]),
            outputs=(2, placeholder),
            rid="g",
        ),
        make_request(impl, SamplingParams(temperature=0.0), outputs=(2, placeholder), rid="free"),
        make_request(
            impl,
            SamplingParams(temperature=1.5, seed=3, bad_words_token_ids=[[7]]),
            outputs=(placeholder,),
            rid="s",
        ),
    ]
    x = logits.expand(len(reqs), -1).contiguous()
    drawn = Sampler(8, seed=0).sample_deferred(x, reqs)
    assert drawn is not None
    ids = drawn.token_ids.tolist()
    assert ids[0] == 5 and ids[1] == 7 and ids[2] != 7
    assert ids == Sampler(8, seed=0)(x, reqs).token_ids
    two = make_request(
        impl, SamplingParams(temperature=0.0, bad_words_token_ids=[[2, 3]]), outputs=(2,), rid="t"
    )
    assert Sampler(8).sample_deferred(logits.expand(4, -1).contiguous(), reqs + [two]) is None


@pytest.mark.parametrize(
    "extra",
    [
        dict(repetition_penalty=1.3),
        dict(presence_penalty=0.5, frequency_penalty=0.2),
        dict(logit_bias={6: 1.0}),
    ],
    ids=["repetition", "presence-frequency", "bias"],
)
def test_one_token_bans_hold_beside_every_other_edit(impl, extra):
    """A row with one-token bad words and another edit (penalties take a one-pass copy of their
    own when they are a batch's only edit) still never draws a banned id, on the device path as
    on the serial one."""
    logits = torch.arange(8, dtype=torch.float32).view(1, 8)  # token 7 best, then 6, 5, ...
    params = SamplingParams(temperature=0.0, bad_words_token_ids=[[7], [6]], **extra)
    reqs = [make_request(impl, params, outputs=(1, 2), rid=f"r{i}") for i in range(3)]
    x = logits.expand(len(reqs), -1).contiguous()
    drawn = Sampler(8, seed=0).sample_deferred(x, reqs).token_ids.tolist()
    assert drawn == Sampler(8, seed=0)(x, reqs).token_ids
    assert not set(drawn) & {6, 7}, drawn


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bans_never_make_the_host_wait_for_the_device(impl):
    """Under async scheduling a step's bans are applied while its forward runs: a copy that
    synchronises (a pageable upload, a scalar sent up for the fill) would make the host wait
    for it. The second call, its plan built, runs under torch's sync debug mode."""
    logits = torch.randn(3, 64, device="cuda")
    banned = SamplingParams(temperature=0.0, bad_words_token_ids=[[7], [2, 3]])
    reqs = [make_request(impl, banned, outputs=(1, 2), rid=f"b{i}") for i in range(2)]
    reqs.append(make_request(impl, SamplingParams(temperature=0.0), outputs=(1, 2), rid="free"))
    logits[:, 7] = logits[:, 3] = 50.0  # the two banned ids would win every row
    sampler = Sampler(64)
    assert sampler.sample_deferred(logits, reqs, resolved=True) is not None
    torch.cuda.set_sync_debug_mode("error")
    try:
        drawn = sampler.sample_deferred(logits, reqs, resolved=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ids = drawn.token_ids.tolist()
    assert ids[0] not in (7, 3) and ids[1] not in (7, 3) and ids[2] in (7, 3)


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_raw_log_softmax(impl):
    torch.manual_seed(1)
    logits = torch.randn(5, 40) * 4
    params = [
        SamplingParams(logprobs=3, temperature=0.0),
        SamplingParams(logprobs=0, top_k=5),
        SamplingParams(),
        SamplingParams(logprobs=5, repetition_penalty=2.0, logit_bias={0: 9.0}),
        SamplingParams(logprobs=1, seed=3),
    ]
    reqs = [make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)]
    out = Sampler(40, seed=0)(logits, reqs)
    lp = torch.log_softmax(logits.double(), dim=1)
    assert out.logprobs[2] is None
    for i, p in enumerate(params):
        if p.logprobs is None:
            continue
        entries = out.logprobs[i]
        assert len(entries) == 1 + p.logprobs
        assert entries[0][0] == out.token_ids[i]
        for tok, value in entries:
            assert math.isclose(value, lp[i, tok].item(), abs_tol=1e-5)
        top = [t for t, _ in entries[1:]]
        assert top == lp[i].topk(p.logprobs).indices.tolist()


def test_prompt_logprobs(impl):
    torch.manual_seed(2)
    logits = torch.randn(4, 20)
    targets = [3, 0, 19, 7]
    lp = torch.log_softmax(logits.double(), dim=1)
    got = Sampler(20).prompt_logprobs(logits, targets, 2)
    for p, entry in enumerate(got):
        assert list(entry)[0] == targets[p]
        want = {targets[p]} | set(lp[p].topk(2).indices.tolist())
        assert set(entry) == want
        for tok, value in entry.items():
            assert math.isclose(value, lp[p, tok].item(), abs_tol=1e-5)
    assert [list(e) for e in prompt_logprobs(logits, targets, 0)] == [[t] for t in targets]


def _rank(row: torch.Tensor, token: int) -> int:
    """vLLM V1's rank of `token` in a row: the entries >= it, itself and ties included
    (vllm/v1/sample/ops/logprobs.py, batched_count_greater_than)."""
    return int((row >= row[token]).sum())


def _rank_logits() -> torch.Tensor:
    torch.manual_seed(4)
    logits = torch.randn(4, 40) * 4
    logits[2] = 0.0
    logits[2, [1, 2, 3]] = 10.0  # three tied at the top, all above row 2's forced token 9
    logits[2, [9, 12]] = 5.0  # token 9 ties with token 12: both count, rank 5
    return logits


def test_logprobs_are_logprob_objects_with_vllm_ranks(impl):
    """Every value is a Logprob: the float itself (arithmetic, comparisons and isclose as on a
    plain float) with vLLM's attributes: .logprob, .rank (the top k: 1..k in order; the sampled
    token: the entries at or above it in its row, ties included, here far outside the top k) and
    .decoded_token (None from the sampler: the engine names tokens)."""
    logits = _rank_logits()
    lowest = int(logits[0].argmin())
    params = [
        SamplingParams(logprobs=2, allowed_token_ids=(lowest,)),  # sampled: the row's last
        SamplingParams(logprobs=3, temperature=0.0),
        SamplingParams(logprobs=1, allowed_token_ids=(9,)),
        SamplingParams(logprobs=0, temperature=1.0, seed=1),
    ]
    reqs = [make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)]
    out = Sampler(40, seed=0)(logits, reqs)
    lp = torch.log_softmax(logits, dim=1)
    assert (
        out.token_ids[0] == lowest and out.token_ids[1] == int(logits[1].argmax()) and out.token_ids[2] == 9
    )
    for i, p in enumerate(params):
        (tok, chosen), *top = out.logprobs[i]
        assert tok == out.token_ids[i] and chosen.rank == _rank(logits[i], tok)
        assert type(chosen.logprob) is float and chosen.logprob == chosen and chosen.decoded_token is None
        assert [v.rank for _, v in top] == list(range(1, p.logprobs + 1))
        for t, v in top:
            assert math.isclose(v, lp[i, t].item(), abs_tol=1e-5) and v + 1 == v.logprob + 1
    assert out.logprobs[0][0][1].rank == 40 and out.logprobs[1][0][1].rank == 1
    assert out.logprobs[2][0][1].rank == 5 and out.logprobs[2][1][1].rank == 1


def test_prompt_logprobs_rank_the_actual_token(impl):
    """Prompt logprobs: the target's rank counts the entries at or above it (ties included);
    the top-k entries not already in the dict have ranks 1..k in order."""
    logits = _rank_logits()
    targets = [int(logits[0].argmin()), int(logits[1].argmax()), 12, int(logits[3].argmin())]
    got = prompt_logprobs(logits, targets, 2)
    for p, entry in enumerate(got):
        assert entry[targets[p]].rank == _rank(logits[p], targets[p])
        top = logits[p].topk(2).indices.tolist()
        assert [entry[t].rank for t in top if t != targets[p]] == [
            r for r, t in enumerate(top, 1) if t != targets[p]
        ]
    assert [entry[t].rank for entry, t in zip(got, targets)] == [40, 1, 5, 40]


def test_tied_tokens_rank_after_all_their_ties(impl):
    """vLLM V1 ranks a chosen token by the entries >= it, itself included
    (batched_count_greater_than), so every token it ties with counts; a target that is also in
    the top k shows its top-k entry (vLLM builds the dict target first, then the top k), so the
    top k's ranks stay 1..k whichever tied token the target is. Rows 0-4: five tokens tied at
    the top, each the target of one row; row 5's target ties with a token and five zeros."""
    logits = torch.zeros(6, 12)
    logits[:, :5] = 3.0
    logits[:, [7, 8]] = -1.0
    targets = [0, 1, 2, 3, 4, 8]
    got = prompt_logprobs(logits, targets, 5)
    for entry, target in zip(got, targets):
        assert next(iter(entry)) == target
        assert sorted(entry[t].rank for t in range(5)) == [1, 2, 3, 4, 5]
    assert got[5][8].rank == 12
    sampled = make_request(impl, SamplingParams(logprobs=0, allowed_token_ids=(8,)))
    (token, chosen), *_ = Sampler(12, seed=0)(logits[5:], [sampled]).logprobs[0]
    assert (token, chosen.rank) == (8, 12)


def test_bad_shapes_raise_value_errors(impl):
    req = make_request(impl, SamplingParams())
    with pytest.raises(ValueError, match="len\\(requests\\)"):
        Sampler(10)(torch.zeros(2, 10), [req])
    with pytest.raises(ValueError, match="vocab_size"):
        Sampler(10)(torch.zeros(1, 8), [req])
    with pytest.raises(ValueError, match="target_ids"):
        prompt_logprobs(torch.zeros(2, 10), [1], 1)
    with pytest.raises(ValueError, match="vocab_size"):
        Sampler(0)


# ---------------------------------------------------------------- Triton draw vs torch draw


@pytest.mark.parametrize("chunk", [64, 256, 1024])
def test_triton_draw_matches_torch_draw(chunk):
    """The two Triton kernels (interpreted on CPU) draw the same tokens as the torch path, for
    seeded, unseeded (derived keys) and greedy rows, with and without cuts, over several chunks."""
    from enginespec.kernels import sampling as sampling_triton
    from enginespec.sample.rng import resolve_keys
    from enginespec.sample.sampler import draw_torch

    if sampling_triton.triton is None:
        pytest.skip("triton not installed")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(11)
    rows, vocab = 8, 3000  # vocab spans several blocks and chunks, the last one partial
    x = (torch.randn(rows, vocab, generator=gen) * 2).to(dev)
    x[0, 5] = x[0, 2900] = x[0].max() + 1  # a greedy tie: the lower id must win
    x[7, :1500] = float("-inf")  # whole chunks masked (allowed-ids style)
    noisy = [False, True, True, True, False, True, True, True]
    x_scale = torch.tensor([1.0, 1.0, 2.0, 0.5, 1.0, 1.3, 0.8, 1.0], device=dev)
    thr = torch.tensor(
        [float("-inf"), float("-inf"), 1.0, 0.0, float("-inf"), 2.5, float("-inf"), 0.5], device=dev
    )
    keys = [0, row_key(1, 0), row_key(2, 5), -1, 0, 2**63 - 1, -1, row_key(4, 1)]
    base = (123456789, 2**31 - 1)
    noise = torch.tensor([1.0 if n else 0.0 for n in noisy], device=dev)
    got = sampling_triton.draw(x, x_scale, thr, noise, torch.tensor(keys, device=dev), base, chunk=chunk)
    want = draw_torch(x, x_scale, thr, resolve_keys(keys, base), noisy, chunk=chunk)
    assert got.tolist() == want.tolist()
    assert got[0].item() == 5
    assert all(x[i, t] >= thr[i] and x[i, t] > float("-inf") for i, t in enumerate(got.tolist()))


def test_penalty_state_follows_requests_across_calls(impl):
    """One Sampler over several steps: new outputs count, a new request reusing an id gets
    its own prompt (the prompt-mask cache must not go stale)."""
    vocab = 12
    logits = torch.linspace(1.0, 2.0, vocab).unsqueeze(0)  # token 11 best, then 10, ...
    params = SamplingParams(temperature=0.0, repetition_penalty=4.0)
    sampler = Sampler(vocab)
    first = make_request(impl, params, prompt=[11], rid="same")
    assert sampler(logits, [first]).token_ids == [10]
    first.append(10)
    assert sampler(logits, [first]).token_ids == [9]
    second = make_request(impl, params, prompt=[10], rid="same")
    assert sampler(logits, [second]).token_ids == [11]


# ---------------------------------------------------------------- large vocabularies

WIDE = 2048  # > NUM_CANDIDATES, so top-p takes its candidate and full-sort paths


@pytest.mark.parametrize("case", ["flat_top_p", "peaky_top_p", "min_p_then_top_p", "top_k_large"])
def test_wide_vocab_cuts_match_exact(impl, case):
    """Top-p where the nucleus is wider than the candidates (full-sort fallback), fits in
    them (candidate path with a whole-row mass), is bounded by min-p, and a top-k > 512."""
    from enginespec.sample.truncation import NUM_CANDIDATES

    assert WIDE > NUM_CANDIDATES
    ramp = torch.linspace(0.0, 1.0, WIDE)
    logits, params = {
        "flat_top_p": (ramp, SamplingParams(top_p=0.8)),
        "peaky_top_p": (ramp * 12, SamplingParams(top_p=0.7)),
        "min_p_then_top_p": (ramp * 6, SamplingParams(min_p=0.2, top_p=0.9)),
        "top_k_large": (ramp, SamplingParams(top_k=700, top_p=0.95)),
    }[case]
    req = make_request(impl, params)
    probs = reference_probs(logits, req)
    draws = 3000  # fewer than elsewhere: the CPU noise hash over 2048 columns is the cost
    out = Sampler(WIDE, seed=3)(logits.expand(draws, -1).contiguous(), [req] * draws)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=WIDE)
    assert_matches(counts, probs)


def test_wide_vocab_mixed_batch_matches_exact(impl):
    """Rows on different top-p paths (fallback, candidates, bounded by min-p), plus greedy
    rows, in one batch: each row group still draws from its own exact distribution."""
    ramp = torch.linspace(0.0, 1.0, WIDE)
    groups = [
        (ramp, SamplingParams(top_p=0.8)),
        (ramp * 12, SamplingParams(top_p=0.7)),
        (ramp * 6, SamplingParams(min_p=0.2, top_p=0.9, temperature=0.7)),
        (ramp * 3, SamplingParams(temperature=0.0)),
    ]
    per_group = 1000
    reqs = [make_request(impl, p, rid=f"g{g}") for g, (_, p) in enumerate(groups)]
    rows = [g for _ in range(per_group) for g in range(len(groups))]
    logits = torch.stack([groups[g][0] for g in rows])
    out = Sampler(WIDE, seed=5)(logits, [reqs[g] for g in rows])
    tokens = torch.tensor(out.token_ids)
    for g, (row_logits, _) in enumerate(groups):
        counts = torch.bincount(tokens[torch.tensor(rows) == g], minlength=WIDE)
        assert_matches(counts, reference_probs(row_logits, reqs[g]))


def test_sampler_triton_path_matches_torch_path(impl, monkeypatch):
    """The whole Sampler with its Triton draw (`cut_draw`, interpreted on CPU) against the
    torch path: seeded rows with every kind of cut, greedy rows, and a batch with no cut."""
    from enginespec.kernels import cut_draw
    from enginespec.kernels import sampling as sampling_triton
    from enginespec.sample import draw as sampling_draw

    if sampling_triton.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(12, 700, generator=gen) * 3
    settings = [
        dict(temperature=0.0),
        dict(temperature=0.7, top_k=20),
        dict(top_p=0.9),
        dict(min_p=0.1, temperature=1.3),
        dict(top_k=600, top_p=0.8),
        dict(temperature=0.5),
    ]
    batches = [
        [make_request(impl, SamplingParams(seed=i, **settings[i % 6]), rid=f"r{i}") for i in range(12)],
        [make_request(impl, SamplingParams(seed=i, temperature=0.9), rid=f"t{i}") for i in range(12)],
    ]
    monkeypatch.setattr(sampling_draw, "CHUNK", 64)  # candidate cuts over 11 chunks, not one wide row
    for reqs in batches:
        want = Sampler(700)(logits, reqs).token_ids
        with monkeypatch.context() as m:
            m.setattr(sampling_triton, "available", lambda device: True)
            m.setattr(cut_draw, "available", lambda device: True)
            got = Sampler(700)(logits, reqs).token_ids
        assert got == want


# ---------------------------------------------------------------- the chunked draw


def test_chunk_stats_kernel_matches_torch():
    """Pass 1 of the Triton draw (interpreted on CPU) against `chunk_weights`: chunk maxima and
    first argmax exactly, kept masses to float32 rounding (different summation order)."""
    from enginespec.kernels import sampling as sampling_triton
    from enginespec.sample.draw import chunk_weights

    if sampling_triton.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    gen = torch.Generator().manual_seed(21)
    rows, vocab, chunk = 4, 200, 64
    x = torch.randn(rows, vocab, generator=gen) * 3
    x[1, 64:128] = float("-inf")  # a chunk with nothing kept
    x[2, 10] = x[2, 40] = 20.0  # a tie inside one chunk
    scale = torch.tensor([1.0, 2.0, 0.5, 1.4427])
    thr = torch.tensor([float("-inf"), 0.0, 1.0, 2.0])
    stats = torch.empty((rows, 3, 4), dtype=torch.float32)
    sampling_triton._chunk_stats_kernel[(rows, 4)](
        x, x.stride(0), scale, thr, stats, vocab, 4, CHUNK=chunk, BLOCK=32
    )
    tops, weights = chunk_weights(x, scale, thr, chunk)
    assert torch.equal(stats[:, 0], tops)
    torch.testing.assert_close(stats[:, 1], weights.sum(dim=2), rtol=1e-5, atol=1e-6)
    padded = torch.nn.functional.pad(x, (0, 4 * chunk - vocab), value=float("-inf")).view(rows, 4, chunk)
    want_first = padded.argmax(dim=2) + torch.arange(4) * chunk
    finite = tops > float("-inf")
    assert torch.equal(stats[:, 2].long()[finite], want_first[finite])
    assert stats[2, 2, 0].item() == 10


WIDE_RAMP = torch.linspace(0.0, 4.0, 700)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(top_p=0.8),
        SamplingParams(top_k=300, min_p=0.02, temperature=1.3),
    ],
)
def test_multi_chunk_torch_draw_matches_exact(impl, monkeypatch, params):
    """With chunks of 64 tokens (11 chunks over 700) the two-step draw (chunk, then token) is
    still the exact cut softmax."""
    from enginespec.sample import draw as sampling_draw

    monkeypatch.setattr(sampling_draw, "CHUNK", 64)
    req = make_request(impl, params)
    draws = 6000
    out = Sampler(700, seed=9)(WIDE_RAMP.expand(draws, -1).contiguous(), [req] * draws)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=700)
    assert_matches(counts, reference_probs(WIDE_RAMP, req))


def test_the_torch_draw_skips_chunks_without_a_finite_logit_and_leaves_greedy_rows_alone():
    """draw_torch over rows of several chunks where whole chunks are -inf (allowed_token_ids or
    bans leave a few ids of a real vocabulary: most of its chunks), with no cut: only finite
    ids are drawn (a -inf chunk weighs 0, never NaN). And a greedy row beside noisy ones keeps
    its argmax whatever the batch's shape (here as many noisy rows as the vocabulary has ids)."""
    from enginespec.sample.draw import draw_torch

    x = torch.full((64, 16), float("-inf"))
    x[:, 1], x[:, 13], x[:, 15] = 1.0, 1.0, 0.5  # finite: chunks 0 and 3 of four
    drawn = draw_torch(x, torch.ones(64), None, list(range(64)), [True] * 64, chunk=4)
    assert set(drawn.tolist()) == {1, 13, 15}
    rows = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))
    greedy = draw_torch(rows, torch.ones(5), None, [1, 2, 3, 4, 5], [True, True, True, True, False])
    assert greedy[4].item() == rows[4].argmax().item()


def test_multi_chunk_triton_draw_matches_exact(impl, monkeypatch):
    """The Triton draw (interpreted) with 8-token chunks over 32 tokens, unseeded and seeded
    rows, against the exact distribution (few draws: the interpreter runs each program in
    Python; the torch path, which must draw the same tokens, has the high-power tests). This
    is `sampling_triton.draw` with torch's thresholds; the fused `cut_draw` is held to the
    torch path's tokens (test_sampler_triton_path_matches_torch_path and the device tests)."""
    from enginespec.kernels import sampling as sampling_triton
    from enginespec.sample import draw as sampling_draw

    if sampling_triton.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    monkeypatch.setattr(sampling_draw, "CHUNK", 8)
    monkeypatch.setattr(sampling_triton, "available", lambda device: True)
    logits = torch.linspace(0.0, 3.0, 32)
    draws = 400
    reqs = [
        make_request(
            impl, SamplingParams(temperature=0.8, top_p=0.9, seed=(i if i % 2 else None)), rid=f"r{i}"
        )
        for i in range(draws)
    ]
    out = Sampler(32, seed=4)(logits.expand(draws, -1).contiguous(), reqs)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=32)
    assert_matches(counts, reference_probs(logits, reqs[0]))


def test_triton_seeded_draw_independent_of_batch(impl, monkeypatch):
    """On the Triton path (`cut_draw`, interpreted) a seeded row draws the same token alone and
    at any position of a batch with other seeded, unseeded and greedy rows."""
    from enginespec.kernels import cut_draw
    from enginespec.kernels import sampling as sampling_triton

    if sampling_triton.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    monkeypatch.setattr(cut_draw, "available", lambda device: True)
    gen = torch.Generator().manual_seed(8)
    row = torch.randn(1, 300, generator=gen)
    target = make_request(impl, SamplingParams(temperature=1.0, top_p=0.95, seed=17), outputs=[3, 4], rid="t")
    alone = Sampler(300, seed=0)(row, [target]).token_ids[0]
    for size, pos in ((3, 0), (5, 4), (4, 2)):
        others = [
            make_request(
                impl, SamplingParams(temperature=[0.0, 0.9][j % 2], seed=[None, j][j % 2]), rid=f"o{j}"
            )
            for j in range(size - 1)
        ]
        logits = torch.randn(size, 300, generator=gen)
        logits[pos] = row[0]
        assert Sampler(300, seed=size)(logits, others[:pos] + [target] + others[pos:]).token_ids[pos] == alone


@pytest.mark.parametrize("case", range(3))
def test_triton_penalties_match_torch(impl, monkeypatch, case):
    """The fused penalty kernel (interpreted on CPU) against the torch arithmetic, on edits
    mixing penalties with allowed ids, min_tokens (-inf entries) and bias, and a vocab that is
    not a multiple of the kernel's block."""
    from enginespec.kernels import sampling as sampling_triton

    if sampling_triton.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    rng, vocab = random.Random(100 + case), 2100
    reqs = _random_requests(impl, rng, vocab, 6, max_prompt=40, max_output=40)
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(case)) * 3
    want = edit_logits(logits, reqs)
    with monkeypatch.context() as m:
        m.setattr(sampling_triton, "available", lambda device: True)
        got = edit_logits(logits, reqs)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-6, atol=1e-6)
    assert not torch.equal(want, logits.float()), "the case must edit something"


# ---------------------------------------------------------------- what the sampler keeps


def test_the_sampler_keeps_no_params_of_requests_that_left_the_batch(impl):
    """A server's engine samples millions of requests over its life: the params of those that
    left the batch (finished, aborted) must not stay alive in the sampler. Its per-params cache
    kept up to 4096 of them, each with whatever the client sent (an allowed_token_ids of the
    whole vocabulary, a large logit_bias), so the engine's memory grew long after the requests
    were gone."""
    sampler = Sampler(LOGITS6.numel(), "cpu", seed=0)
    allowed = tuple(range(LOGITS6.numel())) * 1000  # a large request payload
    params = [SamplingParams(temperature=1.0, seed=i, allowed_token_ids=allowed) for i in range(3)]
    refs = [weakref.ref(p) for p in params]
    gone = [make_request(impl, p, rid=f"a{i}") for i, p in enumerate(params)]
    sampler(LOGITS6.expand(3, -1).contiguous(), gone)
    del params, gone
    staying = make_request(impl, SamplingParams(temperature=0.5), rid="b")
    for _ in range(2 * SPEC_CACHE_CALLS):  # a few steps of the batch without them
        sampler(LOGITS6.expand(1, -1).contiguous(), [staying])
    gc.collect()
    assert [ref() is None for ref in refs] == [True] * 3


def test_a_step_sampling_its_rows_in_several_calls_reuses_every_rows_spec(impl, monkeypatch):
    """Speculation samples a step's rows in up to three calls (drafted and undrafted rows,
    greedy and random): a cache of the last call's params alone rebuilt every row's RowSpec on
    every call (about 0.7 ms a call at 256 rows on a CPU)."""
    import enginespec.sample.sampler as sampler_module

    sampler = Sampler(LOGITS6.numel(), "cpu", seed=0)
    subsets = [
        [make_request(impl, SamplingParams(temperature=t, seed=i), rid=f"{t}-{i}") for i in range(4)]
        for t in (0.5, 1.0, 1.5)
    ]
    for rows in subsets:  # the first step builds every spec once
        sampler(LOGITS6.expand(len(rows), -1).contiguous(), rows)
    built = []
    real = sampler_module.RowSpec.of
    monkeypatch.setattr(
        sampler_module.RowSpec, "of", staticmethod(lambda p, v: built.append(p) or real(p, v))
    )
    for _ in range(3):  # later steps, each in the same three calls
        for rows in subsets:
            sampler(LOGITS6.expand(len(rows), -1).contiguous(), rows)
    assert built == []
