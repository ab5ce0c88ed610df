"""The batched sampler: one call turns the logits of every sampling row into one token per row.

Pipeline per call (row i belongs to requests[i]), all on [S, V] tensors, no per-row loop over
the vocabulary:

1. raw float32 logits -> allowed_token_ids -> min_tokens -> logit_bias -> penalties
   (`sampling_penalties`, vLLM's order and semantics);
2. random rows (temperature >= GREEDY_EPS) get one raw-space threshold each from min-p, top-k
   and top-p (`sampling_truncation`; no full sort in the common case);
3. one draw over all rows by the Gumbel-max trick: argmax over tokens with x >= thr of
   x / T + G, G = -log(-log(U)), is a sample of the cut softmax(x / T). Greedy rows are the
   same argmax with T = 1, no noise and no cut, so mixed batches need no split. U is a hash of
   (row key, token id) (`sampling_rng`): a seeded row's key is (seed, output index), so its draw
   is the same whatever batch or position it is in; unseeded rows take 64 bits of the
   sampler's generator (`random.Random(seed)`). On CUDA the draw is one Triton pass
   (`sampling_triton`), elsewhere plain torch (`draw_torch`), with the same noise bits.

Logprobs are of the RAW distribution: log_softmax of the model's logits before any edit,
temperature or cut (vLLM V1's default "raw_logprobs"), so a token's reported logprob does not
change with sampling settings. Each row asking for logprobs = k gets [(sampled id, its logprob)]
followed by the k most likely (id, logprob) pairs, best first.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .sampling_penalties import apply_allowed_tokens, apply_logit_bias, apply_min_tokens, apply_penalties, prompt_seen, to_device
from . import sampling_triton
from .sampling_rng import gumbel, row_key
from .sampling_truncation import cut_thresholds

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


def edit_logits(logits: torch.Tensor, requests: Sequence, seen_in_prompt=prompt_seen) -> torch.Tensor:
    """Float32 logits with allowed-ids, min_tokens, bias and penalties applied (a copy when
    anything changes; the caller's tensor is never modified)."""
    if not any(_needs_edits(r.params) for r in requests):
        return logits.float()
    x = logits.to(torch.float32, copy=True)
    apply_allowed_tokens(x, requests)
    apply_min_tokens(x, requests)
    apply_logit_bias(x, requests)
    apply_penalties(x, requests, seen_in_prompt)
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


def _has_cut(params, vocab: int) -> bool:
    return 0 < params.top_k < vocab or params.top_p < 1.0 or params.min_p > 0.0


def draw_torch(x, inv_t, thr, keys: Sequence[int], noisy: Sequence[bool]) -> torch.Tensor:
    """The plain-torch draw (CPU, and the oracle of the Triton kernel): argmax over tokens
    with x >= thr of x * inv_t + Gumbel(keys[row], token) (noise only on `noisy` rows)."""
    scaled = x * inv_t.unsqueeze(1)
    rows = [i for i, n in enumerate(noisy) if n]
    noise = gumbel([keys[i] for i in rows], x.shape[1], x.device)
    if len(rows) == x.shape[0]:
        scaled = scaled + noise
    else:
        scaled = scaled.index_add(0, torch.tensor(rows, dtype=torch.long, device=x.device), noise)
    return scaled.masked_fill(x < thr.unsqueeze(1), float("-inf")).argmax(dim=1)


class Sampler:
    """Samples one token per row. `vocab_size` is the model's; logits may carry padded columns
    beyond it, which are never sampled. State across calls: only the generator that keys the
    unseeded rows (`random.Random(seed)`; seed None draws from OS entropy)."""

    def __init__(self, vocab_size: int, device="cpu", seed: Optional[int] = None):
        if vocab_size < 1:
            raise ValueError(f"Sampler.vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.seed = seed
        self.generator = random.Random(seed)
        self._flags: dict[int, tuple] = {}          # id(params) -> (params, flags); see _row_flags
        self._prompt_masks: dict[int, tuple] = {}   # id(request) -> (request, bool [V] prompt mask)

    def _row_flags(self, params) -> tuple[bool, bool, bool]:
        """(needs edits, random, wants logprobs) of a params object, computed once per object:
        the params are frozen, and the entry keeps the object alive so its id is not reused."""
        hit = self._flags.get(id(params))
        if hit is not None and hit[0] is params:
            return hit[1]
        if len(self._flags) > 4096:
            self._flags.clear()
        flags = (_needs_edits(params), params.temperature >= GREEDY_EPS, params.logprobs is not None)
        self._flags[id(params)] = (params, flags)
        return flags

    def _cached_prompt_seen(self, requests: Sequence, vocab: int, device) -> torch.Tensor:
        """prompt_seen, with each request's mask built once (prompts never change) and kept
        while the request keeps appearing in penalty rows. Entries are keyed by the request
        object (kept alive by the entry), so a reused request_id never sees a stale mask."""
        device = torch.device(device)

        def cached(r):
            entry = self._prompt_masks.get(id(r))
            return entry if entry is not None and entry[0] is r and entry[1].device == device else None

        missing = [r for r in requests if cached(r) is None]
        built = iter(prompt_seen(missing, vocab, device).unbind(0)) if missing else iter(())
        masks, fresh = [], {}
        for r in requests:
            entry = fresh.get(id(r)) or cached(r) or (r, next(built))
            fresh[id(r)] = entry
            masks.append(entry[1])
        self._prompt_masks = fresh
        return torch.stack(masks)

    def __call__(self, logits: torch.Tensor, requests: Sequence) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(f"Sampler: logits must be [len(requests)={len(requests)}, V], got {tuple(logits.shape)}")
        if logits.shape[1] < self.vocab_size:
            raise ValueError(f"Sampler: logits have {logits.shape[1]} columns, fewer than vocab_size {self.vocab_size}")
        if not requests:
            return SamplerOutput([], [])
        raw = logits[:, :self.vocab_size]
        flags = [self._row_flags(r.params) for r in requests]
        if any(f[0] for f in flags):
            x = edit_logits(raw, requests, self._cached_prompt_seen)
        else:
            x = raw.float()
        if any(f[1] for f in flags):
            tokens = self._draw(x, requests)
        else:
            tokens = x.argmax(dim=1)
        token_ids = tokens.tolist()
        if not any(f[2] for f in flags):
            return SamplerOutput(token_ids, [None] * len(token_ids))
        return SamplerOutput(token_ids, self._logprobs(raw, tokens, token_ids, requests))

    def _row_key(self, request) -> int:
        """Seeded rows: a key of (seed, output index). Unseeded: 64 bits of the generator."""
        seed = request.params.seed
        if seed is None:
            return self.generator.getrandbits(64)
        return row_key(seed, request.num_output_tokens)

    def _draw(self, x: torch.Tensor, requests: Sequence) -> torch.Tensor:
        """Every row in one draw: greedy rows are random rows with T = 1, no noise, no cut."""
        dev = x.device
        noisy = [r.params.temperature >= GREEDY_EPS for r in requests]
        temps = [r.params.temperature if n else 1.0 for r, n in zip(requests, noisy)]
        keys = [self._row_key(r) if n else 0 for r, n in zip(requests, noisy)]
        thr = self._thresholds(x, requests, noisy, temps)
        if sampling_triton.available(dev) and x.stride(1) == 1:
            inv_t, scale = to_device([[1.0 / t for t in temps], [1.0 if n else 0.0 for n in noisy]],
                                     torch.float32, dev)
            lo, hi = to_device([[k & 0xFFFFFFFF for k in keys], [k >> 32 for k in keys]], torch.int64, dev)
            return sampling_triton.draw(x, inv_t, thr, lo, hi, scale)
        inv_t = torch.tensor([1.0 / t for t in temps], dtype=torch.float32, device=dev)
        return draw_torch(x, inv_t, thr, keys, noisy)

    def _thresholds(self, x, requests, noisy, temps) -> torch.Tensor:
        """Raw-space cut per row (-inf for greedy rows and rows without a cut)."""
        vocab = x.shape[1]
        rows = [i for i, (r, n) in enumerate(zip(requests, noisy)) if n and _has_cut(r.params, vocab)]
        thr = torch.full((x.shape[0],), float("-inf"), dtype=torch.float32, device=x.device)
        if not rows:
            return thr
        params = [requests[i].params for i in rows]
        index = torch.tensor(rows, dtype=torch.long, device=x.device)
        sub = x if len(rows) == x.shape[0] else x.index_select(0, index)
        cut = cut_thresholds(sub, [temps[i] for i in rows], [p.top_k if p.top_k < vocab else 0 for p in params],
                             [p.top_p for p in params], [p.min_p for p in params])
        return cut if len(rows) == x.shape[0] else thr.index_copy(0, index, cut)

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
