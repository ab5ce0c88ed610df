"""The server's spec-decode metrics under vLLM's names follow the engine's cumulative
SpecDecodeStats: each counter update adds what grew since the last one."""

from __future__ import annotations

from types import SimpleNamespace

from enginespec.engine.spec_decode import SpecDecodeStats
from enginespec.entrypoints.openai.engine_loop import EngineLoop
from enginespec.entrypoints.openai.metrics import ServerMetrics


def _value(metrics: ServerMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, {"model_name": "m", **labels}) or 0.0


def test_engine_loop_publishes_spec_decode_counters():
    stats = SpecDecodeStats()
    engine = SimpleNamespace(
        args=SimpleNamespace(max_num_seqs=4, block_size=16),
        add_request=lambda request_id, prompt_token_ids, params: None,
        block_manager=SimpleNamespace(num_queries=0, num_hits=0),
        stats=SimpleNamespace(num_preemptions=0, spec_decode=stats),
    )
    metrics = ServerMetrics("m")
    loop = EngineLoop(engine, metrics)
    stats.observe(3, 2)
    stats.observe(1, 0)
    loop._update_counters()
    stats.observe(3, 3)
    loop._update_counters()
    loop._update_counters()  # nothing new: nothing added
    assert _value(metrics, "vllm:spec_decode_num_drafts_total") == 3
    assert _value(metrics, "vllm:spec_decode_num_draft_tokens_total") == 7
    assert _value(metrics, "vllm:spec_decode_num_accepted_tokens_total") == 5
    per_pos = [
        _value(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
        for i in range(3)
    ]
    assert per_pos == [2, 2, 1]
    assert stats.acceptance_rate_per_pos == [2 / 3, 1.0, 0.5]
