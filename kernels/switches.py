"""Environment switches of one bit (ENGINESPEC_COMPILE, ENGINESPEC_PDL, ENGINESPEC_FUSED_DECODE,
...): one parser, so every such variable reads the same way and fails with the same message.
It lives here, where nothing else of enginespec may be imported, so that the kernels' own
switches (PDL, the precompile pass) and the rest of the engine (worker.switches re-exports it)
share it."""

from __future__ import annotations

import os
from typing import Optional


def env_switch(name: str) -> Optional[bool]:
    """The switch `name` says: None when unset or empty (the caller's default applies), True for
    "1", False for "0" (surrounding spaces ignored). ValueError naming the variable for anything
    else: a typo must not silently pick the default."""
    raw = os.environ.get(name, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {raw!r}")
    return None if raw == "" else raw == "1"
