"""A tree of symlinks that lays the repository out under its installed import names.

pyproject.toml's package-dir maps each folder to `enginespec.<name>`. Tools that cannot use an
installed copy (mypy, which cannot follow setuptools' editable finder; the device machine, which
has no network to build a wheel) import from this tree instead:

    python tools/link_tree.py /tmp/es && PYTHONPATH=/tmp/es python -c "import enginespec"

The links point into the repository, so edits show through; only new root-package files need
the tree made again. Entry points (the pytest plugin, the enginespec.impls group) are not
registered this way: pass `-p enginespec.conformance.plugin` to pytest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomllib is 3.11's; tomli is the same parser
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """The package-dir table of pyproject.toml: installed name -> folder."""
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def link_tree(dest: Path, package_dir: dict[str, str], root: Path = ROOT) -> None:
    """Symlink each mapped folder at its installed dotted path under dest (which must not hold
    an enginespec/ yet)."""
    for name, folder in sorted(package_dir.items(), key=lambda kv: kv[0].count(".")):
        target = dest.joinpath(*name.split("."))
        src = root / folder
        if "." not in name:  # the root package: link its files and its own subpackages (api/utils:
            target.mkdir(parents=True)  # enginespec.utils); mapped subpackages go inside it next
            for f in src.iterdir():
                if f.suffix in (".py", ".typed") or (f / "__init__.py").is_file():
                    (target / f.name).symlink_to(f, target_is_directory=f.is_dir())
        else:
            target.symlink_to(src, target_is_directory=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "dest", nargs="?", default="build/linked", help="the tree's folder (default build/linked)"
    )
    out = Path(parser.parse_args().dest)
    out.mkdir(parents=True, exist_ok=True)
    link_tree(out, package_dirs())
    print(out)
