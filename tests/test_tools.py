"""The scripts of tools/ that tools/check.sh runs import on every Python the package supports
(requires-python >= 3.10): link_tree.py and typecheck.py read pyproject.toml, with tomllib from
3.11 and tomli (the same parser) on 3.10, where `import tomllib` was a ModuleNotFoundError;
and the mypy settings typecheck.py uses accept the numpy that pip installs for this Python."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, monkeypatch):
    """tools/<name>.py as a module (tools/ is a folder of scripts, not a package)."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # typecheck.py puts tools/ on sys.path
    spec = importlib.util.spec_from_file_location(f"tools_{name}", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_link_tree_lays_out_the_installed_names(tmp_path, monkeypatch):
    link_tree = _load("link_tree", monkeypatch)
    package_dir = link_tree.package_dirs()
    assert package_dir["enginespec"] == "api" and package_dir["enginespec.spec"] == "spec"
    link_tree.link_tree(tmp_path, package_dir)
    assert (tmp_path / "enginespec" / "__init__.py").resolve() == (ROOT / "api" / "__init__.py").resolve()
    assert (tmp_path / "enginespec" / "spec").resolve() == (ROOT / "spec").resolve()
    # the root package's own subpackages (api/utils is enginespec.utils), not only its files:
    # the device imports from this tree, and `enginespec.utils` was missing there
    assert (tmp_path / "enginespec" / "utils" / "argparse_utils.py").resolve() == (
        ROOT / "api" / "utils" / "argparse_utils.py"
    ).resolve()


def test_typecheck_imports(monkeypatch):
    assert callable(_load("typecheck", monkeypatch).main)


def test_mypy_config_reads_this_interpreters_numpy_stubs(tmp_path):
    """typecheck.py runs mypy with pyproject.toml's [tool.mypy]. Under Python 3.13 pip installs
    numpy 2.5 (Python >= 3.12 only), whose stubs read as the "3.11" the config once pinned had no
    `ndarray.max()` without arguments: impls/fast/batch.py's `counts.max()` failed the check."""
    pytest.importorskip("mypy")
    (tmp_path / "snippet.py").write_text(
        "import numpy as np\n\nmax_len = int(np.asarray([1, 2], dtype=np.int64).max())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "snippet.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_users_type_check_sees_the_top_level_names_types(tmp_path, monkeypatch):
    """The package ships py.typed, and README's `from enginespec import LLM, AsyncLLM, LLMEngine,
    EngineArgs, ...` are imported on first use (the module's __getattr__), which mypy read as Any:
    a user's script passed its type check whatever it did with them. Each must have its type
    (the tree laid out under the installed names, as typecheck.py checks it)."""
    pytest.importorskip("mypy")
    link_tree = _load("link_tree", monkeypatch)
    link_tree.link_tree(tmp_path / "tree", link_tree.package_dirs())
    lazy = {  # name -> the class mypy must see
        "AsyncEngineArgs": "EngineArgs",
        "AsyncLLM": "AsyncLLM",
        "BeamSearchParams": "BeamSearchParams",
        "EngineArgs": "EngineArgs",
        "LLM": "LLM",
        "LLMEngine": "LLMEngine",
    }
    lines = [f"from enginespec import {', '.join(lazy)}"] + [f"{n.lower()}: int = {n}" for n in lazy]
    (tmp_path / "user.py").write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports", "user.py"]
    env = {**os.environ, "MYPYPATH": str(tmp_path / "tree")}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    errors = [line for line in proc.stdout.splitlines() if ": error: " in line]
    assert [e.split('"')[1] for e in errors] == [f"type[{cls}]" for cls in lazy.values()], (
        proc.stdout + proc.stderr
    )
