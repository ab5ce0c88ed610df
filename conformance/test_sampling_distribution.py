"""What a user samples follows the distribution vLLM's semantics define, through `LLM.generate`.

The oracle is independent of the sampler: transformers' forward of the same tiny checkpoint
gives the logits, and `vllm_probs` (plain torch, float64) processes them in vLLM V1's order
(vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py, ops/penalties.py, the builtin logits
processors): allowed_token_ids -> bad words -> min_tokens -> logit_bias -> repetition /
frequency / presence penalties -> temperature -> min-p -> top-k -> top-p -> softmax. min_tokens
bans the stop ids and the EOS, under ignore_eos too (vLLM adds the EOS to every request's
`all_stop_token_ids`). Temperature 0 is the argmax.

Each case samples many copies of one prompt in one `LLM.generate` call (the cases share its
batches, so rows of every kind sit side by side) and compares the joint distribution of the
first `depth` tokens (a sample ends early at a stop) with the exact one, enumerated over every
prefix of nonzero probability. Penalties, bad words and min_tokens act on the generated
history, so their cases run 2-3 tokens deep.

Thresholds. The engine seed and request seeds are fixed, so each run is deterministic. A case
passes when Pearson's test (cells pooled to >= 5 expected draws) gives p > ALPHA = 1e-4 and no
draw falls on an outcome of probability 0. ALPHA bounds how often a correct engine would fail
a case after a legitimate change in how it draws its bits (a fresh stream of seeds): 1e-4 per
case, about 1e-3 for the module. Power is shown, not assumed: each case names plausible wrong
semantics (another order of operations, a cut applied before the temperature, an off-by-one,
the EOS left free under ignore_eos) whose distributions the same counts must reject at
p < POWER = 1e-6. The sample sizes were chosen so that each is rejected by a wide margin: most
alternatives have draws on outcomes they give probability 0; the closest, "temperature
ignored" for T = 1.7, is rejected at p ~ 1e-14. The zero-mass check is exact, not a matter of
rounding: no case has a cut within JITTER of a token (test_no_case_cuts_within_rounding_of_a_token).
Cost: ~11,000 sampled tokens per impl (a few seconds of this module's ~10 s on a 2-core CPU).

Also here: every sampled token's logprob is the raw log_softmax of the model's logits
(vLLM's default logprobs_mode, "raw_logprobs": before any edit, temperature or cut), and a
seeded request draws the same tokens whatever runs beside it (alone, in a batch of 8 mixed
requests, chunked prefill, preemption, async scheduling off, the reference impl).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import NamedTuple

import pytest
import torch

from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import EOS_ID, tiny_model_dir
from enginespec.testing.stats import pearson

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ALPHA = 1e-4
POWER = 1e-6
N = 256  # samples per request (SamplingParams.n)
PROMPT = [5, 9, 14, 20, 33, 41, 2, 7, 9]
# How far the logits may move without changing which outcomes have probability 0 in any case:
# about 100x the engine's distance from transformers here (its logprobs agree within 2e-6).
JITTER = 3e-4
NEG_INF = float("-inf")


# ---------------------------------------------------------------- the oracle


def vllm_probs(logits: torch.Tensor, prompt, output, params: SamplingParams, wrong: str = "") -> torch.Tensor:
    """The distribution vLLM V1 draws the next token from, float64 [V], given the raw logits
    after prompt + output. `wrong` names one deviation from vLLM's semantics (the power checks'
    alternatives; "" for none)."""
    p = params
    x = logits.double().clone()
    if p.allowed_token_ids is not None:
        keep = torch.zeros_like(x, dtype=torch.bool)
        keep[list(p.allowed_token_ids)] = True
        x = x.masked_fill(~keep, NEG_INF)
    for *head, last in p.bad_words_token_ids:
        if wrong == "bad word without its prefix" or (
            len(head) <= len(output) and list(output[len(output) - len(head) :]) == head
        ):
            x[last] = NEG_INF
    if len(output) < p.min_tokens and wrong != "no min_tokens":
        eos = [] if wrong == "EOS free under ignore_eos" and p.ignore_eos else [EOS_ID]
        x[list(p.stop_token_ids) + eos] = NEG_INF
    if wrong not in ("bias after penalties", "no bias"):
        x = _bias(x, p)
    if wrong == "penalties after temperature":
        x = x / p.temperature
    x = _penalties(x, prompt, output, p, wrong)
    if wrong == "bias after penalties":
        x = _bias(x, p)
    if p.temperature == 0 or wrong == "greedy":
        return torch.nn.functional.one_hot(x.argmax(), x.numel()).double()
    if wrong != "penalties after temperature":
        x = x / _temperature(p, wrong)
    return torch.softmax(_cuts(x, p, wrong), dim=0)


def _bias(x: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    for token, bias in (p.logit_bias or {}).items():
        x[token] += bias
    return x


def _penalties(x, prompt, output, p: SamplingParams, wrong: str) -> torch.Tensor:
    """vLLM's apply_penalties: repetition (divide a positive logit, multiply a negative one) on
    tokens of the prompt or the output; frequency * count and presence on output tokens."""
    counted = list(output) + (list(prompt) if wrong == "frequency counts the prompt" else [])
    counts = torch.bincount(torch.tensor(counted, dtype=torch.long), minlength=x.numel()).double()
    seen = torch.zeros_like(x, dtype=torch.bool)
    seen[list(output)] = True
    if wrong != "repetition ignores the prompt":
        seen[list(prompt)] = True
    r = p.repetition_penalty
    x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    return x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).double()


def _temperature(p: SamplingParams, wrong: str) -> float:
    return 1.0 if wrong == "temperature ignored" else p.temperature


def _cuts(x: torch.Tensor, p: SamplingParams, wrong: str) -> torch.Tensor:
    """min-p (on the tempered softmax), top-k, top-p (vLLM's: sort ascending, drop the tokens
    whose cumulative mass is <= 1 - top_p, never the last)."""
    if p.min_p > 0:
        ref = x * p.temperature if wrong == "min-p before temperature" else x
        probs = torch.softmax(ref, dim=0)
        x = x.masked_fill(probs < p.min_p * probs.max(), NEG_INF)
    k = p.top_k - 1 if wrong == "top-k one short" else p.top_k
    top_p_first = wrong == "top-p before top-k"
    if p.top_p < 1 and top_p_first:
        x = _top_p(x, p.top_p, x)
    if 0 < k < x.numel():
        kth = torch.sort(x, descending=True).values[k - 1]
        x = x.masked_fill(x < kth, NEG_INF)
    if p.top_p < 1 and not top_p_first:
        ref = x * p.temperature if wrong == "top-p before temperature" else x
        x = _top_p(x, p.top_p, ref)
    return x


def _top_p(x: torch.Tensor, top_p: float, ref: torch.Tensor) -> torch.Tensor:
    """x with the tokens outside the top-p nucleus of softmax(ref) at -inf."""
    order = torch.argsort(ref)
    cum = torch.softmax(ref[order], dim=0).cumsum(0)
    drop = cum <= 1 - top_p
    drop[-1] = False
    out = x.clone()
    out[order[drop]] = NEG_INF
    return out


@functools.lru_cache(maxsize=None)
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir("qwen3")), dtype=torch.float32).eval()


_LOGITS: dict = {}


def raw_logits(prefixes) -> list[torch.Tensor]:
    """transformers' last-position logits after PROMPT + each prefix (one forward per length)."""
    missing = sorted({h for h in prefixes if h not in _LOGITS})
    for length in sorted({len(h) for h in missing}):
        batch = [h for h in missing if len(h) == length]
        with torch.no_grad():
            out = hf_model()(torch.tensor([PROMPT + list(h) for h in batch])).logits[:, -1]
        _LOGITS.update(zip(batch, out.float()))
    return [_LOGITS[h] for h in prefixes]


def _stops(token: int, num_out: int, p: SamplingParams) -> bool:
    """Whether `token` as output number num_out + 1 ends the sample (min_tokens masked it before)."""
    return num_out + 1 > p.min_tokens and (
        token in p.stop_token_ids or (token == EOS_ID and not p.ignore_eos)
    )


def exact_joint(
    params: SamplingParams, depth: int, wrong: str = "", jitter=None
) -> dict[tuple[int, ...], float]:
    """{output ids: probability} over samples of up to `depth` tokens after PROMPT, a sample
    ending early at a stop; every prefix of nonzero probability is expanded. jitter: a
    torch.Generator to move every logit by JITTER * N(0, 1) first (the rounding check)."""
    level, done = {(): 1.0}, {}
    for d in range(depth):
        prefixes = sorted(level)
        grown = {}
        for h, logits in zip(prefixes, raw_logits(prefixes)):
            if jitter is not None:
                logits = logits + JITTER * torch.randn(logits.shape, generator=jitter)
            probs = vllm_probs(logits, PROMPT, h, params, wrong)
            for t in torch.nonzero(probs).flatten().tolist():
                cell, mass = h + (t,), level[h] * float(probs[t])
                (done if d == depth - 1 or _stops(t, d, params) else grown)[cell] = mass
        level = grown
    return done


# ---------------------------------------------------------------- the cases


class Case(NamedTuple):
    params: SamplingParams
    depth: int
    requests: int  # of N samples each
    wrong: tuple[str, ...]  # alternatives the counts must reject
    seeded: bool = False


def _case(depth, requests, wrong, seeded=False, **params) -> Case:
    base = dict(max_tokens=depth, n=N, detokenize=False, logprobs=0)
    return Case(SamplingParams(**{**base, **params}), depth, requests, tuple(wrong), seeded)


# The prompt's likeliest next tokens: 4 (logit 2.247), 76 (2.078), 19 (2.021); EOS (3) is 82nd.
# Prompt token 20 has logit -0.788: pen_bias lifts it by 4 before its repetition penalty halves it.
CASES = {
    "hot": _case(1, 2, ["temperature ignored"], temperature=1.7),
    # 76 biased to 0.01 below 4: at T = 0.02 it holds e^-0.5 of 4's mass, the rest nearly none
    # (0.02 is above the 0.01 that vLLM's SamplingParams raises smaller temperatures to)
    "tiny_temperature": _case(1, 1, ["greedy", "temperature ignored"], temperature=0.02, logit_bias={76: 0.159}),
    "top_k": _case(1, 2, ["top-k one short"], temperature=0.5, top_k=5),
    "top_p": _case(1, 2, ["top-p before temperature"], temperature=1.3, top_p=0.6),
    "top_p_seeded": _case(1, 2, ["top-p before temperature"], True, temperature=1.3, top_p=0.6),
    "min_p": _case(1, 2, ["min-p before temperature"], temperature=1.6, min_p=0.25),
    "chat": _case(1, 3, ["top-p before top-k"], True, temperature=0.7, top_p=0.8, top_k=20),
    # min-p binds (at T = 1.5 it keeps 23 tokens), top-k 50 does not, top-p cuts the survivors
    "combined": _case(
        1, 2, ["min-p before temperature", "top-p before temperature"], True,
        temperature=1.5, top_k=50, top_p=0.7, min_p=0.4,
    ),
    "penalties": _case(
        3, 2, ["repetition ignores the prompt", "frequency counts the prompt", "penalties after temperature"],
        temperature=0.4, top_k=5, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4,
        logit_bias={14: 1.5}, ignore_eos=True,
    ),
    "pen_bias": _case(
        2, 2, ["bias after penalties"], True,
        temperature=1.0, top_k=12, repetition_penalty=2.0, presence_penalty=-0.5, logit_bias={20: 4.0},
    ),
    "allowed_bias_bad_words": _case(
        2, 2, ["bad word without its prefix", "no bias"],
        temperature=1.0, allowed_token_ids=(4, 76, 19, 20, 50, 60), logit_bias={50: 2.5, 4: -1.0},
        bad_words_token_ids=((76, 19), (60,)),
    ),
    "min_tokens": _case(
        3, 2, ["no min_tokens"], temperature=1.0, top_k=5, min_tokens=2, stop_token_ids=(19,),
        logit_bias={EOS_ID: 4.0},
    ),
    "min_tokens_ignore_eos": _case(
        2, 2, ["EOS free under ignore_eos"], temperature=1.0, top_k=4, min_tokens=2, ignore_eos=True,
        logit_bias={EOS_ID: 4.0},
    ),
}  # fmt: skip


def test_no_case_cuts_within_rounding_of_a_token():
    """Which outcomes a case gives probability 0 (top-k, top-p, min-p boundaries) is the same
    with every logit moved by JITTER: the engine's float32 logits (and another CPU's rounding)
    cannot put a token on the other side of a cut, so the zero-mass check is exact. (At top_k
    6 the penalties case had two tokens 1e-4 apart at its cut.)"""
    for name, case in CASES.items():
        exact = {k for k, v in exact_joint(case.params, case.depth).items() if v > 0}
        for seed in range(2):
            moved = exact_joint(case.params, case.depth, jitter=torch.Generator().manual_seed(seed))
            assert {k for k, v in moved.items() if v > 0} == exact, (
                f"{name}: a cut lies within {JITTER} of a token"
            )


@pytest.fixture(scope="module")
def samples(impl) -> dict[str, list]:
    """Case name -> its samples (CompletionOutputs), all cases in one LLM.generate call."""
    from enginespec.llm import LLM

    llm = LLM(
        str(tiny_model_dir("qwen3")),
        impl=impl,
        dtype="float32",
        device="cpu",
        seed=0,
        block_size=16,
        num_blocks=1024,
        max_model_len=64,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
    )
    names, prompts, params = [], [], []
    for name, case in CASES.items():
        for _ in range(case.requests):
            seed = 1000 * (len(names) + 1) if case.seeded else None
            names.append(name)
            prompts.append({"prompt_token_ids": PROMPT})
            params.append(dataclasses.replace(case.params, seed=seed))
    outs = llm.generate(prompts, params, use_tqdm=False)
    got = collections.defaultdict(list)
    for name, out in zip(names, outs):
        got[name].extend(out.outputs)
    return got


@pytest.mark.parametrize("name", sorted(CASES))
def test_sampled_tokens_follow_vllms_distribution(samples, name):
    case = CASES[name]
    counts = collections.Counter(tuple(c.token_ids) for c in samples[name])
    assert sum(counts.values()) == case.requests * N
    fit = pearson(counts, exact_joint(case.params, case.depth))
    assert fit.outside == 0 and fit.p > ALPHA, f"{name}: {fit}; most drawn {counts.most_common(8)}"
    for wrong in case.wrong:
        alt = pearson(counts, exact_joint(case.params, case.depth, wrong))
        assert alt.p < POWER, f"{name}: the counts fit {wrong!r} too ({alt}): the case tests nothing there"


def test_sampled_tokens_logprobs_are_the_raw_distributions(samples):
    """logprobs=0 returns each sampled token's logprob: the log_softmax of the model's raw logits
    (vLLM's default logprobs_mode "raw_logprobs"), whatever the temperature, cuts, bias,
    penalties, allowed ids, bad words or min_tokens did to the distribution it was drawn from."""
    worst = 0.0
    for name, outputs in samples.items():
        prefixes = sorted({tuple(c.token_ids[:j]) for c in outputs for j in range(len(c.token_ids))})
        raw = dict(zip(prefixes, (torch.log_softmax(x.double(), 0) for x in raw_logits(prefixes))))
        for c in outputs:
            assert len(c.logprobs) == len(c.token_ids), name
            for j, (token, entry) in enumerate(zip(c.token_ids, c.logprobs)):
                assert list(entry) == [token], f"{name}: logprobs=0 returns the sampled token alone"
                worst = max(worst, abs(entry[token] - float(raw[tuple(c.token_ids[:j])][token])))
    assert worst < 1e-4, f"a sampled token's logprob is off the raw log_softmax by {worst}"


# ---------------------------------------------------------------- seeded requests

# (prompt length, settings) of 8 seeded requests: every row kind, prompts of 3 to 40 tokens
SEEDED = [
    (3, dict(temperature=0.7, top_p=0.8, top_k=20)),
    (23, dict(temperature=1.0, top_p=0.6)),  # loose top-p: drawn by rejection
    (9, dict(temperature=1.5, min_p=0.2, logprobs=2)),
    (31, dict(temperature=0.9, top_k=8, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2)),
    (5, dict(temperature=1.2, logit_bias={4: -2.0, 50: 3.0}, allowed_token_ids=tuple(range(4, 90)))),
    (17, dict(temperature=1.0, bad_words_token_ids=((4,), (76, 19)), min_tokens=4, ignore_eos=False)),
    (12, dict(temperature=0.5, n=3)),  # siblings: seeds 106, 107, 108
    (40, dict(temperature=2.0, top_k=40)),
]


def _seeded_prompts():
    gen = torch.Generator().manual_seed(7)
    prompts, params = [], []
    for i, (length, settings) in enumerate(SEEDED):
        ids = torch.randint(4, 96, (length,), generator=gen).tolist()
        prompts.append({"prompt_token_ids": ids})
        params.append(SamplingParams(**{"max_tokens": 10, "ignore_eos": True, "seed": 100 + i, **settings}))
    return prompts, params


def _noise():
    """Two unseeded requests that draw from the engine's generator beside the seeded ones."""
    prompts = [{"prompt_token_ids": list(range(10, 10 + k))} for k in (6, 27)]
    return prompts, [SamplingParams(max_tokens=k, temperature=1.0, ignore_eos=True) for k in (4, 12)]


def _tokens(outs) -> list:
    return [[(c.token_ids, c.finish_reason) for c in o.outputs] for o in outs]


def _llm(impl, **kwargs):
    from enginespec.llm import LLM

    args = dict(dtype="float32", device="cpu", seed=0, block_size=4, num_blocks=256, max_model_len=64)
    return LLM(str(tiny_model_dir("qwen3")), impl=impl, **{**args, **kwargs})


BESIDE = {  # engine settings the batch runs under, with what each must be seen to force
    "batched": ({}, None),
    "chunked": ({"max_num_batched_tokens": 8, "long_prefill_token_threshold": 5}, None),
    "preempted": ({"num_blocks": 24}, "num_preemptions"),
    "serial": ({"async_scheduling": False}, None),
}


@pytest.mark.parametrize("beside", sorted(BESIDE))
def test_a_seeded_request_draws_the_same_tokens_whatever_runs_beside_it(impl, beside):
    """Each of SEEDED alone on a fresh engine, then all 8 in one batch beside two unseeded
    requests, under the engine settings `beside` names: the same tokens (README: a seeded
    request's draws do not depend on what else is in the batch)."""
    prompts, params = _seeded_prompts()
    alone = [_tokens(_llm(impl).generate([p], [s], use_tqdm=False))[0] for p, s in zip(prompts, params)]
    noise_prompts, noise_params = _noise()
    settings, forced = BESIDE[beside]
    llm = _llm(impl, **settings)
    outs = llm.generate(
        noise_prompts[:1] + prompts + noise_prompts[1:],
        noise_params[:1] + params + noise_params[1:],
        use_tqdm=False,
    )
    assert _tokens(outs[1:-1]) == alone
    if forced:
        assert getattr(llm.engine.stats, forced) > 0, f"{beside} was meant to force {forced}"
    assert len({tuple(c[0]) for row in alone for c in row}) == len(alone) + 2, (
        "seeds must give different samples"
    )


def test_a_seeded_request_draws_the_same_tokens_on_the_reference_impl(impl, reference_impl):
    prompts, params = _seeded_prompts()
    runs = [
        _tokens(_llm(i, num_blocks=40).generate(prompts, params, use_tqdm=False))
        for i in (impl, reference_impl)
    ]
    assert runs[0] == runs[1]
