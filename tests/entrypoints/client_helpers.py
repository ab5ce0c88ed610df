"""Helpers shared by the tests that drive the engine client (entrypoints/openai/engine_client.py)
without HTTP."""

from __future__ import annotations


async def final_output(gen):
    """The last output of a Generation (raising the error it ends with, if any)."""
    last = None
    while not gen.done:
        for kind, payload in await gen.next():
            if kind == "error":
                raise payload
            last = payload
    return last
