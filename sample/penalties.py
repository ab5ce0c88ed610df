"""Logit edits that depend on a request's history or its explicit token lists.

Applied to the raw float32 logits before temperature, in this order (vLLM's):
allowed_token_ids -> bad words -> min_tokens -> logit_bias -> repetition / frequency / presence
penalties.
Every function edits the rows it is given in place and is a no-op for rows that ask for nothing.
Row work is vectorised: per-row Python only builds small index tensors once per call.
"""

from __future__ import annotations

import itertools
from typing import AbstractSet, NamedTuple, Optional, Sequence

import numpy as np
import torch

from enginespec.kernels import sampling as sampling_triton

NEG_INF = float("-inf")


def apply_allowed_tokens(logits: torch.Tensor, requests: Sequence) -> None:
    """Rows with `allowed_token_ids` keep only those tokens (others become -inf)."""
    rows, cols = [], []
    for i, r in enumerate(requests):
        allowed = r.params.allowed_token_ids
        if allowed is not None:
            rows.extend([i] * len(allowed))
            cols.extend(allowed)
    if not rows:
        return
    dev = logits.device
    keep = torch.ones((logits.shape[0], logits.shape[1]), dtype=torch.bool, device=dev)
    keep[torch.tensor(sorted(set(rows)), dtype=torch.long, device=dev)] = False
    keep[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)] = True
    logits.masked_fill_(~keep, NEG_INF)


def bans_read_outputs(sequences: Sequence[Sequence[int]]) -> bool:
    """Whether these bad words' bans depend on the output so far: a word of two or more tokens
    is banned only after its prefix. One-token words are banned at every step whatever came
    before, so rows that have only those need no real newest token (under async scheduling the
    step before need not be resolved first)."""
    return any(len(seq) > 1 for seq in sequences)


def banned_tokens(sequences: Sequence[Sequence[int]], past: Sequence[int]) -> list[int]:
    """vLLM's bad-words rule: the last token of each sequence whose other tokens are the last
    tokens of `past` (a one-token sequence: always; a sequence longer than past + 1: never)."""
    out = []
    for seq in sequences:
        k = len(seq) - 1
        if k == 0 or (k <= len(past) and tuple(past[-k:]) == tuple(seq[:k])):
            out.append(seq[-1])
    return out


def apply_bad_words(logits: torch.Tensor, requests: Sequence) -> None:
    """Rows with `bad_words_token_ids` get -inf on the tokens that would complete one of them
    after the request's output so far (`banned_tokens`; the prompt does not count, as in vLLM
    V1). Reads the host's output lists, so the newest token must be real (no placeholder)."""
    rows, cols = [], []
    for i, r in enumerate(requests):
        sequences = r.params.bad_words_token_ids
        if sequences:
            banned = banned_tokens(sequences, r.output_token_ids)
            rows.extend([i] * len(banned))
            cols.extend(banned)
    if rows:
        dev = logits.device
        logits[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)] = NEG_INF


def stop_ids_to_mask(request) -> list[int]:
    """Token ids that would stop `request`: its stop_token_ids, plus EOS unless ignore_eos."""
    ids = list(request.params.stop_token_ids)
    if request.eos_token_id is not None and not request.params.ignore_eos:
        ids.append(request.eos_token_id)
    return ids


def min_tokens_ids(request) -> list[int]:
    """Token ids min_tokens bans until that many tokens are out: its stop_token_ids, the EOS and
    the further EOS ids (params.further_eos_token_ids), each once, under ignore_eos too. vLLM's
    rule ("before EOS or stop_token_ids can be generated"): its MinTokensLogitsProcessor masks
    `all_stop_token_ids`, to which the engine adds the EOS of every request and
    generation_config.json's EOS ids whatever ignore_eos says. Leaving an EOS id free under
    ignore_eos drew it at those positions, where vLLM never does."""
    ids = list(request.params.stop_token_ids)
    further = getattr(request.params, "further_eos_token_ids", ())
    for token in (request.eos_token_id, *further):
        if token is not None and token not in ids:
            ids.append(token)
    return ids


def min_tokens_yields(params) -> bool:
    """Whether min_tokens' ban yields on this row where it would leave no token at all: a row
    with hard constraints, which the user states as things never to emit (allowed_token_ids,
    bad words, a grammar), outranks min_tokens, a soft lower bound. Only such a row can be left
    with nothing but stop ids before the ban (a free row holds the model's finite logits over
    a vocabulary wider than its stop ids), so only such a row is checked."""
    return (
        params.allowed_token_ids is not None
        or bool(params.bad_words_token_ids)
        or getattr(params, "structured_outputs", None) is not None
    )


class Breach(NamedTuple):
    """What `first_breach` found at the index-th of a request's newest tokens: the token its
    hard constraints refuse (`refused`: its row had no token left), or else a stop id drawn
    below min_tokens (the ban yielded, `apply_min_tokens`), which ends the request "stop"
    with stop_reason `stop_reason` (the stop id; None for the EOS)."""

    index: int
    refused: bool
    stop_reason: Optional[int] = None


def holds_draws(params) -> bool:
    """Whether a request's draws can break its hard constraints or come below min_tokens as a
    stop id, so that `first_breach` must look at them: only bad words of several tokens empty a
    row of allowed ids mid-generation (the engine refuses on add allowed ids that one-token
    bad words, the stop ids and the EOS leave nothing of), and min_tokens yields only on a row
    of hard constraints (`min_tokens_yields`)."""
    hard = params.allowed_token_ids is not None or bool(params.bad_words_token_ids)
    return hard and (params.min_tokens > 0 or bans_read_outputs(params.bad_words_token_ids))


def first_breach(request, num_new: int, allowed: Optional[AbstractSet[int]]) -> Optional[Breach]:
    """The first of the request's newest num_new output tokens (all real ids, the last of
    output_token_ids) that is an id its allowed ids (`allowed`: its allowed_token_ids as a set,
    None for every id) or bad words refuse after the output before it, or a stop id (a
    stop_token_ids entry; the EOS unless ignore_eos) drawn while fewer than min_tokens were out;
    None when there is none. The sampler never draws a -inf id from a row that has a finite
    one, so a refused id means its row had no token left, and a stop id below min_tokens that
    the ban yielded (allowed ids and bad words outrank min_tokens)."""
    p, out = request.params, request.output_token_ids
    start = len(out) - num_new
    for j, token in enumerate(out[start:]):
        k = start + j
        if (allowed is not None and token not in allowed) or token in banned_tokens(
            p.bad_words_token_ids, out[:k]
        ):
            return Breach(j, True)
        if k < p.min_tokens:
            if token in p.stop_token_ids:
                return Breach(j, False, token)
            if token == request.eos_token_id and not p.ignore_eos:
                return Breach(j, False, None)
    return None


def apply_min_tokens(logits: torch.Tensor, requests: Sequence) -> None:
    """While num_output_tokens < min_tokens, the stop ids and EOS (`min_tokens_ids`) are -inf.

    Except where that would leave a row of hard constraints (`min_tokens_yields`) with no token:
    a structured-outputs row whose grammar allows nothing but a stop token (its value is
    complete), or a row whose allowed_token_ids and bad words leave only stop ids. There the
    hard constraints win and the row keeps its stop ids, so the request ends "stop" below
    min_tokens (vLLM's rule for a grammar; the engine ends it) instead of drawing a token they
    refuse from an all -inf row. Decided on the device (no host sync): such a row is left as it
    was when masking would empty it."""
    rows, cols, guarded = [], [], []
    vocab = logits.shape[1]
    for i, r in enumerate(requests):
        if r.num_output_tokens < r.params.min_tokens:
            ids = [t for t in min_tokens_ids(r) if t < vocab]
            rows.extend([i] * len(ids))
            cols.extend(ids)
            if ids and min_tokens_yields(r.params):
                guarded.append(i)
    if not rows:
        return
    dev = logits.device
    index = torch.tensor(guarded, dtype=torch.long, device=dev)
    before = logits.index_select(0, index) if guarded else None
    logits[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)] = NEG_INF
    if before is not None:
        after = logits.index_select(0, index)
        alive = (after > NEG_INF).any(dim=1, keepdim=True)
        logits.index_copy_(0, index, torch.where(alive, after, before))


def apply_logit_bias(logits: torch.Tensor, requests: Sequence) -> None:
    """Add each row's `logit_bias[token]` to that token's logit."""
    rows, cols, vals = [], [], []
    for i, r in enumerate(requests):
        bias = r.params.logit_bias
        if bias:
            for tok, val in bias.items():
                rows.append(i)
                cols.append(tok)
                vals.append(float(val))
    if rows:
        dev = logits.device
        index = (torch.tensor(rows, device=dev), torch.tensor(cols, device=dev))
        logits.index_put_(index, torch.tensor(vals, dtype=logits.dtype, device=dev), accumulate=True)


def needs_penalty(params) -> bool:
    return (
        params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
    )


def upload(host: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device` without making the host wait: through pinned memory on CUDA.
    CUDA's API notes say a copy from pageable memory may synchronize with the stream first,
    i.e. wait for the step the GPU is running, which would undo async scheduling's overlap
    whenever a batch plan is rebuilt. Elsewhere a plain copy."""
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


_TORCH_DTYPES = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.uint8): torch.uint8,
}


# Every segment of `upload_packed` starts 16-byte aligned whatever the row counts before it:
# Triton specialises pointer arguments on 16-byte alignment, so a view at an offset that
# followed the batch's row counts (8-byte segments did) made the sampler's kernels compile
# another variant whenever a batch moved it, in the warm-up and in the middle of traffic, and
# the startup's compile-only launches (sample/precompile.py) could not know which to compile.
SEGMENT_ALIGN = 16


def upload_packed(arrays: Sequence[np.ndarray], device) -> list[torch.Tensor]:
    """Several host arrays on `device` in ONE host-to-device copy (`upload`): their bytes laid
    end to end in one uint8 buffer, each segment starting at a multiple of SEGMENT_ALIGN bytes,
    so that every device view can take its array's dtype and shape back. Returns one device
    tensor per array (views of one device buffer: writing one never touches another's bytes)."""
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // SEGMENT_ALIGN) * SEGMENT_ALIGN
    host = np.zeros(max(total, SEGMENT_ALIGN), dtype=np.uint8)
    for a, start in zip(arrays, offsets):
        host[start : start + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    buf = upload(torch.from_numpy(host), device)
    out = []
    for a, start in zip(arrays, offsets):
        view = buf[start : start + a.nbytes].view(_TORCH_DTYPES[a.dtype])
        out.append(view if a.ndim == 1 else view.view(a.shape))
    return out


def aligned_rows(a: np.ndarray) -> np.ndarray:
    """A 2-D array with its rows padded (zeros) to a multiple of SEGMENT_ALIGN bytes, so that
    each row of its `upload_packed` view starts 16-byte aligned whatever the row length (see
    SEGMENT_ALIGN); the caller slices each device row back to a.shape[1]."""
    width = -(-a.shape[1] * a.itemsize // SEGMENT_ALIGN) * SEGMENT_ALIGN // a.itemsize
    return np.pad(a, ((0, 0), (0, width - a.shape[1])))


def to_device(columns: Sequence[Sequence[float]], dtype: torch.dtype, device) -> list[torch.Tensor]:
    """Per-row parameter columns, in ONE host-to-device copy (each copy costs a launch and a
    wait, which at 256 rows dominates the small tensors' cost). Returns one [R] tensor each."""
    return list(upload(torch.tensor(columns, dtype=dtype), device).unbind(0))


def _counts(id_lists: Sequence[Sequence[int]], vocab: int, device) -> torch.Tensor:
    """[R, vocab] int32 occurrence counts of each row's ids: one host->device copy of all ids
    (gathered by numpy, not per-row tensors) and one scatter_add of ones at row * vocab + id."""
    lengths = np.fromiter((len(ids) for ids in id_lists), dtype=np.int64, count=len(id_lists))
    counts = torch.zeros((len(id_lists), vocab), dtype=torch.int32, device=device)
    total = int(lengths.sum())
    if total == 0:
        return counts
    flat = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=total)
    flat += np.repeat(np.arange(len(id_lists), dtype=np.int64) * vocab, lengths)
    index = upload(torch.from_numpy(flat), device)
    counts.view(-1).scatter_add_(0, index, torch.ones(total, dtype=torch.int32, device=device))
    return counts


def prompt_seen(requests: Sequence, vocab: int, device) -> torch.Tensor:
    """[R, vocab] bool: which tokens occur in each request's prompt."""
    return _counts([r.prompt_token_ids for r in requests], vocab, device) > 0


class PenaltyColumns(NamedTuple):
    """The penalty rows of a batch and their parameters on the device (float32 [R] each), built
    once per batch of params (the Sampler keeps them in its BatchPlan)."""

    rows: list
    index: torch.Tensor
    rep: torch.Tensor
    freq: torch.Tensor
    pres: torch.Tensor


def penalty_columns(params: Sequence, device) -> Optional[PenaltyColumns]:
    """PenaltyColumns of the rows whose params ask for a penalty; None when none does."""
    rows = [i for i, p in enumerate(params) if needs_penalty(p)]
    if not rows:
        return None
    ps = [params[i] for i in rows]
    rep, freq, pres, index = to_device(
        [
            [p.repetition_penalty for p in ps],
            [p.frequency_penalty for p in ps],
            [p.presence_penalty for p in ps],
            rows,
        ],
        torch.float64,
        device,
    )
    return PenaltyColumns(rows, index.long(), rep.float(), freq.float(), pres.float())


_UNSET = object()


def apply_penalties(
    logits: torch.Tensor, requests: Sequence, seen_in_prompt=prompt_seen, columns=_UNSET
) -> None:
    """vLLM semantics. Repetition (prompt + output tokens): positive logits are divided by the
    penalty, negative ones multiplied. Frequency (output count) and presence (output seen) are
    subtracted: logit -= frequency * count + presence * (count > 0). `seen_in_prompt(requests,
    vocab, device)` gives the prompt masks (the Sampler passes a cached version); `columns`, the
    batch's `penalty_columns` when the caller keeps them. On CUDA the arithmetic is one Triton
    launch (`sampling_triton.apply_penalties`), elsewhere torch."""
    dev, vocab = logits.device, logits.shape[1]
    cols = penalty_columns([r.params for r in requests], dev) if columns is _UNSET else columns
    if cols is None:
        return
    reqs = [requests[i] for i in cols.rows]
    out_counts = _counts([r.output_token_ids for r in reqs], vocab, dev)
    penalize_rows(logits, cols, seen_in_prompt(reqs, vocab, dev), out_counts)


def penalize_rows(
    logits: torch.Tensor,
    cols,
    in_prompt: torch.Tensor,
    out_counts: torch.Tensor,
    slots: Optional[torch.Tensor] = None,
    source: Optional[tuple] = None,
) -> None:
    """The penalty arithmetic, in place on the rows `cols.index` of `logits` [S, V]: row i's
    prompt mask and output token counts are row slots[i] of in_prompt [N, V] bool and
    out_counts [N, V] int (slots None: row i, N = R). One Triton launch on CUDA
    (`sampling_triton.apply_penalties`, reading the tables in place), else torch; the serial
    sampler and the device path (device_edits.py, whose tables are OutputCounts') share it.
    source = (src [*, V], src_map int64): each penalty row r is computed from row src_map[r] of
    src rather than from logits' own row (the copy of the edited rows folded into this pass)."""
    if slots is None:
        slots = torch.arange(cols.index.shape[0], dtype=torch.int64, device=logits.device)
    if sampling_triton.available(logits.device) and logits.stride(1) == 1:
        sampling_triton.apply_penalties(
            logits, cols.index, in_prompt, out_counts, cols.rep, cols.freq, cols.pres, slots, source
        )
        return
    in_prompt, out_counts = in_prompt.index_select(0, slots), out_counts.index_select(0, slots)
    rep, freq, pres = cols.rep[:, None], cols.freq[:, None], cols.pres[:, None]
    out_seen = out_counts > 0
    if source is None:
        sub = logits.index_select(0, cols.index)
    else:
        src, src_map = source
        sub = src.index_select(0, src_map.index_select(0, cols.index)).to(logits.dtype)
    scaled = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(in_prompt | out_seen, scaled, sub)
    sub = sub - freq * out_counts.to(sub.dtype) - pres * out_seen.to(sub.dtype)
    logits.index_copy_(0, cols.index, sub)
