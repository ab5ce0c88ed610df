"""LLM.get_metrics(): vLLM's offline metrics snapshot (enginespec.metrics_reader), read the way
vLLM's speculative-decoding example (examples/offline_inference/spec_decode.py) reads it: the
spec-decode counters and the per-position Vector agree with the engine's own counters and with
the per-sample ones on each CompletionOutput; the gauges and counters follow the engine."""

from __future__ import annotations

import pytest

from enginespec.llm import LLM
from enginespec.metrics_reader import Counter, Gauge, Histogram, Vector
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

K = 4
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
# prompts that repeat themselves: the n-gram lookup drafts from the first decode on
PROMPTS = [{"prompt_token_ids": ([5, 9, 13] * 4)[: 6 + i]} for i in range(4)]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def _llm(**engine_args) -> LLM:
    return LLM(str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", num_blocks=64, **engine_args)


def _spec_figures(metrics) -> tuple[int, int, int, list[int]]:
    """vLLM's spec_decode example, verbatim in its logic: sum the counters by name, add the
    Vector's values position by position into a list of num_speculative_tokens entries."""
    num_drafts = num_draft_tokens = num_accepted_tokens = 0
    acceptance_counts = [0] * K
    for metric in metrics:
        if metric.name == "vllm:spec_decode_num_drafts":
            assert isinstance(metric, Counter)
            num_drafts += metric.value
        elif metric.name == "vllm:spec_decode_num_draft_tokens":
            assert isinstance(metric, Counter)
            num_draft_tokens += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            assert isinstance(metric, Counter)
            num_accepted_tokens += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            assert isinstance(metric, Vector)
            for pos in range(len(metric.values)):
                acceptance_counts[pos] += metric.values[pos]
    return num_drafts, num_draft_tokens, num_accepted_tokens, acceptance_counts


def test_get_metrics_gives_the_spec_decode_counters_as_vllms_example_reads_them():
    llm = _llm(speculative_config=NGRAM)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    drafts, draft_tokens, accepted, per_pos = _spec_figures(llm.get_metrics())
    samples = [c.spec_decode for o in outs for c in o.outputs]
    assert drafts == sum(s.num_drafts for s in samples) > 0
    assert draft_tokens == sum(s.num_draft_tokens for s in samples)
    assert 0 < accepted == sum(s.num_accepted_tokens for s in samples) == sum(per_pos)
    stats = llm.engine.stats.spec_decode
    assert per_pos == stats.accepted_per_pos + [0] * (K - len(stats.accepted_per_pos))
    vector = next(m for m in llm.get_metrics() if isinstance(m, Vector))
    assert len(vector.values) == K
    assert vector.labels == {"model_name": str(tiny_model_dir("qwen3")), "engine": "0"}
    assert llm.llm_engine.get_metrics() == llm.get_metrics()


def test_get_metrics_before_any_draft_has_a_zero_for_every_draft_position():
    """vLLM's per-position counters all exist from the start: before any step the Vector has
    num_speculative_tokens zeros (the engine's own list is empty until drafts come), and the
    example's loop reads zeros throughout."""
    llm = _llm(speculative_config=NGRAM)
    assert llm.engine.stats.spec_decode.accepted_per_pos == []  # the premise: nothing to copy
    (vector,) = [m for m in llm.get_metrics() if isinstance(m, Vector)]
    assert vector.values == [0] * K
    assert _spec_figures(llm.get_metrics()) == (0, 0, 0, [0] * K)


def test_get_metrics_without_speculation_has_the_engine_gauges_and_counters():
    llm = _llm()
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    metrics = {m.name: m for m in llm.get_metrics()}
    assert not any(name.startswith("vllm:spec_decode") for name in metrics)
    assert not any(isinstance(m, Histogram) for m in metrics.values())
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert isinstance(metrics[name], Gauge) and metrics[name].value == 0.0, name
    generated = metrics["vllm:generation_tokens"]
    assert isinstance(generated, Counter)
    assert generated.value == sum(len(o.outputs[0].token_ids) for o in outs) == 4 * 24
    queries = metrics["vllm:prefix_cache_queries"].value
    assert queries == sum(len(p["prompt_token_ids"]) for p in PROMPTS)
    assert 0 <= metrics["vllm:prefix_cache_hits"].value <= queries
    assert metrics["vllm:num_preemptions"].value == 0


def test_get_metrics_mid_run_sees_the_running_requests():
    llm = _llm()
    engine = llm.llm_engine
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, GREEDY)
    engine.step()
    metrics = {m.name: m.value for m in llm.get_metrics() if isinstance(m, Gauge)}
    assert metrics["vllm:num_requests_running"] == 4.0 and metrics["vllm:num_requests_waiting"] == 0.0
    assert 0.0 < metrics["vllm:kv_cache_usage_perc"] < 1.0
    engine.abort_request([str(i) for i in range(4)])


def _counters(llm: LLM) -> dict:
    """{(name, finished_reason or None): value} of the snapshot's Counters."""
    return {
        (m.name, m.labels.get("finished_reason")): m.value
        for m in llm.get_metrics()
        if isinstance(m, Counter)
    }


def test_get_metrics_counts_prompt_tokens_and_finished_samples_by_reason():
    """vLLM's LLM.get_metrics() reads every vllm: metric of its registry, vllm:prompt_tokens and
    vllm:request_success{finished_reason} among them (a series at 0 for each reason from the
    start), so offline throughput scripts sum prompt and generation tokens from it. Both were
    missing: a lookup of "vllm:prompt_tokens" found nothing. A sample's prompt counts at its
    first token (a request aborted before one adds nothing); n > 1 counts n samples, as V1
    counts its child requests."""
    llm = _llm()
    fresh = _counters(llm)
    assert fresh[("vllm:prompt_tokens", None)] == 0
    assert {
        r: fresh[("vllm:request_success", r)] for r in ("stop", "length", "abort", "error")
    } == dict.fromkeys(("stop", "length", "abort", "error"), 0)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    probe = llm.generate({"prompt_token_ids": [9, 10, 11]}, greedy, use_tqdm=False)
    stop_id = probe[0].outputs[0].token_ids[2]  # so the greedy run below stops at its third token
    base = _counters(llm)
    outs = llm.generate(
        [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10, 11]}],
        [
            SamplingParams(max_tokens=3, n=2, temperature=1.0, seed=0, ignore_eos=True),
            SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[stop_id]),
        ],
        use_tqdm=False,
    )
    assert sorted(c.finish_reason for o in outs for c in o.outputs) == ["length", "length", "stop"]
    engine = llm.llm_engine
    engine.add_request("gone", {"prompt_token_ids": [12, 13, 14, 15, 16]}, GREEDY)
    engine.abort_request("gone")  # before any step: no token, no prompt counted
    while engine.has_unfinished_requests():
        engine.step()
    counters = {key: value - base[key] for key, value in _counters(llm).items()}
    assert counters[("vllm:prompt_tokens", None)] == 4 + 4 + 3
    assert counters[("vllm:generation_tokens", None)] == sum(
        len(c.token_ids) for o in outs for c in o.outputs
    )
    assert {r: counters[("vllm:request_success", r)] for r in ("stop", "length", "abort", "error")} == {
        "stop": 1,
        "length": 2,
        "abort": 1,
        "error": 0,
    }


def test_get_metrics_splits_the_prompt_tokens_by_source():
    """vllm:prompt_tokens_cached and vllm:prompt_tokens_by_source{source} offline too (vLLM's
    reader returns every vllm: counter): a 9-token prompt sent twice (block 4) is computed in
    full once, then served 8 tokens from the prefix cache."""
    llm = LLM(str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", num_blocks=64, block_size=4)
    for _ in range(2):
        llm.generate({"prompt_token_ids": [5, 6, 7, 8, 9, 10, 11, 12, 13]}, GREEDY, use_tqdm=False)
    by_source = {
        m.labels["source"]: m.value for m in llm.get_metrics() if m.name == "vllm:prompt_tokens_by_source"
    }
    assert by_source == {"local_compute": 10, "local_cache_hit": 8, "external_kv_transfer": 0}
    counters = _counters(llm)
    assert counters[("vllm:prompt_tokens_cached", None)] == 8 and counters[("vllm:prompt_tokens", None)] == 18


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_prompt_tokens_cached_counts_what_the_prefix_cache_served_in_every_step_mode(
    async_scheduling, preemption_mode
):
    """vllm:prompt_tokens_cached counts each sample's num_cached_tokens with its prompt, so once
    every sample has drawn a token it equals vllm:prefix_cache_hits (no prompt_logprobs here).
    A serial step (async_scheduling=False, or an async step the sampler cannot defer) applied
    its first token before the admission recorded the sample's num_cached_tokens, so a prompt
    the cache served whole in one step was counted as computed: 0 cached tokens while
    prefix_cache_hits said 8. The same holds when a small pool keeps preempting n=2 siblings,
    whose second sample finds the first one's prompt blocks."""
    prompt = {"prompt_token_ids": [5, 6, 7, 8, 9, 10, 11, 12, 13]}
    llm = _llm(async_scheduling=async_scheduling, block_size=4)
    for _ in range(2):
        llm.generate(prompt, GREEDY, use_tqdm=False)
    counters = _counters(llm)
    assert counters[("vllm:prefix_cache_hits", None)] == 8
    assert counters[("vllm:prompt_tokens_cached", None)] == 8

    tight = _tight_llm(async_scheduling=async_scheduling, preemption_mode=preemption_mode)
    prompts = [{"prompt_token_ids": [10 + i] + [20 + (7 * i + j) % 70 for j in range(10)]} for i in range(6)]
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True, n=2)
    outs = tight.generate(prompts, params, use_tqdm=False)
    counters = _counters(tight)
    assert counters[("vllm:num_preemptions", None)] > 0  # the premise: the pool is too small
    assert all(len(c.token_ids) == 14 for o in outs for c in o.outputs)
    assert counters[("vllm:prefix_cache_hits", None)] == 6 * 8  # each second sample: two blocks
    assert counters[("vllm:prompt_tokens_cached", None)] == 6 * 8


def _tight_llm(**engine_args) -> LLM:
    """The tiny Qwen3 on a 12-block pool of 4-token blocks: too small for the metrics tests' six
    requests at once, so they preempt."""
    return LLM(
        str(tiny_model_dir("qwen3")),
        dtype="float32",
        device="cpu",
        block_size=4,
        num_gpu_blocks_override=12,
        max_model_len=64,
        **engine_args,
    )


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_recomputed_tokens_are_what_preemption_threw_away_and_steps_are_the_batches_run(preemption_mode):
    """EngineStats.num_recomputed_tokens (the pressure benchmark's figure) counts positions
    computed again: with prefix caching off, each preemption by recompute throws away the
    num_computed_tokens its request had, and every such position is computed once more before
    the request finishes (however the preemptions nest, the sum of those counts); a swap throws
    nothing away. num_steps counts the steps that ran a batch. Both read against the schedules
    the scheduler returned."""
    tight = _tight_llm(async_scheduling=False, enable_prefix_caching=False, preemption_mode=preemption_mode)
    scheduler = tight.engine.scheduler
    schedule = scheduler.schedule
    thrown, batches = [], []

    def observed():
        computed = {r.request_id: r.num_computed_tokens for r in scheduler.running}
        output = schedule()
        thrown.extend(computed[r.request_id] for r in output.preempted)
        batches.extend([output] if output.scheduled else [])
        return output

    scheduler.schedule = observed
    prompts = [{"prompt_token_ids": [10 + i] + [20 + (7 * i + j) % 70 for j in range(10)]} for i in range(6)]
    outs = tight.generate(
        prompts, SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True), use_tqdm=False
    )
    assert all(len(o.outputs[0].token_ids) == 14 for o in outs)
    assert thrown and min(thrown) > 0  # the premise: requests were preempted midway
    stats = tight.engine.stats
    assert stats.num_recomputed_tokens == (sum(thrown) if preemption_mode == "recompute" else 0)
    assert stats.num_steps == len(batches)
