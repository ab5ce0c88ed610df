"""The server's spec-decode metrics under vLLM's names follow the engine's cumulative
SpecDecodeStats, carried in each message's EngineState: each update adds what grew since the
last one, and the snapshot the engine process sends is a copy (its sender thread pickles it
later, while the engine goes on counting)."""

from __future__ import annotations

from types import SimpleNamespace

from enginespec.engine.core_messages import EngineState
from enginespec.engine.core_proc import _copy_spec_decode
from enginespec.engine.spec_decode import SpecDecodeStats
from enginespec.entrypoints.openai.engine_client import EngineClient
from enginespec.entrypoints.openai.metrics import ServerMetrics


def _value(metrics: ServerMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, {"model_name": "m", "engine": "0", **labels}) or 0.0


def test_front_end_publishes_spec_decode_counters():
    stats = SpecDecodeStats()
    metrics = ServerMetrics("m")
    client = EngineClient(SimpleNamespace(max_num_seqs=4), tokenizer=None, metrics=metrics)
    engine_stats = SimpleNamespace(spec_decode=stats)
    stats.observe(3, 2)
    stats.observe(1, 0)
    client._observe_state(EngineState(spec_decode=_copy_spec_decode(engine_stats)))
    stats.observe(3, 3)
    snapshot = _copy_spec_decode(engine_stats)
    stats.observe(2, 2)  # counted after the snapshot: not in this message
    client._observe_state(EngineState(spec_decode=snapshot))
    client._observe_state(EngineState(spec_decode=snapshot))  # nothing new: nothing added
    assert _value(metrics, "vllm:spec_decode_num_drafts_total") == 3
    assert _value(metrics, "vllm:spec_decode_num_draft_tokens_total") == 7
    assert _value(metrics, "vllm:spec_decode_num_accepted_tokens_total") == 5
    per_pos = [
        _value(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
        for i in range(3)
    ]
    assert per_pos == [2, 2, 1]
    assert snapshot.acceptance_rate_per_pos == [2 / 3, 1.0, 0.5]


def test_no_drafter_no_spec_decode_state():
    assert _copy_spec_decode(SimpleNamespace(spec_decode=None)) is None
    assert _copy_spec_decode(SimpleNamespace()) is None
