"""Field-by-field differences between what the impl under test and the reference decided.

Used by the lockstep tests: instead of two whole PoolStates with raw 16-byte hashes, a
divergence reads `PoolState.free_queue[0]: impl 3 != reference 4`. Hashes are shortened to
their first 4 bytes (8 hex digits), which is enough to tell blocks apart in a small trace.
"""

from __future__ import annotations

import dataclasses
from enum import Enum

MAX_LINES = 40


def short(value) -> str:
    """A compact repr: bytes as 8 hex digits, enums by name, containers element-wise."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()[:8]
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        inner = ", ".join(short(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{short(k)}: {short(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{f.name}={short(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{type(value).__name__}({fields})"
    return repr(value)


def differences(a, b, path: str = "") -> list[str]:
    """One line per differing leaf, `path: impl X != reference Y`; containers are descended
    when both sides have the same shape, else shown whole."""
    if a == b:
        return []
    if dataclasses.is_dataclass(a) and type(a) is type(b) and not isinstance(a, type):
        out = []
        for f in dataclasses.fields(a):
            out += differences(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=short):
            where = f"{path}[{short(key)}]"
            if key not in b:
                out.append(f"{where}: only in impl ({short(a[key])})")
            elif key not in a:
                out.append(f"{where}: only in reference ({short(b[key])})")
            else:
                out += differences(a[key], b[key], where)
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{path}[{i}]")
        return out
    return [f"{path or 'value'}: impl {short(a)} != reference {short(b)}"]


def divergence_report(what: str, impl_value, reference_value, context: list[str]) -> str:
    """The message of a lockstep failure: what diverged, the field-by-field diff, then context
    lines (the operation, how to get a shrunk trace)."""
    lines = differences(impl_value, reference_value, what)
    if len(lines) > MAX_LINES:
        lines = [*lines[:MAX_LINES], f"... and {len(lines) - MAX_LINES} more differences"]
    return "\n".join(["impl under test and reference diverged:", *(f"  {x}" for x in lines), *context])
