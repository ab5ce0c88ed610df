"""vLLM V1's request-level histograms in /metrics (entrypoints/openai/metrics.py): token counts and
request parameters per finished sample or request, tokens per engine step, the prefill / decode /
inference intervals, and vllm:cache_config_info. The app runs over an in-process engine (the
spawned one's loop and pipes, on a thread) and is scraped through its own /metrics route. Timings
are checked only for their relations (queue + prefill = TTFT, prefill + decode = inference, none
negative)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from enginespec.engine.core_messages import NewRequest
from enginespec.engine.engine_core import load_engine_tokenizer
from enginespec.engine_args import EngineArgs
from enginespec.entrypoints.openai import metrics as metrics_module
from enginespec.entrypoints.openai.api_server import build_app
from enginespec.entrypoints.openai.engine_client import EngineClient
from enginespec.entrypoints.openai.metrics import ServerMetrics
from enginespec.entrypoints.openai.serving import ServerContext
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir
from tests.entrypoints.client_helpers import final_output

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4, block_size=4)

# (prompt ids, n, max_tokens), run one after another; every sample runs to max_tokens (ignore_eos)
REQUESTS = [([5, 6, 7, 8, 9, 10, 11], 1, 5), ([12, 13, 14, 15], 2, 3), ([16, 17, 18], 1, 1)]
SAMPLES = [(len(prompt), max_tokens) for prompt, n, max_tokens in REQUESTS for _ in range(n)]


@pytest.fixture(scope="module")
def scraped():
    """(samples of /metrics before REQUESTS, after them, the engine's EngineInfo, and the /metrics
    text before REQUESTS: a fresh server's)."""
    args = EngineArgs.from_kwargs(str(tiny_model_dir("qwen3")), **ENGINE)
    tokenizer = load_engine_tokenizer(args)
    metrics = ServerMetrics("tiny")
    client = EngineClient(args, tokenizer, metrics, in_process=True, max_waiting=16)
    info = client.launch(timeout=120)
    try:
        app = build_app(ServerContext(client, tokenizer, ["tiny"], info.max_model_len), metrics)
        before_text, after_text = asyncio.run(_run(client, app))
    finally:
        client.stop()
    return SimpleNamespace(
        before=_samples(before_text), after=_samples(after_text), info=info, before_text=before_text
    )


async def _run(client: EngineClient, app) -> tuple[str, str]:
    client.start(asyncio.get_running_loop())  # the lifespan's job (ASGITransport runs none)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as http:
        before = (await http.get("/metrics")).text
        for prompt, n, max_tokens in REQUESTS:
            body = dict(prompt=prompt, n=n, max_tokens=max_tokens, ignore_eos=True, temperature=1.0, seed=0)
            resp = await http.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["completion_tokens"] == n * max_tokens
        after = (await http.get("/metrics")).text
    return before, after


def _samples(text: str) -> dict[tuple, float]:
    """{(sample name, its labels but model_name, sorted): value} of a /metrics text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def _grew(scraped, name: str, **labels) -> float:
    """How much a sample grew over REQUESTS (a sample not yet shown before counts from 0); labels
    besides model_name, engine="0" by default."""
    key = (name, tuple(sorted({"engine": "0", **labels}.items())))
    return scraped.after[key] - scraped.before.get(key, 0.0)


def _bounds(scraped, name: str) -> list[str]:
    return [dict(labels)["le"] for n, labels in scraped.after if n == f"{name}_bucket"]


def test_token_histograms_observe_each_finished_sample(scraped):
    assert _grew(scraped, "vllm:request_prompt_tokens_count") == len(SAMPLES) == 4
    assert _grew(scraped, "vllm:request_prompt_tokens_sum") == sum(p for p, _ in SAMPLES) == 7 + 4 + 4 + 3
    assert _grew(scraped, "vllm:request_generation_tokens_count") == 4
    assert _grew(scraped, "vllm:request_generation_tokens_sum") == sum(g for _, g in SAMPLES) == 12
    assert _grew(scraped, "vllm:generation_tokens_total") == 12
    assert _grew(scraped, "vllm:request_params_max_tokens_count") == 4
    assert _grew(scraped, "vllm:request_params_max_tokens_sum") == 5 + 3 + 3 + 1
    assert _grew(scraped, "vllm:request_params_max_tokens_bucket", le="2.0") == 1  # max_tokens=1
    assert _grew(scraped, "vllm:request_params_max_tokens_bucket", le="5.0") == 4


def test_request_histograms_observe_each_finished_request(scraped):
    assert _grew(scraped, "vllm:request_params_n_count") == len(REQUESTS) == 3
    assert _grew(scraped, "vllm:request_params_n_sum") == 1 + 2 + 1
    assert _grew(scraped, "vllm:request_params_n_bucket", le="1.0") == 2
    assert _grew(scraped, "vllm:request_params_n_bucket", le="2.0") == 3
    assert _grew(scraped, "vllm:request_max_num_generation_tokens_count") == 3
    assert _grew(scraped, "vllm:request_max_num_generation_tokens_sum") == 5 + 3 + 1


def test_iteration_tokens_are_each_steps_started_prompts_and_generated_tokens(scraped):
    prompts = sum(p for p, _ in SAMPLES)
    assert _grew(scraped, "vllm:iteration_tokens_total_sum") == prompts + 12
    assert _grew(scraped, "vllm:prompt_tokens_total") == prompts
    assert _grew(scraped, "vllm:iteration_tokens_total_count") >= 5 + 3 + 1  # one step per token at least
    want = [str(float(b)) for b in (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
    assert _bounds(scraped, "vllm:iteration_tokens_total") == [*want, "+Inf"]


def test_token_buckets_are_1_2_5_up_to_max_model_len(scraped):
    build = metrics_module.build_1_2_5_buckets
    assert build(100) == [1, 2, 5, 10, 20, 50, 100] and build(99) == [1, 2, 5, 10, 20, 50] and build(0) == []
    max_model_len = scraped.info.max_model_len
    want = [b for b in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000) if b <= max_model_len]
    assert max_model_len < 20000 and len(want) >= 4
    for name in ("prompt_tokens", "generation_tokens", "max_num_generation_tokens", "params_max_tokens"):
        assert _bounds(scraped, f"vllm:request_{name}") == [*(str(float(b)) for b in want), "+Inf"]


def test_phases_sum_up_and_none_is_negative(scraped):
    """Prefill, decode and inference per finished sample with tokens (all 4), and so the time per
    output token (checked below)."""
    phases = ("prefill", "decode", "inference")
    counts = [_grew(scraped, f"vllm:request_{p}_time_seconds_count") for p in phases]
    assert counts == [4, 4, 4]
    prefill, decode, inference = (_grew(scraped, f"vllm:request_{p}_time_seconds_sum") for p in phases)
    assert (
        min(prefill, decode, inference, _grew(scraped, "vllm:request_time_per_output_token_seconds_sum")) >= 0
    )
    assert prefill + decode == pytest.approx(inference, rel=1e-9, abs=1e-9)
    queue = _grew(scraped, "vllm:request_queue_time_seconds_sum")
    ttft = _grew(scraped, "vllm:time_to_first_token_seconds_sum")
    assert queue >= 0 and queue + prefill == pytest.approx(ttft, rel=1e-9, abs=1e-9)
    # each sample finished with its last token: its e2e latency is its queue time plus its
    # inference time (arrival -> scheduled -> last token), to the rounding
    e2e = _grew(scraped, "vllm:e2e_request_latency_seconds_sum")
    assert queue + inference == pytest.approx(e2e, rel=1e-9, abs=1e-9)
    assert _bounds(scraped, "vllm:request_inference_time_seconds")[-4:] == [
        "960.0",
        "1920.0",
        "7680.0",
        "+Inf",
    ]


def test_time_per_output_token_observes_every_finished_sample_a_one_token_one_at_0(scraped):
    """vllm:request_time_per_output_token_seconds is observed once per finished sample, as vLLM
    V1 observes each finished request's mean_time_per_output_token (vllm/v1/metrics/stats.py:
    decode / (tokens - 1), 0 for a one-token request), so its _count is e2e's and a mean over
    _sum / _count reads as a V1 server's. The max_tokens=1 sample went unobserved (count 3, not
    4): a workload of short answers read a higher mean and a smaller count than vLLM shows."""
    count = _grew(scraped, "vllm:request_time_per_output_token_seconds_count")
    assert count == _grew(scraped, "vllm:e2e_request_latency_seconds_count") == len(SAMPLES) == 4
    # the one-token sample's 0 sits in the lowest bucket; the others' decode time is not 0
    assert _grew(scraped, "vllm:request_time_per_output_token_seconds_bucket", le="0.01") >= 1


def test_cache_config_info_names_the_kv_pool(scraped):
    info = [labels for name, labels in scraped.after if name == "vllm:cache_config_info"]
    assert len(info) == 1
    labels = dict(info[0])
    assert labels["block_size"] == "4" and labels["num_gpu_blocks"] == str(scraped.info.num_blocks)
    assert labels["enable_prefix_caching"] == "True" and labels["engine"] == "0"
    assert scraped.after[("vllm:cache_config_info", info[0])] == 1.0


def test_latency_buckets_are_v1s(scraped):
    """The latency histograms' buckets are vLLM V1's, so quantiles over them read the same."""
    ttft = _bounds(scraped, "vllm:time_to_first_token_seconds")
    assert ttft[:2] == ["0.001", "0.005"] and ttft[-6:] == [
        "40.0",
        "80.0",
        "160.0",
        "640.0",
        "2560.0",
        "+Inf",
    ]
    assert "7.5" in ttft and len(ttft) == 22 + 1
    itl = _bounds(scraped, "vllm:inter_token_latency_seconds")
    assert itl == _bounds(scraped, "vllm:request_time_per_output_token_seconds")
    assert (
        itl[:4] == ["0.01", "0.025", "0.05", "0.075"] and itl[-2:] == ["80.0", "+Inf"] and len(itl) == 19 + 1
    )
    for name in ("e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time"):
        bounds = _bounds(scraped, f"vllm:{name}_seconds")
        assert (
            bounds[0] == "0.3"
            and bounds[-4:] == ["960.0", "1920.0", "7680.0", "+Inf"]
            and len(bounds) == 21 + 1
        )


def test_a_fresh_server_labels_every_metric_with_the_engine_and_counts_each_reason_from_0(scraped):
    """Before any request, as vLLM V1's PrometheusStatLogger: every vllm: sample is labelled with
    engine="0" (and model_name, but the cache settings' vllm:cache_config_info), and
    vllm:request_success_total has a series at 0 for each of V1's finish reasons."""
    families = [f for f in text_string_to_metric_families(scraped.before_text) if f.name.startswith("vllm:")]
    assert len(families) >= 20
    # no drafter: no spec-decode family, as V1 makes them only with a speculative_config
    assert not [f.name for f in families if f.name.startswith("vllm:spec_decode")]
    for family in families:
        for sample in family.samples:
            assert sample.labels.get("engine") == "0", (sample.name, sample.labels)
            if family.name != "vllm:cache_config_info":
                assert sample.labels.get("model_name") == "tiny", (sample.name, sample.labels)
    success = {
        s.labels["finished_reason"]: s.value
        for f in families
        for s in f.samples
        if s.name == "vllm:request_success_total"
    }
    assert success == dict.fromkeys(("stop", "length", "abort", "error"), 0.0)


def _value(metrics: ServerMetrics, name: str, **labels) -> float:
    """One sample of `metrics`' registry (engine="0" and model_name="tiny" added), 0 when absent."""
    value = metrics.registry.get_sample_value(name, {"engine": "0", "model_name": "tiny", **labels})
    return value or 0.0


def test_prompt_tokens_count_prefilled_prompts_not_requests_aborted_in_the_queue():
    """vllm:prompt_tokens_total counts a sample's prompt once its prefill produced a token (vLLM
    V1's IterationStats), so a request whose client left while it waited (the engine paused: it
    never ran) adds nothing, and iteration_tokens_total's _sum stays prompt + generation tokens.
    (It counted the prompt of every admitted request: prefill throughput read high under exactly
    the overload where clients time out in the queue.)"""
    args = EngineArgs.from_kwargs(str(tiny_model_dir("qwen3")), **ENGINE)
    metrics = ServerMetrics("tiny")
    client = EngineClient(args, load_engine_tokenizer(args), metrics, in_process=True, max_waiting=16)
    client.launch(timeout=120)
    names = ("vllm:prompt_tokens_total", "vllm:iteration_tokens_total_sum", "vllm:generation_tokens_total")

    async def run() -> list[float]:
        client.start(asyncio.get_running_loop())
        await client.pause()
        params = SamplingParams(max_tokens=4, n=2, temperature=1.0, seed=0)
        gone = await client.submit([NewRequest("gone", None, [5, 6, 7, 8, 9], params)])
        gone.abort()  # the client left while its request waited
        await client.resume()
        kept = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0)
        await final_output(await client.submit([NewRequest("kept", None, [5, 6, 7], kept)]))
        return [_value(metrics, name) for name in names]

    try:
        prompt, iteration, generated = asyncio.run(run())
    finally:
        client.stop()
    assert _value(metrics, "vllm:request_success_total", finished_reason="abort") == 2
    assert (prompt, generated) == (3, 2)  # the kept request's alone
    assert iteration == prompt + generated


SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


def test_prompt_tokens_by_source_split_each_prompt_into_computed_and_cached():
    """vLLM V1's vllm:prompt_tokens_cached and vllm:prompt_tokens_by_source{source}
    (PromptTokenStats, counted at a request's first output): the prompt tokens the prefix cache
    served and the ones computed, so the three sources sum to vllm:prompt_tokens. A 9-token
    prompt sent twice (block 4) is computed in full the first time, and 8 of its tokens come
    from the cache the second (the block holding its last token is always computed). Neither
    family existed: a V1 dashboard's cached-prompt share read "no data"."""
    args = EngineArgs.from_kwargs(str(tiny_model_dir("qwen3")), **ENGINE)
    metrics = ServerMetrics("tiny")
    client = EngineClient(args, load_engine_tokenizer(args), metrics, in_process=True, max_waiting=16)
    client.launch(timeout=120)
    fresh = [_value(metrics, "vllm:prompt_tokens_by_source_total", source=s) for s in SOURCES]
    assert fresh == [0, 0, 0] and _value(metrics, "vllm:prompt_tokens_cached_total") == 0
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]

    async def run() -> None:
        client.start(asyncio.get_running_loop())
        params = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0)
        for i in range(2):
            await final_output(await client.submit([NewRequest(f"r{i}", None, prompt, params)]))

    try:
        asyncio.run(run())
    finally:
        client.stop()
    by_source = {s: _value(metrics, "vllm:prompt_tokens_by_source_total", source=s) for s in SOURCES}
    assert by_source == {"local_compute": 9 + 1, "local_cache_hit": 8, "external_kv_transfer": 0}
    assert _value(metrics, "vllm:prompt_tokens_cached_total") == 8
    assert sum(by_source.values()) == _value(metrics, "vllm:prompt_tokens_total") == 18


def test_an_echo_of_the_prompt_alone_counts_as_its_client_is_answered():
    """echo with max_tokens 0 (lm-evaluation-harness's log-likelihood call) answers each choice
    with its prompt alone: finish_reason "length", usage.completion_tokens 0, whatever the one
    token the engine draws to get the prompt's logprobs. /metrics counted that draw as the
    client's: a generated token per sample, and the sample under "stop" when the draw was EOS,
    so after a churn of such calls the counters disagreed with the usage and the finish reasons
    every client got. They now count what the client is answered (the prompt still counts)."""
    prompt = [5, 6, 7, 8, 9]
    # the draw is EOS (id 3): the engine finishes both samples with "stop"
    body = dict(prompt=prompt, n=2, max_tokens=0, echo=True, logprobs=1, logit_bias={"3": 100})
    (resp,), metrics = _serve_one([body])
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert [c["finish_reason"] for c in answer["choices"]] == ["length", "length"]
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    success = {
        r: _value(metrics, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length")
    }
    assert success == {"stop": 0, "length": 2}
    assert _value(metrics, "vllm:generation_tokens_total") == 0
    assert _value(metrics, "vllm:prompt_tokens_total") == 2 * len(prompt)
    assert _value(metrics, "vllm:request_generation_tokens_sum") == 0
    assert _value(metrics, "vllm:request_params_max_tokens_count") == 0  # 0 as sent: not observed
    assert _value(metrics, "vllm:iteration_tokens_total_sum") == 2 * len(prompt)


def _serve_one(bodies, monkeypatch=None, refuse=None) -> tuple[list, ServerMetrics]:
    """POST each of `bodies` to /v1/completions of a fresh in-process server, in turn: (the
    responses, its ServerMetrics). refuse: an exception EngineClient.submit raises instead."""
    args = EngineArgs.from_kwargs(str(tiny_model_dir("qwen3")), **ENGINE)
    tokenizer = load_engine_tokenizer(args)
    metrics = ServerMetrics("tiny")
    client = EngineClient(args, tokenizer, metrics, in_process=True, max_waiting=16)
    info = client.launch(timeout=120)
    app = build_app(ServerContext(client, tokenizer, ["tiny"], info.max_model_len), metrics)

    async def run() -> list:
        client.start(asyncio.get_running_loop())
        if refuse is not None:

            async def refusing(*args, **kwargs):
                raise refuse

            monkeypatch.setattr(client, "submit", refusing)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as http:
            return [await http.post("/v1/completions", json=body) for body in bodies]

    try:
        return asyncio.run(run()), metrics
    finally:
        client.stop()


def test_a_request_observes_the_most_tokens_one_of_its_samples_got():
    """vllm:request_max_num_generation_tokens takes, once per request, the most tokens one of its
    n samples generated (vLLM V1's max_num_generation_tokens), not the fewest: n=2 samples that
    stop at different lengths (stop ids, seeded)."""
    bodies = [
        dict(
            prompt=[5, 6, 7],
            n=2,
            max_tokens=8,
            temperature=1.5,
            seed=seed,
            stop_token_ids=list(range(20, 60)),
            return_token_ids=True,
        )
        for seed in range(8)
    ]
    answers, metrics = _serve_one(bodies)
    lengths = []
    for resp in answers:
        assert resp.status_code == 200, resp.text
        lengths.append([len(c["token_ids"]) for c in resp.json()["choices"]])
    assert any(a != b for a, b in lengths), lengths  # the premise: samples of one request differ
    assert _value(metrics, "vllm:request_max_num_generation_tokens_sum") == sum(map(max, lengths))


def test_beam_search_steps_count_their_generated_tokens():
    """A use_beam_search request runs as engine requests of one step each (serving_beam), submitted
    without prompt_only: their drawn tokens count as generated (at least the answer's own)."""
    answers, metrics = _serve_one(
        [dict(prompt=[5, 6, 7], use_beam_search=True, n=2, max_tokens=4, temperature=0)]
    )
    assert answers[0].status_code == 200, answers[0].text
    assert _value(metrics, "vllm:generation_tokens_total") >= 4


@pytest.mark.parametrize("refusal", ["queue-full", "shutting-down"])
def test_a_refused_submit_is_a_503_in_vllms_error_shape(monkeypatch, refusal):
    """The engine client's refusals at submit: a full queue is a 503 with Retry-After (try again
    later), a server whose shutdown grace ran out before the engine accepted the request a 503
    without; both in vLLM's error shape."""
    from enginespec.entrypoints.openai.engine_client import QueueFull, ServerShuttingDown

    exc = QueueFull("the queue is full") if refusal == "queue-full" else ServerShuttingDown("shutting down")
    answers, _ = _serve_one([dict(prompt=[5, 6, 7], max_tokens=2)], monkeypatch, refuse=exc)
    resp = answers[0]
    assert resp.status_code == 503 and resp.json()["error"]["code"] == 503
    assert ("retry-after" in resp.headers) == (refusal == "queue-full")
