"""Prometheus metrics under vLLM's names, so dashboards built for vLLM read them unchanged.

Counters appear with prometheus_client's `_total` suffix (vllm:prompt_tokens_total, ...), as
vLLM's do. The server process writes them on its event loop as each engine message arrives
(engine_client.py): latencies are measured there, as a client would see them; the gauges and the
preemption and prefix-cache counters come from the engine's state in the message.

Labels, as vLLM V1's PrometheusStatLogger sets them (vllm/v1/metrics/loggers.py): every metric
carries model_name (the served name) and engine, the engine index, "0" here (one engine per
server; LABEL_NAMES decides the set), plus position on _num_accepted_tokens_per_pos and
finished_reason on request_success; vllm:cache_config_info carries the cache settings and engine.
vllm:request_success_total has a series at 0 for each finish reason this server gives from the
start (FINISHED_REASONS: stop, length, abort, error), as V1 makes one for each of its reasons
when its logger is built, so rate() over one reads 0 rather than nothing before the first
request of that kind: stop, length, abort (the client left or cancelled) and error (a step the
sample was part of failed, or the engine loop dropped the request: a 500 to the client). Newer
V1 releases may list further reasons (third-party copies quote a "repetition"); this engine has
none of them, so none is made up front (a reason outside the list still counts, its series
appearing with its first request).

Speculative decoding (only when the engine has a drafter, as V1 makes them only with a
speculative_config): vllm:spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens and
_num_accepted_tokens_per_pos{position} (a series at 0 for each draft position from the start)
from the engine's cumulative `EngineStats.spec_decode`.

A completion with echo and max_tokens 0 is answered its prompt alone (finish_reason "length",
usage.completion_tokens 0): the one token each sample draws for the prompt's logprobs is not
counted as generated, and the sample counts under "length" (RequestStream.prompt_only), so the
counters read as the usage and finish reasons the clients got. (vLLM's server answers that draw
as a completion token, and its metrics count it so: equally consistent, there.)
A request of n > 1 counts as n in request_success and in the latency histograms (TTFT, queue
time, inter-token latency, e2e: each sample's own), as vLLM V1 counts its child requests.
Prefix-cache counters are in tokens, like vLLM's: queries every prompt token of each request that
looked the cache up, hits the tokens of the cached blocks it found, recorded once a request at its
first admission (EngineCore._record_admission: not a lookup the pool could not admit yet, not a
preempted request's re-admission).
Queue time is from arrival to the start of the step whose outputs first carry the request's
tokens (the engine reports no admission time; with chunked prefill of a long prompt, or with
async scheduling's one-step lag, this overstates the queue time by the earlier steps).

Request-level histograms (vLLM V1's PrometheusStatLogger, vllm/v1/metrics/loggers.py, with the
intervals of vllm/v1/metrics/stats.py), observed once per sample that finishes through the
engine (a finish reason; not a client's abort, not a failed step), so their _count is e2e's:
- request_prompt_tokens, request_generation_tokens: the sample's prompt length and the tokens it
  carries; request_params_max_tokens: its max_tokens as sent (none observed when unset).
- request_prefill_time = first token - scheduled, request_decode_time = last token - first token,
  request_inference_time = last token - scheduled (= prefill + decode), where "scheduled" is the
  queue time's end above (so queue + prefill = TTFT) and the token times are those TTFT and the
  inter-token latency use: when this process received them (V1 uses the engine's output time,
  so our prefill also holds the hop from the engine process). A sample that finished without a
  token has none of these; request_time_per_output_token = decode / (tokens - 1), and 0 for a
  one-token sample, as V1's mean_time_per_output_token (so its _count is e2e's, and a mean over
  _sum / _count reads as a V1 server's).
- request_params_n and request_max_num_generation_tokens (the most tokens of its samples): once
  per request, when its last sample finishes, as V1 observes a parent request.
The token histograms use V1's 1-2-5 buckets up to max_model_len, so they exist once the engine
is built (engine_ready), as does vllm:cache_config_info (a gauge at 1 whose labels are the KV
cache settings this engine has, under V1's CacheConfig field names, plus V1's engine="0").
vllm:prompt_tokens_cached and vllm:prompt_tokens_by_source{source} (V1's PromptTokenStats: a
series at 0 for each of local_compute, local_cache_hit and external_kv_transfer from the start)
split the prompt tokens into those the prefix cache served and those computed. They come from
the engine's counts (EngineState), taken when a sample's first token is attached, so the same
message carries them and the output vllm:prompt_tokens counts here (only a request the client
left in that step's flight is counted by the engine and not here). No KV connector here:
external_kv_transfer stays 0.
iteration_tokens_total: once per engine step whose message carries news of a live request, the
prompt tokens of each sample whose first tokens it carries plus the tokens it carries (V1's
IterationStats: a prompt counts in the output that ends its prefill, not as its chunks run), so
its _sum is prompt_tokens + generation_tokens. vllm:prompt_tokens counts a sample's prompt at
that same output, as V1 does: a request aborted (or failed) before its first token adds nothing.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from enginespec import metrics_reader

# Every metric's labels (vLLM V1's labelnames): the served model name and the engine index, "0"
# here (one engine per server; V1 numbers its data-parallel engines 0, 1, ...). The per-position
# spec-decode counter and request_success add one label each (position, finished_reason), and
# vllm:cache_config_info has its own (the cache settings, plus engine).
LABEL_NAMES = ("model_name", "engine")
ENGINE_INDEX = "0"
# vllm:request_success's finished_reason values made at 0 when the server starts: vLLM V1's
# FinishReason strings (vllm/v1/engine/__init__.py), the offline snapshot's too. A reason outside
# them still counts (its series appears with its first request).
FINISHED_REASONS = metrics_reader.FINISHED_REASONS

# vLLM V1's bucket choices (vllm/v1/metrics/loggers.py), so quantiles read as a V1 server's do
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
# inter-token latency and the time per output token
_TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
# e2e latency, queue, prefill, decode and inference time (V1's request_latency_buckets)
_REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# the tokens of one engine step
_ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_N_BUCKETS = (1, 2, 5, 10, 20)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... while <= max_value (V1's buckets for token counts up to
    max_model_len): [1, 2, 5, 10, 20, 50, 100] for 100; [] below 1."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


def cache_config_info(info, args) -> dict[str, str]:
    """vllm:cache_config_info's labels, under V1's CacheConfig field names, str() of each value
    as V1's CacheConfig.metrics_info renders them: only the fields this engine has (info: the
    EngineInfo of the built engine; args: its EngineArgs). num_gpu_blocks is the KV pool's
    block count, on the device or (device cpu) in host memory."""
    return {
        "block_size": str(info.block_size),
        "num_gpu_blocks": str(info.num_blocks),
        "num_gpu_blocks_override": str(args.num_gpu_blocks_override),
        "enable_prefix_caching": str(args.enable_prefix_caching),
        "cache_dtype": str(args.kv_cache_dtype),
    }


class _TokenHistograms(NamedTuple):
    """The histograms of token counts, whose 1-2-5 buckets reach max_model_len."""

    prompt: Histogram
    generation: Histogram
    max_num_generation: Histogram
    max_tokens: Histogram


class _SpecDecodeCounters(NamedTuple):
    """The spec-decode counters (a server whose engine has a drafter); per_pos is the family,
    labelled position besides LABEL_NAMES."""

    drafts: Counter
    draft_tokens: Counter
    accepted_tokens: Counter
    per_pos: Counter


class ServerMetrics:
    """Every metric of one server, in its own registry (several apps may live in one process)."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self._label_values = (model_name, ENGINE_INDEX)  # LABEL_NAMES' values, in order

        def gauge(name, doc):
            return self._labelled(Gauge, name, doc)

        def counter(name, doc):
            return self._labelled(Counter, name, doc)

        def histogram(name, doc, buckets):
            return self._labelled(Histogram, name, doc, buckets=buckets)

        self.num_requests_running = gauge("vllm:num_requests_running", "Requests in the running batch")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled")
        self.kv_cache_usage_perc = gauge(
            "vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full)"
        )
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache"
        )
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache")
        self.num_preemptions = counter("vllm:num_preemptions", "Preemptions")
        self.prompt_tokens = counter(
            "vllm:prompt_tokens", "Prompt tokens of samples whose prefill produced a token"
        )
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens")
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Prompt tokens (of vllm:prompt_tokens) the prefix cache served"
        )
        by_source = self._family(Counter, "vllm:prompt_tokens_by_source", "Prompt tokens by source", "source")
        self._by_source = [
            by_source.labels(*self._label_values, s) for s in metrics_reader.PROMPT_TOKEN_SOURCES
        ]
        self._success = self._family(
            Counter, "vllm:request_success", "Finished requests by finish reason", "finished_reason"
        )
        for reason in FINISHED_REASONS:  # every series from the start, at 0, as V1 makes them
            self._success.labels(*self._label_values, reason)
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds", "Arrival to first token", _TTFT_BUCKETS
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds", "Time between token-carrying outputs", _TOKEN_LATENCY_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to final output", _REQUEST_LATENCY_BUCKETS
        )
        self.request_queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Arrival to the first step that produced output",
            _REQUEST_LATENCY_BUCKETS,
        )

        self.spec_decode: Optional[_SpecDecodeCounters] = None  # engine_ready, with a drafter
        self._spec_seen = (0, 0, 0, [])  # the cumulative stats already counted

        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Prompt tokens of samples whose first tokens a step carries, plus its generated tokens",
            _ITERATION_TOKEN_BUCKETS,
        )
        self.request_params_n = histogram("vllm:request_params_n", "The n of finished requests", _N_BUCKETS)
        self.request_prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Scheduled to first token, per sample",
            _REQUEST_LATENCY_BUCKETS,
        )
        self.request_decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "First token to last token, per sample",
            _REQUEST_LATENCY_BUCKETS,
        )
        self.request_inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Scheduled to last token, per sample",
            _REQUEST_LATENCY_BUCKETS,
        )
        self.request_time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Decode time over the tokens after the first, per finished sample (0 for one token)",
            _TOKEN_LATENCY_BUCKETS,
        )
        self.token_histograms: Optional[_TokenHistograms] = None  # engine_ready makes them

    def _family(self, cls, name: str, doc: str, *extra: str, **kwargs):
        """A metric labelled LABEL_NAMES + extra, in this server's registry (unlabelled: the caller
        makes its series with labels(*self._label_values, *extra values))."""
        return cls(name, doc, [*LABEL_NAMES, *extra], registry=self.registry, **kwargs)

    def _labelled(self, cls, name: str, doc: str, **kwargs):
        """The one series of a metric labelled LABEL_NAMES only."""
        return self._family(cls, name, doc, **kwargs).labels(*self._label_values)

    def engine_ready(
        self, max_model_len: int, cache_config: dict[str, str], num_speculative_tokens: int = 0
    ) -> None:
        """Make what needs the built engine: the token histograms (1-2-5 buckets up to
        max_model_len), vllm:cache_config_info, a gauge at 1 labelled with cache_config (V1's
        CacheConfig field names -> str(value)) and engine="0", and with a drafter
        (num_speculative_tokens > 0) the spec-decode counters, as V1's SpecDecodingProm makes
        them only with a speculative_config: one per-position series for each draft position,
        at 0 from the start. Once per ServerMetrics (a second call is a ValueError: the names
        are registered)."""
        if num_speculative_tokens > 0:
            self.spec_decode = self._make_spec_decode(num_speculative_tokens)
        buckets = build_1_2_5_buckets(max_model_len)

        def tokens(name, doc):
            return self._labelled(Histogram, name, doc, buckets=buckets)

        self.token_histograms = _TokenHistograms(
            tokens("vllm:request_prompt_tokens", "Prompt tokens, per finished sample"),
            tokens("vllm:request_generation_tokens", "Generated tokens, per finished sample"),
            tokens(
                "vllm:request_max_num_generation_tokens",
                "The most generated tokens of a finished request's samples",
            ),
            tokens("vllm:request_params_max_tokens", "The max_tokens of finished samples (where set)"),
        )
        labels = {**cache_config, "engine": ENGINE_INDEX}
        info = Gauge(
            "vllm:cache_config_info", "The engine's KV cache settings", list(labels), registry=self.registry
        )
        info.labels(**labels).set(1)

    def _make_spec_decode(self, num_speculative_tokens: int) -> _SpecDecodeCounters:
        """vLLM V1's spec-decode counters (vllm/v1/spec_decode/metrics.py, SpecDecodingProm)."""
        counters = _SpecDecodeCounters(
            self._labelled(
                Counter,
                "vllm:spec_decode_num_drafts",
                "Verification steps of a request with at least one draft",
            ),
            self._labelled(Counter, "vllm:spec_decode_num_draft_tokens", "Draft tokens verified"),
            self._labelled(Counter, "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted"),
            self._family(
                Counter,
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Draft tokens accepted, by draft position (0-based)",
                "position",
            ),
        )
        for pos in range(num_speculative_tokens):
            counters.per_pos.labels(*self._label_values, str(pos))
        return counters

    def observe_finished_sample(
        self, num_prompt_tokens: int, num_generation_tokens: int, max_tokens: Optional[int]
    ) -> None:
        """The token histograms of one finished sample (nothing before engine_ready); max_tokens
        None or 0 is not observed (V1 observes a set max_tokens only)."""
        h = self.token_histograms
        if h is None:
            return
        h.prompt.observe(num_prompt_tokens)
        h.generation.observe(num_generation_tokens)
        if max_tokens:
            h.max_tokens.observe(max_tokens)

    def observe_phases(self, scheduled: float, first: float, last: float, num_generation_tokens: int) -> None:
        """Prefill, decode and inference time of one finished sample that got tokens (scheduled <=
        first <= last, monotonic seconds), and its time per output token: decode over the tokens
        after the first, 0 for a one-token sample (V1's mean_time_per_output_token, observed for
        every finished request)."""
        decode = last - first
        self.request_prefill_time.observe(first - scheduled)
        self.request_decode_time.observe(decode)
        self.request_inference_time.observe(last - scheduled)
        per_token = decode / (num_generation_tokens - 1) if num_generation_tokens > 1 else 0.0
        self.request_time_per_output_token.observe(per_token)

    def observe_finished_request(self, n: int, max_num_generation_tokens: int) -> None:
        """A request whose samples all finished: its n, and the most tokens one sample got."""
        self.request_params_n.observe(n)
        if self.token_histograms is not None:
            self.token_histograms.max_num_generation.observe(max_num_generation_tokens)

    def observe_spec_decode(self, stats) -> None:
        """Advance the spec-decode counters to an engine's cumulative SpecDecodeStats
        (engine/spec_decode/stats.py): each call adds what grew since the last one. Nothing
        before engine_ready made them (an engine without a drafter sends no such stats)."""
        counters = self.spec_decode
        if counters is None:
            return
        drafts, tokens, accepted, per_pos = self._spec_seen
        counters.drafts.inc(max(0, stats.num_drafts - drafts))
        counters.draft_tokens.inc(max(0, stats.num_draft_tokens - tokens))
        counters.accepted_tokens.inc(max(0, stats.num_accepted_tokens - accepted))
        for pos, count in enumerate(stats.accepted_per_pos):
            seen = per_pos[pos] if pos < len(per_pos) else 0
            counters.per_pos.labels(*self._label_values, str(pos)).inc(max(0, count - seen))
        self._spec_seen = (
            stats.num_drafts,
            stats.num_draft_tokens,
            stats.num_accepted_tokens,
            list(stats.accepted_per_pos),
        )

    def observe_prompt_sources(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        """The engine's newly counted prompt tokens (samples at their first tokens) and those of
        them the prefix cache served: vllm:prompt_tokens_cached, and prompt_tokens_by_source's
        local_cache_hit and local_compute (the rest); external_kv_transfer stays 0."""
        self.prompt_tokens_cached.inc(num_cached_tokens)
        self._by_source[0].inc(max(0, num_prompt_tokens - num_cached_tokens))
        self._by_source[1].inc(num_cached_tokens)

    def request_success(self, finished_reason: str) -> None:
        self._success.labels(*self._label_values, finished_reason).inc()
