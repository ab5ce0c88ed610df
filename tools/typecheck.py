"""Type-check the product with mypy, under the import names it installs with.

The tree is laid out by role (spec/, impls/, ...) and pyproject.toml's package-dir maps each
folder to `enginespec.<name>`; mypy cannot follow setuptools' editable-install finder, so this
script builds a throwaway tree of symlinks with the installed names (read from pyproject.toml,
so it never drifts), runs mypy there with the settings of [tool.mypy], and prints each error
with its path in this repository. Exit status is mypy's.

    python tools/typecheck.py                 # the packages in [tool.enginespec.typecheck]
    python tools/typecheck.py enginespec.spec # one package
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomllib is 3.11's; tomli is the same parser
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from link_tree import link_tree  # noqa: E402


def main(argv: list[str]) -> int:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir = config["tool"]["setuptools"]["package-dir"]
    packages = argv or config["tool"]["enginespec"]["typecheck"]["packages"]
    with tempfile.TemporaryDirectory(prefix="enginespec-typecheck-") as tmp:
        link_tree(Path(tmp), package_dir, ROOT)
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
        for p in packages:
            cmd += ["-p", p]
        proc = subprocess.run(
            cmd, cwd=tmp, capture_output=True, text=True, env={**os.environ, "MYPYPATH": tmp}
        )
    back = {name.replace(".", "/") + "/": folder + "/" for name, folder in package_dir.items()}
    pattern = re.compile("|".join(re.escape(k) for k in sorted(back, key=len, reverse=True)))
    for line in (proc.stdout + proc.stderr).splitlines():
        print(pattern.sub(lambda m: back[m.group(0)], line, count=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
