"""pyproject.toml as setuptools, the build backend, reads it: what `pip install .` and `pip wheel .`
put in the distribution's metadata. These call setuptools' own configuration readers (the test
extra pins a setuptools as new as [build-system] asks), so a field the backend reads otherwise
than this file means, or warns about, fails here rather than in a user's build log.
tools/outside_check.sh checks the installed wheel's metadata itself."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools.config.pyprojecttoml import read_configuration

ROOT = Path(__file__).resolve().parent.parent


def test_the_distributions_version_is_the_packages_own():
    import enginespec

    assert read_configuration(ROOT / "pyproject.toml")["project"]["version"] == enginespec.__version__


def test_a_version_bumped_in_the_package_alone_is_the_distributions(tmp_path):
    """The version is written once, `__version__` in api/__init__.py, and the build reads it from
    there: pyproject.toml wrote it too ("0.2.0" twice), so a bump of one left the wheel's metadata
    and `enginespec --version` disagreeing. The planted copy holds only that file, whose imports
    cannot run there: setuptools must read the assignment without importing the package, as it
    must in pip's build isolation (no torch)."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "api").mkdir()
    source = (ROOT / "api" / "__init__.py").read_text()
    import enginespec

    line = f'__version__ = "{enginespec.__version__}"\n'
    assert source.count(line) == 1, "api/__init__.py must assign __version__ a string literal"
    (tmp_path / "api" / "__init__.py").write_text(source.replace(line, '__version__ = "9.9.9"\n'))
    assert read_configuration(tmp_path / "pyproject.toml")["project"]["version"] == "9.9.9"
