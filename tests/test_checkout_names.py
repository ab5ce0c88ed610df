"""A checkout's root is on sys.path when pytest, `python -m` or a benchmark script runs from it,
so its folders answer top-level imports meant for installed packages of the same name. Hugging
Face's `kernels` is one (transformers 5.25 requires it and imports it at import time); our
kernels/__init__.py hands such an import over to the installed package. These tests run fresh
interpreters with a stand-in for the installed package ahead of site-packages, or without
site-packages (`-S`), so what is installed here does not decide them."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, *paths: Path, site: bool = False) -> str:
    """stdout of `code` in a fresh interpreter, cwd the root, `paths` first on sys.path (then
    site-packages only when `site`)."""
    setup = f"import sys; sys.path[:0] = {[str(p) for p in paths]!r}; "
    flags = [] if site else ["-S"]
    done = subprocess.run(
        [sys.executable, *flags, "-c", setup + code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _installed_kernels(tmp_path: Path) -> Path:
    """A site folder holding a stand-in for an installed top-level `kernels` package."""
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("WHOSE = 'installed'\n")
    return site


def test_top_level_kernels_is_the_installed_package(tmp_path):
    site = _installed_kernels(tmp_path)
    out = _run("import kernels; print(kernels.WHOSE, kernels.__file__)", ROOT, site)
    assert out == f"installed {site / 'kernels' / '__init__.py'}"


def test_top_level_kernels_is_ours_when_none_is_installed():
    out = _run("import kernels; print(kernels.__file__)", ROOT)
    assert out == str(ROOT / "kernels" / "__init__.py")


def test_an_installed_kernels_leaves_ours_to_enginespec(tmp_path):
    """With the installed one taking `kernels`, ours still loads as enginespec.kernels (the way
    our code imports it), submodules included."""
    site = _installed_kernels(tmp_path)
    pkg = tmp_path / "pkg"  # enginespec laid out as the install maps it: enginespec.kernels -> kernels/
    (pkg / "enginespec").mkdir(parents=True)
    (pkg / "enginespec" / "__init__.py").write_text("")
    (pkg / "enginespec" / "kernels").symlink_to(ROOT / "kernels")
    code = (
        "import kernels, enginespec.kernels, enginespec.kernels.reference as r; "
        "print(kernels.WHOSE, enginespec.kernels.__name__, callable(r.paged_attention_ref))"
    )
    assert _run(code, ROOT, site, pkg, site=True) == "installed enginespec.kernels True"


def test_no_other_root_package_shadows_an_installed_one():
    """Every root folder that is a package, against the top-level names installed distributions
    provide here: only `kernels` may be both (it defers, above)."""
    installed = md.packages_distributions()
    ours = [p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()]
    clashes = {name: installed[name] for name in ours if name in installed and name != "kernels"}
    assert not clashes, f"root packages shadowing installed distributions: {clashes}"


def test_transformers_imports_from_the_root():
    """The failure this guards against, as users met it: transformers' hub-kernels integration
    imported from a checkout's root (meaningful where Hugging Face's kernels is installed, as
    transformers 5.25 requires; elsewhere it imports nothing of it)."""
    out = _run("import transformers.integrations.hub_kernels as h; print(h.__name__)", ROOT, site=True)
    assert out.endswith("hub_kernels")


def test_a_second_checkout_on_sys_path_is_passed_over(tmp_path):
    """Two checkouts on sys.path (the current directory one, PYTHONPATH naming another: a git
    worktree, a second clone): each one's kernels/__init__.py deferred to the other's, and
    `import kernels` (transformers' at import time, so every model load) ended in
    RecursionError, then KeyError, tracebacks. Both copies are passed over for the installed
    package, and with none installed, the first checkout's own folder answers."""
    other = tmp_path / "other-checkout"
    (other / "kernels").mkdir(parents=True)
    (other / "kernels" / "__init__.py").write_text((ROOT / "kernels" / "__init__.py").read_text())
    site = _installed_kernels(tmp_path)
    assert _run("import kernels; print(kernels.WHOSE)", ROOT, other, site) == "installed"
    assert _run("import kernels; print(kernels.WHOSE)", other, ROOT, site) == "installed"
    assert _run("import kernels; print(kernels.__file__)", ROOT, other) == str(
        ROOT / "kernels" / "__init__.py"
    )
