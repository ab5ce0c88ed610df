"""benchmarks/host_contention_probe.py runs on the CPU (--dry-run) and writes every call's idle
and busy medians."""

import json

from benchmarks import host_contention_probe as probe


def test_dry_run_writes_each_call(tmp_path):
    out = tmp_path / "probe.json"
    probe.main(["--dry-run", "--reps", "3", "--out", str(out)])
    rows = json.loads(out.read_text())["calls"]
    assert {"empty", "h2d_copy_4k", "index_row", "slice_row", "logits_linear"} <= set(rows)
    assert all(r["idle_us"] > 0 and r["busy_us"] > 0 for r in rows.values())
