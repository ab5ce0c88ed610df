"""The server's spec-decode metrics under vLLM's names follow the engine's cumulative
SpecDecodeStats, carried in each message's EngineState: each update adds what grew since the
last one, and the snapshot the engine process sends is a copy (its sender thread pickles it
later, while the engine goes on counting)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

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
    metrics.engine_ready(64, {"block_size": "4"}, num_speculative_tokens=3)
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


def _families(metrics: ServerMetrics) -> dict[str, list]:
    """{family name: its samples} of the registry's spec-decode families."""
    return {f.name: f.samples for f in metrics.registry.collect() if f.name.startswith("vllm:spec_decode")}


def test_spec_decode_counters_exist_only_with_a_drafter_each_position_from_0():
    """As vLLM V1's SpecDecodingProm: without a speculative_config no spec-decode family at all
    (a dashboard's acceptance panel reads "no data", not a rate of 0 / 0 it would take for a
    drafter that never drafts); with one, the three counters and one per-position series for
    each of its num_speculative_tokens positions, at 0 from the start. The server showed the
    three counters on every server and the per-position series only once a draft was
    accepted at that position."""
    plain = ServerMetrics("m")
    plain.engine_ready(64, {"block_size": "4"})
    assert _families(plain) == {}
    drafting = ServerMetrics("m")
    drafting.engine_ready(64, {"block_size": "4"}, num_speculative_tokens=3)
    families = _families(drafting)
    assert set(families) == {
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
    }
    per_pos = [
        _value(drafting, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
        for i in range(3)
    ]
    positions = sorted(
        s.labels["position"]
        for s in families["vllm:spec_decode_num_accepted_tokens_per_pos"]
        if s.name.endswith("_total")
    )
    assert positions == ["0", "1", "2"] and per_pos == [0, 0, 0]


@pytest.mark.usefixtures("torch_one_thread")
def test_a_launched_drafting_engine_gives_its_server_a_series_per_draft_position():
    """The front end learns num_speculative_tokens from the built engine (EngineInfo, 0 without
    a drafter) and its /metrics makes the series that engine will feed before any request."""
    from enginespec.engine.engine_core import load_engine_tokenizer
    from enginespec.engine_args import EngineArgs
    from enginespec.testing.checkpoints import tiny_model_dir

    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    args = EngineArgs.from_kwargs(
        str(tiny_model_dir("qwen3")),
        device="cpu",
        dtype="float32",
        num_blocks=16,
        block_size=4,
        speculative_config=ngram,
    )
    metrics = ServerMetrics("m")
    client = EngineClient(args, load_engine_tokenizer(args), metrics, in_process=True, max_waiting=4)
    try:
        assert client.launch(timeout=120).num_speculative_tokens == 3
    finally:
        client.stop()
    per_pos = _families(metrics)["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert sorted(s.labels["position"] for s in per_pos if s.name.endswith("_total")) == ["0", "1", "2"]
