"""Session fixtures shared with the other test tree (defined once, in enginespec.testing.fixtures).

The suite's modules need hypothesis, which the `test` extra installs; without it the suite
stops here with one error naming the extra (each module's import error would not name it)."""

import pytest

from enginespec.testing.fixtures import (  # noqa: F401 - fixtures
    ctrl_c,
    enginespec_cache,
    release_cuda_cache,
    tiny_checkpoint_root,
    torch_compile_cache,
)

try:
    import hypothesis  # noqa: F401
except ImportError:
    raise pytest.UsageError(
        "enginespec's conformance suite needs hypothesis: pip install 'enginespec[test]'"
    ) from None
