"""The batched sampler: one call turns the logits of every sampling row into one token per row.

Pipeline per call (row i belongs to requests[i]), all on [S, V] tensors, no per-row loop over
the vocabulary:

1. raw logits (upcast to float32) -> allowed_token_ids -> bad words -> min_tokens -> logit_bias
   -> penalties (`sampling_penalties`, vLLM's order and semantics);
2. random rows (temperature >= GREEDY_EPS) get one raw-space threshold each from min-p, top-k
   and top-p (`sampling_truncation`; no full sort in the common case);
3. one draw over all rows (`sampling_draw`): inverse-CDF sampling of the cut softmax(x / T),
   split over fixed chunks of the vocabulary (computed in base 2: x_scale = log2(e) / T), with
   two uniforms per row hashed from the row key (`sampling_rng`). Greedy rows take the first
   argmax, so mixed batches need no split. A seeded row's key is row_key(seed, output index), so
   its draw is the same whatever batch or position it is in; unseeded rows derive theirs from
   one 62-bit base per call drawn from the sampler's generator (`random.Random(seed)`) and the
   row's position.

On CUDA steps 2 and 3 are ONE fused pair of Triton launches for every row type (`cut_draw`:
the cuts come out of the draw's own pass over the logits, exact, with no topk or sort and no
host sync); elsewhere the thresholds come from torch (`sampling_truncation`) and the draw is
plain torch (`draw_torch`), computing the same cuts and the same sums, so seeded rows draw the
same tokens on both (up to float rounding at a top-p or CDF boundary).

Per-row parameters are uploaded once per distinct batch of params, all in one host-to-device
copy (`BatchPlan`, cached while the same params come in the same order), so a steady step of
any top-k/top-p/min-p/temperature mix is two launches plus the host copy of the ids
(tests/sample/test_host_work.py counts them).

Two entry points draw the same tokens. `__call__` (serial steps) returns host lists; its edits
read the requests' token lists on the host and a top-p row whose nucleus may lie beyond the
candidates is checked on the host (read with the ids) and redrawn after a full sort.
`sample_deferred` (async scheduling) does everything on the device with no host sync, for
every setting: edits from the batch's `EditPlan` on a copy of the edited rows only (indices
uploaded once, `device_edits`; the fused draw reads those rows through a row map), penalties
read in place from device-side output-count and prompt tables updated from the drawn ids
(`output_counts`, so the in-flight placeholder is counted with its real id), exact cuts
(`cut_draw` on CUDA, `truncation.exact_thresholds` elsewhere), and logprobs left on the device
(two launches on CUDA, `kernels.logprobs`) to travel with the ids in one host copy
(`deferred`). Steady-state launches on CUDA (ids' host copy included): temperature, top-k,
top-p, min-p in any mix 3; all seeded 4 (the step's keys); a batch with a loose top-p (no
top-k, no min-p) 3 + 2 * reject_top_p.GRID_ROUNDS + 1 (REJECT_TOP_P: those rows draw uncut,
then by rejection, `sample/reject.py`: no cut is searched for), or with REJECT_TOP_P off 3,
or 3 + 2 + cut_draw.NUM_ROUNDS with SPREAD_CUT (off: see there);
quarters of greedy / temperature / top-k+top-p / top-p+min-p+penalties+logprobs about 13, plus 5
small torch launches for the sampled tokens' ranks when rows ask for logprobs (`token_ranks`;
tests/sample/test_host_work.py counts them). Seeded rows give the same tokens on both paths;
unseeded rows too, as both advance the generator once per call with a random row.

Temperatures below GREEDY_EPS count as greedy (vLLM's _SAMPLING_EPS, the same 1e-5; newer vLLM
also raises a temperature in (0, 0.01) to 0.01 with a warning: here it is used as given); a
min_tokens mask covers stop_token_ids and EOS, under ignore_eos too (vLLM's rule: its min_tokens
processor masks all_stop_token_ids, which always hold the EOS). Tokens tied with a top-k / top-p / min-p threshold are all kept.

Logprobs are of the RAW distribution: log_softmax of the model's logits before any edit,
temperature or cut (vLLM V1's default "raw_logprobs"), so a token's reported logprob does not
change with sampling settings. Each row asking for logprobs = k gets [(sampled id, its logprob)]
followed by the k most likely (id, logprob) pairs, best first; each logprob is an
`enginespec.outputs.Logprob` (a float) whose rank is 1..k for the top k and, for the sampled id,
the number of entries of its row at or above it, itself and ties included (vLLM V1's count,
`logprob_ranks.token_ranks`, on every path).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch

from enginespec.kernels import argmax as argmax_kernel
from enginespec.kernels import cut_draw, reject_top_p
from enginespec.kernels import sampling as sampling_triton
from enginespec.kernels.switches import env_switch
from enginespec.outputs import Logprob
from enginespec.sample import draw as sampling_draw
from enginespec.sample.deferred import DeviceSample, device_logprobs
from enginespec.sample.device_edits import EditPlan
from enginespec.sample.draw import draw_torch
from enginespec.sample.logprob_ranks import token_ranks
from enginespec.sample.output_counts import OutputCounts
from enginespec.sample.penalties import (
    PenaltyColumns,
    aligned_rows,
    apply_allowed_tokens,
    apply_bad_words,
    apply_logit_bias,
    apply_min_tokens,
    apply_penalties,
    bans_read_outputs,
    needs_penalty,
    prompt_seen,
    upload,
    upload_packed,
)
from enginespec.sample.reject import refine_top_p
from enginespec.sample.rng import resolve_keys, row_keys
from enginespec.sample.truncation import (
    CutPlan,
    cut_thresholds,
    effective_top_p,
    exact_thresholds,
    full_sort_thresholds,
)

# Whether a loose top-p's cut is spread over several programs per row (cut_draw's spread cut)
# instead of the draw's in-program wide cut. Off: on the H200 at fd7f0c1 (benchmarks/RESULTS.md)
# the spread took 2.75 ms of device time for 256 flat rows against the in-program cut's 2.28 ms
# at 5fd202c (eight rounds of ~0.3 ms each), so it does not pay yet; its kernels stay tested.
SPREAD_CUT = False
# Whether loose top-p rows (top-p < 1, no top-k, no min-p) draw by rejection (sample/reject.py:
# no cut is found, round 0 is the uncut draw) on every path. ENGINESPEC_REJECT_TOP_P=0 turns it
# off (the exact cut, then the draw), for A/B runs; the two draw different tokens for a seed.
REJECT_TOP_P_ENV = "ENGINESPEC_REJECT_TOP_P"


def reject_top_p_from_env() -> bool:
    """ENGINESPEC_REJECT_TOP_P as env_switch reads it: "0" off, "1" or unset on, anything else a
    ValueError naming it (any value but "0" had meant on, "false" too)."""
    return env_switch(REJECT_TOP_P_ENV) is not False


REJECT_TOP_P = reject_top_p_from_env()

LOG2E = 1.4426950408889634  # log2(e): the draw works in base 2 (see sampling_draw)
GREEDY_EPS = 1e-5  # temperatures below this are treated as greedy (dividing by them overflows)
# Temperatures above this draw as this one: the draw scales float32 logits by 1 / T, which past
# about 1e38 is zero in float32 (and a GPU flushes its subnormals to zero before that), and a
# zero scale turned every draw into the last vocabulary id. At 1e30 every finite logit scales
# to within float32's rounding of 0, so the draw is already uniform over the finite logits: the
# limit that larger temperatures tend to, unchanged.
MAX_TEMPERATURE = 1e30


# The most rows greedy_tokens takes kernels/argmax.py for: the row counts it was timed at end
# to end on the H200 (decode steps of 1, 4 and 16 rows, seventeenth session); bigger batches
# keep torch.argmax until they are timed.
GREEDY_KERNEL_MAX_ROWS = 16


def greedy_tokens(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=1) (the first max); on CUDA, for up to GREEDY_KERNEL_MAX_ROWS rows, as one
    launch (kernels/argmax.py: torch's reduction took 8.8 us at the Qwen vocabulary on the
    H200, the end of every greedy batch-1 step; the kernel 4.2)."""
    if x.is_cuda and x.shape[0] <= GREEDY_KERNEL_MAX_ROWS:
        return argmax_kernel.argmax(x)
    return x.argmax(dim=1)


# A params object's RowSpec stays cached while some call of the last this many used it: past
# one step's calls (up to three: speculation's subsets), short enough that a departed request's
# params (a client payload) go within a few steps (Sampler._row_specs).
SPEC_CACHE_CALLS = 8


@dataclass
class SamplerOutput:
    """token_ids[i] is row i's token; logprobs[i] is None unless its params ask for logprobs."""

    token_ids: list[int]
    logprobs: list[Optional[list[tuple[int, Logprob]]]]


def _needs_edits(params) -> bool:
    return (
        params.allowed_token_ids is not None
        or bool(params.bad_words_token_ids)
        or params.min_tokens > 0
        or bool(params.logit_bias)
        or params.repetition_penalty != 1.0
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
    )


def edit_kinds(params: Sequence) -> tuple[bool, bool, bool, bool, bool]:
    """Which edits any row asks for: (allowed ids, bad words, min_tokens, logit_bias,
    penalties)."""
    return (
        any(p.allowed_token_ids is not None for p in params),
        any(p.bad_words_token_ids for p in params),
        any(p.min_tokens > 0 for p in params),
        any(bool(p.logit_bias) for p in params),
        any(
            p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
            for p in params
        ),
    )


def edit_logits(
    logits: torch.Tensor, requests: Sequence, seen_in_prompt=prompt_seen, kinds=None, **penalty
) -> torch.Tensor:
    """Float32 logits with allowed-ids, bad words, min_tokens, bias and penalties applied (a
    copy when anything changes; the caller's tensor is never modified). `kinds`: the batch's
    `edit_kinds` when the caller keeps them (edits no row asks for are skipped without a pass
    over the rows); `penalty` may carry the batch's cached `columns` (see
    `sampling_penalties.apply_penalties`)."""
    allowed, bans, min_tokens, bias, penalties = kinds or edit_kinds([r.params for r in requests])
    if not (allowed or bans or min_tokens or bias or penalties):
        return logits.float()
    x = logits.to(torch.float32, copy=True)
    if allowed:
        apply_allowed_tokens(x, requests)
    if bans:
        apply_bad_words(x, requests)
    if min_tokens:
        apply_min_tokens(x, requests)
    if bias:
        apply_logit_bias(x, requests)
    if penalties:
        apply_penalties(x, requests, seen_in_prompt, **penalty)
    return x


def top_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> tuple[list[Logprob], list, list]:
    """log_softmax of float32 `logits`: the Logprob of token_ids[r] in row r (its rank from
    `token_ranks`), and the top-k (ids, Logprobs of ranks 1..k) per row as nested lists (empty
    when k == 0). One host copy: ids and ranks travel as floats (exact: vocabularies are below
    2**24 ids, float64 beyond)."""
    x = logits.float()
    lp = torch.log_softmax(x, dim=1)
    chosen = lp.gather(1, token_ids.view(-1, 1))
    wide = lp.shape[1] >= 1 << 24
    if wide:
        chosen = chosen.double()
    ranks = token_ranks(x, token_ids, chosen.dtype).view(-1, 1)
    n = min(max(k, 0), lp.shape[1])
    values, ids = torch.topk(lp, n, dim=1) if n > 0 else (lp[:, :0], lp[:, :0].long())
    rows = torch.cat([chosen, ranks, values.to(chosen.dtype), ids.to(chosen.dtype)], dim=1).tolist()
    return (
        [Logprob(r[0], int(r[1])) for r in rows],
        [[int(t) for t in r[2 + n :]] for r in rows],
        [[Logprob(v, j) for j, v in enumerate(r[2 : 2 + n], 1)] for r in rows],
    )


def prompt_logprobs(logits: torch.Tensor, target_ids: Sequence[int], k: int) -> list[dict[int, Logprob]]:
    """Row p of `logits` predicts target_ids[p]: {target: Logprob} then the top-k entries
    (a dict, so a target that is also in the top-k appears once, first, with its top-k rank:
    vLLM's dict, as for sampled tokens). Raw distribution; ranks as `top_logprobs`."""
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
        entry.update(zip(row_ids, row_vals))
        out.append(entry)
    return out


# Columns of a row's vector (RowSpec.vector): cut_draw's table first (NUM_PARAMS columns, min_p
# in place of base_off), then what the plan's row lists are read from.
EDITS, LOGPROBS, PENALTY, MIN_TOKENS, SEEDED, ALLOWED, BIAS, REP, FREQ, PRES, BANS, GRAMMAR = range(8, 20)
WIDTH = GRAMMAR + 1  # a row vector's length


class RowSpec(NamedTuple):
    """What a row's params ask of the sampler, derived once per params object."""

    noisy: bool  # random (temperature >= GREEDY_EPS) rather than greedy
    temperature: float  # 1.0 for greedy rows
    seed: Optional[int]
    # float64 [WIDTH]: x_scale (log2(e) / T; 1 greedy), noisy, cut (a random row with a
    # min-p, top-k or top-p cut), min_p, top_k (0 = off), top_p, 1 / T, 0, then EDITS..GRAMMAR
    vector: np.ndarray
    key: bytes  # the vector's bytes: rows that ask the same compare equal in one step

    @classmethod
    def of(cls, p, vocab: int) -> "RowSpec":
        noisy = p.temperature >= GREEDY_EPS
        cut = noisy and (0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0)
        t = min(p.temperature, MAX_TEMPERATURE) if noisy else 1.0
        vector = np.array(
            [
                LOG2E / t if noisy else 1.0,
                1.0 if noisy else 0.0,
                1.0 if cut else 0.0,
                p.min_p if cut else 0.0,
                p.top_k if cut and 0 < p.top_k < vocab else 0,
                effective_top_p(p.top_p) if cut else 1.0,
                1.0 / t,
                0.0,
                float(_needs_edits(p)),
                -1.0 if p.logprobs is None else float(p.logprobs),
                float(needs_penalty(p)),
                float(p.min_tokens > 0),
                float(noisy and p.seed is not None),
                float(p.allowed_token_ids is not None),
                float(bool(p.logit_bias)),
                p.repetition_penalty,
                p.frequency_penalty,
                p.presence_penalty,
                float(bool(p.bad_words_token_ids)),
                float(p.structured_outputs is not None),
            ],
            dtype=np.float64,
        )
        return cls(noisy, t, p.seed, vector, vector.tobytes())


def row_matrix(specs: Sequence[RowSpec]) -> np.ndarray:
    """float64 [S, WIDTH]: the rows' vectors (each RowSpec's, converted to numpy once)."""
    if not specs:
        return np.zeros((0, WIDTH))
    return np.concatenate([s.vector for s in specs]).reshape(-1, WIDTH)


def _rows(flags: np.ndarray) -> list[int]:
    return np.flatnonzero(flags).tolist()


def _uniform_key(specs: Sequence[RowSpec], m: np.ndarray) -> Optional[bytes]:
    """The rows' common RowSpec key when every row asks the same and nothing of it is per row
    beyond its position (no seed, no edits, no logprobs: BatchPlan.first may slice the plan),
    else None."""
    if not specs:
        return None
    key = specs[0].key
    if m[0, EDITS] or m[0, LOGPROBS] >= 0 or m[0, SEEDED] or any(s.key != key for s in specs):
        return None
    return key


class BatchPlan:
    """What one batch's params ask of the sampler: flags, per-row columns on the device, the key
    template, the cut rows' CutPlan. Built once per distinct params list (`Sampler._plan`) and
    reused while the same params come in the same order (the engine's steady state), so a step
    of temperature-only or greedy rows does no per-row Python beyond the list comparison.

    Built from the rows' vectors (`row_matrix`) with numpy: no per-row Python but one dict
    lookup. Every device column of the plan (the fused draw's table, keys, edit / logprob / cut
    row indices, penalty columns) travels in ONE host-to-device copy (`upload_packed`), plus two
    small in-place launches for min-p's offset when a row asks for min-p.

    keys: per row 0 (greedy), -1 (unseeded: derived from the call's random base) or, for
    seeded rows, filled per step by `step_keys` (the key depends on the output index).

    A uniform plan (`uniform_key` set: every row asks the same, with no seed, edit or logprobs:
    the common case of one SamplingParams for a whole generate() call, whatever each request's
    max_tokens) holds the same thing in every row, so the plan of its first n rows (`first`) is
    a view of it: when requests finish, the shrinking batch's plan is sliced, not rebuilt (a
    rebuild costs about 1 ms of host time on the H200's host, on the step after each finish)."""

    def __init__(self, params: list, specs: Sequence[RowSpec], vocab: int, device: torch.device):
        m = row_matrix(specs)
        self.params, self.device, self._specs, self._vocab = params, device, specs, vocab
        self.num_rows = len(specs)
        self.uniform_key = _uniform_key(specs, m)
        self.noisy = (m[:, 1] != 0).tolist()
        self.any_noisy, self.any_cut = bool(m[:, 1].any()), bool(m[:, 2].any())
        self.any_edits, self.any_logprobs = bool(m[:, EDITS].any()), bool((m[:, LOGPROBS] >= 0).any())
        self.seeded_rows = np.flatnonzero(m[:, SEEDED])
        self.seeds = np.array(
            [params[i].seed & 0xFFFFFFFFFFFFFFFF for i in self.seeded_rows.tolist()], np.uint64
        )
        self.keys = np.where(m[:, 1] != 0, -1, 0).astype(np.int64)
        kinds = tuple(bool(m[:, c].any()) for c in (ALLOWED, BANS, MIN_TOKENS, BIAS, PENALTY))
        # bad words of several tokens read the newest output tokens, which the device path
        # knows only once the caller has resolved the previous step (as the engine does for a
        # grammar's mask); one-token words read nothing (penalties.bans_read_outputs).
        self.history_bans = any(
            bans_read_outputs(params[i].bad_words_token_ids) for i in np.flatnonzero(m[:, BANS]).tolist()
        )
        self.edit_kinds = kinds if self.any_edits else None
        self.min_token_rows = _rows(m[:, MIN_TOKENS])
        self.edit_rows = _rows(m[:, EDITS])
        self.logprob_rows = _rows(m[:, LOGPROBS] >= 0)
        self.logprob_counts = m[self.logprob_rows, LOGPROBS].astype(np.int64).tolist()
        self.cut_rows = _rows(m[:, 2])
        self._cut_plan: Optional[CutPlan] = None
        self._draw_cut_plan: Optional[CutPlan] = None
        self._edit_plan: Optional[EditPlan] = None
        self._edit_eos: list = []
        self._upload(m)

    def _upload(self, m: np.ndarray) -> None:
        """The plan's device columns in one copy (see the class docstring)."""
        num_rows = m.shape[0]
        edit_map = np.full(num_rows, -1, dtype=np.int64)
        edit_map[self.edit_rows] = np.arange(len(self.edit_rows), dtype=np.int64)
        pen_rows = np.flatnonzero(m[:, PENALTY])
        columns = aligned_rows(
            np.stack([m[:, 0], m[:, 1], np.full(num_rows, float("-inf"))]).astype(np.float32)
        )
        table = m[:, : cut_draw.NUM_PARAMS].astype(np.float32)  # rounded as draw_params was
        any_min_p = bool((table[:, 3] > 0).any())
        # a loose top-p (no top-k, no min-p): its nucleus often lies beyond the draw's
        # candidates, so its cut is spread over several programs per row (cut_draw spread)
        loose = (table[:, 2] != 0) & (table[:, 3] == 0) & (table[:, 4] == 0) & (table[:, 5] < 1)
        self.reject_rows = _rows(loose) if REJECT_TOP_P else []
        if self.reject_rows:  # drawn uncut (round 0), then refined by rejection (sample/reject.py)
            reject_p = table[self.reject_rows, 5].copy()
            table[self.reject_rows, 2], table[self.reject_rows, 5] = 0.0, 1.0
        else:
            reject_p = np.zeros(0, dtype=np.float32)
        self.spread = SPREAD_CUT and bool(loose.any()) and not self.reject_rows
        if not any_min_p:  # log(0) / inv_t = -inf exactly: no device arithmetic needed
            table[:, 3] = float("-inf")
        (
            self.draw_params, self.keys_t, columns_t, self.edit_index, self.edit_map, self.logprob_index,
            self.cut_index, pen_index, pen_local, pen_t, self.reject_index, self.reject_p,
        ) = upload_packed(
            [
                table, self.keys, columns, np.array(self.edit_rows, dtype=np.int64), edit_map,
                np.array(self.logprob_rows, dtype=np.int64), np.array(self.cut_rows, dtype=np.int64),
                pen_rows, edit_map[pen_rows], aligned_rows(m[pen_rows][:, REP : PRES + 1].T.astype(np.float32)),
                np.array(self.reject_rows, dtype=np.int64), reject_p,
            ],
            self.device,
        )  # fmt: skip
        if any_min_p:
            self.draw_params[:, 3].log_().div_(self.draw_params[:, 6])
        self.x_scale, self.noise, self.no_cut = (c[:num_rows] for c in columns_t.unbind(0))
        # the penalty rows as batch rows, and as rows of the edited rows (the EditPlan's)
        self.penalties = self._edit_penalties = None
        if len(pen_rows):
            rep, freq, pres = (c[: len(pen_rows)] for c in pen_t.unbind(0))
            self.penalties = PenaltyColumns(pen_rows.tolist(), pen_index, rep, freq, pres)
            self._edit_penalties = PenaltyColumns(edit_map[pen_rows].tolist(), pen_local, rep, freq, pres)

    def first(self, params: list, specs: Sequence[RowSpec]) -> "BatchPlan":
        """The plan of this uniform plan's first len(params) rows for `params` (whose specs all
        have this plan's uniform_key; at most num_rows of them): every per-row list, array and
        device column cut to n rows (views: nothing is copied or uploaded); the lazily built
        CutPlan and EditPlan are built again on first use."""
        n = len(specs)
        assert self.uniform_key is not None and 0 < n <= self.num_rows
        plan = copy.copy(self)
        plan.params, plan._specs, plan.num_rows = params, specs, n
        plan.noisy, plan.keys, plan.keys_t = self.noisy[:n], self.keys[:n], self.keys_t[:n]
        plan.cut_rows, plan.reject_rows = self.cut_rows[:n], self.reject_rows[:n]
        plan.cut_index, plan.reject_index = self.cut_index[:n], self.reject_index[:n]
        plan.reject_p, plan.edit_map, plan.draw_params = (
            self.reject_p[:n],
            self.edit_map[:n],
            self.draw_params[:n],
        )
        plan.x_scale, plan.noise, plan.no_cut = self.x_scale[:n], self.noise[:n], self.no_cut[:n]
        plan._cut_plan = plan._draw_cut_plan = plan._edit_plan = None
        plan._edit_eos = []
        return plan

    @property
    def cut_plan(self) -> CutPlan:
        """The cut rows' CutPlan (the torch cuts), built on first use: the fused draw never
        needs it, so a CUDA batch plan does not pay its upload."""
        if self._cut_plan is None:
            self._cut_plan = self._build_cut_plan(uncut=())
        return self._cut_plan

    @property
    def draw_cut_plan(self) -> CutPlan:
        """The CutPlan the torch draws use: `cut_plan` with the rows drawn by rejection
        (`reject_rows`) uncut (top-p 1), so no threshold is searched for them; `cut_plan` keeps
        their top-p (`Sampler.probs` needs the cut itself)."""
        if not self.reject_rows:
            return self.cut_plan
        if self._draw_cut_plan is None:
            self._draw_cut_plan = self._build_cut_plan(uncut=set(self.reject_rows))
        return self._draw_cut_plan

    def _build_cut_plan(self, uncut) -> CutPlan:
        ps = [self.params[i] for i in self.cut_rows]
        return CutPlan(
            [self._specs[i].temperature for i in self.cut_rows],
            [p.top_k for p in ps],
            [1.0 if i in uncut else p.top_p for i, p in zip(self.cut_rows, ps)],
            [p.min_p for p in ps],
            self._vocab,
            self.device,
        )

    def fused_params(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-row table of `cut_draw.draw` and the key template on the device (uploaded
        with the plan)."""
        return self.draw_params, self.keys_t

    def edit_plan(self, requests: Sequence, vocab: int) -> EditPlan:
        """The device EditPlan of the edited rows (`edit_rows`: its row j is batch row
        edit_rows[j]), built on first use; rebuilt when the EOS ids of min_tokens rows differ
        from those it was built with (EOS is the request's, not its params')."""
        eos = [requests[i].eos_token_id for i in self.min_token_rows]
        if self._edit_plan is None or eos != self._edit_eos:
            sub = [requests[i] for i in self.edit_rows]
            self._edit_plan = EditPlan(sub, vocab, self.device, penalties=self._edit_penalties)
            self._edit_eos = eos
        return self._edit_plan

    def step_keys(self, requests: Sequence) -> np.ndarray:
        """This step's keys: the template with each seeded row's row_key(seed, output index)."""
        if not len(self.seeded_rows):
            return self.keys
        index = np.fromiter(
            (requests[i].num_output_tokens for i in self.seeded_rows.tolist()),
            dtype=np.uint64,
            count=len(self.seeded_rows),
        )
        keys = self.keys.copy()
        keys[self.seeded_rows] = row_keys(self.seeds, index)
        return keys


def _fits_uniform(plan: Optional[BatchPlan], specs: Sequence[RowSpec], device) -> bool:
    """Whether `plan` is uniform, on `device`, with at least len(specs) rows, all of which ask
    what these specs ask (so its first rows are their plan)."""
    if plan is None or plan.uniform_key is None or plan.device != device:
        return False
    key = plan.uniform_key
    return 0 < len(specs) <= plan.num_rows and all(s.key == key for s in specs)


class Sampler:
    """Samples one token per row. `vocab_size` is the model's; logits may carry padded columns
    beyond it, which are never sampled. State across calls: the generator that keys the
    unseeded rows (`random.Random(seed)`; seed None draws from OS entropy: one 62-bit base per
    call with a random row), and caches that never change results (RowSpecs, the last BatchPlan,
    prompt masks)."""

    def __init__(self, vocab_size: int, device="cpu", seed: Optional[int] = None):
        if vocab_size < 1:
            raise ValueError(f"Sampler.vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.seed = seed
        self.generator = random.Random(seed)
        self._specs: dict[int, list] = {}  # id(params) -> [params, RowSpec, last call]; _row_specs
        self._spec_calls = 0  # _plan calls so far: the RowSpec entries' clock (_sweep_specs)
        self._prompt_masks: dict[int, tuple] = {}  # id(request) -> (request, bool [V] prompt mask)
        self._last_plan: Optional[BatchPlan] = None
        self._counts: Optional[OutputCounts] = None  # device output counts (sample_deferred)

    def _row_specs(self, params: Sequence) -> list[RowSpec]:
        """Each row's RowSpec, computed once per params object while its request keeps being
        sampled (params are frozen; the entry keeps the object alive so its id cannot be reused
        by another), stamped with the sampler call that last used it (_sweep_specs)."""
        now, cache, out = self._spec_calls, self._specs, []
        for p in params:
            hit = cache.get(id(p))
            if hit is None or hit[0] is not p:
                hit = cache[id(p)] = [p, RowSpec.of(p, self.vocab_size), now]
            hit[2] = now
            out.append(hit[1])
        return out

    def _sweep_specs(self, live: Sequence) -> None:
        """Let go of the RowSpecs no call of the last SPEC_CACHE_CALLS used, `live` (the current
        plan's params, reused without a _row_specs call) kept: a long-running engine holds no
        params (nor the client payload in them: allowed_token_ids, logit_bias) of requests long
        gone, while a step that samples its rows in several calls (speculation's drafted and
        undrafted rows, greedy and random) finds every row's entry from its previous steps."""
        now = self._spec_calls
        for p in live:
            hit = self._specs.get(id(p))
            if hit is not None and hit[0] is p:
                hit[2] = now
        self._specs = {k: v for k, v in self._specs.items() if now - v[2] < SPEC_CACHE_CALLS}

    def _plan(self, requests: Sequence, device: torch.device) -> BatchPlan:
        """The last plan when the rows' params are the same objects (or equal) in the same order
        and on the same device, else a new one. An equal list is adopted as the plan's own, so
        the next call compares by identity (a list of equal but distinct params objects would
        otherwise be compared field by field on every step: ~0.2 ms at 256 rows)."""
        params = [r.params for r in requests]
        plan = self._last_plan
        self._spec_calls += 1
        if plan is None or plan.device != device or plan.params != params:
            specs = self._row_specs(params)
            if _fits_uniform(plan, specs, device):
                plan = plan.first(params, specs)
            else:
                plan = BatchPlan(params, specs, self.vocab_size, device)
            self._last_plan = plan
        plan.params = params
        if self._spec_calls % SPEC_CACHE_CALLS == 0:
            self._sweep_specs(params)
        return plan

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

    def _check(self, logits: torch.Tensor, requests: Sequence) -> None:
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(
                f"Sampler: logits must be [len(requests)={len(requests)}, V], got {tuple(logits.shape)}"
            )
        if logits.shape[1] < self.vocab_size:
            raise ValueError(
                f"Sampler: logits have {logits.shape[1]} columns, fewer than vocab_size {self.vocab_size}"
            )

    def sample_deferred(
        self, logits: torch.Tensor, requests: Sequence, resolved: bool = False
    ) -> Optional[DeviceSample]:
        """Every setting on the device, for async scheduling: the tokens __call__ would draw
        (seeded rows exactly; unseeded rows from the same generator advance) and the requested
        logprobs, left on the device with no host sync (`sample_deferred.pack` makes the one
        buffer to copy). None for an empty batch; for a batch with a row of bad words of
        several tokens unless `resolved` (they ban by the newest output tokens: the caller says
        with resolved=True that the requests' tokens are all real, no placeholder of a step
        still in flight; their bans are then one small upload; one-token words ban whatever
        came before, so they need no resolve): the caller samples such a step serially
        (__call__), after the previous step's tokens are in. Rows of structured outputs come
        masked (the engine resolves the previous step first, so each grammar has accepted its
        real tokens, then masks the logits): they draw here like any other, min_tokens
        yielding to a complete grammar as on the host (EditPlan.min_guard). Edits use the
        batch's EditPlan (indices
        uploaded once) and the device-side output counts (`OutputCounts`, which this call
        updates with the drawn ids: the caller must append them, placeholder or real);
        top-p rows without a top-k settle their threshold on the device (`exact_thresholds`).
        Each request appears at most once per call (the engine's case)."""
        self._check(logits, requests)
        if not requests:
            return None
        raw = logits[:, : self.vocab_size]
        plan = self._plan(requests, raw.device)
        if plan.history_bans and not resolved:
            return None
        # the fused draw reads bf16/fp16 logits as they are (no conversion pass) unless rows
        # are edited (edits work in float32, and both row sources must share a dtype)
        keep_dtype = self._fused(raw) and not plan.any_edits and raw.dtype in cut_draw.FLOAT_TYPES
        x, edited, slots = (raw if keep_dtype else raw.float()), None, None
        if plan.any_edits:  # only the edited rows are copied (raw is never modified)
            edited, slots = plan.edit_plan(requests, self.vocab_size).edited_copy(
                x, plan.edit_index, [requests[i] for i in plan.edit_rows], self._output_counts(raw.device)
            )
        fused = self._fused(x) and (plan.any_noisy or edited is not None)
        if edited is not None and not fused:
            x = x.index_copy(0, plan.edit_index, edited)
        keys, base = plan.keys, (0, 0)
        if plan.any_noisy:
            keys = plan.step_keys(requests)
            bits = self.generator.getrandbits(62)
            base = (bits & 0x7FFFFFFF, bits >> 31)
        if fused:
            tokens = self._fused_draw(x, plan, keys, base, edited)
        elif plan.any_noisy:
            thr = self._exact_thresholds(x, plan, plan.draw_cut_plan) if plan.any_cut else None
            tokens = self._refine_loose(x, self._draw(x, thr, plan, keys, base), plan, keys, base)
        else:
            tokens = greedy_tokens(x)
        if slots is not None:
            cols = plan.penalties
            self._counts.add([requests[i] for i in cols.rows], slots, tokens.index_select(0, cols.index))
        logprobs = None
        if plan.any_logprobs:
            logprobs = device_logprobs(
                raw, tokens, plan.logprob_rows, plan.logprob_counts, plan.logprob_index
            )
        return DeviceSample(tokens, logprobs)

    def _output_counts(self, device) -> OutputCounts:
        if self._counts is None or self._counts.device != torch.device(device):
            self._counts = OutputCounts(self.vocab_size, device)
        return self._counts

    @staticmethod
    def _fused(x: torch.Tensor) -> bool:
        """Whether the draw runs as `cut_draw` (Triton: cuts found inside the draw)."""
        return cut_draw.available(x.device) and x.stride(1) == 1

    def _fused_draw(
        self, x: torch.Tensor, plan: BatchPlan, keys: np.ndarray, base, edited: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Every row's cut and draw in two launches (`cut_draw.draw`); exact cuts, no host sync.
        edited: the plan's edited rows (`BatchPlan.edit_rows`), read in place of x's."""
        prm, keys_t = plan.fused_params()
        if keys is not plan.keys:
            keys_t = upload(torch.from_numpy(keys), x.device)
        edit_map = None if edited is None else plan.edit_map
        tokens = cut_draw.draw(
            x,
            prm,
            keys_t,
            base,
            chunk=sampling_draw.CHUNK,
            edited=edited,
            edit_map=edit_map,
            spread=plan.spread,
        )
        if not plan.reject_rows:
            return tokens
        return reject_top_p.refine(
            x, plan.reject_index, plan.x_scale, plan.reject_p, keys_t, base, tokens,
            chunk=sampling_draw.CHUNK, edited=edited, edit_map=edit_map,
        )  # fmt: skip

    def _exact_thresholds(
        self, x: torch.Tensor, plan: BatchPlan, cut_plan: Optional[CutPlan] = None
    ) -> torch.Tensor:
        """[S] raw-space cuts (-inf where none) with every top-p row settled on the device;
        cut_plan: plan.cut_plan (the exact cuts) unless given (plan.draw_cut_plan for a draw)."""
        every = len(plan.cut_rows) == x.shape[0]
        sub = x if every else x.index_select(0, plan.cut_index)
        cut_thr = exact_thresholds(sub, cut_plan or plan.cut_plan)
        return cut_thr if every else plan.no_cut.index_copy(0, plan.cut_index, cut_thr)

    def _edited(self, raw: torch.Tensor, requests: Sequence, plan: "BatchPlan") -> torch.Tensor:
        """raw with the plan's edits (allowed ids, min_tokens, bias, penalties) applied, or raw
        itself when no row asks for one."""
        if not plan.any_edits:
            return raw
        return edit_logits(raw, requests, self._cached_prompt_seen, plan.edit_kinds, columns=plan.penalties)

    def __call__(self, logits: torch.Tensor, requests: Sequence) -> SamplerOutput:
        self._check(logits, requests)
        if not requests:
            return SamplerOutput([], [])
        raw = logits[:, : self.vocab_size]
        plan = self._plan(requests, raw.device)
        x = self._edited(raw, requests, plan)
        if plan.any_noisy:
            fused_dtype = self._fused(x) and x.dtype in cut_draw.FLOAT_TYPES  # read as it is
            tokens, token_ids = self._sample(x if fused_dtype else x.float(), requests, plan)
        else:
            tokens = greedy_tokens(x)
            token_ids = tokens.tolist()
        if not plan.any_logprobs:
            return SamplerOutput(token_ids, [None] * len(token_ids))
        return SamplerOutput(token_ids, self._logprobs(raw, tokens, token_ids, plan))

    def probs(self, logits: torch.Tensor, requests: Sequence) -> torch.Tensor:
        """The distribution __call__ draws each row from, float32 [S, vocab_size]: the same
        edits, then softmax(x / T) over the tokens at or above the row's min-p/top-k/top-p
        threshold (exact: unsure top-p rows are recomputed by the full sort, as in _sample);
        a greedy row is one-hot on its argmax. Speculative decoding's rejection sampling
        (engine/spec_decode/verify.py) reads it, so the target distribution is the sampler's
        own. Draws nothing: the generator is untouched."""
        self._check(logits, requests)
        raw = logits[:, : self.vocab_size]
        plan = self._plan(requests, raw.device)
        x = self._edited(raw, requests, plan).float()
        out = torch.zeros_like(x)
        out.scatter_(1, x.argmax(dim=1, keepdim=True), 1.0)
        if not plan.any_noisy:
            return out
        if plan.any_cut:
            thr, unsure = self._thresholds(x, plan, plan.cut_plan)
            if unsure is not None and bool(unsure.any()):
                redo = unsure.nonzero().flatten().tolist()  # indices among the cut rows
                sub = full_sort_thresholds(
                    x.index_select(0, plan.cut_index),
                    thr.index_select(0, plan.cut_index),
                    plan.cut_plan,
                    redo,
                )
                thr = thr.index_copy(0, plan.cut_index, sub)
            x = x.masked_fill(x < thr.view(-1, 1), float("-inf"))
        scale = plan.x_scale.view(-1, 1) / LOG2E  # 1 / T on random rows
        soft = torch.softmax(x * scale, dim=1)
        noisy = torch.tensor(plan.noisy, dtype=torch.bool, device=x.device).view(-1, 1)
        return torch.where(noisy, soft, out)

    def _sample(self, x: torch.Tensor, requests: Sequence, plan: BatchPlan) -> tuple[torch.Tensor, list[int]]:
        """(tokens, their ids as a list). One 62-bit base from the generator per call keys the
        unseeded rows (`sampling_rng.derived_key`). When a top-p threshold came from candidates
        that may not hold the nucleus, the check is read with the ids (one host copy) and, in
        the rare case it failed, those rows' thresholds are recomputed by a full sort and the
        batch is drawn again with the same keys."""
        keys = plan.step_keys(requests)
        bits = self.generator.getrandbits(62)
        base = (bits & 0x7FFFFFFF, bits >> 31)
        if self._fused(x):
            tokens = self._fused_draw(x, plan, keys, base)
            return tokens, tokens.tolist()
        cut_plan = plan.draw_cut_plan if plan.any_cut else None
        thr, unsure = self._thresholds(x, plan, cut_plan) if plan.any_cut else (None, None)
        tokens = self._refine_loose(x, self._draw(x, thr, plan, keys, base), plan, keys, base)
        if unsure is None:
            return tokens, tokens.tolist()
        both = torch.cat([tokens, unsure.long()]).tolist()
        n = len(requests)
        redo = [plan.cut_rows[j] for j, bad in enumerate(both[n:]) if bad]
        if not redo:
            return tokens, both[:n]
        local = [plan.cut_rows.index(i) for i in redo]
        thr = thr.index_copy(
            0,
            plan.cut_index,
            full_sort_thresholds(
                x.index_select(0, plan.cut_index), thr.index_select(0, plan.cut_index), cut_plan, local
            ),
        )
        tokens = self._refine_loose(x, self._draw(x, thr, plan, keys, base), plan, keys, base)
        return tokens, tokens.tolist()

    @staticmethod
    def _refine_loose(x: torch.Tensor, tokens: torch.Tensor, plan: BatchPlan, keys, base) -> torch.Tensor:
        """tokens with the loose rows' round-0 draws refined by rejection (sample/reject.py, in
        torch: the paths without the fused draw)."""
        if not plan.reject_rows:
            return tokens
        idx, resolved = plan.reject_index, resolve_keys(keys.tolist(), base)
        refined = refine_top_p(
            x.index_select(0, idx).float(),
            plan.x_scale.index_select(0, idx),
            plan.reject_p,
            [resolved[i] for i in plan.reject_rows],
            tokens.index_select(0, idx),
            chunk=sampling_draw.CHUNK,
        )
        return tokens.index_copy(0, idx, refined)

    def _draw(
        self,
        x: torch.Tensor,
        thr: Optional[torch.Tensor],
        plan: BatchPlan,
        keys: np.ndarray,
        base: tuple[int, int],
    ) -> torch.Tensor:
        """Every row in one draw (`sampling_draw`): greedy rows take their argmax, random rows
        an exact sample of their cut softmax (thr None: no row is cut)."""
        dev = x.device
        if sampling_triton.available(dev) and x.stride(1) == 1:
            keys_t = plan.keys_t if keys is plan.keys else upload(torch.from_numpy(keys), dev)
            cut = plan.no_cut if thr is None else thr
            return sampling_triton.draw(
                x, plan.x_scale, cut, plan.noise, keys_t, base, chunk=sampling_draw.CHUNK
            )
        return draw_torch(x, plan.x_scale, thr, resolve_keys(keys.tolist(), base), plan.noisy)

    def _thresholds(
        self, x, plan: BatchPlan, cut_plan: CutPlan
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(thr [S], unsure): the raw-space cut per row (-inf for greedy rows and rows without a
        cut) and `cut_thresholds`' check of the open rows (None when there are none)."""
        every = len(plan.cut_rows) == x.shape[0]
        sub = x if every else x.index_select(0, plan.cut_index)
        cut_thr, unsure = cut_thresholds(sub, cut_plan)
        if unsure is not None:  # [S_cut] over all cut rows, False except unsure open rows
            unsure = torch.zeros(len(plan.cut_rows), dtype=torch.bool, device=x.device).index_copy(
                0, cut_plan.open_index, unsure
            )
        return (cut_thr if every else plan.no_cut.index_copy(0, plan.cut_index, cut_thr)), unsure

    def _logprobs(self, raw, tokens, token_ids, plan: "BatchPlan") -> list:
        """Per row: None, or [(sampled id, logprob)] + the top params.logprobs (id, logprob)."""
        out: list = [None] * len(token_ids)
        rows, index, counts = plan.logprob_rows, plan.logprob_index, plan.logprob_counts
        chosen, ids, values = top_logprobs(
            raw.index_select(0, index), tokens.index_select(0, index), max(counts)
        )
        for j, (i, n) in enumerate(zip(rows, counts)):
            out[i] = [(token_ids[i], chosen[j])] + list(zip(ids[j][:n], values[j][:n]))
        return out

    def prompt_logprobs(
        self, logits: torch.Tensor, target_ids: Sequence[int], k: int
    ) -> list[dict[int, Logprob]]:
        """See the module-level `prompt_logprobs`."""
        return prompt_logprobs(logits[:, : self.vocab_size], target_ids, k)
