"""Mutation testing of the control plane: how many small planted faults the conformance suite kills.

A small AST mutator (no dependency): each mutant changes ONE node of one file (a comparison, an
arithmetic or boolean operator, an int constant, a True/False, min/max, `not`), is compiled, and
served in place of the real module by an import hook in a fresh `python -m pytest` process
running a fast subset of the conformance suite plus the impl's own unit tests (-x). The mutant
is killed when that run fails (or times out: a mutant that loops forever is caught too); it
survives when the run passes.
Mutants that do not compile are not counted. Survivors are printed with their line, to be
judged by hand (killed or argued equivalent).

    python tools/mutation.py --sample 40 --seed 0            # 40 random mutants per impl
    python tools/mutation.py --files impls/fast/free_queue.py --sample 0   # every mutant of one file
    python tools/mutation.py --impls fast --files spec/stops.py --sample 0 \
        --tests conformance/test_scheduler.py tests/engine/test_detokenizer.py   # any file, its own tests
    python tools/mutation.py --impls fast --files worker/loader.py --sample 0 \
        --functions checkpoint_files --tests tests/worker/test_loader.py   # some functions of it

A file outside the control plane (TARGETS) is mutated when --files names it, under each impl of
--impls; --tests then names the tests that reach it (they replace the conformance subset and the
impl's own tests).

The reference is mutated with --impl=reference (its lockstep then compares it with itself, so
only the invariant checkers judge it); the fast impl with --impl=fast (lockstep included).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = {
    "fast": [
        f"impls/fast/{m}.py" for m in ("block_manager", "scheduler", "request", "free_queue", "hashing")
    ],
    "reference": [f"impls/reference/{m}.py" for m in ("block_manager", "scheduler", "request", "__init__")],
}
SUITE = [
    "conformance/test_block_manager.py",
    "conformance/test_scheduler.py",
    "conformance/test_errors.py",
    "conformance/test_numeric_args.py",
    "conformance/test_stateful.py",
    "conformance/test_schedule_edges.py",
]
#: Each impl's own unit tests (part of the full suite; they reach helpers the conformance
#: suite only sees through the BlockManager, e.g. FreeQueue.push_back).
OWN_TESTS = {impl: [f"tests/impls/test_{impl}_examples.py"] for impl in TARGETS}
SWAP_CMP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
SWAP_BIN = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
}
SWAP_BOOL = {ast.And: ast.Or, ast.Or: ast.And}
SWAP_CALL = {"min": "max", "max": "min"}


@dataclass(frozen=True)
class Mutant:
    path: str  # repo-relative file
    index: int  # which mutation site of the file
    line: int
    what: str


class Mutator(ast.NodeTransformer):
    """Walks a module; the `target`-th mutation site is changed (target=-1: only count them)."""

    def __init__(self, target: int = -1):
        self.target, self.count, self.sites = target, 0, []

    def _site(self, node, what: str) -> bool:
        hit = self.count == self.target
        self.sites.append((getattr(node, "lineno", 0), what))
        self.count += 1
        return hit

    def visit_Compare(self, node):
        self.generic_visit(node)
        for i, op in enumerate(node.ops):
            new = SWAP_CMP.get(type(op))
            if new and self._site(node, f"{type(op).__name__} -> {new.__name__}"):
                node.ops[i] = new()
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        new = SWAP_BIN.get(type(node.op))
        if new and self._site(node, f"{type(node.op).__name__} -> {new.__name__}"):
            node.op = new()
        return node

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        new = SWAP_BOOL[type(node.op)]
        if self._site(node, f"{type(node.op).__name__} -> {new.__name__}"):
            node.op = new()
        return node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not) and self._site(node, "drop not"):
            return node.operand
        return node

    def visit_Constant(self, node):
        if isinstance(node.value, bool):
            if self._site(node, f"{node.value} -> {not node.value}"):
                return ast.copy_location(ast.Constant(not node.value), node)
        elif isinstance(node.value, int) and self._site(node, f"{node.value} -> {node.value + 1}"):
            return ast.copy_location(ast.Constant(node.value + 1), node)
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in SWAP_CALL:
            new = SWAP_CALL[node.func.id]
            if self._site(node, f"{node.func.id} -> {new}"):
                node.func = ast.copy_location(ast.Name(new, ast.Load()), node.func)
        return node


def mutants_of(path: str) -> list[Mutant]:
    m = Mutator()
    m.visit(ast.parse((REPO / path).read_text()))
    return [Mutant(path, i, line, what) for i, (line, what) in enumerate(m.sites)]


def function_spans(path: str) -> dict[str, tuple[int, int]]:
    """{qualified name: (first line, last line)} of every function in `path`: `f` for a module
    function, `Class.f` for a method (nested ones as `outer.inner`), decorators included."""
    spans: dict[str, tuple[int, int]] = {}

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    spans[name] = (first, child.end_lineno)
                walk(child, f"{name}.")

    walk(ast.parse((REPO / path).read_text()), "")
    return spans


def in_functions(mutants: list[Mutant], names) -> list[Mutant]:
    """The mutants whose line lies in one of the functions `names` (each `f` or `Class.f`, as
    function_spans names them) of their file; all of them when `names` is empty. ValueError
    for a name no mutated file defines (a typo would otherwise silently draw nothing). Indices
    are kept: a mutant is still its file's `index`-th site."""
    if not names:
        return mutants
    spans = {}
    for path in sorted({m.path for m in mutants}):
        spans[path] = {n: s for n, s in function_spans(path).items() if n in names}
    found = {n for per_file in spans.values() for n in per_file}
    if set(names) - found:
        raise ValueError(f"--functions: no function {sorted(set(names) - found)} in {sorted(spans)}")
    return [m for m in mutants if any(a <= m.line <= b for a, b in spans[m.path].values())]


def mutated_source(mutant: Mutant) -> str | None:
    tree = ast.parse((REPO / mutant.path).read_text())
    tree = ast.fix_missing_locations(Mutator(mutant.index).visit(tree))
    source = ast.unparse(tree)
    try:
        compile(source, mutant.path, "exec")
    except SyntaxError:
        return None
    return source


def module_name(path: str) -> str:
    """The import name of a repo file, by pyproject.toml's package-dir table (impls/fast/x.py ->
    enginespec.impls.fast.x; api/x.py -> enginespec.x: api/ is the root package's folder)."""
    parts = Path(path).with_suffix("").parts
    folders = {tuple(Path(folder).parts): name for name, folder in _package_dirs().items()}
    root = max((f for f in folders if parts[: len(f)] == f), key=len, default=None)
    if root is None:
        raise ValueError(f"{path} is in no package folder of pyproject.toml: {sorted(folders)}")
    return ".".join((folders[root], *parts[len(root) :])).removesuffix(".__init__")


@functools.lru_cache(maxsize=1)
def _package_dirs() -> dict[str, str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


BOOT = """
import importlib.abc, importlib.util, os, sys
NAME, SOURCE = os.environ["MUTANT_MODULE"], open(os.environ["MUTANT_SOURCE"]).read()

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname != NAME:
            return None
        sys.meta_path.remove(self)
        real = importlib.util.find_spec(fullname)
        sys.meta_path.insert(0, self)
        spec = importlib.util.spec_from_loader(fullname, self, origin=real.origin,
                                               is_package=real.submodule_search_locations is not None)
        if real.submodule_search_locations is not None:
            spec.submodule_search_locations = real.submodule_search_locations
        return spec
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.__file__ = module.__spec__.origin
        exec(compile(SOURCE, module.__file__, "exec"), module.__dict__)
        open(os.environ["MUTANT_SERVED"], "w").close()  # run_suite checks the mutant ran

sys.meta_path.insert(0, Finder())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


PROFILE = ["--hypothesis-profile=enginespec-ci"]


def run_suite(impl: str, env_extra: dict, timeout: float) -> str:
    """One pytest run of SUITE (and the impl's own tests) with BOOT's import hook serving the
    mutant. --assert=plain: pytest's assertion rewriter loads the modules of a plugin
    distribution itself (enginespec is one, when installed non-editable), ahead of the hook,
    and would run the unmutated code. A run in which the mutant never executed is an error,
    never "survived"."""
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINESPEC_IMPL", "PYTEST_ADDOPTS")}
    env.update(env_extra)
    cmd = [
        sys.executable,
        "-c",
        BOOT,
        "-x",
        "-q",
        "--assert=plain",
        "-p",
        "no:cacheprovider",
        *_plugin_args(),
        *SUITE,
        *OWN_TESTS.get(impl, []),
        f"--impl={impl}",
        *PROFILE,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        served = Path(tmp) / "served"
        env["MUTANT_SERVED"] = str(served)
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "killed (timeout)"
        ran = served.exists() or env["MUTANT_MODULE"] == "-"
    if not ran:
        tail = (proc.stdout[-200:] + proc.stderr[-200:]).strip()
        return f"error (the mutant of {env['MUTANT_MODULE']} was never imported by the run; exit {proc.returncode}: {tail})"
    if proc.returncode == 0:
        return "survived"
    if proc.returncode == 1:
        return "killed"
    return f"error (exit {proc.returncode}): {proc.stdout[-300:]}{proc.stderr[-300:]}"


def _plugin_args() -> list[str]:
    """`-p enginespec.conformance.plugin` where the plugin is not an installed pytest11 entry
    point (the package imported from a tree on PYTHONPATH, as on the device machine: pytest then
    did not know --impl and exited 4 before any mutant ran), else nothing (pytest refuses a
    plugin registered twice)."""
    from importlib.metadata import entry_points

    installed = any(ep.value.startswith("enginespec.conformance") for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "enginespec.conformance.plugin"]


def judge(mutant: Mutant, impl: str, timeout: float, tmp: Path) -> tuple[Mutant, str]:
    source = mutated_source(mutant)
    if source is None:
        return mutant, "not compiled"
    file = tmp / f"{mutant.path.replace('/', '_')}.{mutant.index}.py"
    file.write_text(source)
    return mutant, run_suite(
        impl, {"MUTANT_MODULE": module_name(mutant.path), "MUTANT_SOURCE": str(file)}, timeout
    )


def _files(impl: str, files) -> list[str]:
    """The files mutated under `impl`: its TARGETS (those of them named in `files`, when given),
    and any named file no impl's TARGETS holds (an engine, spec or sampler module)."""
    if not files:
        return TARGETS[impl]
    control_plane = {f for targets in TARGETS.values() for f in targets}
    return [f for f in TARGETS[impl] if f in files] + [f for f in files if f not in control_plane]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=40, help="mutants per impl (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--impls", nargs="*", default=sorted(TARGETS))
    ap.add_argument("--files", nargs="*", help="only these files (repo-relative)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--rejudge", help="re-run only the survivors recorded in this --json file")
    ap.add_argument(
        "--functions",
        nargs="*",
        help="only the mutation sites inside these functions of --files (f or Class.f)",
    )
    ap.add_argument("--profile", default="enginespec-ci", help="Hypothesis profile of the suite runs")
    ap.add_argument(
        "--tests",
        nargs="*",
        help="pytest paths run on each mutant in place of the conformance subset and own tests",
    )
    args = ap.parse_args(argv)
    PROFILE[:] = [f"--hypothesis-profile={args.profile}"]
    if args.tests:
        SUITE[:] = args.tests
        OWN_TESTS.clear()
    baseline = {
        impl: run_suite(impl, {"MUTANT_MODULE": "-", "MUTANT_SOURCE": __file__}, args.timeout)
        for impl in args.impls
    }
    assert all(v == "survived" for v in baseline.values()), f"the unmutated suite must pass: {baseline}"
    results, summary = [], {}
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        for impl in args.impls:
            pool_ = in_functions([m for f in _files(impl, args.files) for m in mutants_of(f)], args.functions)
            chosen = pool_ if not args.sample or args.sample >= len(pool_) else rng.sample(pool_, args.sample)
            if args.rejudge:
                old = json.loads(Path(args.rejudge).read_text())["results"]
                keep = {
                    (r["path"], r["index"]) for r in old if r["impl"] == impl and r["result"] == "survived"
                }
                chosen = [m for m in pool_ if (m.path, m.index) in keep]
            t0 = time.time()
            with ThreadPoolExecutor(args.jobs) as ex:
                done = list(
                    ex.map(functools.partial(judge, impl=impl, timeout=args.timeout, tmp=Path(tmp)), chosen)
                )
            counted = [(m, r) for m, r in done if r.startswith(("killed", "survived"))]
            killed = sum(r.startswith("killed") for _, r in counted)
            summary[impl] = dict(
                sites=len(pool_),
                run=len(chosen),
                counted=len(counted),
                killed=killed,
                rate=killed / len(counted) if counted else None,
                seconds=round(time.time() - t0),
            )
            rate = summary[impl]["rate"]
            print(
                f"{impl}: {killed}/{len(counted)} killed "
                f"({'no mutant judged' if rate is None else format(rate, '.1%')}) of {len(chosen)} sampled "
                f"from {len(pool_)} mutation sites, {summary[impl]['seconds']} s"
            )
            for m, r in done:
                if not r.startswith("killed"):
                    line = (REPO / m.path).read_text().splitlines()[m.line - 1].strip()
                    print(f"  {r.split(':')[0]:>12}  {m.path}:{m.line}  {m.what}   | {line}")
                results.append(
                    dict(impl=impl, path=m.path, index=m.index, line=m.line, what=m.what, result=r)
                )
    if args.json:
        Path(args.json).write_text(json.dumps(dict(summary=summary, results=results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
