"""Environment switches of one bit (ENGINESPEC_COMPILE, ENGINESPEC_FOLD_NORMS,
ENGINESPEC_BALANCED_GRAPHS, ...): one parser, so every such variable reads the same way and
fails with the same message. It is kernels/switches.py's, which the kernels' own switches use
too (the kernels import nothing else of enginespec)."""

from __future__ import annotations

from enginespec.kernels.switches import env_switch

__all__ = ["env_switch"]
