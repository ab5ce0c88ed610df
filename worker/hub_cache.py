"""The model argument as vLLM users write it: a local checkpoint directory, or a Hugging Face
repo id ("Qwen/Qwen3-0.6B") whose snapshot `hf download` already put in the local hub cache.

`resolve_checkpoint(value, field=..., revision=...)` returns the local directory to load:

1. A path that exists (after `~` expansion; a relative one from the current directory, made
   absolute) is the checkpoint, whatever `revision` says (vLLM ignores revision for a local directory
   too). The loader then checks what it holds (a file given for the directory included).
2. Otherwise `value` is read as a repo id and looked up in huggingface_hub's cache only, through
   its own `snapshot_download(..., local_files_only=True)`: refs/<revision> names the commit,
   snapshots/<commit>/ is returned (its files are symlinks into blobs/; reads follow them).
   revision is a branch, a tag or a full commit hash; None is "main". local_files_only keeps
   the lookup off the network whether HF_HUB_OFFLINE is set or not: the contract downloads
   nothing at run time, and a model already cached needs nothing downloaded.
3. Anything else is a CheckpointNotFound (a ValueError and a FileNotFoundError) naming the
   field, the places looked in and the command that fetches the model.

The cache is vLLM's download_dir when given (snapshot_download's cache_dir there too), else the
one huggingface_hub writes (hub_cache_dir): HF_HUB_CACHE, else the legacy
HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
~/.cache/huggingface/hub, read from the environment at each call and handed to
snapshot_download: huggingface_hub.constants reads them once, at its import (transformers
imports it early), so a script or server that sets them afterwards would look elsewhere.

A snapshot the hub knows to be incomplete (its cached tree listing names files the snapshot
lacks) is a CheckpointNotFound with the hub's list; one it cannot judge is returned as it is,
and the loader's CheckpointError names the missing weights or config.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from enginespec.worker.loader import CheckpointNotFound

#: Where huggingface_hub's cache lives, first set wins. A variable set to "" is set (as there:
#: huggingface_hub reads each with os.getenv(name, fallback), so an empty HF_HUB_CACHE is the
#: current directory and an empty HF_HOME puts the cache in ./hub, where `hf download` writes).
CACHE_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")


def hub_cache_dir() -> Path:
    """huggingface_hub's cache folder as the environment sets it now (module doc, the order),
    by its own rule: HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, HF_HOME
    defaulting to $XDG_CACHE_HOME/huggingface, XDG_CACHE_HOME to ~/.cache; set counts, empty or
    not (CACHE_VARIABLES)."""
    env = os.environ
    for name in CACHE_VARIABLES:
        if name in env:
            return _expand(env[name])
    xdg = env.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    return _expand(env.get("HF_HOME", os.path.join(xdg, "huggingface"))) / "hub"


def _expand(path: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(path)))


def resolve_checkpoint(value, *, field: str = "model", revision: Optional[str] = None, cache_dir=None) -> str:
    """The local directory `value` names (module doc): the path itself when it exists, else
    the cached snapshot of repo `value` at `revision` in `cache_dir` (vLLM's download_dir;
    None: hub_cache_dir()); else CheckpointNotFound naming `field`. A blank value is refused by
    name (Path("") is the current directory)."""
    text = str(value)
    if not text.strip():
        raise CheckpointNotFound(f"{field} must be a non-empty path or repo id, got {text!r}")
    local = Path(text).expanduser().absolute()  # a later chdir does not move it
    if local.exists():
        return str(local)
    cache = hub_cache_dir() if cache_dir is None else _expand(str(cache_dir))
    snapshot, why = _cached_snapshot(text, revision, cache)
    if snapshot is not None:
        return snapshot
    source = "set by HF_HUB_CACHE or HF_HOME" if cache_dir is None else "download_dir"
    raise CheckpointNotFound(_not_found(field, text, local, revision, f"{cache} ({source})", why))


def _cached_snapshot(repo_id: str, revision: Optional[str], cache: Path) -> tuple[Optional[str], str]:
    """(snapshot folder, "") when the cache holds repo_id at revision, else (None, why not):
    "" when it is simply not cached, "invalid" when repo_id is no repo id, or the hub's own
    message for a snapshot it knows is incomplete (IncompleteSnapshotError, newer
    huggingface_hub only: older ones return the folder, and the loader names what is missing)."""
    from huggingface_hub import errors, snapshot_download

    incomplete = getattr(errors, "IncompleteSnapshotError", ())
    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
    except errors.HFValidationError:
        return None, "invalid"
    except errors.LocalEntryNotFoundError as e:
        return None, _missing_files(e) if isinstance(e, incomplete) else ""
    return str(folder), ""


def _missing_files(error: Exception) -> str:
    """The files the hub's IncompleteSnapshotError lists ("1 file(s) are missing (x, y)"), or
    its whole message in one line where that part is not found."""
    text = " ".join(str(error).split())
    found = re.search(r"\d+ file\(s\) (are|is) missing \([^)]*\)", text)
    return found.group(0) if found else text.rstrip(".")


def _not_found(field: str, text: str, local: Path, revision: Optional[str], cache: str, why: str) -> str:
    """The one-line message: the field, where it looked, and how to get the model."""
    where = f"{field} {text!r} does not exist: no local directory {local}"
    if why == "invalid":
        return f"{where} (and {text!r} is no Hugging Face repo id to look up in the local cache)"
    rev = revision or "main"
    snapshot = f"snapshot of Hugging Face repo {text} at revision {rev!r} in the local cache {cache}"
    looked = (
        f"{field} {text!r}: the {snapshot} is incomplete: {why}" if why else f"{where}, and no {snapshot}"
    )
    fetch = f"hf download {text}" + (f" --revision {revision}" if revision else "")
    return (
        f"{looked}. enginespec loads only what is on disk, nothing is downloaded at run time: fetch "
        f"it first with `{fetch}` (`huggingface-cli download` before huggingface_hub 1.0), or give "
        f"a local directory"
    )
