"""vLLM's in-memory metrics reader (`vllm.v1.metrics.reader`): the types `LLM.get_metrics()` and
`LLMEngine.get_metrics()` return, and the snapshot they take.

vLLM's offline speculative-decoding example (examples/offline_inference/spec_decode.py) reads
its acceptance figures this way:

    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":            # a Counter
            num_drafts += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":  # a Vector
            for pos, count in enumerate(metric.values):
                acceptance_counts[pos] += count

Names, types and labels are vLLM's (`model_name`, `engine` "0"; counters without the `_total`
suffix Prometheus adds). The snapshot holds what the engine itself counts (EngineStats and its
scheduler and pool), since construction and from zero after the warm-up:
- gauges vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc;
- counters vllm:num_preemptions, vllm:prompt_tokens, vllm:prompt_tokens_cached (of them, those
  the prefix cache served), vllm:prompt_tokens_by_source labelled source (PROMPT_TOKEN_SOURCES:
  computed, cached, 0 received over a KV connector), vllm:generation_tokens,
  vllm:prefix_cache_queries, vllm:prefix_cache_hits, and vllm:request_success labelled
  finished_reason, one for each of FINISHED_REASONS from the start (at 0, as V1 makes a series
  for each of its reasons) and for any other reason a sample ended with. Per sample, as V1 counts
  the child requests of n > 1: a sample's prompt counts at its first token (a request aborted
  before one adds nothing), its finish once its request is done (finished or aborted);
- with a speculative_config, counters vllm:spec_decode_num_drafts, _num_draft_tokens,
  _num_accepted_tokens and the Vector vllm:spec_decode_num_accepted_tokens_per_pos, one value
  per draft position 0 .. num_speculative_tokens - 1 (zeros for positions not yet accepted at,
  as vLLM's per-position counters all exist from the start).
Latencies are measured where a client sees them: `enginespec serve`'s /metrics has them.
Histogram is here for code that tests isinstance against it (none is returned offline). vLLM
asserts its stat logging is on; these counters are always kept.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FINISHED_REASONS",
    "PROMPT_TOKEN_SOURCES",
    "Counter",
    "Gauge",
    "Histogram",
    "Metric",
    "Vector",
    "metrics_snapshot",
]

# vllm:request_success's finished_reason values shown from the start, at 0: vLLM V1's
# FinishReason strings (vllm/v1/engine/__init__.py) that this engine gives. The server's
# /metrics makes the same series (entrypoints/openai/metrics.py).
FINISHED_REASONS = ("stop", "length", "abort", "error")
# vllm:prompt_tokens_by_source's source values (vLLM V1's PromptTokenStats.ALL_SOURCES): the
# prompt tokens computed here, found in the prefix cache, and received over a KV connector (none
# here: always 0).
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


@dataclass
class Metric:
    """A metric's name and its key=value labels."""

    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    """A monotonically increasing integer counter."""

    value: int


@dataclass
class Vector(Metric):
    """An ordered array of integer counters (vllm:spec_decode_num_accepted_tokens_per_pos)."""

    values: list[int]


@dataclass
class Gauge(Metric):
    """A numerical value that can go up or down."""

    value: float


@dataclass
class Histogram(Metric):
    """Observations in buckets: upper limit ('+Inf' included) -> count."""

    count: int
    sum: float
    buckets: dict[str, int]


def metrics_snapshot(engine, model_name: str) -> list[Metric]:
    """The engine's metrics now (module doc), labelled model_name and engine "0". Call it
    between steps (LLM holds its lock)."""
    labels = {"model_name": model_name, "engine": "0"}
    stats, bm = engine.stats, engine.block_manager
    out: list[Metric] = [
        Gauge("vllm:num_requests_running", dict(labels), float(len(engine.scheduler.running))),
        Gauge("vllm:num_requests_waiting", dict(labels), float(len(engine.scheduler.waiting))),
        Gauge("vllm:kv_cache_usage_perc", dict(labels), float(bm.usage)),
        Counter("vllm:num_preemptions", dict(labels), int(stats.num_preemptions)),
        Counter("vllm:prompt_tokens", dict(labels), int(stats.num_prompt_tokens)),
        Counter("vllm:prompt_tokens_cached", dict(labels), int(stats.num_prompt_cached_tokens)),
        Counter("vllm:generation_tokens", dict(labels), int(stats.num_generated_tokens)),
        Counter("vllm:prefix_cache_queries", dict(labels), int(stats.num_prefix_queries)),
        Counter("vllm:prefix_cache_hits", dict(labels), int(stats.num_prefix_hits)),
    ]
    cached = int(stats.num_prompt_cached_tokens)
    by_source = (int(stats.num_prompt_tokens) - cached, cached, 0)  # PROMPT_TOKEN_SOURCES' order
    out += [
        Counter("vllm:prompt_tokens_by_source", {**labels, "source": source}, count)
        for source, count in zip(PROMPT_TOKEN_SOURCES, by_source)
    ]
    finished = {**dict.fromkeys(FINISHED_REASONS, 0), **stats.finish_reasons}
    out += [
        Counter("vllm:request_success", {**labels, "finished_reason": reason}, int(count))
        for reason, count in finished.items()
    ]
    spec = stats.spec_decode
    positions = getattr(engine, "num_draft_positions", 0)
    if spec is None or not positions:
        return out
    per_pos = list(spec.accepted_per_pos)[:positions]
    per_pos += [0] * (positions - len(per_pos))
    out += [
        Counter("vllm:spec_decode_num_drafts", dict(labels), int(spec.num_drafts)),
        Counter("vllm:spec_decode_num_draft_tokens", dict(labels), int(spec.num_draft_tokens)),
        Counter("vllm:spec_decode_num_accepted_tokens", dict(labels), int(spec.num_accepted_tokens)),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", dict(labels), per_pos),
    ]
    return out
