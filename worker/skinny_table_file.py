"""A LinearTable's choices on disk: saved after tuning and loaded at the next start, which then
tunes only what the file lacks. Where (`table_path`): ENGINESPEC_SKINNY_TABLE=path; unset, a
file in the cache folder (ENGINESPEC_CACHE_DIR, else $XDG_CACHE_HOME/enginespec, else
~/.cache/enginespec) named by a hash of the fingerprint below, so a second start skips the
tuning as inductor's and Triton's caches skip their compiles; ENGINESPEC_SKINNY_TABLE=0 (or
blank): no file, every start tunes.

Why: tuning times every launch shape at startup (seconds), and its picks vary from run to run
where two shapes are within noise of each other, which confounds A/B runs of anything else in
the step (benchmarks/RESULTS.md, fifteenth session: the gate|up GEMV took block_n 4 in one tree
and 8 in the others). A file pins the picks across runs and trees, and skips the tuning.

Invariant: a file is used only where it was measured for the same thing. Its fingerprint (the
device's name, compute capability and SM count, the torch and triton versions, a hash of
kernels/skinny_gemm.py's source, one of worker/gemm_tuning.py's, which says which launch
shapes were timed: a file tuned before new candidates were offered would keep the old picks,
and one of worker/skinny_linear.py's, whose rules pick among the timings: a file picked under
an older margin would keep its picks)
must equal this process's, and it must cover at least the
table's max_rows; otherwise it is ignored with a warning naming the path and the difference,
and the table is tuned as without it (then saved over it). A file that does not exist yet is
the first run, not a warning. Writes are atomic (a temp file, then os.replace), so processes
sharing a path (tensor-parallel ranks) never read half a file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Optional

import torch

log = logging.getLogger(__name__)

TABLE_ENV = "ENGINESPEC_SKINNY_TABLE"
FORMAT = 1


CACHE_ENV = "ENGINESPEC_CACHE_DIR"


def path_from_env() -> Optional[Path]:
    """ENGINESPEC_SKINNY_TABLE as a path, or None when unset, blank or "0"."""
    raw = os.environ.get(TABLE_ENV, "").strip()
    return Path(raw).expanduser() if raw and raw != "0" else None


def cache_dir() -> Path:
    """enginespec's cache folder: ENGINESPEC_CACHE_DIR, else $XDG_CACHE_HOME/enginespec, else
    ~/.cache/enginespec, else (no home directory) the temp dir's enginespec-cache; not created
    here."""
    raw = os.environ.get(CACHE_ENV, "").strip()
    if raw:
        return Path(raw).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg:
        return Path(xdg) / "enginespec"
    try:
        return Path.home() / ".cache" / "enginespec"
    except RuntimeError:  # no home to resolve (HOME unset, no passwd entry): a cache, not a need
        return Path(tempfile.gettempdir()) / "enginespec-cache"


def table_path(device) -> Optional[Path]:
    """Where this process's table lives (module doc): the env's path, None when the env turns
    the file off, else the cache folder's file for this device's fingerprint."""
    if TABLE_ENV in os.environ:
        return path_from_env()
    digest = hashlib.sha256(json.dumps(fingerprint(device), sort_keys=True).encode()).hexdigest()
    return cache_dir() / f"skinny_table-{digest[:16]}.json"


def fingerprint(device) -> dict:
    """What the choices were measured on and with (module doc): equal fingerprints, same table."""
    import triton

    from enginespec.kernels import skinny_gemm
    from enginespec.worker import gemm_tuning, skinny_linear

    device = torch.device(device)
    out = {
        "format": FORMAT,
        "device": device.type,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "kernel": _source_hash(skinny_gemm),
        "candidates": _source_hash(gemm_tuning),
        "picker": _source_hash(skinny_linear),
        "gemv_tune_rows": gemm_tuning.gemv_tune_rows(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(device=props.name, capability=[props.major, props.minor], sms=props.multi_processor_count)
    return out


def _source_hash(module) -> str:
    return hashlib.sha256(inspect.getsource(module).encode()).hexdigest()[:16]


def save(table, path: Path) -> bool:
    """Write every choice of `table` (a LinearTable) to path, atomically; False (warned, no
    temp file left) when the path cannot be written: a cache that cannot be saved must not stop
    an engine that has its table in memory."""
    rows = [_row(key, choice) for key, choice in table.choices.items()]
    doc = {"fingerprint": fingerprint(table.device), "max_rows": table.max_rows, "choices": rows}
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("%s: could not save the table to %s (%s: %s)", TABLE_ENV, path, type(e).__name__, e)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        return False
    return True


def load(table, path: Path) -> int:
    """Add the file's choices to `table` (those of at most table.max_rows rows); the number
    added, 0 when the file is absent or does not apply (module doc: warned, then ignored)."""
    path = Path(path)
    try:
        if not path.exists():
            return 0
        doc = json.loads(path.read_text())
        theirs, rows = doc["fingerprint"], doc["choices"]
        entries = [_entry(row) for row in rows]
        max_rows = int(doc["max_rows"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning(
            "%s: ignoring %s (unreadable: %s: %s); tuning instead", TABLE_ENV, path, type(e).__name__, e
        )
        return 0
    ours = fingerprint(table.device)
    if theirs != ours:
        diff = {
            k: (theirs.get(k), ours.get(k))
            for k in ours.keys() | theirs.keys()
            if theirs.get(k) != ours.get(k)
        }
        log.warning(
            "%s: ignoring %s (measured elsewhere: file vs this process %s); tuning instead",
            TABLE_ENV,
            path,
            diff,
        )
        return 0
    if max_rows < table.max_rows:
        log.warning(
            "%s: ignoring %s (tuned up to %d rows, %d needed); tuning instead",
            TABLE_ENV,
            path,
            max_rows,
            table.max_rows,
        )
        return 0
    added = 0
    for key, choice in entries:
        if key[0] <= table.max_rows:
            table.choices[key] = choice
            added += 1
    return added


def _row(key: tuple, choice) -> dict:
    """One choice as JSON: its key's fields, the launch shape (None: the baseline), the times."""
    bucket, n, k, dtype, has_bias, variant = key
    config = None if choice.config is None else dataclasses.asdict(choice.config)
    return {
        "rows": bucket,
        "n": n,
        "k": k,
        "dtype": str(dtype).removeprefix("torch."),
        "bias": has_bias,
        "variant": variant,
        "config": config,
        "us": choice.us,
        "baseline_us": choice.baseline_us,
    }


def _entry(row: dict) -> tuple:
    """_row's inverse: (LinearTable key, Choice); ValueError/KeyError/TypeError on a bad row."""
    from enginespec.kernels.skinny_gemm import SkinnyConfig
    from enginespec.worker.skinny_linear import VARIANTS, Choice

    dtype = getattr(torch, str(row["dtype"]), None)
    if not isinstance(dtype, torch.dtype) or row["variant"] not in VARIANTS:
        raise ValueError(f"bad dtype or variant in {row}")
    key = (int(row["rows"]), int(row["n"]), int(row["k"]), dtype, bool(row["bias"]), row["variant"])
    config = None if row["config"] is None else SkinnyConfig(**row["config"])
    return key, Choice(config, float(row["us"]), float(row["baseline_us"]))
