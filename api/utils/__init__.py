"""vLLM's `vllm.utils` module path, for the one name its example scripts import from it:
`from vllm.utils import FlexibleArgumentParser` becomes `from enginespec.utils import
FlexibleArgumentParser` (later vLLM releases moved it to `vllm.utils.argparse_utils`, and
`enginespec.utils.argparse_utils` holds it too)."""

from __future__ import annotations

from enginespec.utils.argparse_utils import FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]
