"""benchmarks/constrained_cost.py on a CPU: the tiny shape, two batch sizes, every case; each
run gives every request exactly --tokens outputs, the constrained ones within the regex (the
synthetic tokenizer spells token i "w{i}": `regex_held`), and each ratio is over its batch's
greedy."""

from __future__ import annotations

import json

import pytest

from benchmarks import constrained_cost

pytest.importorskip("xgrammar")


def test_every_case_runs_its_tokens_and_the_regex_holds(tmp_path, monkeypatch, torch_one_thread):
    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path / "synth"))
    out = tmp_path / "cc.json"
    argv = ["--shape", "tiny", "--device", "cpu", "--batches", "1,3", "--tokens", "5", "--out", str(out)]
    assert constrained_cost.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["case"]) for r in rows] == [
        (b, c) for b in (1, 3) for c in ("greedy", "t0.6", "bad_words", "bad_pair", "regex", "one_regex")
    ]
    for row in rows:
        assert row["output_lens"] == [5] and row["finish_reasons"] == ["length"]
        assert row["ms_per_step"] > 0
        assert len(row["walls_s"]) == 3 and sorted(row["walls_s"])[1] == row["wall_s"]  # the median
        if row["case"] == "greedy":
            assert row["over_greedy"] == 1.0
        assert row["regex_held"] is (True if "regex" in row["case"] else None)
        assert row["step_ms_median"] > 0 and row["wait_ms_median"] >= 0  # the traced run's decode steps
        # only a grammar or a two-token bad word makes a step resolve the one before first
        assert (row["num_resolved_first"] > 0) == (row["case"] in ("regex", "one_regex", "bad_pair")), row
