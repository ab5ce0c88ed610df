"""tools/mutation.py judges a mutant only when the mutant actually ran: a run that never imported
it is an error, not a survivor (an outsider's non-editable install reported every mutant as
survived: pytest's assertion rewriter loaded the real modules first)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mutation():
    spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation_tool"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules["mutation_tool"]


def _one_file_suite(mutation, monkeypatch):
    """The impl's own example tests alone (seconds), in place of the conformance selection."""
    monkeypatch.setattr(mutation, "SUITE", [])


def test_a_mutant_no_test_imports_is_an_error_not_a_survivor(mutation, monkeypatch, tmp_path):
    _one_file_suite(mutation, monkeypatch)
    source = tmp_path / "m.py"
    source.write_text("X = 1\n")
    env = {"MUTANT_MODULE": "enginespec.impls.fast.no_such_module", "MUTANT_SOURCE": str(source)}
    result = mutation.run_suite("fast", env, timeout=300)
    assert result.startswith("error") and "never imported" in result


def test_a_crashing_mutant_of_an_imported_module_is_killed(mutation, monkeypatch, tmp_path):
    _one_file_suite(mutation, monkeypatch)
    mutants = mutation.mutants_of("impls/fast/hashing.py")
    arithmetic = [m for m in mutants if "Add" in m.what or "Sub" in m.what]
    assert arithmetic, [m.what for m in mutants]
    _, result = mutation.judge(arithmetic[0], "fast", 300, tmp_path)
    assert result == "killed", result


def test_the_plugin_is_named_only_where_it_is_not_installed(mutation, monkeypatch):
    """Under a PYTHONPATH tree (the device machine) the plugin is no entry point, and a mutant
    run without `-p enginespec.conformance.plugin` failed on --impl before any mutant ran (the
    thirty-fourth session's CUDA suite); installed, naming it again is an error."""
    import importlib.metadata as md

    class Point:
        value = "enginespec.conformance.plugin"

    monkeypatch.setattr(md, "entry_points", lambda group: [Point()])
    assert mutation._plugin_args() == []
    monkeypatch.setattr(md, "entry_points", lambda group: [])
    assert mutation._plugin_args() == ["-p", "enginespec.conformance.plugin"]


def test_rejudging_a_sample_with_no_survivors_reports_zero_of_zero(mutation, monkeypatch, tmp_path, capsys):
    """docs/mutation.md's `--rejudge f.json` after a sample was wholly killed: nothing to re-run,
    so the summary says 0/0 and the JSON is written (the rate's None crashed the print with a
    TypeError, and no JSON was written)."""
    monkeypatch.setattr(mutation, "run_suite", lambda impl, env, timeout: "survived")  # the baseline
    old = tmp_path / "r.json"
    old.write_text(
        '{"results": [{"impl": "reference", "path": "impls/reference/block_manager.py", '
        '"index": 0, "line": 1, "what": "x", "result": "killed"}]}'
    )
    out = tmp_path / "again.json"
    argv = ["--impls", "reference", "--rejudge", str(old), "--jobs", "1", "--json", str(out)]
    assert mutation.main(argv) == 0
    assert "reference: 0/0 killed (no mutant judged)" in capsys.readouterr().out
    summary = json.loads(out.read_text())["summary"]["reference"]
    assert (summary["run"], summary["counted"], summary["rate"]) == (0, 0, None)


def test_a_file_outside_the_control_plane_is_mutated_over_the_tests_named(mutation, monkeypatch, tmp_path):
    """`--files spec/stops.py --tests ...`: the sampler, spec and engine modules are mutated too,
    each over the tests that reach it (the conformance subset never imports most of them; before
    --tests such a run drew no mutant, its file being in no impl's TARGETS)."""
    monkeypatch.setattr(mutation, "SUITE", list(mutation.SUITE))
    monkeypatch.setattr(mutation, "OWN_TESTS", dict(mutation.OWN_TESTS))
    runs = []

    def fake_run(impl, env, timeout):
        runs.append((impl, env["MUTANT_MODULE"], list(mutation.SUITE), dict(mutation.OWN_TESTS)))
        return "survived" if env["MUTANT_MODULE"] == "-" else "killed"

    monkeypatch.setattr(mutation, "run_suite", fake_run)
    out = tmp_path / "r.json"
    argv = ["--impls", "fast", "--files", "spec/stops.py", "--sample", "3", "--jobs", "1"]
    assert mutation.main([*argv, "--json", str(out), "--tests", "tests/engine/test_detokenizer.py"]) == 0
    results = json.loads(out.read_text())["results"]
    assert len(results) == 3 and {r["path"] for r in results} == {"spec/stops.py"}
    assert {module for _, module, _, _ in runs[1:]} == {"enginespec.spec.stops"}
    assert all(suite == ["tests/engine/test_detokenizer.py"] and not own for _, _, suite, own in runs)
    assert mutation._files("fast", ["impls/fast/scheduler.py", "impls/reference/scheduler.py"]) == [
        "impls/fast/scheduler.py"
    ]


def test_functions_keep_only_the_sites_inside_the_named_functions(mutation, monkeypatch, tmp_path):
    """`--functions checkpoint_files`: only that function's sites are drawn, each keeping its
    index in the file (judge mutates the file's index-th site); a method is named `Class.f`; a
    name the file does not define is a ValueError, never a run that silently draws nothing."""
    spans = mutation.function_spans("engine/structured_output.py")
    assert "GrammarState._watch" in spans and "fill_bitmask" in spans and "_watch" not in spans
    every = mutation.mutants_of("worker/loader.py")
    first, last = mutation.function_spans("worker/loader.py")["checkpoint_files"]
    kept = mutation.in_functions(every, ["checkpoint_files"])
    assert kept and kept == [m for m in every if first <= m.line <= last]
    assert len(kept) < len(every) and all(every[m.index] == m for m in kept)
    assert mutation.in_functions(every, None) == every
    with pytest.raises(ValueError, match="no_such_function"):
        mutation.in_functions(every, ["checkpoint_files", "no_such_function"])
    monkeypatch.setattr(
        mutation,
        "run_suite",
        lambda impl, env, timeout: "survived" if env["MUTANT_MODULE"] == "-" else "killed",
    )
    out = tmp_path / "r.json"
    argv = ["--impls", "fast", "--files", "worker/loader.py", "--sample", "0", "--jobs", "1"]
    assert mutation.main([*argv, "--functions", "checkpoint_files", "--json", str(out), "--tests", "x"]) == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["index"], r["line"]) for r in results] == [(m.index, m.line) for m in kept]


def test_a_mutant_is_served_under_the_files_installed_import_name(mutation):
    """api/ is the root package's folder (pyproject's package-dir): api/metrics_reader.py is
    enginespec.metrics_reader. The hook served it as enginespec.api.metrics_reader, a module
    nobody imports, so every mutant of an api/ file came back 'never imported'."""
    assert mutation.module_name("api/metrics_reader.py") == "enginespec.metrics_reader"
    assert mutation.module_name("api/__init__.py") == "enginespec"
    assert mutation.module_name("impls/fast/scheduler.py") == "enginespec.impls.fast.scheduler"
    assert mutation.module_name("impls/reference/__init__.py") == "enginespec.impls.reference"
    assert mutation.module_name("entrypoints/openai/serving.py") == "enginespec.entrypoints.openai.serving"
    with pytest.raises(ValueError, match="tools/mutation.py"):
        mutation.module_name("tools/mutation.py")
