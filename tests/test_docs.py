"""The user docs name only what exists: each file path they point at, each command-line flag of
ours, and the install line before each conformance command carries what that command needs.

tests/test_readme.py runs the README's Python blocks; this file checks the cheap, textual claims
of every page a new user reads (README, CONTRIBUTING, docs/, benchmarks/README.md, the example
backend's README), so that a renamed file, a dropped flag or a trimmed install line shows here
and not in a user's terminal."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    "README.md",
    "CONTRIBUTING.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
    "benchmarks/README.md",
    "examples/ordered-pool-backend/README.md",
]

# a path with a folder and a file extension (`worker/runner.py`, `impls/fast/{a,b}.py`)
PATH = re.compile(r"(?<![\w./{-])((?:[\w.{},-]+/)+[\w.{},-]*\.(?:py|md|sh|toml|json))(?![\w/])")
# a backticked bare file name (`throughput.py`): benchmarks/README.md names its scripts so
BARE = re.compile(r"`([\w-]+\.(?:py|sh))\b")


def _prose(text: str) -> str:
    """The page without its fenced blocks (those show a user's own package, not this tree)."""
    return re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)


def _expand(path: str) -> list[str]:
    """`a/{b,c}.py` -> [`a/b.py`, `a/c.py`] (one brace group, as the docs write them)."""
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [path[: m.start()] + part + path[m.end() :] for part in m.group(1).split(",")]


def _exists(page: str, path: str) -> bool:
    """Found from the root, from the page's folder, or as enginespec.X's folder (`enginespec/`
    names the installed package, whose folders are the root's)."""
    here = (ROOT / page).parent
    candidates = [ROOT / path, here / path]
    if path.startswith("enginespec/"):
        candidates.append(ROOT / path.removeprefix("enginespec/"))
    return any(c.exists() for c in candidates)


@pytest.mark.parametrize("page", PAGES)
def test_every_path_a_page_names_exists(page):
    text = _prose((ROOT / page).read_text())
    named = [p for m in PATH.finditer(text) for p in _expand(m.group(1)) if not re.search(r"[A-Z]{3,}", p)]
    if page == "benchmarks/README.md":
        named += BARE.findall(text)
    assert named, f"{page} names no path: the pattern is wrong"
    missing = sorted({p for p in named if not _exists(page, p)})
    assert not missing, f"{page} names paths that do not exist: {missing}"


def _install_lines_before(lines: list[str], i: int) -> list[str]:
    """The `pip install` lines of the block (consecutive non-blank lines) holding line i."""
    start = i
    while start > 0 and lines[start - 1].strip():
        start -= 1
    return [line for line in lines[start:i] if "pip install" in line]


def _installs_the_test_extra(line: str) -> bool:
    """A pip install of enginespec with `[test]`: from a checkout (`.`, a path) or by name."""
    return re.search(r"""(?:^|\s)["']?(?:\.|[\w/.-]*enginespec|enginespec)\[test\]""", line) is not None


@pytest.mark.parametrize("page", PAGES)
def test_an_install_before_a_conformance_run_takes_the_test_extra(page):
    """The suite needs pytest and hypothesis, which only the test extra brings: a block that
    installs enginespec and then runs `pytest --pyargs enginespec.conformance` must ask for it
    (a bare `pip install .` in a fresh venv leaves the next line failing)."""
    lines = (ROOT / page).read_text().splitlines()
    for i, line in enumerate(lines):
        if "pytest --pyargs enginespec.conformance" not in line:
            continue
        for install in _install_lines_before(lines, i):
            if "enginespec" in install or re.search(r"pip install (?:-e )?[\"']?\.[\s\[\"']", install):
                assert _installs_the_test_extra(install), f"{page}:{i + 1}: {install.strip()!r} lacks [test]"


def test_the_readme_says_what_each_extra_adds():
    """One README line a pyproject extra (`- `name`: what it adds`), and no line for an extra
    pyproject lacks: `kernels` (Triton) was in no page, so a user could not tell whether the fast
    impl needed it, nor that it is not Hugging Face's `kernels`."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomli is the same parser (the test extra has it)
        import tomli as tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    described = re.findall(r"^- `([\w-]+)`: \S", (ROOT / "README.md").read_text(), flags=re.M)
    assert sorted(described) == sorted(extras), (
        f"README describes {described}, pyproject has {sorted(extras)}"
    )


COMMANDS = ("generate", "demo", "serve", "simulate", "collect-env")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")


def _help_flags(command: str) -> set[str]:
    """The long flags `enginespec COMMAND --help` lists (simulate and collect-env parse their
    own arguments, so cli._parser() does not hold theirs)."""
    from enginespec.entrypoints.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    return set(FLAG.findall(out.getvalue()))


def _cli_flags() -> set[str]:
    return set().union(*(_help_flags(c) for c in COMMANDS))


def _plugin_flags() -> set[str]:
    """The conformance plugin's pytest options, and pytest's own that the docs use."""
    from enginespec.conformance import plugin

    class Group:
        def __init__(self):
            self.flags: set[str] = set()

        def addoption(self, *names, **_):
            self.flags.update(names)

        def getgroup(self, *_, **__):
            return self

    parser = Group()
    plugin.pytest_addoption(parser)
    return parser.flags | {"--pyargs", "--lf", "--dist", "--hypothesis-profile", "--hypothesis-seed"}


# flags of the benchmark scripts the README names beside them: checked against each one's --help
README_SCRIPT_FLAGS = {
    "benchmarks.serving": {"--request-rate", "--offline"},
    "benchmarks.prefill_profile": {"--unsynced", "--output-len", "--host-probe"},
    "benchmarks.throughput": {"--shape", "--device"},
}


def test_every_flag_the_readme_names_is_an_option_of_ours():
    """Each `--flag` of the README is a flag of the `enginespec` CLI, of the conformance
    plugin, or of the benchmark script it is named beside (README_SCRIPT_FLAGS)."""
    text = (ROOT / "README.md").read_text()
    named = set(FLAG.findall(text))
    scripts = set().union(*README_SCRIPT_FLAGS.values())
    unknown = sorted(named - _cli_flags() - _plugin_flags() - scripts)
    assert not unknown, f"the README names flags nothing of ours takes: {unknown}"


def _readme_scripts() -> list[str]:
    """benchmarks.NAME for each benchmark script the README names (`benchmarks/NAME.py`,
    `python -m benchmarks.NAME`)."""
    text = (ROOT / "README.md").read_text()
    names = re.findall(r"benchmarks/(\w+)\.py\b", text) + re.findall(r"-m benchmarks\.(\w+)", text)
    return sorted({f"benchmarks.{name}" for name in names})


def test_the_readme_scripts_include_the_ones_it_names_flags_of():
    assert set(README_SCRIPT_FLAGS) <= set(_readme_scripts()), _readme_scripts()


@pytest.mark.parametrize("module", _readme_scripts())
def test_the_benchmark_scripts_the_readme_names_parse_their_flags(module, monkeypatch, capsys):
    """Each script the README points at takes --help (on this CPU machine too: most of them
    run on a GPU alone), and lists the flags the README names beside it."""
    import importlib

    script = importlib.import_module(module)
    monkeypatch.setattr("sys.argv", [module, "--help"])
    with pytest.raises(SystemExit) as done:
        script.main() if hasattr(script, "main") else script.parse_args()
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith("usage:"), shown[:200]
    missing = sorted(f for f in README_SCRIPT_FLAGS.get(module, ()) if f not in shown)
    assert not missing, f"{module} has no {missing}"


def test_every_flag_of_ours_is_named_in_the_readme():
    """The README names each command's own flags, and says the rest are the engine's: one
    `EngineArgs` field each (plus --impl, --seed, --no-tqdm). Eight of serve's own (--host,
    --chat-template, --max-waiting-requests, ...) and every own flag of generate, demo, simulate
    and collect-env were in `--help` alone."""
    import dataclasses

    from enginespec.engine_args import EngineArgs
    from enginespec.entrypoints import cli

    engine = argparse.ArgumentParser()
    cli._add_engine_args(engine)
    engine_flags = {o for a in engine._actions for o in a.option_strings}
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    odd = sorted(a.dest for a in engine._actions if a.option_strings and a.dest not in fields)
    assert odd == ["help", "use_tqdm"], f"engine flags that are no EngineArgs field: {odd}"
    readme = set(FLAG.findall((ROOT / "README.md").read_text()))
    readme |= {"--no-" + flag[2:] for flag in readme}  # "each boolean flag has its negative too"
    unnamed = {c: sorted(_help_flags(c) - engine_flags - readme) for c in COMMANDS}
    assert not any(unnamed.values()), f"flags the README does not name: {unnamed}"


def test_the_cli_impl_defaults_are_the_readmes():
    """README: the CLI's --impl defaults to fast, as LLM() does; simulate keeps the reference."""
    import inspect

    from enginespec.entrypoints import cli, simulate
    from enginespec.llm import LLM

    parser = cli._parser()
    for command in ("generate", "demo", "serve"):
        argv = {"generate": ["--model", "m", "--prompt", "p"], "serve": ["m"]}.get(command, [])
        assert parser.parse_args([command, *argv]).impl == "fast", command
    assert inspect.signature(LLM).parameters["impl"].default == "fast"
    assert simulate.parse_args([]).impl == "reference"


@pytest.mark.parametrize("command", ["generate", "simulate"])
def test_the_impl_help_names_the_entry_point_form(command):
    """docs/writing-a-backend.md runs an outside backend by its entry-point name (`--impl=
    my-backend`, `enginespec simulate --impl ordered-pool` works too); --impl's help listed only
    the built-ins and pkg.module:attr, leaving a backend author to guess that it works."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        from enginespec.entrypoints.cli import main

        main([command, "--help"])
    options = out.getvalue().split("\noptions:\n", 1)[1]
    entry = " ".join(options.split("  --impl IMPL", 1)[1].split("\n  --", 1)[0].split())
    assert "entry point" in entry and "pkg.module" in entry, entry


def _imports_benchmarks(stmt) -> bool:
    import ast

    if isinstance(stmt, ast.ImportFrom):
        return (stmt.module or "").split(".")[0] == "benchmarks"
    return isinstance(stmt, ast.Import) and any(a.name.split(".")[0] == "benchmarks" for a in stmt.names)


def _puts_the_root_on_the_path(stmt) -> bool:
    import ast

    return any(isinstance(n, ast.Call) and ast.unparse(n.func) == "sys.path.insert" for n in ast.walk(stmt))


def test_every_benchmark_script_runs_as_a_script_from_the_root():
    """benchmarks/README.md: run them from the root as `python3 -m benchmarks.NAME` or `python3
    benchmarks/NAME.py`. The second puts benchmarks/ on sys.path, not the root, so a script that
    imports `benchmarks.*` must first put the root there; host_phases.py, serving.py and
    sweep_profile.py did not, and died with "No module named 'benchmarks'"."""
    import ast

    broken = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text())
        if "__main__" not in path.read_text():
            continue  # a module of the others, not a script
        for stmt in tree.body:
            if _puts_the_root_on_the_path(stmt):
                break
            if _imports_benchmarks(stmt):
                broken.append(path.name)
                break
    assert not broken, f"these fail as `python benchmarks/NAME.py`: {broken}"


ENV_VAR = r"(?:ENGINESPEC|VLLM)_[A-Z0-9_]*[A-Z0-9]"  # ours, and the vLLM ones we honour


def _env_vars_the_code_reads() -> dict[str, list[str]]:
    """Each ENGINESPEC_* / VLLM_* name that is a whole string constant of the shipped code (the
    key it reads os.environ with), and the files it is in."""
    import ast

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found: dict[str, list[str]] = {}
    for folder in sorted(set(folders.values())):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if re.fullmatch(ENV_VAR, node.value):
                        found.setdefault(node.value, []).append(str(path.relative_to(ROOT)))
    return found


def _env_vars_the_pages_name() -> dict[str, list[str]]:
    named: dict[str, list[str]] = {}
    for page in PAGES:
        for name in re.findall(rf"\b({ENV_VAR})\b", (ROOT / page).read_text()):
            named.setdefault(name, []).append(page)
    return named


def test_every_environment_variable_a_page_names_is_read():
    """A variable the docs tell a user to set does something: the shipped code reads it (a
    renamed or removed switch would otherwise be set in vain, with no error)."""
    read = _env_vars_the_code_reads()
    named = _env_vars_the_pages_name()
    assert "ENGINESPEC_PDL" in named and "ENGINESPEC_PDL" in read  # the patterns find them
    unread = {name: sorted(set(pages)) for name, pages in named.items() if name not in read}
    assert not unread, f"the docs name environment variables nothing reads: {unread}"


def test_every_environment_variable_the_code_reads_is_named_in_a_page():
    """Each switch the engine reads is in a user's page (README, CONTRIBUTING, docs/, the
    benchmarks' map): ENGINESPEC_GEMV_TUNE_ROWS, ENGINESPEC_ROW_SCALE,
    ENGINESPEC_MIXED_SHORT_QUERY_TOKENS, ENGINESPEC_STEP_TRACE and ENGINESPEC_SYNTH_DIR were only
    in the code, so a user could neither find nor unset one that changed a run."""
    named = _env_vars_the_pages_name()
    unnamed = {name: files for name, files in _env_vars_the_code_reads().items() if name not in named}
    assert not unnamed, f"the code reads environment variables no page names: {unnamed}"


# a measured figure: a number with its unit (`0.636 ms`, `1.38x`, `26,462 tok/s`, `4.4%`)
FIGURE = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)?) ?(?:ms|us|s|%|x|tok/s|TFLOP/s|TB/s)(?![\w/])")
SHA = re.compile(r"(?<![\w/])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])([0-9a-f]{7})(?![\w])")


def test_every_figure_and_commit_the_readme_cites_is_in_the_results():
    """CONTRIBUTING: every figure in benchmarks/RESULTS.md carries its command, commit, machine
    and date. So each figure the README quotes (a number with its unit, every number of the
    "Status and figures" table) and each commit it cites must appear there too: a figure typed
    from memory, or a commit no run was recorded at, shows here. A textual check, so a weak one
    for figures: the number is found somewhere in RESULTS.md, not beside the same words, and a
    short one (`0.887`) is likely found by chance; a commit's seven digits are not."""
    readme = (ROOT / "README.md").read_text()
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    table = readme.split("## Status and figures", 1)[1]
    table = "\n".join(line for line in table.splitlines() if line.startswith("| "))
    numbers = set(FIGURE.findall(readme)) | set(re.findall(r"(?<![\w.,])\d[\d,]*\.\d+", table))
    shas = set(SHA.findall(readme))
    assert "26,462" in numbers and "2b790a6" in shas  # the patterns find them
    missing = sorted(x for x in numbers | shas if x not in results)
    assert not missing, f"the README cites figures or commits benchmarks/RESULTS.md lacks: {missing}"


@functools.cache
def _tool_help_flags(script: str) -> frozenset[str]:
    """The long flags `python tools/SCRIPT --help` lists."""
    import importlib.util
    import sys

    name = f"docs_tools_{Path(script).stem}"
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / script)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # its dataclasses look here
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        module.main(["--help"])
    return frozenset(FLAG.findall(out.getvalue()))


# flags of other programs the pages name: venv's, ruff's, torchrun's (docs/multi-node.md, a
# design note on launching with it), and tools/outside_check.sh's one
OTHER_PROGRAMS_FLAGS = {"--system-site-packages", "--check", "--nnodes", "--nproc-per-node"}
OTHER_PROGRAMS_FLAGS |= {"--rdzv-backend", "--rdzv-endpoint"}


@pytest.mark.parametrize("page", [p for p in PAGES if p not in ("README.md", "benchmarks/README.md")])
def test_every_flag_the_other_pages_name_is_an_option_of_what_they_run(page):
    """As the README's check, for the other pages: each `--flag` is the CLI's, the conformance
    plugin's, tools/mutation.py's (docs/mutation.md's commands), tools/outside_check.sh's
    `--full`, or another program's the page runs (OTHER_PROGRAMS_FLAGS). benchmarks/README.md
    names its scripts' own flags (tests/benchmarks/test_own_flags_help.py)."""
    known = _cli_flags() | _plugin_flags() | _tool_help_flags("mutation.py") | OTHER_PROGRAMS_FLAGS
    if "--full" in (ROOT / "tools" / "outside_check.sh").read_text():
        known.add("--full")
    unknown = sorted(set(FLAG.findall((ROOT / page).read_text())) - known)
    assert not unknown, f"{page} names flags nothing it runs takes: {unknown}"


def test_every_test_a_page_names_exists():
    """The pages cite tests by name (docs/mutation.md's "the tests that close them", the backend
    guide's capability table): each `test_...` they name is a test function or test module of
    tests/ or conformance/, so a renamed test does not leave a reader hunting for it."""
    files = [*ROOT.glob("tests/**/test_*.py"), *ROOT.glob("conformance/**/test_*.py")]
    defined = {p.stem for p in files} | {
        m
        for path in files
        for m in re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), flags=re.M)
    }
    missing = {}
    for page in PAGES:
        named = set(re.findall(r"(?<![\w/.])(test_\w+)(?![\w.])", _prose((ROOT / page).read_text())))
        named = {n for n in named if not n.endswith("_")}  # `test_<name>` patterns, cut at the <
        if gone := sorted(named - defined):
            missing[page] = gone
    assert defined and not missing, f"pages name tests that do not exist: {missing}"


def test_every_spec_name_the_backend_guide_gives_is_importable_from_spec():
    """docs/writing-a-backend.md names the spec's helpers as `spec.NAME`; each is an attribute
    of `enginespec.spec` and in its `__all__`, so an outside author imports it as written (add()'s
    refusals, which every scheduler shares, were reachable only as the undocumented
    `enginespec.spec.admission.check_add`)."""
    import enginespec.spec as spec

    named = set(re.findall(r"\bspec\.([A-Za-z_]\w*)", (ROOT / "docs" / "writing-a-backend.md").read_text()))
    assert {"check_add", "stop_after_token", "hash_request_blocks"} <= named
    missing = sorted(n for n in named if not hasattr(spec, n) or n not in spec.__all__)
    assert not missing, f"the guide names spec.{missing}, which enginespec.spec does not export"
