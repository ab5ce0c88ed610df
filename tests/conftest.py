"""Session fixtures shared with the other test tree (defined once, in enginespec.testing.fixtures)."""

from enginespec.testing.fixtures import (  # noqa: F401 - fixtures
    enginespec_cache,
    release_cuda_cache,
    tiny_checkpoint_root,
    torch_compile_cache,
)
