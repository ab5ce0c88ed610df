"""Session fixtures shared with the other test tree (defined once, in enginespec.testing.fixtures)."""

from enginespec.testing.fixtures import tiny_checkpoint_root  # noqa: F401 - a fixture, used by pytest
