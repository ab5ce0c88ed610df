"""benchmarks/spec_decode.py's throughput phase on a CPU: tiny shape, a few requests. No timing
is asserted: every config and temperature is reported with its ratio to off, greedy output
equal to off's,
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
    args += ["--temperatures", "0", "0.6"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert spec_decode.main(args + ["--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    runs = json.loads(out.read_text())["throughput"]
    assert set(runs) == {"t0", "t0.6"}
    for temperature, results in runs.items():
        assert set(results) == {
            "off",
            "ngram_k4",
            "ngram_k4_nocutoff",
            "ngram_k4_rejected",
            "ngram_k4_disable2",
        }
        for name, entry in results.items():
            assert entry["throughput_vs_off"] > 0, (temperature, name)
            assert entry["output_tokens"] == entry["requested_output_tokens"], (temperature, name)
            assert entry.get("outputs_equal_to_off", temperature != "t0"), (temperature, name)
    greedy = runs["t0"]
    assert (
        greedy["ngram_k4_rejected"]["rejected_drafts"] and greedy["ngram_k4_rejected"]["num_draft_tokens"] > 0
    )
    assert greedy["ngram_k4_rejected"]["num_accepted_tokens"] == 0
    assert greedy["ngram_k4"]["num_accepted_tokens"] > 0
    assert greedy["ngram_k4_disable2"]["num_disabled_steps"] > 0
    assert greedy["ngram_k4_nocutoff"]["num_disabled_steps"] == 0
