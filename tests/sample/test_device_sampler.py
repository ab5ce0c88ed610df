"""The device path (Sampler.sample_deferred, async scheduling's sampler) against the serial one.

Every setting draws on the device: seeded rows must give the serial sampler's tokens and
logprobs over several steps, with the newest token a placeholder (the id vocab_size) while the
draw happens, as under async scheduling; distributions per setting by chi-square (the helpers
of test_sampler); the Triton kernels (interpreted on CPU) against the torch path; the device
output counts against the host lists.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from enginespec.kernels import cut_draw
from enginespec.sample import draw as sampling_draw
from enginespec.sample import sampler as sampler_module
from enginespec.sample.deferred import pack
from enginespec.sample.output_counts import OutputCounts
from enginespec.sample.rng import row_key
from enginespec.sample.sampler import Sampler
from enginespec.sample.truncation import (
    NUM_CANDIDATES,
    CutPlan,
    cut_thresholds,
    exact_thresholds,
    full_sort_thresholds,
)
from enginespec.spec import SamplingParams

from .test_sampler import LOGITS6, MODES, N_DRAWS, assert_matches, make_request, reference_probs

SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=0.7, top_p=0.8, top_k=20),
    dict(top_p=0.9),
    dict(min_p=0.1, temperature=1.3, logprobs=2),
    dict(top_k=600, top_p=0.8),
    dict(top_p=0.95, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2, logprobs=3),
    dict(logit_bias={3: 5.0, 7: -2.0}, top_k=5),
    dict(allowed_token_ids=(1, 2, 3, 50), temperature=0.0, repetition_penalty=2.0),
    dict(min_tokens=3, stop_token_ids=(4,), logprobs=0, presence_penalty=1.5),
    # one-token bad words read no output, so they take the device path over a placeholder too
    dict(bad_words_token_ids=((7,), (50,)), temperature=0.9, repetition_penalty=1.2, logprobs=1),
]


def _requests(impl, vocab: int, count: int, seeded: bool = True, settings=SETTINGS):
    rng = random.Random(0)
    reqs = []
    for i in range(count):
        params = SamplingParams(seed=i if seeded else None, **settings[i % len(settings)])
        reqs.append(make_request(impl, params, [rng.randrange(vocab) for _ in range(5)], rid=f"r{i}"))
        for _ in range(rng.randrange(4)):
            reqs[-1].append(rng.randrange(vocab))
    return reqs


def _run_steps(
    impl, vocab: int, num_steps: int, draw, seeded: bool = True, device: str = "cpu", settings=SETTINGS
) -> list:
    """Tokens and logprobs of num_steps steps over the same requests; draw(sampler, logits,
    reqs) -> (ids, logprobs, placeholder): with placeholder True the ids are appended as the
    placeholder first and made real after the next draw, as async scheduling does."""
    reqs, sampler = _requests(impl, vocab, 20, seeded, settings), Sampler(vocab, device=device, seed=7)
    gen, steps, pending = torch.Generator().manual_seed(3), [], None
    for _ in range(num_steps):
        logits = (torch.randn(len(reqs), vocab, generator=gen) * 3).to(device)
        ids, logprobs, placeholder = draw(sampler, logits, reqs)
        if pending is not None:
            for r, t in zip(reqs, pending):
                r.replace_last_token(t)
        for r, t in zip(reqs, ids):
            r.append(vocab if placeholder else t)
        pending = ids if placeholder else None
        steps.append((ids, logprobs))
    return steps


def _serial(sampler, logits, reqs):
    out = sampler(logits, reqs)
    return out.token_ids, out.logprobs, False


def _deferred(sampler, logits, reqs):
    sample = sampler.sample_deferred(logits, reqs)
    flat = pack(sample).tolist()
    ids = [int(t) for t in flat[: len(reqs)]]
    return ids, sample.logprobs.unpack(flat[len(reqs) :], ids), True


@pytest.mark.parametrize("seeded", [True, False])
def test_device_path_equals_serial_over_steps_with_placeholders(impl, seeded):
    """Every setting; unseeded rows too (one generator draw per call in both paths)."""
    assert _run_steps(impl, 700, 5, _deferred, seeded) == _run_steps(impl, 700, 5, _serial, seeded)


def _ranked(steps: list) -> list:
    """Steps with each logprob value's rank beside it (a Logprob compares as its float)."""
    return [
        (ids, [None if e is None else [(t, float(v), v.rank) for t, v in e] for e in lps])
        for ids, lps in steps
    ]


def test_device_path_ranks_equal_serial(impl):
    """The device path's Logprobs carry the serial sampler's ranks (the sampled token's, 1..k
    for the top k) over steps with placeholders."""
    assert _ranked(_run_steps(impl, 700, 5, _deferred)) == _ranked(_run_steps(impl, 700, 5, _serial))


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "triton"])
def test_device_logprob_ranks_count_the_larger_entries(monkeypatch, kernel):
    """device_logprobs and device_prompt_logprobs, in torch and beside the Triton logprob
    kernels (interpreted on the CPU): the chosen token's rank is the number of entries at or
    above it (itself and a tie included, vLLM V1's count), the top k's are 1..k; the prompt
    entries equal the serial prompt_logprobs' with their ranks."""
    from enginespec.kernels import logprobs as logprob_kernels
    from enginespec.sample.deferred import device_logprobs, device_prompt_logprobs
    from enginespec.sample.sampler import prompt_logprobs

    if kernel and logprob_kernels.triton is None:
        pytest.skip("needs triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setattr(logprob_kernels, "CHUNK", 64)
    monkeypatch.setattr(logprob_kernels, "SUB", 16)
    monkeypatch.setattr(logprob_kernels, "available", lambda device: kernel)
    raw = torch.randn(4, 300, generator=torch.Generator().manual_seed(5)) * 3
    raw[1] = 0.0
    raw[1, [7, 8, 9]] = torch.tensor([4.0, 3.5, 3.0])  # above token 5, with no tie (topk's order)
    raw[1, [5, 6]] = 2.0  # token 5: three above, one tie (counted): rank 5
    chosen = [int(raw[0].argmin()), 5, 0, int(raw[3].argmax())]
    want = [int((raw[i] >= raw[i, t]).sum()) for i, t in enumerate(chosen)]
    assert want[:2] == [300, 5] and want[3] == 1
    raw, rows, counts = raw.to(device), [0, 1, 3], [2, 2, 0]
    lps = device_logprobs(
        raw, torch.tensor(chosen, device=device), rows, counts, torch.tensor(rows, device=device)
    )
    got = lps.unpack(torch.cat([lps.packed.flatten(), lps.ranks]).tolist(), chosen)
    assert got[2] is None
    assert [(got[i][0][0], got[i][0][1].rank) for i in rows] == [(chosen[i], want[i]) for i in rows]
    assert [[v.rank for _, v in got[i][1:]] for i in rows] == [[1, 2], [1, 2], []]
    prompt = device_prompt_logprobs({"a": ([3, 4, 5, 6], raw, chosen)}, {"a": 2}, 300)
    positions, entries = prompt.unpack(prompt.packed.tolist())["a"]
    serial = prompt_logprobs(raw.cpu(), chosen, 2)
    assert positions == [3, 4, 5, 6] and [entry[t].rank for entry, t in zip(entries, chosen)] == want
    assert [[(t, v.rank) for t, v in e.items()] for e in entries] == [
        [(t, v.rank) for t, v in e.items()] for e in serial
    ]


@pytest.mark.parametrize("chunk", [64, 8192])
def test_device_path_triton_equals_torch(impl, monkeypatch, chunk):
    """The device path with the Triton kernels (the fused cut and draw, penalties;
    interpreted on CPU) against the same path in torch, seeded rows over steps. Chunks of 64
    tokens put most cuts on cut_draw's candidate path; one chunk of 8192 over 600 tokens
    overflows the candidate slots, so every cut row takes its wide (bisection) path."""
    from enginespec.kernels import sampling as sampling_triton

    if sampling_triton.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    monkeypatch.setattr(sampling_draw, "CHUNK", chunk)
    want = _run_steps(impl, 600, 2, _deferred)
    monkeypatch.setattr(sampling_triton, "available", lambda device: True)
    monkeypatch.setattr(cut_draw, "available", lambda device: True)
    assert _run_steps(impl, 600, 2, _deferred) == want


PENALTIES_ONLY = [
    dict(repetition_penalty=1.3),
    dict(temperature=0.8),
    dict(frequency_penalty=0.5, presence_penalty=0.3, top_k=20, top_p=0.9, logprobs=2),
    dict(temperature=0.0, repetition_penalty=2.0),
]


def test_penalty_only_batch_copies_and_edits_rows_in_one_pass(impl, monkeypatch):
    """A batch whose only edits are penalties: its edited rows are written by the penalty pass
    from the raw rows (`EditPlan.edited_copy`; EditPlan.apply, the copy-then-edit path, is not
    called), and the tokens and logprobs over steps are the serial sampler's, on the torch
    path and with the Triton kernels (interpreted: penalties, fused draw)."""
    from enginespec.kernels import sampling as sampling_triton
    from enginespec.sample.device_edits import EditPlan

    monkeypatch.setattr(sampling_draw, "CHUNK", 64)  # the draw's chunks (several over 600 tokens)
    want = _run_steps(impl, 600, 3, _serial, settings=PENALTIES_ONLY)

    def copy_then_edit(*args, **kwargs):
        raise AssertionError("a penalty-only batch took the copy-then-edit path")

    monkeypatch.setattr(EditPlan, "apply", copy_then_edit)
    assert _run_steps(impl, 600, 3, _deferred, settings=PENALTIES_ONLY) == want
    if sampling_triton.triton is None or torch.cuda.is_available():
        return
    monkeypatch.setattr(sampling_triton, "available", lambda device: True)
    monkeypatch.setattr(cut_draw, "available", lambda device: True)
    assert _run_steps(impl, 600, 3, _deferred, settings=PENALTIES_ONLY) == want


@pytest.mark.parametrize("mode", sorted(MODES))
def test_device_distribution_matches_exact(impl, mode, monkeypatch):
    """Chunks of 4 tokens (the draw's CHUNK is read per call): a two-chunk draw over the tiny
    vocabulary, and no padding of every row to 8192 columns, which would cost seconds."""
    monkeypatch.setattr(sampling_draw, "CHUNK", 4)
    req = make_request(impl, MODES[mode], prompt=(0, 2), outputs=(1, 1, 4))
    logits = LOGITS6.expand(N_DRAWS, -1).contiguous()
    ids = Sampler(6, seed=99).sample_deferred(logits, [req] * N_DRAWS).token_ids
    assert_matches(torch.bincount(ids, minlength=6), reference_probs(LOGITS6, req))


def test_top_p_bisection_kernel_matches_full_sort(monkeypatch):
    """kernels.top_p (interpreted) gives the sorted definition's cut on flat rows, with min-p,
    -inf columns and temperatures; rows that were not unsure keep their candidate cut."""
    from enginespec.kernels import top_p as top_p_kernel

    if top_p_kernel.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    vocab = 3000
    scales = torch.tensor([0.05, 0.5, 2.0, 0.05, 0.3, 0.01]).view(-1, 1)
    x = torch.randn(6, vocab, generator=torch.Generator().manual_seed(0)) * scales
    x[1, 5:40] = float("-inf")
    plan = CutPlan(
        [1.0, 0.7, 1.0, 1.3, 1.0, 1.0],
        [0] * 6,
        [0.9, 0.95, 0.5, 0.99, 0.3, 0.7],
        [0, 0.01, 0, 0, 0.2, 0],
        vocab,
        "cpu",
    )
    thr, unsure = cut_thresholds(x, plan)
    assert 0 < int(unsure.sum()) < 6, "the case needs unsure and settled rows"
    redo = [plan.open_rows[j] for j, u in enumerate(unsure.tolist()) if u]
    want = full_sort_thresholds(x, thr, plan, redo)
    assert torch.equal(exact_thresholds(x, plan), want)
    calls = []
    bisect = top_p_kernel.top_p_bisect
    monkeypatch.setattr(top_p_kernel, "available", lambda device: True)
    monkeypatch.setattr(top_p_kernel, "top_p_bisect", lambda *a: calls.append(1) or bisect(*a))
    assert torch.equal(exact_thresholds(x, plan), want)
    assert calls == [1], "a contiguous row must take the kernel where it is available, not the sort"


def _sorted_definition_threshold(row: torch.Tensor, temperature, top_k, top_p, min_p) -> float:
    """sample/truncation.py's docstring cut in float64 by sorting the whole row: min-p, then
    top-k, then the shortest prefix of the survivors whose mass reaches top_p; ties with the
    threshold stay. An oracle outside the module: the kernels are checked against
    exact_thresholds, so a wrong cut there would be the kernels' reference too."""
    x = row.double()
    thr = float("-inf")
    if min_p > 0:
        thr = x.max().item() + temperature * math.log(min_p)
    ranked = torch.sort(x, descending=True).values
    if 0 < top_k < x.numel():
        thr = max(thr, ranked[top_k - 1].item())
    if top_p < 1.0:
        s = ranked[ranked >= thr]
        w = torch.exp((s - s[0]) / temperature)
        before = torch.cumsum(w, 0) - w
        thr = max(thr, s[max(1, int((before < top_p * w.sum()).sum())) - 1].item())
    return thr


def test_open_rows_cut_where_the_sorted_definition_does():
    """Top-p rows without a top-k over a vocabulary wider than the candidates ("open" rows):
    one whose min-p survivors all fit among the candidates (their own mass is the total), two
    whose nucleus lies beyond them (unsure: settled by the sort, with min-p and a temperature),
    one settled by its candidates, and a row without any cut beside them. Both ways of settling
    the unsure rows keep the tokens the sorted definition keeps (within one token: float32
    sums in another order may move the boundary token)."""
    vocab = 2048
    ramp = torch.linspace(0.0, 1.0, vocab)
    peaky = torch.full((vocab,), -30.0)
    peaky[7] = 0.0
    rows = [  # (logits, temperature, top_k, top_p, min_p)
        (ramp * 12, 1.0, 0, 0.9, 0.1),  # min-p leaves ~390 tokens, fewer than the candidates
        (ramp, 1.0, 0, 0.9, 0.5),  # min-p leaves ~1420 tokens, the nucleus ~1290
        (ramp * 4, 0.7, 0, 0.97, 0.05),
        (peaky, 1.0, 0, 1.0, 0.0),
        (ramp * 12, 1.0, 0, 0.7, 0.0),
    ]
    x = torch.stack([r[0] for r in rows])
    plan = CutPlan(*([r[i] for r in rows] for i in range(1, 5)), vocab, "cpu")
    assert vocab > NUM_CANDIDATES and plan.open_rows == [0, 1, 2, 4]
    thr, unsure = cut_thresholds(x, plan)
    assert unsure.tolist() == [False, True, True, False], "the case needs both kinds of open rows"
    redo = [plan.open_rows[j] for j, u in enumerate(unsure.tolist()) if u]
    for got in (exact_thresholds(x, plan), full_sort_thresholds(x, thr, plan, redo)):
        for i, (row, *params) in enumerate(rows):
            want = int((row >= _sorted_definition_threshold(row, *params)).sum())
            assert abs(int((row >= got[i]).sum()) - want) <= 1, (i, int((row >= got[i]).sum()), want)
        assert got[3] == float("-inf")


def test_ties_with_the_kth_logit_stay_under_top_p():
    """top_k 2 over [5, 2, 2, 0, ...] keeps both 2s (ties stay), and a loose top-p keeps them
    and nothing below: the row is settled by its candidates, never by the sort, which knows no
    top-k (a row with a top-k is never open)."""
    x = torch.tensor([[5.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    plan = CutPlan([1.0], [2], [0.999], [0.0], 8, "cpu")
    assert plan.open_rows == [] and exact_thresholds(x, plan).tolist() == [2.0]


def test_ties_with_the_min_p_threshold_count_in_the_top_p_mass():
    """min-p 0.5 over a max of ln 2 puts the threshold exactly on 1,000 tokens at 0: they stay,
    and their mass is part of the total top-p takes 0.9 of (so every one of them stays too)."""
    vocab = 2048
    x = torch.full((1, vocab), -5.0)
    x[0, :1000] = 0.0
    x[0, 1000] = math.log(2.0)
    plan = CutPlan([1.0], [0], [0.9], [0.5], vocab, "cpu")
    assert (x.amax() + torch.log(torch.tensor(0.5))).item() == 0.0, "the min-p cut must tie the 0s"
    assert exact_thresholds(x, plan).tolist() == [0.0]


def test_output_counts_rebuild_and_release(impl):
    """Counts follow the host lists: incremental adds, a rebuild after tokens appended
    elsewhere, a repeated request marked stale, finished requests' slots released."""
    vocab = 10
    counts = OutputCounts(vocab, "cpu")
    a = make_request(impl, SamplingParams(), outputs=(1, 1, 2), rid="a")
    b = make_request(impl, SamplingParams(), rid="b")
    slots = counts.slots([a, b])
    counts.add([a, b], slots, torch.tensor([3, 3]))
    a.append(3)
    b.append(3)
    assert counts.gather(slots).tolist() == [[0, 2, 1, 1, 0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]]
    b.append(9)  # appended outside the device path: rebuilt from the host list
    assert counts.gather(counts.slots([b]))[0].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 1]
    counts.add([a, a], counts.slots([a, a]), torch.tensor([4, 4]))  # stale: rebuilt next call
    a.append(4)
    assert counts.gather(counts.slots([a]))[0].tolist() == [0, 2, 1, 1, 1, 0, 0, 0, 0, 0]
    a.status = type(a.status).FINISHED_STOPPED
    counts.slots([b])
    assert id(a) not in counts.entries and len(counts.entries) == 1


@pytest.mark.parametrize("k", [0, 3])
def test_logprob_kernels_match_log_softmax(monkeypatch, k):
    """kernels.logprobs (64-token chunks of 16-token sub-blocks over 300; interpreted on the
    CPU) against torch's log_softmax and topk: the sampled token's logprob and the top-k values
    to float32 rounding, the top-k ids exactly (no ties in random logits); then k + 1 tokens
    tied at the top across two sub-blocks (the lower ids are kept) and a whole chunk of -inf."""
    from enginespec.kernels import logprobs as logprob_kernels
    from enginespec.sample.deferred import device_logprobs

    if logprob_kernels.triton is None:
        pytest.skip("needs triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setattr(logprob_kernels, "CHUNK", 64)
    monkeypatch.setattr(logprob_kernels, "SUB", 16)
    raw = (torch.randn(6, 300, generator=torch.Generator().manual_seed(0)) * 3).to(device)
    rows, tokens, counts = [0, 2, 5], torch.tensor([5, 1, 7, 3, 9, 299], device=device), [k, 0, k]
    index = torch.tensor(rows, device=device)
    monkeypatch.setattr(logprob_kernels, "available", lambda device: False)
    want = device_logprobs(raw, tokens, rows, counts, index).packed
    monkeypatch.setattr(logprob_kernels, "available", lambda device: True)
    got = device_logprobs(raw, tokens, rows, counts, index).packed
    assert got.shape == want.shape == (3, 1 + 2 * k)
    torch.testing.assert_close(got[:, : 1 + k], want[:, : 1 + k], rtol=0, atol=1e-5)
    assert torch.equal(got[:, 1 + k :], want[:, 1 + k :])
    raw[0, [30, 20, 10, 3]] = 50.0  # k + 1 tied at the top, in sub-blocks 0 and 1: the lower ids kept
    raw[5, :64] = float("-inf")  # a whole chunk of -inf
    got = device_logprobs(raw, tokens, rows, counts, index).packed
    if k:
        assert got[0, 1 + k :].tolist() == [3.0, 10.0, 20.0] and got[0, 1] == got[0, k]
    assert torch.isfinite(got[2]).all()


@pytest.mark.parametrize("case", ["many_in_one_sub_block", "flat", "few_finite", "max_k"])
def test_logprob_kernels_top_k_where_sub_blocks_hold_it(monkeypatch, case):
    """The merge takes the top k from the k sub-blocks of largest maxima (kernels.logprobs'
    docstring): rows built so a wrong choice shows. Every top token in one sub-block (its
    neighbours' maxima rank next, but hold none of it); a flat row (every sub-block ties: the
    lowest ids win); a row with fewer finite values than k (k distinct ids, the -inf ones the
    lowest); k = MAX_K. Ids equal torch.topk's (ties to the lower id), values to float32."""
    from enginespec.kernels import logprobs as logprob_kernels
    from enginespec.sample.deferred import device_logprobs

    if logprob_kernels.triton is None:
        pytest.skip("needs triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setattr(logprob_kernels, "CHUNK", 64)
    monkeypatch.setattr(logprob_kernels, "SUB", 16)
    vocab, k = 300, 5
    raw = torch.randn(2, vocab, generator=torch.Generator().manual_seed(3)).clamp(-3, 3)
    if case == "many_in_one_sub_block":
        raw[:, 100:105] = torch.tensor([9.0, 8.0, 7.5, 7.0, 6.5])  # all five in sub-block 6
        raw[:, 40], raw[:, 200], raw[:, 290] = 6.0, 5.9, 5.8  # the next sub-block maxima
    elif case == "flat":
        raw[:] = 1.0
    elif case == "few_finite":
        raw[:] = float("-inf")
        raw[:, [250, 17]] = torch.tensor([2.0, 1.0])
    else:
        k = logprob_kernels.MAX_K
    want_ids = torch.topk(torch.log_softmax(raw, dim=1), k, dim=1).indices
    if case in ("flat", "few_finite"):  # torch.topk orders ties arbitrarily; the kernel takes the lower ids
        keep = 2 if case == "few_finite" else 0
        want_ids = torch.cat([want_ids[:, :keep], torch.arange(k - keep).expand(2, -1)], dim=1)
    raw, tokens, index = (
        raw.to(device),
        torch.tensor([0, 1], device=device),
        torch.tensor([0, 1], device=device),
    )
    monkeypatch.setattr(logprob_kernels, "available", lambda device: True)
    got = device_logprobs(raw, tokens, [0, 1], [k, k], index).packed.cpu()
    assert got[:, 1 + k :].long().tolist() == want_ids.tolist()
    want_values = torch.log_softmax(raw.cpu().double(), dim=1).gather(1, want_ids)
    torch.testing.assert_close(got[:, 1 : 1 + k], want_values, rtol=0, atol=1e-5)


def test_fused_draw_reads_bf16_logits_as_torch_does(impl, monkeypatch):
    """Model-dtype (bfloat16) logits go to the fused draw unconverted (interpreted, 64-token
    chunks); seeded chat-setting rows draw the torch path's tokens (which converts first)."""
    if cut_draw.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    monkeypatch.setattr(sampling_draw, "CHUNK", 64)
    logits = (torch.randn(6, 500, generator=torch.Generator().manual_seed(1)) * 3).bfloat16()
    params = [SamplingParams(temperature=0.7, top_k=20, top_p=0.8, seed=i) for i in range(5)]
    params.append(SamplingParams(temperature=0.0))
    reqs = [make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)]
    want = Sampler(500).sample_deferred(logits, reqs).token_ids.tolist()
    monkeypatch.setattr(cut_draw, "available", lambda device: True)
    assert Sampler(500).sample_deferred(logits, reqs).token_ids.tolist() == want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_path_equals_torch_path(impl, monkeypatch):
    """On CUDA the device path's kernels (fused cut and draw, penalties, logprobs) against the
    same path with every Triton kernel off (torch on the same GPU), seeded rows of every
    setting over steps with placeholders: the same tokens, logprobs to float32 rounding."""
    from enginespec.kernels import cut_draw, logprobs, sampling, top_p

    got = _run_steps(impl, 40_000, 3, _deferred, device="cuda")
    for module in (cut_draw, logprobs, sampling, top_p):
        monkeypatch.setattr(module, "available", lambda device: False)
    want = _run_steps(impl, 40_000, 3, _deferred, device="cuda")
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    for (_, got_lp), (_, want_lp) in zip(got, want):
        for g, w in zip(got_lp, want_lp):
            assert (g is None) == (w is None)
            if g is not None:
                assert [t for t, _ in g] == [t for t, _ in w]
                assert all(abs(a - b) < 1e-4 for (_, a), (_, b) in zip(g, w))


def _flat_rows(num_rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Flat rows (small logits) whose loose top-p nucleus spans most of the vocabulary, with a
    few -inf columns and a tied pair."""
    x = torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(seed)) * 0.3
    x[1, 10:30] = float("-inf")
    x[2, 5] = x[2, 6]
    return x


def test_spread_cut_matches_torch_reference(impl, monkeypatch):
    """cut_draw's spread cut (several programs per row, interpreted: 64-token chunks over 1000
    tokens, so 16 chunks per row and candidates far short of the nucleus) gives each row the
    torch reference's exact threshold (`exact_thresholds`: a full sort), hence the same token
    set. Rows: loose top-p at several temperatures, one with min-p too (spread as well, above
    its min-p cut), one with a top-k beyond the candidates (the in-program wide path), one
    greedy, one temperature-only."""
    monkeypatch.setattr(sampler_module, "SPREAD_CUT", True)  # off by default (sample/sampler.py)
    monkeypatch.setattr(sampler_module, "REJECT_TOP_P", False)  # which would draw loose rows instead
    if cut_draw.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    vocab, chunk = 1000, 64
    params = [
        SamplingParams(temperature=1.0, top_p=0.95),
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.3, top_p=0.5),
        SamplingParams(temperature=1.0, top_p=0.99, min_p=0.2),
        SamplingParams(temperature=0.8, top_p=0.8, top_k=700),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.6),
    ]
    x = _flat_rows(len(params), vocab, 0)
    sampler = Sampler(vocab)
    plan = sampler._plan([make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)], x.device)
    assert plan.spread
    want = sampler._exact_thresholds(x, plan)
    got = cut_draw.spread_cuts(x, plan.draw_params, chunk=chunk)
    noisy = torch.tensor(plan.noisy)
    assert torch.equal(got[noisy], want[noisy]), (got, want)
    # the same token sets, stated as such
    assert torch.equal((x >= got[:, None])[noisy], (x >= want[:, None])[noisy])


@pytest.mark.parametrize("seed", [0, 1])
def test_spread_draw_equals_torch_draw(impl, monkeypatch, seed):
    """Seeded loose top-p rows (with greedy and edited rows in the batch): the Sampler's
    device path with the spread cut (interpreted) draws the plain-torch path's tokens."""
    monkeypatch.setattr(sampler_module, "SPREAD_CUT", True)  # off by default (sample/sampler.py)
    monkeypatch.setattr(sampler_module, "REJECT_TOP_P", False)  # which would draw loose rows instead
    if cut_draw.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    # 8 chunks of 64 a row: the spread rounds' programs (rows x chunks, eight rounds) run one at
    # a time under the interpreter, so 1000 tokens made this minutes of CI; each loose row's
    # nucleus (384-468 tokens) still lies far beyond the cut's CAND (256) candidates
    vocab = 512
    monkeypatch.setattr(sampling_draw, "CHUNK", 64)
    params = [SamplingParams(temperature=0.5 + 0.2 * i, top_p=0.9, seed=i) for i in range(5)]
    params += [SamplingParams(temperature=0.0), SamplingParams(top_p=0.95, presence_penalty=0.5, seed=9)]
    reqs = [make_request(impl, p, prompt=(1, 2, 3), rid=f"r{i}") for i, p in enumerate(params)]
    x = _flat_rows(len(params), vocab, seed)
    want = Sampler(vocab).sample_deferred(x, reqs).token_ids.tolist()
    monkeypatch.setattr(cut_draw, "available", lambda device: True)
    sampler = Sampler(vocab)
    assert sampler._plan(reqs, x.device).spread
    assert sampler.sample_deferred(x, reqs).token_ids.tolist() == want


def test_fused_draw_row_without_mass_takes_first_argmax(impl, monkeypatch):
    """A random row with no token of positive mass (all -inf: the scan stores argmaxes for
    greedy rows only, so the pick finds this one itself) draws what the torch path draws,
    beside ordinary random and greedy rows (interpreted, 64-token chunks)."""
    if cut_draw.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    monkeypatch.setattr(sampling_draw, "CHUNK", 64)
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(2)) * 3
    x[1] = float("-inf")
    x[3] = float("-inf")
    params = [SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=0.8, top_k=5, seed=2)]
    params += [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0)]
    reqs = [make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)]
    want = Sampler(300).sample_deferred(x, reqs).token_ids.tolist()
    monkeypatch.setattr(cut_draw, "available", lambda device: True)
    got = Sampler(300).sample_deferred(x, reqs).token_ids.tolist()
    assert got == want and got[1] == got[3] == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_spread_cut_matches_torch_reference(impl, monkeypatch):
    """On CUDA, 64 flat rows of Qwen3's vocabulary with a loose top-p (the spread cut, 19
    chunks per row) against the torch reference's full sort: the same token set on nearly every
    row; where the two differ it is by the one token at the top-p boundary, whose cumulative
    mass the two sum in different orders (a flip needs the boundary within float32 rounding,
    ~1e-6 of the total, of a token's edge). Tolerance: at most 1 token on at most 4 rows."""
    monkeypatch.setattr(sampler_module, "SPREAD_CUT", True)  # off by default (sample/sampler.py)
    monkeypatch.setattr(sampler_module, "REJECT_TOP_P", False)  # which would draw loose rows instead
    from enginespec.kernels import top_p as top_p_kernel

    monkeypatch.setattr(top_p_kernel, "available", lambda device: False)  # the torch full sort
    vocab = 151_936
    params = [SamplingParams(temperature=0.6 + 0.02 * i, top_p=0.9 + 0.001 * i) for i in range(64)]
    x = torch.randn(64, vocab, generator=torch.Generator().manual_seed(0)).cuda() * 3
    sampler = Sampler(vocab, device="cuda")
    plan = sampler._plan([make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)], x.device)
    assert plan.spread
    want = exact_thresholds(x, plan.cut_plan)
    got = cut_draw.spread_cuts(x, plan.draw_params, chunk=sampling_draw.CHUNK)
    diff = ((x >= got[:, None]).sum(1) - (x >= want[:, None]).sum(1)).abs()
    assert int(diff.max()) <= 1, diff.tolist()


def _edge_rows(num_rows: int, vocab: int) -> torch.Tensor:
    """Random rows with the candidate cut's edge cases in rows 2, 3 and 5: ties everywhere; 640
    top tokens in the first 40 sub-blocks of 16 (they overflow CAND: the wide path); quantised
    logits (ties at a cut)."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(num_rows, vocab, generator=gen) * 2
    x[2] = torch.randn(vocab, generator=gen).round()
    x[3, : 16 * 40] = 6.0 + torch.rand(16 * 40, generator=gen)
    x[5] = torch.randn(vocab, generator=gen).round() * 0.5
    return x


def test_candidate_cuts_match_torch_reference_at_their_edges(impl):
    """cut_draw's candidate cut (interpreted: 1024-token chunks of 64 sub-blocks, so each
    sub-block the scan summarises holds 16 tokens) gives each row the torch reference's exact
    threshold, on the rows that sit at its edges: top-k just below and at GATHER (the most
    sub-blocks a row reads), ties across the GATHER-th sub-block max, candidates overflowing
    CAND (hundreds of equal tokens in the top sub-blocks: the wide path), min-p above every token
    but the max, and top-k/top-p over quantised logits (ties at the cut)."""
    if cut_draw.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    vocab, chunk, gather = 4096, 1024, cut_draw.GATHER
    x = _edge_rows(7, vocab)
    x[4, 100] = 9.0  # min-p keeps this one alone
    params = [
        SamplingParams(temperature=0.7, top_k=gather - 1, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=gather),
        SamplingParams(temperature=0.8, top_k=gather + 3, top_p=0.95),
        SamplingParams(temperature=0.9, top_k=30),
        SamplingParams(temperature=1.0, min_p=0.5, top_p=0.8),
        SamplingParams(temperature=0.6, top_k=10, top_p=0.5),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.8),
    ]
    sampler = Sampler(vocab)
    plan = sampler._plan([make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)], x.device)
    want = sampler._exact_thresholds(x, plan)
    got = cut_draw.spread_cuts(x, plan.draw_params, chunk=chunk)
    assert torch.equal(got, want), (got, want)
    assert torch.equal(x >= got[:, None], x >= want[:, None])


def test_candidate_pick_draws_the_torch_draws_tokens(impl):
    """The fused draw (MODE 0, interpreted) picks a row's token from its candidates when they
    settled its cut, and from the chunk masses otherwise (uncut rows, the wide path): on the
    edge rows of the test above, four copies each under other seeded keys, every token equals
    the plain-torch draw's over the torch reference's exact cut."""
    from enginespec.sample.draw import draw_torch

    if cut_draw.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    vocab, chunk, gather = 4096, 1024, cut_draw.GATHER
    x = _edge_rows(8, vocab)
    params = [
        SamplingParams(temperature=0.7, top_k=gather - 1, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=gather),
        SamplingParams(temperature=0.8, top_k=12, top_p=0.95),
        SamplingParams(temperature=0.9, top_k=30),
        SamplingParams(temperature=1.0, min_p=0.05, top_p=0.8),
        SamplingParams(temperature=0.6, top_k=10, top_p=0.5),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.8),
        SamplingParams(temperature=0.8),
    ]
    copies = 4
    x = x.repeat(copies, 1)
    reqs = [make_request(impl, params[i % 8], rid=f"r{i}") for i in range(8 * copies)]
    sampler = Sampler(vocab)
    plan = sampler._plan(reqs, x.device)
    thr = sampler._exact_thresholds(x, plan)
    keys = [row_key(1000 + i, 3) for i in range(8 * copies)]
    got = cut_draw.draw(x, plan.draw_params, torch.tensor(keys), (0, 0), chunk=chunk)
    want = draw_torch(x, plan.x_scale, thr, keys, [True] * len(keys), chunk=chunk)
    assert got.tolist() == want.tolist()
    assert len(set(got.tolist())) > 8, "the copies should draw different tokens"


def test_top_k_rows_are_settled_by_top_k_plus_one_sub_blocks():
    """A top-k row ranks only its top_k + 1 largest sub-block maxima for its candidates (fewer
    reads than GATHER), and they still settle its cut (ok, no wide path) at the torch top-k
    threshold: on flat rows, and on a row where exactly top_k tokens lie above the (k + 1)-th
    max (the k-th largest token is then the smallest candidate). Interpreted: 1024-token
    chunks of 64 sub-blocks of 16 tokens."""
    if cut_draw.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    import triton
    import triton.language as tl

    @triton.jit
    def cut_of(x_ptr, bmax_ptr, work_ptr, out_ptr, vocab, num_chunks, top_k,
               NB: tl.constexpr, NC_BLOCK: tl.constexpr, SUB: tl.constexpr):  # fmt: skip
        # out_ptr: [3] float32, in: x_max, -inf (no min-p), 1.0; out: thr, ok, number of candidates
        x_max, base, one = tl.load(out_ptr), tl.load(out_ptr + 1), tl.load(out_ptr + 2)
        cand, _, certain = cut_draw._gather_candidates(
            x_ptr, bmax_ptr, work_ptr, num_chunks, vocab, x_max, base, top_k, NB, NC_BLOCK, SUB,
            cut_draw.GATHER, cut_draw.CAND, cut_draw.MIN_P_ROUNDS,
        )  # fmt: skip
        thr, ok = cut_draw._candidate_cut(cand, certain, x_max, one, base, top_k, one, one, 16, 8)
        tl.store(out_ptr, thr)
        tl.store(out_ptr + 1, ok.to(tl.float32))
        tl.store(out_ptr + 2, tl.sum((cand > float("-inf")).to(tl.float32), axis=0))

    vocab, chunk, nb = 4096, 1024, 64
    gen = torch.Generator().manual_seed(5)
    exact = torch.randn(vocab, generator=gen) * 0.1
    spots = torch.randperm(vocab // 16, generator=gen)[:21] * 16  # one high token in each of 21 sub-blocks
    exact[spots] = 5.0 + torch.arange(21) * 0.01
    cases = [(torch.randn(vocab, generator=gen) * 2, k) for k in (1, 5, 20, 40)] + [(exact, 20)]
    for x, k in cases:
        work = torch.zeros(cut_draw.MIN_P_ROUNDS * cut_draw.GATHER + 2 * cut_draw.CAND)
        out = torch.tensor([float(x.max()), float("-inf"), 1.0])
        bmax = x.view(-1, chunk // nb).amax(dim=1)
        cut_of[(1,)](x, bmax, work, out, vocab, vocab // chunk, k, NB=nb, NC_BLOCK=4, SUB=chunk // nb)
        assert out[1] == 1.0, f"top_k {k}: not settled by its candidates"
        assert out[0] == x.topk(k).values[-1], k
        assert out[2] < cut_draw.GATHER, k
    assert out[2] == 20, "the exact case should hold exactly top_k candidates"


def test_min_p_rows_with_many_tokens_near_the_max_are_settled_by_their_candidates(impl):
    """A min-p row whose survivors lie in more sub-blocks than GATHER (100 here: tokens near the
    max spread over the row) is still cut from its candidates, in rounds of GATHER sub-blocks
    (no flag for the rows that need the wide or spread path), and the cut equals the torch
    reference's; so does a row with more survivors' sub-blocks than MIN_P_ROUNDS rounds hold,
    which takes the other path. Interpreted, 1024-token chunks of 64 sub-blocks of 16 tokens."""
    if cut_draw.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    vocab, chunk = 8192, 1024
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(2, vocab, generator=gen) * 0.3
    many = cut_draw.GATHER + 36
    spots = torch.randperm(vocab // 16, generator=gen)[:many] * 16  # one token in each of `many` sub-blocks
    x[0, spots] = 5.0 + torch.rand(many, generator=gen) * 0.5
    too_many = cut_draw.MIN_P_ROUNDS * cut_draw.GATHER + 10
    spots = torch.randperm(vocab // 16, generator=gen)[:too_many] * 16
    x[1, spots] = 5.0 + torch.rand(too_many, generator=gen) * 0.5
    params = [SamplingParams(temperature=1.0, min_p=0.3, top_p=0.9)] * 2
    sampler = Sampler(vocab)
    plan = sampler._plan([make_request(impl, p, rid=f"r{i}") for i, p in enumerate(params)], x.device)
    keys = torch.zeros(2, dtype=torch.int64)
    cuts = cut_draw._launch(x, plan.draw_params, keys, (0, 0), chunk, None, None, 0, True, pick=False)[1]
    assert cuts[0, 1] == 0, "the 100-sub-block row needed the spread path"
    assert cuts[1, 1] != 0, "a row beyond the rounds' reach should have been flagged"
    want = sampler._exact_thresholds(x, plan)
    assert torch.equal(cut_draw.spread_cuts(x, plan.draw_params, chunk=chunk), want)


def test_draw_work_buffers_are_reused_per_thread_and_shape():
    """cut_draw keeps a draw's work buffers for the next call of the same shape in the same
    thread (the host time of an allocation per call), never across threads (two engines drawing
    at once would interleave their launches over one buffer) or shapes, and keeps at most
    WORK_CACHE shapes a thread."""
    import threading

    if cut_draw.triton is None:
        pytest.skip("needs triton")
    cpu = torch.device("cpu")
    first = cut_draw._work_buffers(8, 3, 64, False, cpu)
    assert cut_draw._work_buffers(8, 3, 64, False, cpu) is first
    assert cut_draw._work_buffers(9, 3, 64, False, cpu) is not first
    other = []
    worker = threading.Thread(target=lambda: other.append(cut_draw._work_buffers(8, 3, 64, False, cpu)))
    worker.start()
    worker.join()
    assert other[0] is not first and other[0][0].data_ptr() != first[0].data_ptr()
    for rows in range(100, 100 + cut_draw.WORK_CACHE + 1):
        cut_draw._work_buffers(rows, 3, 64, False, cpu)
    assert len(cut_draw._WORK.shapes) == cut_draw.WORK_CACHE
    assert cut_draw._work_buffers(8, 3, 64, False, cpu) is not first  # evicted, least recent first


@pytest.mark.parametrize("seed", [0, 1])
def test_loose_top_p_rows_draw_by_rejection_on_every_path(impl, monkeypatch, seed):
    """Seeded loose top-p rows (edited ones among them, beside greedy, chat and min-p rows): the
    serial torch path, the deferred torch path and the deferred fused path (interpreted) draw
    the same tokens, and those are sample/reject.py's (the uncut draw, then its rounds)."""
    from enginespec.sample.draw import draw_torch
    from enginespec.sample.reject import refine_top_p

    if cut_draw.triton is None or torch.cuda.is_available():
        pytest.skip("needs triton's CPU interpreter")
    vocab = 1000
    monkeypatch.setattr(sampling_draw, "CHUNK", 64)
    loose = [
        SamplingParams(temperature=0.5 + 0.2 * i, top_p=(0.9, 0.3, 0.05)[i % 3], seed=i) for i in range(5)
    ]
    params = loose + [
        SamplingParams(temperature=0.0),
        SamplingParams(top_p=0.95, presence_penalty=0.5, logit_bias={3: 4.0}, seed=9),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.8, seed=4),
        SamplingParams(temperature=1.0, top_p=0.9, min_p=0.1, seed=5),
    ]
    reqs = [make_request(impl, p, prompt=(1, 2, 3), rid=f"r{i}") for i, p in enumerate(params)]
    x = _flat_rows(len(params), vocab, seed)
    serial = Sampler(vocab)(x, reqs).token_ids
    deferred = Sampler(vocab).sample_deferred(x, reqs).token_ids.tolist()
    monkeypatch.setattr(cut_draw, "available", lambda device: True)
    sampler = Sampler(vocab)
    assert sampler._plan(reqs, x.device).reject_rows == [0, 1, 2, 3, 4, 6]
    fused = sampler.sample_deferred(x, reqs).token_ids.tolist()
    assert serial == deferred == fused
    # rows 0-4 (no edits) are the rejection rule's tokens, drawn from x itself
    rows = list(range(5))
    scale = torch.tensor([1.4426950408889634 / p.temperature for p in loose])
    keys = [row_key(p.seed, reqs[i].num_output_tokens) for i, p in enumerate(loose)]
    round0 = draw_torch(x[rows], scale, None, keys, [True] * 5, chunk=64)
    want = refine_top_p(x[rows], scale, torch.tensor([p.top_p for p in loose]), keys, round0, chunk=64)
    assert fused[:5] == want.tolist()
