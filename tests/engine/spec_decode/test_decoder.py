"""SpecDecoder's proposal rules: who gets drafts (not prefilling, swapped, logprobs or seeded
sampled requests, nor one waiting for its async token), how many, for one step only, and the
back-off of a request whose drafts keep being rejected."""

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


def test_a_request_whose_drafts_are_rejected_backs_off_exponentially():
    spec = _decoder()
    r = _Req("a", LOOP)
    drafted = []
    for _ in range(12):
        drafted.append(spec.propose([r], PLACEHOLDER) == 1)
        if drafted[-1]:
            spec._observe("a", len(r.spec_token_ids), 0)  # every draft rejected
    # rejected at steps 0, 2, 6 (waits of 2, 4, then 8 steps)
    assert [i for i, d in enumerate(drafted) if d] == [0, 2, 6]
    spec._observe("a", 3, 1)  # an acceptance resets the back-off
    assert spec.propose([r], PLACEHOLDER) == 1


def test_waiting_for_a_token_that_then_drafts_nothing_backs_off():
    spec = _decoder()
    r = _Req("a", LOOP + [PLACEHOLDER])  # the lagged look-up ([3, 1]) would draft
    assert spec.wants_real_tokens([r], PLACEHOLDER)
    r.token_ids[-1] = 7  # the real token: [1, 7] never occurred, nothing to draft
    assert spec.propose([r], PLACEHOLDER) == 0
    r.token_ids[-1] = PLACEHOLDER
    assert not spec.wants_real_tokens([r], PLACEHOLDER)  # backing off: no more waiting
