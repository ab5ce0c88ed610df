"""pyproject.toml as setuptools, the build backend, reads it: what `pip install .` and `pip wheel .`
put in the distribution's metadata. These call setuptools' own configuration readers (the test
extra pins a setuptools as new as [build-system] asks), so a field the backend reads otherwise
than this file means, or warns about, fails here rather than in a user's build log.
tools/outside_check.sh checks the installed wheel's metadata itself."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from packaging.requirements import Requirement
from setuptools.config.pyprojecttoml import apply_configuration, read_configuration
from setuptools.dist import Distribution

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli is the same parser (the test extra has it)
    import tomli as tomllib

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


def test_the_license_is_an_spdx_expression_the_backend_takes_without_a_warning():
    """`license = {text = ...}` made setuptools >= 77 print a SetuptoolsDeprecationWarning three
    times in every build (the table form is to be removed); the SPDX string form needs
    setuptools >= 77, so [build-system] must not admit an older one."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    (backend,) = [Requirement(r) for r in requires if Requirement(r).name == "setuptools"]
    assert "77.0.0" in backend.specifier and "76.1.0" not in backend.specifier, backend
