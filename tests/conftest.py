"""Session fixtures shared with the other test tree (defined once, in enginespec.testing.fixtures)."""

from enginespec.testing.fixtures import tiny_checkpoint_root, torch_compile_cache  # noqa: F401 - fixtures
