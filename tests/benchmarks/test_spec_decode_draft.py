"""benchmarks/spec_decode_draft.py on a CPU: tiny target and tiny drafts, end to end. No timing
is asserted: the report holds every config and batch size, greedy outputs equal speculation
off's, the cycle draft (same permutation as the target) has every draft accepted, and the
random draft is counted."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import spec_decode_draft


def test_draft_benchmark_smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path / "synth"))
    out = tmp_path / "draft.json"
    args = ["--shape", "tiny", "--draft-shape", "tiny", "--device", "cpu", "--batch-sizes", "1", "3"]
    args += ["--max-tokens", "6", "--passage-len", "24", "--k", "2", "--cache-dir", str(tmp_path / "ck")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert spec_decode_draft.main(args + ["--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"off", "draft_cycle_k2", "draft_random_k2"}
    for name, entry in results.items():
        for b in (1, 3):
            phase = entry[f"batch{b}"]
            assert phase["outputs_equal_to_off"], (name, b)
            assert phase["decode_ms_per_token"] > 0 and phase["speedup_vs_off"] > 0
            if name != "off":
                assert phase["num_draft_tokens"] > 0 and len(phase["acceptance_rate_per_pos"]) == 2
    for b in (1, 3):
        assert results["draft_cycle_k2"][f"batch{b}"]["acceptance_rate"] == pytest.approx(1.0)
