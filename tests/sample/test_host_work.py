"""The device path's host work, counted (not timed): kernel launches, host-to-device copies and
host reads per step of `Sampler.sample_deferred`.

The device path runs here as on CUDA (`available` patched to True, the Triton kernels
interpreted on a tiny vocabulary), with counters around every Triton kernel, every torch op
that would launch a kernel (TorchDispatchMode; views and allocations excluded), every
`upload` (one pinned host-to-device copy each on CUDA) and every read of a tensor by the host
(tolist, item, bool, ...). Each count is a bound the step must keep: a regression that adds a
launch, a copy or a sync to a steady step fails here, without a GPU and without timing.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from enginespec.kernels import reject_top_p
from enginespec.sample import deferred, device_edits, output_counts, penalties
from enginespec.sample import draw as sampling_draw
from enginespec.sample import sampler as sampler_module
from enginespec.sample.deferred import pack
from enginespec.sample.sampler import Sampler
from enginespec.spec import SamplingParams

from .test_sampler import make_request

VOCAB = 300
NUM_ROWS = 8
# ops that launch nothing on CUDA: views, metadata, allocations
NO_LAUNCH = {
    "view", "_unsafe_view", "slice", "select", "t", "transpose", "unsqueeze", "squeeze", "expand",
    "alias", "detach", "as_strided", "unbind", "split", "split_with_sizes", "empty", "empty_strided", "lift_fresh",
    "permute", "_reshape_alias", "reshape", "flatten",
}  # fmt: skip
HOST_READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class Counts:
    """What one step did: aten ops that launch, Triton launches, uploads, host reads."""

    def __init__(self):
        self.ops: list[str] = []
        self.triton: list[str] = []
        self.uploads = 0
        self.reads: list[str] = []
        self.paused = 0


class _OpCounter(TorchDispatchMode):
    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.counts.paused and name not in NO_LAUNCH:
            self.counts.ops.append(name)
        return func(*args, **(kwargs or {}))


class _Kernel:
    """A Triton kernel whose launches are counted (torch work inside the interpreter is not)."""

    def __init__(self, kernel, name: str, counts: Counts):
        self.kernel, self.name, self.counts = kernel, name, counts

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.counts.triton.append(self.name)
            self.counts.paused += 1
            try:
                return launch(*args, **kwargs)
            finally:
                self.counts.paused -= 1

        return run


@pytest.fixture
def fake_cuda(monkeypatch):
    """The CUDA branches of the sampler on the CPU, with counters; yields a function that
    returns the Counts of one call of fn()."""
    from enginespec.kernels import cut_draw, logprobs, reject_top_p, sampling, top_p

    if cut_draw.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    counts = Counts()
    monkeypatch.setattr(sampling_draw, "CHUNK", 64)
    monkeypatch.setattr(logprobs, "CHUNK", 64)
    for module in (cut_draw, logprobs, sampling, top_p, reject_top_p):
        if hasattr(module, "available"):
            monkeypatch.setattr(module, "available", lambda device: True)
        for name in dir(module):
            if name.endswith("_kernel"):
                monkeypatch.setattr(module, name, _Kernel(getattr(module, name), name, counts))
    real_upload = penalties.upload

    def counted_upload(host, device):
        counts.uploads += 1
        return real_upload(host, device)

    for module in (penalties, sampler_module, deferred, output_counts, device_edits):
        if hasattr(module, "upload"):
            monkeypatch.setattr(module, "upload", counted_upload)
    for name in HOST_READS:
        real = getattr(torch.Tensor, name)

        def read(self, *args, _real=real, _name=name, **kwargs):
            if not counts.paused:
                counts.reads.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    def measure(fn) -> Counts:
        counts.__init__()
        with _OpCounter(counts):
            fn()
        return _snapshot(counts)

    return measure


def _snapshot(counts: Counts) -> Counts:
    out = Counts()
    out.ops, out.triton, out.uploads, out.reads = (
        list(counts.ops),
        list(counts.triton),
        counts.uploads,
        list(counts.reads),
    )
    return out


def _requests(impl, params_of) -> list:
    rng = random.Random(0)
    reqs = []
    for i in range(NUM_ROWS):
        req = make_request(impl, params_of(i), [rng.randrange(VOCAB) for _ in range(6)], rid=f"r{i}")
        for _ in range(3):
            req.append(rng.randrange(VOCAB))
        reqs.append(req)
    return reqs


def _mixed(i: int) -> SamplingParams:
    """bench_sampler's mixed case: greedy, temperature, top-k + top-p (half seeded), top-p +
    min-p + penalties + logprobs."""
    return [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=i if i % 8 == 2 else None),
        SamplingParams(
            temperature=0.7, top_p=0.95, min_p=0.05, repetition_penalty=1.1, frequency_penalty=0.2, logprobs=5
        ),
    ][i % 4]


CASES = {
    # case: (params of row i, most aten launches, Triton launches, uploads) of a steady step,
    # and the uploads of the first step (the plan's build; None: not bounded here)
    "greedy": (lambda i: SamplingParams(temperature=0.0), 1, 0, 0, 1),
    "temperature": (lambda i: SamplingParams(temperature=0.6), 0, 2, 0, 1),
    "chat": (lambda i: SamplingParams(temperature=0.7, top_p=0.8, top_k=20), 0, 2, 0, 1),
    "seeded_chat": (lambda i: SamplingParams(temperature=0.7, top_p=0.8, top_k=20, seed=i), 0, 2, 1, 2),
    # mixed: the logprob rows' ranks of their sampled tokens take five aten launches beside the
    # two logprob kernels (logprob_ranks.token_ranks over those rows: two index_selects, gather,
    # ge, sum)
    "mixed": (_mixed, 10, 5, 1, 4),
    # a loose top-p: the uncut draw (scan, pick), then rejection (reject_top_p: two launches per
    # grid round and the finish); with SPREAD_CUT (and REJECT_TOP_P off) the spread cut (cut,
    # NUM_ROUNDS rounds, finish, pick after the scan)
    "top_p": (
        lambda i: SamplingParams(temperature=1.0, top_p=0.95),
        0,
        3 + 2 * reject_top_p.GRID_ROUNDS,
        0,
        1,
    ),
    "top_p_spread": (lambda i: SamplingParams(temperature=1.0, top_p=0.95), 0, 12, 0, 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_steady_step_launches_copies_and_syncs(impl, fake_cuda, monkeypatch, case):
    """A steady step (same requests, same params) of the device path: at most the case's
    launches and uploads, and no host read at all (the caller's one copy of `pack` is the
    step's only device-to-host transfer); a step that builds the plan uploads it in one copy
    (plus the step's keys when rows are seeded)."""
    monkeypatch.setattr(sampler_module, "SPREAD_CUT", case.endswith("_spread"))
    monkeypatch.setattr(sampler_module, "REJECT_TOP_P", not case.endswith("_spread"))
    params_of, max_ops, num_triton, max_uploads, first_uploads = CASES[case]
    reqs, sampler = _requests(impl, params_of), Sampler(VOCAB, seed=0)
    gen = torch.Generator().manual_seed(0)

    def step():
        logits = torch.randn(NUM_ROWS, VOCAB, generator=gen) * 3
        return fake_cuda(lambda: pack(sampler.sample_deferred(logits, reqs)))

    first = step()
    for r in reqs:
        r.append(1)
    steady = step()
    print(
        case,
        "first",
        first.ops,
        first.triton,
        first.uploads,
        "steady",
        steady.ops,
        steady.triton,
        steady.uploads,
    )
    assert steady.reads == [] and first.reads == []
    assert len(steady.ops) <= max_ops, steady.ops
    assert len(steady.triton) == num_triton, steady.triton
    assert steady.uploads <= max_uploads
    assert first_uploads is None or first.uploads <= first_uploads


def test_plan_adopts_equal_params_for_identity_checks(impl):
    """A batch whose params equal the last plan's but are other objects (a request replaced by
    one with the same settings) reuses the plan and adopts the new list, so the next step
    compares by identity, not field by field (~0.2 ms a step at 256 rows)."""
    sampler = Sampler(VOCAB, seed=0)
    first = _requests(impl, lambda i: SamplingParams(temperature=0.7, top_p=0.8, top_k=20))
    again = _requests(impl, lambda i: SamplingParams(temperature=0.7, top_p=0.8, top_k=20))
    plan = sampler._plan(first, torch.device("cpu"))
    assert sampler._plan(again, torch.device("cpu")) is plan
    assert all(p is r.params for p, r in zip(plan.params, again))


# ------------------------------------------------ a uniform batch that shrinks (requests finish)

UNIFORM = {
    # one setting for every row, each request with its own params object (its own max_tokens)
    "greedy": lambda i: SamplingParams(temperature=0.0, max_tokens=10 + i),
    "temperature": lambda i: SamplingParams(temperature=0.6, max_tokens=10 + i),
    "chat": lambda i: SamplingParams(temperature=0.7, top_p=0.8, top_k=20, max_tokens=10 + i),
    "top_p_min_p": lambda i: SamplingParams(temperature=1.0, top_p=0.95, min_p=0.05, max_tokens=10 + i),
}
NOT_UNIFORM = {
    "seeded": lambda i: SamplingParams(temperature=0.7, seed=i),
    "logprobs": lambda i: SamplingParams(temperature=0.7, logprobs=2),
    "penalty": lambda i: SamplingParams(temperature=0.7, presence_penalty=0.5),
    "two_temperatures": lambda i: SamplingParams(temperature=0.6 if i < 4 else 0.7),
}
KEPT = [0, 2, 3, 6]  # the rows left after four requests finished


def _plan_fields(plan) -> dict:
    """Everything a BatchPlan holds for the draws, host values as lists and device columns as
    host tensors (the lazily built CutPlan included)."""
    out = {}
    for name, value in vars(plan).items():
        if name in ("params", "_specs", "_cut_plan", "_draw_cut_plan", "_edit_plan"):
            continue
        if isinstance(value, torch.Tensor):
            out[name] = value.cpu()
        elif hasattr(value, "tolist"):
            out[name] = value.tolist()
        else:
            out[name] = value
    if plan.any_cut:
        cuts = plan.cut_plan
        out["cut_plan"] = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in vars(cuts).items()}
    return out


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        elif isinstance(a[k], dict):
            _same(a[k], b[k])
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("case", sorted(UNIFORM))
def test_a_uniform_batch_that_shrinks_slices_its_plan(impl, case, monkeypatch):
    """When requests finish from a batch whose rows all ask the same, the smaller batch's plan
    is the first rows of the last one (no rebuild, no upload), and it holds exactly what a plan
    built afresh for those requests holds; the draws from it are the fresh plan's, bit for bit."""
    reqs = _requests(impl, UNIFORM[case])
    sliced, fresh = Sampler(VOCAB, seed=1), Sampler(VOCAB, seed=1)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(NUM_ROWS, VOCAB, generator=gen) * 3
    full = sliced._plan(reqs, torch.device("cpu"))
    assert full.uniform_key is not None
    assert sliced(logits, reqs).token_ids == fresh(logits, reqs).token_ids
    left = [reqs[i] for i in KEPT]
    built = []
    real_plan = sampler_module.BatchPlan

    class Recording(real_plan):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(sampler_module, "BatchPlan", Recording)
    plan = sliced._plan(left, torch.device("cpu"))
    monkeypatch.setattr(sampler_module, "BatchPlan", real_plan)
    assert built == [] and plan is not full and plan.num_rows == len(KEPT)
    fresh._last_plan = None  # the fresh sampler builds its plan for the smaller batch
    _same(_plan_fields(plan), _plan_fields(fresh._plan(left, torch.device("cpu"))))
    small = logits[KEPT]
    assert sliced(small, left).token_ids == fresh(small, left).token_ids


@pytest.mark.parametrize("case", sorted(NOT_UNIFORM))
def test_a_batch_whose_rows_differ_rebuilds_its_plan(impl, case):
    """Seeds, logprobs, edits or two settings in one batch: no slicing, a plan built afresh."""
    reqs = _requests(impl, NOT_UNIFORM[case])
    sampler = Sampler(VOCAB, seed=1)
    full = sampler._plan(reqs, torch.device("cpu"))
    assert full.uniform_key is None
    plan = sampler._plan([reqs[i] for i in KEPT], torch.device("cpu"))
    assert plan is not full and plan.num_rows == len(KEPT) and plan.uniform_key is None


def test_a_uniform_batch_that_grows_or_changes_setting_rebuilds(impl):
    """A plan is sliced only to fewer rows of the same setting."""
    reqs = _requests(impl, UNIFORM["temperature"])
    sampler = Sampler(VOCAB, seed=1)
    small = sampler._plan(reqs[:3], torch.device("cpu"))
    grown = sampler._plan(reqs, torch.device("cpu"))
    assert grown.num_rows == NUM_ROWS and grown.x_scale.shape[0] == NUM_ROWS and small.num_rows == 3
    other = _requests(impl, UNIFORM["chat"])[:3]
    changed = sampler._plan(other, torch.device("cpu"))
    assert changed.any_cut and changed.uniform_key != grown.uniform_key
