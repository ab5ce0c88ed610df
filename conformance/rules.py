"""Spec rules the checkers enforce, and where the spec states each one.

A checker decorated with `@spec_rule(key)` re-raises its AssertionError (or pytest's failure,
such as the "DID NOT RAISE" of a `pytest.raises` whose refusal never came) with a first line
naming the rule and the section of spec/SCHEDULING.md that states it (and the DESIGN.md
conformance point), so a failing property test tells a backend author what to read. The
original traceback is kept (the message is changed in place), so Hypothesis still tells apart
failures raised at different lines.
"""

from __future__ import annotations

import functools
from importlib.resources import files

import pytest

SPEC_FILE = "spec/SCHEDULING.md"
PREFIX = "[spec rule "

#: rule -> (what it says, SCHEDULING.md section heading, DESIGN.md conformance point)
RULES = {
    "pool-accounting": (
        "ref counts equal table occurrences, the free queue holds exactly the unreferenced blocks, "
        "`cached` inverts `block_hashes`, empty tables are absent",
        "Block manager",
        1,
    ),
    "idle-pool": ("with nothing unfinished every block is free", "Block manager", 1),
    "no-caching": ("with prefix caching off nothing is published", "Block manager", 3),
    "request-invariants": (
        "token_ids = prompt + output, 0 <= cached <= computed <= num_tokens, block_hashes is the canonical chain",
        "Block manager",
        1,
    ),
    "hash-chain": ("a published block carries its position's canonical chain hash", "Block manager", 3),
    "allocate-slots": (
        "all-or-nothing feasibility, cached blocks adopted in order, new blocks popped from the front",
        "Block manager",
        2,
    ),
    "free-order": (
        "blocks reaching ref 0 go to the back of the free queue tail first, keeping their hash "
        "(trimmed ones without a hash to the front)",
        "Block manager",
        4,
    ),
    "find-cached-prefix": (
        "longest cached run, stop at first miss, one token always left",
        "Block manager",
        3,
    ),
    "step-limits": (
        "budget and max_num_seqs never exceeded, n >= 1, never past the known tokens",
        "Scheduler.schedule()",
        5,
    ),
    "chunking": (
        "long_prefill_token_threshold caps a chunk starting inside the prompt, never a decode or its drafts; "
        "chunked prefill off schedules whole",
        "Scheduler.schedule()",
        5,
    ),
    "schedule-order": (
        "running first in key order, victims from the back, admissions in policy order, "
        "none past a swapped request of a better key, no admission in a step that preempted",
        "Orders",
        5,
    ),
    "preemption": (
        "recompute resets progress and drops drafts; swap keeps it and lists the blocks to copy out",
        "Scheduler.schedule()",
        5,
    ),
    "admission": (
        "admitted after their cached prefix; swap-ins list the blocks of their kept KV",
        "Scheduler.schedule()",
        5,
    ),
    "tables-after-schedule": (
        "a scheduled request's table covers exactly computed + scheduled tokens",
        "Scheduler.schedule()",
        5,
    ),
    "update-and-stops": (
        "progress advanced by n, samples appended at the end only, stop rules in order",
        "Scheduler.update_from_output(output, sampled)",
        5,
    ),
    "queues": ("queues hold the unfinished requests in policy order, tables match each status", "Orders", 5),
    "liveness": (
        "every request that fits finishes; never two empty steps while work is left",
        "Scheduler.schedule()",
        5,
    ),
    "abort": (
        "abort/finish from any state free the blocks and report the id next step",
        "Scheduler.update_from_output(output, sampled)",
        5,
    ),
    "add-refusals": ("add() refuses what can never run, changing nothing", "Scheduler.add(r)", 5),
}


def headings() -> list[str]:
    """The `## ` section headings of the shipped SCHEDULING.md."""
    text = files("enginespec.spec").joinpath("SCHEDULING.md").read_text()
    return [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]


def where(key: str) -> str:
    what, section, point = RULES[key]
    return (
        f'{PREFIX}{key}: {what}; see {SPEC_FILE}, section "{section}" (DESIGN.md conformance point {point})]'
    )


def spec_rule(key: str):
    """Decorator: an AssertionError or a pytest failure (`pytest.fail`, `pytest.raises`' "DID
    NOT RAISE") from the checker is prefixed with `where(key)` (once: the innermost rule wins
    when checkers call each other)."""
    if key not in RULES:
        raise KeyError(f"unknown spec rule {key!r}")

    def wrap(fn):
        @functools.wraps(fn)
        def checked(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except AssertionError as e:
                msg = str(e.args[0]) if e.args else ""
                if not msg.startswith(PREFIX):
                    e.args = (f"{where(key)}\n{msg}", *e.args[1:])
                raise
            except pytest.fail.Exception as e:  # pytest.xfail's XFailed is one too: left alone
                if not isinstance(e, pytest.xfail.Exception) and not (e.msg or "").startswith(PREFIX):
                    e.msg = f"{where(key)}\n{e.msg}"
                raise

        return checked

    return wrap
