"""Prometheus metrics under vLLM's names, so dashboards built for vLLM read them unchanged.

Counters appear with prometheus_client's `_total` suffix (vllm:prompt_tokens_total, ...), as
vLLM's do. The server process writes them on its event loop as each engine message arrives
(engine_client.py): latencies are measured there, as a client would see them; the gauges and the
preemption and prefix-cache counters come from the engine's state in the message.

Speculative decoding (when the engine has a drafter): vllm:spec_decode_num_drafts,
_num_draft_tokens, _num_accepted_tokens and _num_accepted_tokens_per_pos{position} from the
engine's cumulative `EngineStats.spec_decode`.

A request of n > 1 counts as n in request_success and in the latency histograms (TTFT, queue
time, inter-token latency, e2e: each sample's own), as vLLM V1 counts its child requests.
Prefix-cache counters are in tokens, like vLLM's: queries every token of each looked-up request,
hits the tokens of the cached blocks found (core_proc._prefix_counters).
Queue time is from arrival to the start of the step whose outputs first carry the request's
tokens (the engine reports no admission time; with chunked prefill of a long prompt, or with
async scheduling's one-step lag, this overstates the queue time by the earlier steps).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (
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
    10.0,
    20.0,
    40.0,
    80.0,
)
_E2E_BUCKETS = (
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
)


class ServerMetrics:
    """Every metric of one server, in its own registry (several apps may live in one process)."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=r).labels(model_name)

        def counter(name, doc):
            return Counter(name, doc, labels, registry=r).labels(model_name)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(model_name)

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
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of admitted requests")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens")
        self._success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason",
            labels + ["finished_reason"],
            registry=r,
        )
        self._model_name = model_name
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds", "Arrival to first token", _LATENCY_BUCKETS
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds", "Time between token-carrying outputs", _LATENCY_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to final output", _E2E_BUCKETS
        )
        self.request_queue_time = histogram(
            "vllm:request_queue_time_seconds", "Arrival to the first step that produced output", _E2E_BUCKETS
        )

        self.spec_decode_num_drafts = counter(
            "vllm:spec_decode_num_drafts", "Verification steps of a request with at least one draft"
        )
        self.spec_decode_num_draft_tokens = counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens verified"
        )
        self.spec_decode_num_accepted_tokens = counter(
            "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted"
        )
        self._accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by draft position (0-based)",
            labels + ["position"],
            registry=r,
        )
        self._spec_seen = (0, 0, 0, [])  # the cumulative stats already counted

    def observe_spec_decode(self, stats) -> None:
        """Advance the spec-decode counters to an engine's cumulative SpecDecodeStats
        (engine/spec_decode/stats.py): each call adds what grew since the last one."""
        drafts, tokens, accepted, per_pos = self._spec_seen
        self.spec_decode_num_drafts.inc(max(0, stats.num_drafts - drafts))
        self.spec_decode_num_draft_tokens.inc(max(0, stats.num_draft_tokens - tokens))
        self.spec_decode_num_accepted_tokens.inc(max(0, stats.num_accepted_tokens - accepted))
        for pos, count in enumerate(stats.accepted_per_pos):
            seen = per_pos[pos] if pos < len(per_pos) else 0
            self._accepted_per_pos.labels(self._model_name, str(pos)).inc(max(0, count - seen))
        self._spec_seen = (
            stats.num_drafts,
            stats.num_draft_tokens,
            stats.num_accepted_tokens,
            list(stats.accepted_per_pos),
        )

    def request_success(self, finished_reason: str) -> None:
        self._success.labels(self._model_name, finished_reason).inc()
