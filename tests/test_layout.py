"""The house rules that enforce themselves: dependency directions, and the README's map of the tree.

`tools/check_imports.py` holds the rules (DESIGN.md's "Dependency directions"); these tests run it
on the real tree (no violation) and on a copy with planted violations (each one reported), so a
checker that silently passes everything fails here.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _checker():
    """tools/check_imports.py as a module (tools/ is a folder of scripts, not a package)."""
    if "check_imports" not in sys.modules:
        spec = importlib.util.spec_from_file_location("check_imports", ROOT / "tools" / "check_imports.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["check_imports"] = module  # dataclasses look their module up while defining
        spec.loader.exec_module(module)
    return sys.modules["check_imports"]


def test_tree_follows_the_dependency_directions():
    violations = _checker().check_tree(ROOT)
    assert not violations, "\n".join(map(str, violations))


PLANTED = [
    (
        "engine/planted.py",
        "from enginespec.conformance import strategies",
        "engine may not depend on conformance",
    ),
    ("worker/planted.py", "def f():\n    import enginespec.impls.fast\n", "worker may not depend on fast"),
    ("api/planted.py", "import benchmarks.harness", "api may not depend on benchmarks"),
    ("spec/planted.py", "from enginespec.kernels import reference", "spec may not depend on kernels"),
    ("kernels/planted.py", "from enginespec.spec import BatchMeta", "kernels may not depend on spec"),
    (
        "impls/fast/planted.py",
        "from enginespec.impls.reference import IMPL",
        "fast may not depend on reference",
    ),
    ("impls/reference/planted.py", "from enginespec import kernels", "reference may not depend on kernels"),
    (
        "conformance/planted.py",
        "from tests.impls import test_fast_examples",
        "conformance may not depend on tests",
    ),
    ("testing/planted.py", "from spec import hash_block", "bare `spec`"),
    ("sample/planted.py", "from .draw import CHUNK", "relative import in shipped code"),
]


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory):
    """The repository's Python files (and nothing else) in a scratch directory."""
    dest = tmp_path_factory.mktemp("tree")
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".git", "build") or "results" in rel.parts:
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / rel)
    return dest


@pytest.mark.parametrize("rel, source, reason", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_violation_is_reported(tree_copy, rel, source, reason):
    planted = tree_copy / rel
    planted.write_text(source + "\n")
    try:
        found = [v for v in _checker().check_tree(tree_copy) if v.path == rel]
    finally:
        planted.unlink()
    assert found and reason in found[0].reason, f"{rel}: expected a violation ({reason}), got {found}"


def test_readme_layout_table_matches_the_tree():
    """Every folder the README's layout table names exists, and every top-level folder that holds
    code or docs is in the table."""
    text = (ROOT / "README.md").read_text()
    named = set(re.findall(r"^\| `([\w/.-]+?)/?` \|", text, flags=re.M))
    assert named, "README has no layout table"
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"README names folders that do not exist: {missing}"
    top = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    top -= {"build"} | {p.name for p in ROOT.iterdir() if p.name.endswith(".egg-info")}
    unlisted = sorted(top - {n.split("/")[0] for n in named})
    assert not unlisted, f"top-level folders missing from the README's layout table: {unlisted}"
