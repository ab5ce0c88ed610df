"""A pinned skinny-GEMM table (ENGINESPEC_SKINNY_TABLE's file) with chosen picks replaced, for
A/B runs of launch shapes the startup tuning did not pick.

The tuning times each launch alone; in the decode step a launch also decides how soon the next
kernel's programs become resident under PDL (benchmarks/RESULTS.md, twenty-fourth session: the
down GEMV's 1,024 programs of 8 warps fill 97% of the warp slots before the q|k|v GEMV). A run
with ENGINESPEC_SKINNY_TABLE pointing at a variant file takes its picks as they are (the
fingerprint is the base file's, so make it from a table tuned by the same tree on the same
machine), which is how one shape is tried in the step without touching the tuning.

    python3 benchmarks/table_variant.py BASE.json OUT.json --set 1,1024,3072,residual=num_warps:4 \\
        [--set ROWS,N,K,VARIANT=KEY:VALUE,...]

Each --set names the entries (rows, n, k, variant; every dtype and bias) whose launch shape
changes: the given SkinnyConfig fields over the pick's (a baseline pick, config null, needs a
whole shape), checked by SkinnyConfig itself. Its times stay the base's (they are the tuning's,
not the new shape's); the changed entries are listed on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

_INT_FIELDS = ("block_n", "block_k", "num_splits", "num_warps", "num_stages")
_BOOL_FIELDS = ("use_dot", "gemv")


def parse_set(text: str) -> tuple[tuple, dict]:
    """'ROWS,N,K,VARIANT=KEY:VALUE,...' -> ((rows, n, k, variant), {field: value}); ValueError
    naming --set otherwise."""
    key_text, sep, fields_text = text.partition("=")
    parts = [p.strip() for p in key_text.split(",")]
    if not sep or len(parts) != 4 or not all(p.isdigit() for p in parts[:3]) or not fields_text.strip():
        raise ValueError(f"--set takes ROWS,N,K,VARIANT=KEY:VALUE,..., got {text!r}")
    fields: dict = {}
    for item in fields_text.split(","):
        name, _, value = item.strip().partition(":")
        if name in _INT_FIELDS and value.isdigit():
            fields[name] = int(value)
        elif name in _BOOL_FIELDS and value in ("0", "1"):
            fields[name] = value == "1"
        else:
            raise ValueError(
                f"--set: {item!r} is not one of {_INT_FIELDS + _BOOL_FIELDS} with an int (0/1) value"
            )
    return (int(parts[0]), int(parts[1]), int(parts[2]), parts[3]), fields


def apply(doc: dict, key: tuple, fields: dict) -> list[dict]:
    """Replace the launch shape of doc's entries matching key (rows, n, k, variant) by their
    config with `fields` over it, in place; returns the changed entries. ValueError when none
    match or the shape is not a valid SkinnyConfig."""
    from enginespec.kernels.skinny_gemm import SkinnyConfig

    rows, n, k, variant = key
    hits = [e for e in doc["choices"] if (e["rows"], e["n"], e["k"], e["variant"]) == (rows, n, k, variant)]
    if not hits:
        raise ValueError(f"no entry for rows={rows}, n={n}, k={k}, variant={variant!r} in the base table")
    for entry in hits:
        shape = dict(entry["config"] or {}, **fields)
        try:
            entry["config"] = dataclasses.asdict(SkinnyConfig(**shape))
        except TypeError as e:  # a baseline pick given only some fields
            raise ValueError(f"{key}: the pick is the baseline, give a whole shape ({e})") from None
    return hits


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/table_variant.py", description=__doc__.split("\n\n")[0])
    p.add_argument("base", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument(
        "--set", dest="sets", action="append", required=True, metavar="ROWS,N,K,VARIANT=KEY:VALUE,..."
    )
    args = p.parse_args(argv)
    try:
        doc = json.loads(args.base.read_text())
        changed = [entry for text in args.sets for entry in apply(doc, *parse_set(text))]
    except (OSError, ValueError, KeyError) as e:
        print(f"table_variant: {e}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(doc, indent=1))
    for e in changed:
        print(
            f"{args.out}: rows {e['rows']} {e['n']} x {e['k']} {e['variant']} ({e['dtype']}) -> {e['config']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
