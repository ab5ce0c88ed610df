"""benchmarks/spec_decode.py's throughput phase on a CPU: tiny shape, a few requests. No timing
is asserted: every config is reported with its ratio to off and greedy output equal to off's,
the rejected-drafts config verifies drafts and accepts none, and the cut-off config drafts
nothing while the batch is at its bound."""

from __future__ import annotations

import json

import torch

from benchmarks import spec_decode


def test_throughput_phase_smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path / "synth"))
    out = tmp_path / "spec.json"
    args = ["--shape", "tiny", "--device", "cpu", "--skip-batch1", "--num-requests", "4"]
    args += ["--max-input-len", "48", "--max-output-len", "24", "--disable-by-batch-size", "2"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert spec_decode.main(args + ["--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    results = json.loads(out.read_text())["throughput"]
    assert set(results) == {"off", "ngram_k4", "ngram_k4_rejected", "ngram_k4_disable2"}
    for name, entry in results.items():
        assert entry["outputs_equal_to_off"], name
        assert entry["throughput_vs_off"] > 0 and entry["output_tokens"] == entry["requested_output_tokens"]
    rejected = results["ngram_k4_rejected"]
    assert rejected["rejected_drafts"] and rejected["num_draft_tokens"] > 0
    assert rejected["num_accepted_tokens"] == 0
    assert results["ngram_k4_disable2"]["num_disabled_steps"] > 0
