"""argparse types the benchmark scripts share (no heavy imports: a front-end benchmark takes it
without torch's)."""

from __future__ import annotations

import argparse


def at_least_one(text: str) -> int:
    """An int >= 1, else argparse's usage error naming the bound (exit status 2)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
