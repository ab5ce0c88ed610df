"""The one workload generator: the benchmark's workload is exactly the one the old harness drew
(so figures stay comparable across the move), and the demo's and simulator's shapes hold."""

from __future__ import annotations

import random

import pytest

from enginespec.testing.workload import NANO_VLLM, Workload, make_workload


def _old_harness_draw(
    num_requests, *, min_input_len, max_input_len, min_output_len, max_output_len, id_bound, seed
):
    """The draw benchmarks/harness.py made before the generators were merged (kept here as the
    oracle): per request a length then its ids, then every output length."""
    rng = random.Random(seed)
    lo_in, lo_out = min(min_input_len, max_input_len), min(min_output_len, max_output_len)
    prompts = []
    for _ in range(num_requests):
        length = rng.randint(lo_in, max_input_len)
        prompts.append([rng.randint(0, id_bound - 1) for _ in range(length)])
    return prompts, [rng.randint(lo_out, max_output_len) for _ in range(num_requests)]


def test_default_is_the_nano_vllm_workload_of_the_old_harness():
    workload = make_workload()
    prompts, output_lens = _old_harness_draw(**NANO_VLLM)
    assert workload.prompts == prompts and workload.output_lens == output_lens
    assert len(workload.prompts) == 256
    assert all(100 <= n <= 1024 for n in workload.prompt_lens + workload.output_lens)
    assert all(0 <= t < 10000 for p in workload.prompts for t in p)


@pytest.mark.parametrize(
    "kw",
    [
        dict(num_requests=4, min_input_len=100, max_input_len=32, min_output_len=100, max_output_len=16),
        dict(num_requests=64, min_input_len=5, max_input_len=9, min_output_len=2, max_output_len=7, seed=3),
    ],
)
def test_smaller_runs_match_the_old_harness_too(kw):
    kw = {**NANO_VLLM, **kw}
    workload = make_workload(**kw)
    assert (workload.prompts, workload.output_lens) == _old_harness_draw(**kw)


def test_seeded_and_within_bounds():
    kw = dict(min_input_len=5, max_input_len=9, min_output_len=2, max_output_len=7, id_bound=50)
    a, b = make_workload(20, **kw), make_workload(20, **kw)
    assert a == b and a != make_workload(20, seed=1, **kw)
    assert all(5 <= n <= 9 for n in a.prompt_lens) and all(2 <= n <= 7 for n in a.output_lens)
    assert all(0 <= t < 50 for p in a.prompts for t in p)


def test_shared_prefixes_open_every_prompt():
    workload = make_workload(
        9,
        min_input_len=2,
        max_input_len=4,
        max_output_len=3,
        id_bound=100,
        shared_prefix_len=6,
        num_prefixes=3,
    )
    heads = [tuple(p[:6]) for p in workload.prompts]
    assert len(set(heads)) == 3 and heads[:3] * 3 == heads  # request i opens with prefix i % 3
    assert all(8 <= len(p) <= 10 for p in workload.prompts)


def test_params_and_inputs_follow_the_workload():
    workload = Workload([[1, 2], [3]], [4, 1])
    assert workload.prompt_inputs() == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    params = workload.sampling_params(temperature=0.5)
    assert [p.max_tokens for p in params] == [4, 1]
    assert all(p.ignore_eos and p.temperature == 0.5 for p in params)
    assert not any(p.ignore_eos for p in workload.sampling_params(ignore_eos=False))
    assert workload.head(1) == Workload([[1, 2]], [4]) and workload.num_output_tokens == 5


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(num_requests=0), "num_requests"),
        (dict(min_input_len=0), "min_input_len"),
        (dict(max_output_len=0), "max_output_len"),
        (dict(id_bound=0), "id_bound"),
        (dict(shared_prefix_len=-1), "shared_prefix_len"),
        (dict(num_prefixes=0), "num_prefixes"),
    ],
)
def test_bad_argument_is_named(bad, name):
    with pytest.raises(ValueError, match=name):
        make_workload(**{"num_requests": 2, **bad})
