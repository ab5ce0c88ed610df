"""Speculation does not change what a user samples: through the whole engine, the tokens drawn
for unseeded sampled requests have the target's distribution whether drafts are off, proposed
by the n-gram lookup, or proposed by a draft model whose distribution differs from the target's.

The target is a tiny random qwen3 with peaked distributions (initializer_range 0.5: its most
likely token holds about 40% of the mass), so drafts are accepted often and rejected often. The
prompt is a run of the token the model tends to repeat, so n-gram drafts (more of that token)
hit often; the draft model is the target with a noisy head (its argmax differs from the target's
now and then). Many copies of each request are sampled in one engine run (400 per setting:
temperature 1, then with top-p 0.8 and top-k 5, then with penalties) and checked two ways
against the target: transformers' logits put through the sampler's own processed distribution
(`Sampler.probs`: penalties, temperature, top-k, top-p) given the tokens generated before.

- For each generated position j and each prefix h of j tokens seen at least MIN_GROUP times,
  Pearson's statistic of token j's counts; summed over the groups it must stay within a bound
  (dof + 6 sqrt(2 dof) + 10) that a correct sampler exceeds with negligible probability.
- Over every position of every sample, the counts of a few token classes (the drawn token's
  rank under its target row; whether it repeats an earlier output token) against their
  expectation, as z-scores (a martingale: each term's mean and variance are its row's).

No token of probability 0 may appear. The engine seed is fixed, so a run is deterministic.
Speculation off is checked the same way (it validates the oracle).

Also: an unseeded engine (seed=None) verifies drafts with fresh entropy, a seeded one
reproducibly.
"""

from __future__ import annotations

import collections
import functools
import math

import pytest
import torch

from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import make_checkpoint, tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

VOCAB = 96  # the tiny checkpoints'
PROMPT = [17] * 8  # 17 is the peaked model's likeliest follower of a run of 17s (about 1 in 3)
MAX_TOKENS = 4
COPIES = 400  # requests per sampling setting
MIN_GROUP = 30  # a prefix seen fewer times is not tested (its expected counts are too small)
PARAMS = {
    "plain": SamplingParams(temperature=1.0),
    "top_p_top_k": SamplingParams(temperature=1.0, top_p=0.8, top_k=5),
    "penalties": SamplingParams(temperature=1.0, repetition_penalty=1.2, frequency_penalty=0.5),
}
Z_BOUND = 5.5  # |z| of a correct sampler's class counts exceeds it with probability < 1e-7
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
    "disable_by_batch_size": None,
}


@functools.lru_cache(maxsize=None)
def peaked_checkpoint():
    return make_checkpoint(
        "qwen3", tiny_model_dir("qwen3").parent / "qwen3-peaked", seed=3, initializer_range=0.5
    )


_MODELS: dict = {}


def flat_model(impl, noisy: bool):
    """The peaked checkpoint as a FlatModel (noisy: its head perturbed, the draft), once per impl."""
    from enginespec.worker.flat_model import FlatModel

    key = (id(impl), noisy)
    if key not in _MODELS:
        model = FlatModel.from_pretrained(
            peaked_checkpoint(),
            dtype=torch.float32,
            device="cpu",
            attention=impl.attention_backend(torch.device("cpu")),
        )
        if noisy:
            head = model.hf_model.get_output_embeddings().weight
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                head.add_(0.2 * head.std() * torch.randn(head.shape, generator=gen))
        _MODELS[key] = model
    return _MODELS[key]


def make_engine(impl, drafts: str, seed=0, **engine_args):
    """An engine over the peaked target; drafts: "off", "ngram" or "draft_model"."""
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs
    from enginespec.worker.loader import load_tokenizer

    path = peaked_checkpoint()
    config, draft = None, None
    if drafts == "ngram":
        config = NGRAM
    elif drafts == "draft_model":
        config = {**NGRAM, "method": "draft_model", "model": str(path)}
        del config["prompt_lookup_min"], config["prompt_lookup_max"]
        draft = flat_model(impl, noisy=True)
    args = EngineArgs(
        model=str(path),
        impl=impl,
        dtype="float32",
        device="cpu",
        seed=seed,
        num_blocks=1024,
        max_num_seqs=len(PARAMS) * COPIES,
        max_num_batched_tokens=8192,
        speculative_config=config,
        **engine_args,
    )
    kwargs = {} if draft is None else {"draft_model": draft}
    return EngineCore(args, model=flat_model(impl, noisy=False), tokenizer=load_tokenizer(path), **kwargs)


def sample_all(engine) -> dict[str, list[tuple[int, ...]]]:
    """setting name -> the MAX_TOKENS ids of each of its COPIES requests (one engine run)."""
    import dataclasses

    for name, params in PARAMS.items():
        full = dataclasses.replace(params, max_tokens=MAX_TOKENS, ignore_eos=True)
        for i in range(COPIES):
            engine.add_request(f"{name}-{i}", list(PROMPT), full)
    finals = {}
    for _ in range(100):
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
        if not engine.has_unfinished:
            break
    out: dict = collections.defaultdict(list)
    for rid, o in finals.items():
        ids = tuple(o.outputs[0].token_ids)
        assert len(ids) == MAX_TOKENS, (rid, ids)
        out[rid.rsplit("-", 1)[0]].append(ids)
    assert all(len(v) == COPIES for v in out.values())
    return out


class _Row:
    """What Sampler.probs reads of a request: its params, prompt and output so far."""

    def __init__(self, params, output):
        self.request_id, self.params, self.eos_token_id = "oracle", params, 3
        self.prompt_token_ids, self.output_token_ids = list(PROMPT), list(output)
        self.num_output_tokens = len(output)


_HF: dict = {}
_ORACLE: dict = {}


def target_probs(name: str, prefixes) -> list[torch.Tensor]:
    """For each prefix (a tuple of generated ids), the distribution plain decoding draws the
    token after PROMPT + prefix from, float64 [V]: transformers' logits through the sampler's
    processing for setting `name` (prefixes of one length share a forward)."""
    from transformers import AutoModelForCausalLM

    from enginespec.sample.sampler import Sampler

    if "model" not in _HF:
        _HF["model"] = AutoModelForCausalLM.from_pretrained(
            str(peaked_checkpoint()), dtype=torch.float32
        ).eval()
    missing = sorted({h for h in prefixes if (name, h) not in _ORACLE})
    for length in sorted({len(h) for h in missing}):
        batch = [h for h in missing if len(h) == length]
        with torch.no_grad():
            logits = _HF["model"](torch.tensor([PROMPT + list(h) for h in batch])).logits[:, -1].float()
        probs = Sampler(VOCAB).probs(logits, [_Row(PARAMS[name], h) for h in batch]).double()
        _ORACLE.update(((name, h), p) for h, p in zip(batch, probs))
    return [_ORACLE[(name, h)] for h in prefixes]


def goodness_of_fit(name: str, samples: list[tuple[int, ...]]):
    """(statistic, dof, per-group report) of Pearson's test of every position j given each
    prefix of j tokens seen at least MIN_GROUP times; a token of probability 0 fails at once."""
    stat, dof, report = 0.0, 0, []
    for j in range(MAX_TOKENS):
        groups = collections.defaultdict(list)
        for ids in samples:
            groups[ids[:j]].append(ids[j])
        for prefix, tokens in groups.items():
            if len(tokens) < MIN_GROUP:
                continue
            (p,) = target_probs(name, [prefix])
            counts = collections.Counter(tokens)
            expected = p * len(tokens)
            big = [t for t in range(VOCAB) if expected[t] >= 5]
            small = [t for t in range(VOCAB) if 0 < expected[t] < 5]
            obs = [counts.get(t, 0) for t in big]
            exp = [float(expected[t]) for t in big]
            if small:
                obs.append(sum(counts.get(t, 0) for t in small))
                exp.append(float(sum(expected[t] for t in small)))
            if len(obs) < 2:
                continue
            s = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
            stat, dof = stat + s, dof + len(obs) - 1
            report.append((round(s, 1), len(obs) - 1, j, prefix, len(tokens)))
    return stat, dof, report


CLASSES = ("1st", "2nd", "3rd", "4th-6th", "rest", "repeats an earlier output token")
_RANKS = ((0, 1), (1, 2), (2, 3), (3, 6), (6, VOCAB))


def class_scores(name: str, samples: list[tuple[int, ...]]) -> list[float]:
    """Per token class (CLASSES: the drawn token's rank under its target row, ties broken by
    id, and whether it repeats a token generated before it), z = (observed - expected) / sd
    summed over every generated position of every sample: each term's mean and variance are
    its target row's, so the sum is a martingale whose variance is the sum of theirs. Every
    sample counts, at every position, however rare its prefix."""
    cells = [(ids[:j], ids[j]) for ids in samples for j in range(MAX_TOKENS)]
    p = torch.stack(target_probs(name, [h for h, _ in cells]))  # [n, V]
    token = torch.tensor([t for _, t in cells]).view(-1, 1)
    drawn = p.gather(1, token).view(-1)
    assert bool((drawn > 0).all()), f"{name}: drew tokens of probability 0: {token.view(-1)[drawn == 0]}"
    order = torch.argsort(p, dim=1, descending=True, stable=True)
    rank = (
        torch.empty_like(order)
        .scatter_(1, order, torch.arange(VOCAB).expand_as(order))
        .gather(1, token)
        .view(-1)
    )
    by_rank = p.gather(1, order)
    hits, masses = [], []
    for lo, hi in _RANKS:
        hits.append((rank >= lo) & (rank < hi))
        masses.append(by_rank[:, lo:hi].sum(dim=1))
    seen = torch.zeros_like(p, dtype=torch.bool)
    for i, (prefix, _) in enumerate(cells):
        seen[i, list(prefix)] = True
    hits.append(seen.gather(1, token).view(-1))
    masses.append((p * seen).sum(dim=1))
    z = []
    for hit, q in zip(hits, masses):
        var = float((q * (1 - q)).sum())
        z.append(float(hit.double().sum() - q.sum()) / math.sqrt(var) if var > 0 else 0.0)
    return z


def bound(dof: int) -> float:
    """A chi-square of `dof` degrees of freedom exceeds this with negligible probability (about
    6 standard deviations above its mean, plus slack for the normal approximation's tail)."""
    return dof + 6 * math.sqrt(2 * dof) + 10


@pytest.mark.parametrize("drafts", ["off", "ngram", "draft_model"])
def test_speculation_samples_the_target_distribution(impl, drafts):
    engine = make_engine(impl, drafts)
    samples = sample_all(engine)
    if drafts != "off":  # the drafts were exercised: accepted and rejected, many times
        stats = engine.stats.spec_decode
        assert stats.num_accepted_tokens > COPIES // 4, (stats.num_draft_tokens, stats.num_accepted_tokens)
        assert stats.num_draft_tokens - stats.num_accepted_tokens > COPIES // 4
    for name, got in samples.items():
        stat, dof, report = goodness_of_fit(name, got)
        assert dof >= 20, (name, report)  # enough groups were tested to mean something
        worst = sorted(report, reverse=True)[:5]
        assert stat < bound(dof), (
            f"{drafts}/{name}: chi2 {stat:.1f} on {dof} dof; worst (chi2, dof, j, prefix, n): {worst}"
        )
        z = class_scores(name, got)
        assert max(map(abs, z)) < Z_BOUND, f"{drafts}/{name}: z per token class {dict(zip(CLASSES, z))}"


def _verifier_draws(engine) -> list[float]:
    return torch.rand(8, generator=engine.spec.generator).tolist()


def test_an_unseeded_engine_verifies_with_fresh_entropy_and_a_seeded_one_reproducibly(impl):
    """LLM(seed=None): the verifier's accept and residual draws differ from one engine to the
    next, as the sampler's unseeded draws do; LLM(seed=S): they are the same."""
    unseeded = [_verifier_draws(make_engine(impl, "ngram", seed=None)) for _ in range(2)]
    assert unseeded[0] != unseeded[1]
    seeded = [_verifier_draws(make_engine(impl, "ngram", seed=5)) for _ in range(2)]
    assert seeded[0] == seeded[1]
