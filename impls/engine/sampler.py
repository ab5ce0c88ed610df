"""The batched sampler: one call turns the logits of every sampling row into one token per row.

Pipeline per call (row i belongs to requests[i]), all on [S, V] tensors, no per-row loop over
the vocabulary:

1. raw float32 logits -> allowed_token_ids -> min_tokens -> logit_bias -> penalties
   (`sampling_penalties`, vLLM's order and semantics);
2. greedy rows (temperature < GREEDY_EPS, i.e. 0) take the argmax of the edited logits;
3. random rows divide by temperature, cut with min-p, top-k, top-p (`sampling_truncation`) and
   draw by the Gumbel-max trick: argmax(x - log(E)) with E ~ Exp(1) is a sample of softmax(x).
   A seeded row's E comes from a hash of (seed, output index, token) (`sampling_rng`), so its
   draw is the same whatever batch or position it is in; unseeded rows share the sampler's
   `torch.Generator` (seeded by `Sampler(seed=...)`).

Logprobs are of the RAW distribution: log_softmax of the model's logits before any edit,
temperature or cut (vLLM V1's default "raw_logprobs"), so a token's reported logprob does not
change with sampling settings. Each row asking for logprobs = k gets [(sampled id, its logprob)]
followed by the k most likely (id, logprob) pairs, best first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .sampling_penalties import apply_allowed_tokens, apply_logit_bias, apply_min_tokens, apply_penalties
from .sampling_rng import row_key, seeded_uniform
from .sampling_truncation import apply_truncation

GREEDY_EPS = 1e-5  # temperatures below this are treated as greedy (dividing by them overflows)


@dataclass
class SamplerOutput:
    """token_ids[i] is row i's token; logprobs[i] is None unless its params ask for logprobs."""

    token_ids: list[int]
    logprobs: list[Optional[list[tuple[int, float]]]]


def _needs_edits(params) -> bool:
    return (params.allowed_token_ids is not None or params.min_tokens > 0 or bool(params.logit_bias)
            or params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0)


def edit_logits(logits: torch.Tensor, requests: Sequence) -> torch.Tensor:
    """Float32 logits with allowed-ids, min_tokens, bias and penalties applied (a copy when
    anything changes; the caller's tensor is never modified)."""
    if not any(_needs_edits(r.params) for r in requests):
        return logits.float()
    x = logits.to(torch.float32, copy=True)
    apply_allowed_tokens(x, requests)
    apply_min_tokens(x, requests)
    apply_logit_bias(x, requests)
    apply_penalties(x, requests)
    return x


def top_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> tuple[list[float], list, list]:
    """log_softmax of float32 `logits`: the logprob of token_ids[r] in row r, and the top-k
    (ids, logprobs) per row as nested lists (empty when k == 0)."""
    lp = torch.log_softmax(logits.float(), dim=1)
    chosen = lp.gather(1, token_ids.view(-1, 1)).squeeze(1).tolist()
    if k <= 0:
        return chosen, [[] for _ in chosen], [[] for _ in chosen]
    values, ids = torch.topk(lp, min(k, lp.shape[1]), dim=1)
    return chosen, ids.tolist(), values.tolist()


def prompt_logprobs(logits: torch.Tensor, target_ids: Sequence[int], k: int) -> list[dict[int, float]]:
    """Row p of `logits` predicts target_ids[p]: {target: logprob} then the top-k entries
    (a dict, so a target that is also in the top-k appears once). Raw distribution."""
    if logits.shape[0] != len(target_ids):
        raise ValueError(f"prompt_logprobs: target_ids has {len(target_ids)} ids for {logits.shape[0]} rows")
    if k < 0:
        raise ValueError(f"prompt_logprobs: k must be >= 0, got {k}")
    if not target_ids:
        return []
    targets = torch.as_tensor(list(target_ids), dtype=torch.long, device=logits.device)
    chosen, ids, values = top_logprobs(logits, targets, k)
    out = []
    for t, lp, row_ids, row_vals in zip(target_ids, chosen, ids, values):
        entry = {int(t): lp}
        for i, v in zip(row_ids, row_vals):
            entry.setdefault(i, v)
        out.append(entry)
    return out


class Sampler:
    """Samples one token per row. `vocab_size` is the model's; logits may carry padded columns
    beyond it, which are never sampled. Stateless across calls except the unseeded generator."""

    def __init__(self, vocab_size: int, device="cpu", seed: Optional[int] = None):
        if vocab_size < 1:
            raise ValueError(f"Sampler.vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """The generator for unseeded rows on `device` (seeded from `seed`, else randomly)."""
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            if self.seed is None:
                gen.seed()
            else:
                gen.manual_seed(self.seed)
            self._generators[device] = gen
        return gen

    def __call__(self, logits: torch.Tensor, requests: Sequence) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(f"Sampler: logits must be [len(requests)={len(requests)}, V], got {tuple(logits.shape)}")
        if logits.shape[1] < self.vocab_size:
            raise ValueError(f"Sampler: logits have {logits.shape[1]} columns, fewer than vocab_size {self.vocab_size}")
        if not requests:
            return SamplerOutput([], [])
        raw = logits[:, :self.vocab_size]
        x = edit_logits(raw, requests)
        tokens = x.argmax(dim=1)
        random_rows = [i for i, r in enumerate(requests) if r.params.temperature >= GREEDY_EPS]
        if random_rows:
            tokens = self._sample_random(x, tokens, requests, random_rows)
        token_ids = tokens.tolist()
        return SamplerOutput(token_ids, self._logprobs(raw, tokens, token_ids, requests))

    def _sample_random(self, x, tokens, requests, rows: list[int]) -> torch.Tensor:
        """Overwrite `tokens` at `rows` with draws from their scaled, truncated distributions."""
        dev = x.device
        reqs = [requests[i] for i in rows]
        index = torch.tensor(rows, dtype=torch.long, device=dev)
        sub = x if len(rows) == x.shape[0] else x.index_select(0, index)
        params = [r.params for r in reqs]
        temps = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)
        sub = sub / temps.unsqueeze(1)
        top_k = [p.top_k if 0 < p.top_k < sub.shape[1] else 0 for p in params]
        sub = apply_truncation(
            sub, torch.tensor(top_k, dtype=torch.long, device=dev),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev),
            torch.tensor([p.min_p for p in params], dtype=torch.float32, device=dev),
            k_max=max(top_k), use_p=any(p.top_p < 1.0 for p in params),
            use_min_p=any(p.min_p > 0.0 for p in params))
        drawn = (sub + self._gumbel(reqs, sub.shape[1], dev)).argmax(dim=1)
        if len(rows) == x.shape[0]:
            return drawn
        return tokens.index_copy(0, index, drawn)

    def _gumbel(self, reqs, vocab: int, dev) -> torch.Tensor:
        """Gumbel noise -log(E), E ~ Exp(1), one row per request (seeded rows by hash)."""
        noise = torch.empty((len(reqs), vocab), dtype=torch.float32, device=dev)
        seeded = [j for j, r in enumerate(reqs) if r.params.seed is not None]
        if len(seeded) < len(reqs):
            noise.exponential_(generator=self.generator(dev))
        if seeded:
            keys = [row_key(reqs[j].params.seed, reqs[j].num_output_tokens) for j in seeded]
            e = -torch.log(seeded_uniform(keys, vocab, dev))
            noise.index_copy_(0, torch.tensor(seeded, dtype=torch.long, device=dev), e)
        return -torch.log(noise)

    def _logprobs(self, raw, tokens, token_ids, requests) -> list:
        rows = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
        out: list = [None] * len(requests)
        if not rows:
            return out
        index = torch.tensor(rows, dtype=torch.long, device=raw.device)
        k = max(requests[i].params.logprobs for i in rows)
        chosen, ids, values = top_logprobs(raw.index_select(0, index), tokens.index_select(0, index), k)
        for j, i in enumerate(rows):
            n = requests[i].params.logprobs
            out[i] = [(token_ids[i], chosen[j])] + list(zip(ids[j][:n], values[j][:n]))
        return out

    def prompt_logprobs(self, logits: torch.Tensor, target_ids: Sequence[int], k: int) -> list[dict[int, float]]:
        """See the module-level `prompt_logprobs`."""
        return prompt_logprobs(logits[:, :self.vocab_size], target_ids, k)
