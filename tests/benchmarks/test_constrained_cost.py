"""benchmarks/constrained_cost.py on a CPU: the tiny shape, two batch sizes, every case; each
run gives every request exactly --tokens outputs, the constrained ones within the regex (the
synthetic tokenizer spells token i "w{i}": `regex_held`), and each ratio is over its batch's
greedy."""

from __future__ import annotations

import json

import pytest
import torch

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


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--batches", "0"], "--batches"),
        (["--batches=-1,2"], "--batches"),
        (["--batches", "a"], "--batches"),
        (["--tokens", "1"], "--tokens must be >= 2"),
        (["--tokens", "-2"], "--tokens must be >= 2"),
        (["--prompt-len", "0"], "--prompt-len must be >= 1"),
        (["--reps", "0"], "--reps must be >= 1"),
        (["--cases", "greedy,nope"], "--cases"),
        (["--device", "cuda"], "cuda") if not torch.cuda.is_available() else (["--batches", ""], "--batches"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2_before_any_work(flags, named, capsys, monkeypatch):
    """A batch of 0 used to 'run' (no requests, a negative ms/step, exit 0); --tokens 1 divided by
    zero after the whole run; the others were tracebacks. Now each is refused before a model is
    built (make_llm would fail the test), in one line naming the flag."""
    monkeypatch.setattr(constrained_cost, "make_llm", lambda *a, **k: pytest.fail("built an engine"))
    argv = ["--shape", "tiny", "--device", "cpu", "--batches", "1", "--tokens", "4"] + flags
    assert constrained_cost.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and "\n" not in err and "Traceback" not in err, err


def test_the_table_has_a_header_and_the_json_lands_in_a_new_folder(
    tmp_path, monkeypatch, capsys, torch_one_thread
):
    """--out in a folder that does not exist yet: the folder is made (it was a FileNotFoundError
    after the whole run), and the printed table starts with its header (columns and units)."""
    monkeypatch.setenv("ENGINESPEC_SYNTH_DIR", str(tmp_path / "synth"))
    out = tmp_path / "new" / "dir" / "cc.json"
    argv = ["--shape", "tiny", "--device", "cpu", "--batches", "1", "--cases", "greedy", "--tokens", "3"]
    assert constrained_cost.main(argv + ["--reps", "1", "--out", str(out)]) == 0
    assert [r["case"] for r in json.loads(out.read_text())["rows"]] == ["greedy"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| batch | case | ms/step |") and lines[1].startswith("| ---: |")
    assert lines[2].startswith("| 1 | greedy |") and lines[2].count("|") == lines[0].count("|")
