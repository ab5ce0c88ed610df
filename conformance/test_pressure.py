"""Features under memory pressure: a pool too small for the batch, so the scheduler preempts
(recompute or swap) all the time, crossed with what a request may ask (n > 1, seeded sampling
with top-p/top-k/min-p, logprobs, prompt_logprobs, stop ids with min_tokens, stop strings,
logit_bias, allowed_token_ids, bad words, penalties, structured outputs, beam search) and what
the engine may do (chunked prefill on a budget of a few tokens, prefix caching over shared
system prompts, priority order, async scheduling, n-gram and draft-model speculation).

Every greedy or seeded request must give exactly what the same request gives in a roomy pool:
ids, text, finish and stop reasons, logprobs, prompt_logprobs. Beside that, what each request
and the counters report must hold together: num_cached_tokens a whole number of blocks below
the prompt (0 with prompt_logprobs), vllm:generation_tokens the tokens returned,
vllm:prompt_tokens each sample's prompt once, vllm:prompt_tokens_cached the prefix-cache hits,
vllm:request_success one per sample; aborts (LLMEngine.abort_request) mid-run leave the others
exact and their own tokens a prefix of the roomy run's. After every call the pool (and a draft
model's) is all free and the engine holds no request state.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginespec.conformance.invariants import check_idle
from enginespec.conformance.soak import _leftovers
from enginespec.spec import RequestOutputKind, SamplingParams, StructuredOutputsParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")

_SYSTEMS = ([17, 43, 8, 61, 29, 70, 12, 55, 38], [81, 26, 64, 9, 47, 33, 90, 15, 52])
#: seven prompts over two shared system prompts (9 tokens: two full blocks of 4 to share)
PROMPTS = [_SYSTEMS[i % 2] + [(11 * i + 5 * j) % 86 + 4 for j in range(1 + i % 7)] for i in range(7)]
MAX_TOKENS = 12
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
_BASE = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
_SO = StructuredOutputsParams


def _combos(texts: list[str]) -> dict[str, SamplingParams]:
    """name -> params; the stop strings are cut from the roomy greedy run's texts, so they stop."""
    edit = functools.partial(dataclasses.replace, _BASE)
    return {
        "greedy": _BASE,
        "seeded_n2_truncated": edit(temperature=0.8, top_p=0.9, top_k=20, min_p=0.05, seed=9, n=2),
        "seeded_penalties_bias": edit(
            temperature=1.2, seed=4, repetition_penalty=1.2, frequency_penalty=0.3, logit_bias={12: 2.0}
        ),
        "logprobs_prompt_logprobs": edit(logprobs=2, prompt_logprobs=2),
        "min_tokens_stop_ids": edit(ignore_eos=False, stop_token_ids=tuple(range(20, 60)), min_tokens=4),
        "allowed_bias": edit(allowed_token_ids=(10, 11, 12, 13, 40, 41, 42), logit_bias={41: -50.0}),
        "bad_words": edit(bad_words_token_ids=((32,), (55, 32))),
        "stop_strings": edit(stop=(texts[0][5:7], texts[1][6:8], texts[3][3:5])),
        "stop_string_n2_delta": edit(
            stop=(texts[2][4:6],), include_stop_str_in_output=True, n=2, output_kind=RequestOutputKind.DELTA
        ),
        "json": edit(
            ignore_eos=False,
            structured_outputs=_SO(json={"type": "object", "properties": {"a": {"type": "integer"}}}),
        ),
        "regex_seeded_logprobs": edit(
            temperature=0.7, seed=2, logprobs=3, structured_outputs=_SO(regex=r"[a-e]{2,6}\d{1,3}")
        ),
        "choice_n2": edit(n=2, structured_outputs=_SO(choice=["alpha", "beta", "gamma"])),
        "one_token": edit(max_tokens=1, prompt_logprobs=1),
    }


def _llm(impl, **engine_args):
    from enginespec.llm import LLM
    from enginespec.testing.checkpoints import json_model_dir

    args = {"impl": impl, "dtype": "float32", "device": "cpu", "block_size": 4, "max_model_len": 64}
    return LLM(str(json_model_dir()), **{**args, **engine_args})


class _Roomy:
    """The roomy engine of one impl (serial steps, 256 blocks) and its outputs, each made once."""

    def __init__(self, impl):
        self.llm = _llm(impl, num_blocks=256, async_scheduling=False)
        free = self.llm.generate(self.inputs(), _BASE, use_tqdm=False)
        self.combos = _combos([o.outputs[0].text for o in free])
        self._outs: dict = {}

    @staticmethod
    def inputs(ks=range(len(PROMPTS))) -> list[dict]:
        return [{"prompt_token_ids": PROMPTS[k]} for k in ks]

    def params(self, name: str) -> SamplingParams:
        return self.combos[name]

    def want(self, name: str, k: int):
        """The roomy run's cumulative output of prompt k under combo `name`."""
        if (name, k) not in self._outs:
            params = dataclasses.replace(self.combos[name], output_kind=RequestOutputKind.CUMULATIVE)
            outs = self.llm.generate(self.inputs(), params, use_tqdm=False)
            self._outs.update(((name, i), out) for i, out in enumerate(outs))
        return self._outs[name, k]


@pytest.fixture(scope="module")
def roomy(impl):
    return _Roomy(impl)


def _draft_config() -> dict:
    from enginespec.testing.checkpoints import json_model_dir

    return {"method": "draft_model", "model": str(json_model_dir()), "num_speculative_tokens": 2}


@st.composite
def pressured_configs(draw, impl) -> dict:
    """Engine args of a pool too small for the batch: at most two blocks more than the longest
    request needs alone, three or more requests at once, and a token budget that leaves room
    for a prefill chunk beside a decode with its drafts (so two requests grow at once)."""
    block_size = draw(st.sampled_from([2, 4, 8]))
    need = -(-(max(map(len, PROMPTS)) + MAX_TOKENS + 3) // block_size)  # + 3: drafts
    modes = ["recompute", "swap"] if "swap" in getattr(impl, "capabilities", ()) else ["recompute"]
    config = {
        "block_size": block_size,
        "num_gpu_blocks_override": need + draw(st.integers(0, 2)),
        "max_num_seqs": draw(st.integers(3, 8)),
        "preemption_mode": draw(st.sampled_from(modes)),
        "async_scheduling": draw(st.booleans()),
        "enable_prefix_caching": draw(st.booleans()),
        "scheduling_policy": draw(st.sampled_from(["fcfs", "priority"])),
    }
    speculation = draw(st.sampled_from([None, "ngram", "draft_model"]))
    if speculation is not None:
        config["speculative_config"] = NGRAM if speculation == "ngram" else _draft_config()
    if draw(st.booleans()):  # chunked prefill on a budget of a few tokens beyond one decode's
        decode = 1 + config.get("speculative_config", {}).get("num_speculative_tokens", 0)
        config["max_num_batched_tokens"] = max(config["max_num_seqs"], decode + draw(st.integers(1, 4)))
        config["long_prefill_token_threshold"] = draw(st.sampled_from([0, 2]))
    return config


def _seen(out) -> tuple:
    return out.prompt_token_ids, [
        (list(c.token_ids), c.text, c.finish_reason, c.stop_reason, c.cumulative_logprob is None)
        for c in out.outputs
    ]


def _same_logprob(x, y) -> bool:
    """Same ids and ranks, logprobs within 1e-4 (a token a grammar masks is -inf in both)."""
    return x.keys() == y.keys() and all(
        math.isclose(x[t].logprob, y[t].logprob, abs_tol=1e-4) and x[t].rank == y[t].rank for t in x
    )


def assert_same_output(want, got, context: str) -> None:
    """Ids, text, finish and stop reasons, logprobs (keys, values within 1e-4, ranks), the
    cumulative logprob (within 1e-3) and prompt_logprobs of the pressured run equal the roomy one's."""
    assert _seen(got) == _seen(want), context
    for a, b in zip(want.outputs, got.outputs):
        assert (a.logprobs is None) == (b.logprobs is None), context
        assert all(_same_logprob(x, y) for x, y in zip(a.logprobs or (), b.logprobs or ())), context
        if a.cumulative_logprob is not None:
            assert abs(a.cumulative_logprob - b.cumulative_logprob) < 1e-3, context
    assert (want.prompt_logprobs is None) == (got.prompt_logprobs is None), context
    if want.prompt_logprobs is not None:
        assert len(got.prompt_logprobs) == len(want.prompt_logprobs), context
        assert got.prompt_logprobs[0] is None, context
        pairs = zip(want.prompt_logprobs[1:], got.prompt_logprobs[1:])
        assert all(_same_logprob(x, y) for x, y in pairs), context


def _counters(llm) -> dict:
    from enginespec.metrics_reader import Counter

    counts: dict = {}
    for m in llm.get_metrics():
        if isinstance(m, Counter) and "source" not in m.labels:
            counts[m.name] = counts.get(m.name, 0) + m.value  # request_success: every reason
    return counts


def assert_counts_hold_together(
    before: dict, after: dict, outs, params: SamplingParams, block_size: int
) -> None:
    """num_cached_tokens and the counters' growth over one generate() call (module doc)."""
    grew = {name: after[name] - before.get(name, 0) for name in after}
    samples = [c for o in outs for c in o.outputs]
    assert grew["vllm:generation_tokens"] == sum(len(c.token_ids) for c in samples)
    assert grew["vllm:prompt_tokens"] == sum(len(o.prompt_token_ids) * len(o.outputs) for o in outs)
    assert grew["vllm:request_success"] == len(samples)
    if params.prompt_logprobs is None:
        assert grew["vllm:prompt_tokens_cached"] == grew["vllm:prefix_cache_hits"]
    for o in outs:
        cached = o.num_cached_tokens
        assert cached % block_size == 0 and 0 <= cached < len(o.prompt_token_ids), cached
        assert params.prompt_logprobs is None or cached == 0, cached


def assert_idle(llm) -> None:
    """Every block free (the draft model's pool too), no request state left, gauges at 0."""
    from enginespec.metrics_reader import Gauge

    engine = llm.engine
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    drafter = engine.spec.drafter if engine.spec is not None else None
    if hasattr(drafter, "block_manager"):
        check_idle(drafter.block_manager.state(), drafter.block_manager.num_blocks)
    assert _leftovers(engine) == 0 and not engine._pending
    gauges = [m.value for m in llm.get_metrics() if isinstance(m, Gauge)]
    assert gauges == [0.0, 0.0, 0.0], gauges  # running, waiting, KV usage


@settings(max_examples=max(1, settings.default.max_examples // 2))
@given(data=st.data())
def test_pressured_generate_equals_the_roomy_run(impl, roomy, data):
    """Greedy (every request runs its 12 tokens: the pool must preempt) and two more combos
    through LLM.generate on one pressured engine (pressured_configs), with per-prompt
    priorities under the priority policy: outputs exact, counters consistent, the pool idle
    after each call."""
    config = data.draw(pressured_configs(impl), label="engine")
    llm = _llm(impl, **config)
    others = sorted(set(roomy.combos) - {"greedy"})
    names = ["greedy", *data.draw(st.lists(st.sampled_from(others), min_size=2, max_size=2, unique=True))]
    for name in names:
        params = roomy.params(name)
        priority = None
        if config["scheduling_policy"] == "priority":
            priority = data.draw(st.lists(st.integers(0, 2), min_size=len(PROMPTS), max_size=len(PROMPTS)))
        before = _counters(llm)
        outs = llm.generate(roomy.inputs(), params, priority=priority, use_tqdm=False)
        for k, got in enumerate(outs):  # generate() returns whole outputs whatever the kind
            assert_same_output(roomy.want(name, k), got, f"{name} prompt {k}")
        assert_counts_hold_together(before, _counters(llm), outs, params, config["block_size"])
        assert_idle(llm)
    assert llm.engine.stats.num_preemptions > 0, "the premise: the pool is too small for the batch"


#: The interactive run's arrivals: (step it arrives before, prompt index, combo pick, priority),
#: at least six requests; and its aborts: (step, which live request, by position in id order).
_ARRIVALS = st.lists(
    st.tuples(st.integers(0, 8), st.integers(0, len(PROMPTS) - 1), st.integers(0, 99), st.integers(0, 2)),
    min_size=6,
    max_size=12,
)
_ABORTS = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 99)), max_size=4)


class _Interactive:
    """LLMEngine driven op by op; every output checked against the roomy run as it comes."""

    def __init__(self, engine, roomy: _Roomy):
        self.engine, self.roomy = engine, roomy
        self.live: dict[str, tuple] = {}  # request id -> (prompt index, combo name, {index: ids})
        self.added = 0

    def add(self, k: int, pick: int, priority: int, policy: str) -> None:
        name = sorted(self.roomy.combos)[pick % len(self.roomy.combos)]
        rid = f"r{self.added}"
        self.added += 1
        self.engine.add_request(
            rid,
            {"prompt_token_ids": PROMPTS[k]},
            self.roomy.params(name),
            priority=priority if policy == "priority" else 0,
        )
        self.live[rid] = (k, name, {})

    def abort(self, pick: int) -> None:
        """Abort a live request: the ids it showed are a prefix of the roomy run's."""
        if not self.live:
            return
        rid = sorted(self.live)[pick % len(self.live)]
        self.engine.abort_request(rid)
        k, name, seen = self.live.pop(rid)
        want = self.roomy.want(name, k)
        for index, ids in seen.items():
            assert ids == want.outputs[index].token_ids[: len(ids)], (name, k, "aborted")

    def step(self) -> None:
        for out in self.engine.step():
            k, name, seen = self.live[out.request_id]
            delta = self.roomy.params(name).output_kind == RequestOutputKind.DELTA
            for c in out.outputs:
                seen[c.index] = seen.get(c.index, []) + list(c.token_ids) if delta else list(c.token_ids)
            if out.finished:
                del self.live[out.request_id]
                want = self.roomy.want(name, k)
                if delta:
                    assert [seen[i] for i in range(len(want.outputs))] == [c.token_ids for c in want.outputs]
                else:
                    assert_same_output(want, out, f"{name} prompt {k}")


@settings(max_examples=max(1, settings.default.max_examples // 2))
@given(data=st.data())
def test_adds_aborts_and_priorities_mid_run_under_pressure(impl, roomy, data):
    """Six to twelve requests arriving over the first steps (with priorities under the priority
    policy) and up to four aborted mid-run (LLMEngine.abort_request: running, preempted,
    swapped out) on a pressured engine (every ci-profile example preempts):
    each finished request equals the roomy run, each aborted one showed a prefix of it, and once
    drained the pool is all free with no request state left."""
    from enginespec.llm_engine import LLMEngine

    config = data.draw(pressured_configs(impl), label="engine")
    llm = _llm(impl, **config)
    run = _Interactive(LLMEngine(llm), roomy)
    arrivals, aborts = data.draw(_ARRIVALS, label="arrivals"), data.draw(_ABORTS, label="aborts")
    step = 0
    while step <= 20 or run.engine.has_unfinished_requests():
        for _, k, pick, priority in (a for a in arrivals if a[0] == step):
            run.add(k, pick, priority, config["scheduling_policy"])
        for _, pick in (a for a in aborts if a[0] == step):
            run.abort(pick)
        run.step()
        step += 1
    assert not run.live and run.added == len(arrivals)
    assert_idle(llm)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_beam_search_in_a_small_pool_equals_the_roomy_run(impl, roomy, async_scheduling):
    """LLM.beam_search (width 3: each step one token of every live beam, the beams of a prompt
    sharing its blocks) on 8 blocks of 4, far fewer than the 12 beams' contexts, with prefill
    chunks of 6 tokens: the same beams and scores as the roomy engine's, the pool all free
    after. (Its requests draw one token each and never grow, so the small pool queues them and
    evicts their shared blocks instead of preempting.)"""
    from enginespec.beam_search import BeamSearchParams

    llm = _llm(impl, num_gpu_blocks_override=8, max_num_batched_tokens=6, async_scheduling=async_scheduling)
    params = BeamSearchParams(beam_width=3, max_tokens=8)
    got = llm.beam_search(roomy.inputs(range(4)), params)
    want = roomy.llm.beam_search(roomy.inputs(range(4)), params)

    def beams(outs):
        return [[(b.tokens, b.finish_reason) for b in o.sequences] for o in outs]

    assert beams(got) == beams(want)
    scores = [
        (a.cum_logprob, b.cum_logprob) for x, y in zip(want, got) for a, b in zip(x.sequences, y.sequences)
    ]
    assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in scores), scores
    assert_idle(llm)
