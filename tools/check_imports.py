"""The dependency directions of DESIGN.md, checked on every import statement in the tree.

Each folder has a role (ROLES); an import of one of our modules is allowed only if the importing
role may depend on the imported one (ALLOWED). Imports inside functions count too: a lazy import
is still a dependency. Exit status 1 and one line per violation when any rule is broken:

    python tools/check_imports.py [ROOT]

The rules, in words:
- spec imports nothing of ours; kernels import nothing of ours.
- impls/reference imports only spec (the oracle stays plain); impls/fast imports spec and
  kernels, never the reference (shared code would hide shared bugs from the differential tests).
- the product (api, engine, worker, sample, entrypoints, testing) reaches an implementation only
  through spec.load_impl, and never imports conformance, tests, benchmarks, examples or tools.
- conformance reaches implementations only through load_impl too, and never imports tests or
  benchmarks: it ships, they do not.
- our packages are imported by their installed names (enginespec.*), never as bare `spec`,
  `kernels`, ... (those would resolve to other projects' packages once installed).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

# folder (relative to the repo root) -> role; the longest matching prefix wins.
ROLES = {
    "spec": "spec",
    "impls/reference": "reference",
    "impls/fast": "fast",
    "impls": "impls",
    "kernels": "kernels",
    "api": "api",
    "engine": "engine",
    "worker": "worker",
    "sample": "sample",
    "entrypoints": "entrypoints",
    "testing": "testing",
    "conformance": "conformance",
    "tests": "tests",
    "benchmarks": "benchmarks",
    "examples": "examples",
    "tools": "tools",
}
# installed module prefix -> role of the module it names; the longest matching prefix wins.
MODULES = {
    "enginespec": "api",
    "enginespec.spec": "spec",
    "enginespec.impls": "impls",
    "enginespec.impls.reference": "reference",
    "enginespec.impls.fast": "fast",
    "enginespec.kernels": "kernels",
    "enginespec.engine": "engine",
    "enginespec.worker": "worker",
    "enginespec.sample": "sample",
    "enginespec.entrypoints": "entrypoints",
    "enginespec.testing": "testing",
    "enginespec.conformance": "conformance",
    "benchmarks": "benchmarks",
    "tests": "tests",
    "tools": "tools",
}
PRODUCT = {"api", "engine", "worker", "sample", "entrypoints", "testing", "spec", "kernels"}
ALLOWED = {
    "spec": {"spec"},
    "kernels": {"kernels"},
    "reference": {"spec", "reference"},
    "fast": {"spec", "kernels", "fast"},
    "impls": {"spec", "impls", "reference", "fast"},  # impls/__init__.py only
    **{role: PRODUCT for role in ("api", "engine", "worker", "sample", "entrypoints", "testing")},
    "conformance": PRODUCT | {"conformance"},
    "tests": PRODUCT | {"impls", "reference", "fast", "conformance", "tests", "benchmarks"},
    "benchmarks": PRODUCT | {"conformance", "benchmarks"},
    "examples": PRODUCT | {"impls", "reference", "fast", "conformance"},
    "tools": PRODUCT | {"conformance", "tools"},
}
BARE = {
    "spec",
    "impls",
    "kernels",
    "conformance",
    "api",
    "engine",
    "worker",
    "sample",
    "entrypoints",
    "testing",
}
SKIP = {".git", ".venv", "build", "results", "__pycache__"}


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    imported: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.imported}: {self.reason}"


def _longest(table: dict[str, str], key: str, sep: str) -> str | None:
    best = None
    for prefix in table:
        if (key == prefix or key.startswith(prefix + sep)) and (best is None or len(prefix) > len(best)):
            best = prefix
    return table[best] if best is not None else None


def _imports(tree: ast.AST):
    """(line, absolute module name) of every import; relative ones are reported as such."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                yield node.lineno, "." * node.level + (node.module or "")
            elif node.module == "enginespec":  # `from enginespec import spec` names a subpackage
                for alias in node.names:
                    sub = f"enginespec.{alias.name}"
                    yield node.lineno, sub if _longest(MODULES, sub, ".") != "api" else "enginespec"
            else:
                yield node.lineno, node.module or ""


def check_file(root: Path, path: Path) -> list[Violation]:
    rel = path.relative_to(root).as_posix()
    role = _longest(ROLES, rel, "/")
    if role is None:
        return []
    out = []
    for line, name in _imports(ast.parse(path.read_text(), filename=rel)):
        if name.startswith(".") and role in PRODUCT | {"reference", "fast", "impls", "conformance"}:
            out.append(Violation(rel, line, name, "relative import in shipped code: use enginespec.*"))
            continue
        top = name.split(".")[0]
        if top in BARE:
            out.append(Violation(rel, line, name, f"bare `{top}`: import it as enginespec.{name}"))
            continue
        target = _longest(MODULES, name, ".")
        if target is not None and target not in ALLOWED[role]:
            out.append(Violation(rel, line, name, f"{role} may not depend on {target}"))
    return out


def check_tree(root: Path) -> list[Violation]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if not SKIP.intersection(path.relative_to(root).parts):
            out.extend(check_file(root, path))
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    violations = check_tree(root)
    for v in violations:
        print(v)
    print(f"import directions: {len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
