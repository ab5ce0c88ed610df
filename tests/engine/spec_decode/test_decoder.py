"""SpecDecoder's proposal rules: who gets drafts (not prefilling, swapped, logprobs or seeded
sampled requests, nor one waiting for its async token), how many, for one step only; adaptive
drafting (fewer drafts after partial acceptance, aligned back-off of a request whose drafts keep
being rejected, and its way back) and disable_by_batch_size."""

from __future__ import annotations

from enginespec.engine.spec_decode import SpecDecoder, SpeculativeConfig
from enginespec.spec import SamplingParams, Status

PLACEHOLDER = 99


class _Req:
    def __init__(self, rid, tokens, max_tokens=10, computed=None, status=Status.RUNNING, **params):
        self.request_id, self.token_ids, self.status = rid, list(tokens), status
        self.params = SamplingParams(max_tokens=max_tokens, **params)
        self.num_prompt_tokens = 4
        self.num_computed_tokens = len(tokens) - 1 if computed is None else computed
        self.spec_token_ids: list[int] = []

    @property
    def num_tokens(self):
        return len(self.token_ids)

    @property
    def num_output_tokens(self):
        return len(self.token_ids) - self.num_prompt_tokens


def _decoder(k=3):
    cfg = SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=2)
    return SpecDecoder(cfg, sampler=None, device="cpu", max_model_len=64)


LOOP = [1, 2, 3, 1, 2, 3, 1]  # suffix [3, 1] first seen at 2: drafts [2, 3, 1]


def test_only_running_decodes_without_logprobs_get_drafts_within_their_limits():
    spec = _decoder()
    reqs = [
        _Req("a", LOOP),
        _Req("short", LOOP, max_tokens=4),  # 3 outputs so far: room for 0 drafts + the bonus
        _Req("near", LOOP, max_tokens=5),  # room for 1 draft
        _Req("chunk", LOOP, computed=3),  # still prefilling
        _Req("lp", LOOP, logprobs=1),
        _Req("seeded", LOOP, temperature=1.0, seed=5),
        _Req("sampled", LOOP, temperature=1.0),
        _Req("swapped", LOOP, status=Status.SWAPPED),
        _Req("async", LOOP + [PLACEHOLDER]),
    ]
    assert spec.propose(reqs, PLACEHOLDER) == 3
    drafted = {r.request_id: r.spec_token_ids for r in reqs if r.spec_token_ids}
    assert drafted == {"a": [2, 3, 1], "near": [2], "sampled": [2, 3, 1]}
    assert spec.wants_real_tokens(reqs, PLACEHOLDER)  # "async" would draft from [.., 3, 1]
    spec.propose([], PLACEHOLDER)  # the next step: last step's drafts are gone
    assert not any(r.spec_token_ids for r in reqs)


def _drafted_steps(spec, reqs, steps: int, accept) -> dict[str, list[int]]:
    """Run `steps` proposals; each drafted request's drafts are verified with accept(r) of them
    accepted. Returns request id -> (step number, drafts given) for every drafted step."""
    seen: dict[str, list] = {r.request_id: [] for r in reqs}
    for _ in range(steps):
        spec.propose(reqs, PLACEHOLDER)
        for r in reqs:
            if r.spec_token_ids:
                seen[r.request_id].append((spec._num_steps, len(r.spec_token_ids)))
                spec._observe(r.request_id, len(r.spec_token_ids), accept(r))
    return seen


def test_a_request_whose_drafts_are_rejected_backs_off_on_aligned_steps_and_resumes():
    spec = _decoder()
    r = _Req("a", LOOP)
    seen = _drafted_steps(spec, [r], 40, lambda r: 0)  # every draft rejected
    # step 1 with k drafts; then one-draft probes at the next multiple of 2, 4, 8, 16, 32
    assert seen["a"] == [(1, 3), (2, 1), (4, 1), (8, 1), (16, 1), (32, 1)]
    spec._observe("a", 1, 1)  # the probe's draft accepted: back, growing 2 then k
    seen = _drafted_steps(spec, [r], 3, lambda r: len(r.spec_token_ids))
    assert seen["a"] == [(41, 2), (42, 3), (43, 3)]


def test_rejected_requests_probe_together_whatever_step_they_missed_at():
    """Two requests that start missing at different steps line up on the same probe steps."""
    spec = _decoder()
    a, b = _Req("a", LOOP), _Req("b", LOOP)
    spec.adaptive.miss("b", 0)
    spec.adaptive.miss("b", 0)  # b has already missed twice before a starts
    seen = _drafted_steps(spec, [a, b], 70, lambda r: 0)
    steps = {rid: [s for s, _ in got] for rid, got in seen.items()}
    assert steps["a"] == [1, 2, 4, 8, 16, 32, 64]
    assert steps["b"] == [4, 8, 16, 32, 64]
    assert all(n == 1 for s, n in seen["b"])
    assert spec.adaptive.misses("a") == 7 and len(spec.adaptive) == 2


def test_partial_acceptance_proposes_one_more_than_was_right():
    spec = _decoder(k=4)
    r = _Req("a", [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2], max_tokens=40)
    seen = _drafted_steps(spec, [r], 3, lambda r: 1)  # only the first draft is ever right
    assert seen["a"] == [(1, 4), (2, 2), (3, 2)]
    spec.forget("a")
    assert spec.adaptive.allowed("a", 4) == 4 and len(spec.adaptive) == 0


def test_waiting_for_a_token_that_then_drafts_nothing_backs_off():
    spec = _decoder()
    r = _Req("a", LOOP + [PLACEHOLDER])  # the lagged look-up ([3, 1]) would draft
    for step in (1, 2):  # waited for nothing at steps 1 and 2: the next look-up is at step 4
        assert spec.wants_real_tokens([r], PLACEHOLDER)
        r.token_ids[-1] = 7  # the real token: [1, 7] never occurred, nothing to draft
        assert spec.propose([r], PLACEHOLDER) == 0 and spec.adaptive.misses("a") == step
        r.token_ids[-1] = PLACEHOLDER
    assert not spec.wants_real_tokens([r], PLACEHOLDER)  # backing off: no more waiting
    spec.propose([r], PLACEHOLDER)  # step 3
    assert spec.wants_real_tokens([r], PLACEHOLDER)  # step 4 may draft again


def test_no_drafts_at_or_above_disable_by_batch_size():
    cfg = SpeculativeConfig(
        num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2, disable_by_batch_size=3
    )
    spec = SpecDecoder(cfg, sampler=None, device="cpu", max_model_len=64)
    reqs = [_Req(f"r{i}", LOOP) for i in range(3)]
    assert spec.propose(reqs, PLACEHOLDER) == 0 and spec.num_disabled_steps == 1
    async_reqs = [_Req(f"p{i}", LOOP + [PLACEHOLDER]) for i in range(3)]
    assert not spec.wants_real_tokens(async_reqs, PLACEHOLDER)
    assert spec.propose(reqs[:2], PLACEHOLDER) == 2  # below the bound: drafted again
    assert spec.wants_real_tokens(async_reqs[:2], PLACEHOLDER)


def test_a_request_with_nothing_to_draft_is_looked_up_every_fourth_step_after_eight():
    spec = _decoder()
    looked: list[int] = []
    inner = spec.drafter.propose_batch

    def counting(requests, num_reals, limits):
        looked.extend(spec._num_steps for _ in requests)
        return inner(requests, num_reals, limits)

    spec.drafter.propose_batch = counting
    r = _Req("a", [40, 41], max_tokens=60)
    for t in range(42, 62):  # never repeats: nothing to draft
        r.token_ids.append(t)
        r.num_computed_tokens = r.num_tokens - 1
        assert spec.propose([r], PLACEHOLDER) == 0
    assert looked == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20]
    r.token_ids += [41, 42]  # [41, 42] occurred at the start: drafts at the next look-up
    r.num_computed_tokens = r.num_tokens - 1
    got = [spec.propose([r], PLACEHOLDER) for _ in range(4)]  # steps 21..24
    assert got == [0, 0, 0, 1] and r.spec_token_ids == [43, 44, 45]


def test_lagged_look_ups_that_find_nothing_thin_out_too():
    """Async: the look-up on the tokens before the placeholder counts as an empty proposal."""
    spec = _decoder()
    looked: list[int] = []
    inner = spec.drafter.first_to_propose

    def counting(requests, num_reals):
        looked.extend(spec._num_steps + 1 for _ in requests)
        return inner(requests, num_reals)

    spec.drafter.first_to_propose = counting
    r = _Req("a", [40, 41, PLACEHOLDER], max_tokens=60)
    for t in range(42, 62):  # never repeats; the newest token is always the placeholder
        r.token_ids[-1:] = [t, PLACEHOLDER]
        r.num_computed_tokens = r.num_tokens - 1
        assert not spec.wants_real_tokens([r], PLACEHOLDER)
        assert spec.propose([r], PLACEHOLDER) == 0
    assert looked == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20]


def _verifier_draws(spec) -> list[float]:
    import torch

    return torch.rand(8, generator=spec.generator).tolist()


def test_an_unseeded_decoder_draws_fresh_entropy_and_a_seeded_one_repeats():
    """seed None (LLM(seed=None)): the verifier's accept and residual draws come from fresh
    entropy for each decoder and after each reset, as the sampler's unseeded generator does;
    a seed makes every decoder, and every reset, start the same stream."""
    cfg = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2)
    a, b = (SpecDecoder(cfg, sampler=None, device="cpu", max_model_len=64, seed=None) for _ in range(2))
    first = _verifier_draws(a)
    assert first != _verifier_draws(b)
    a.reset()
    assert _verifier_draws(a) != first
    c, d = (SpecDecoder(cfg, sampler=None, device="cpu", max_model_len=64, seed=7) for _ in range(2))
    seeded = _verifier_draws(c)
    assert seeded == _verifier_draws(d)
    c.reset()
    assert _verifier_draws(c) == seeded
