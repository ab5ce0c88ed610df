"""Sleep mode (vLLM's `LLM.sleep` / `wake_up` / `is_sleeping`): a runner's device memory given
back between rollouts, as RLHF frameworks (verl, OpenRLHF) ask of their inference engine.

Two tags, vLLM's: "weights" (the model's parameters, buffers and tensor attributes) and
"kv_cache" (the runner's paged pool). `sleep(level=1)` puts both to sleep: the weights are
copied to host memory (pinned on CUDA) and their device memory freed; the KV cache is freed and
its contents forgotten. `wake_up(tags)` restores the named tags (None: both); a tag that is not
asleep is left alone, so waking twice or in parts is allowed.

Level 2 (vLLM's: discard the weights, for the caller to load new ones) releases the same two
tags, but the target model's parameters (every checkpoint tensor and the merged decoder's merged
weights) get no host copy; its buffers (rotary tables, folded norms' weights: not in the
checkpoint) are kept in host memory as at level 1, and a draft model sleeps as at level 1 (weight
updates reach the target only). `wake_up` gives the discarded storages back zero-filled, and the
engine then refuses requests (EngineAsleepError, naming what is missing) until the weights are
filled again: `load_weights` has given every checkpoint name, over any number of calls, or
`reload_weights` has run (worker/weight_update.py). vLLM's RLHF recipe, which this keeps:
sleep(level=2); train; wake_up(tags=["weights"]); load_weights(the new state dict); wake_up(
tags=["kv_cache"]). A weight update while the weights tag sleeps is a RuntimeError (its storages
are 0 bytes: wake_up(tags=["weights"]) first); the KV cache may sleep meanwhile. Under tensor
parallelism every rank discards its shard, and an update fills every rank's again.

How memory is released, storage by storage, so that every view and every holder follows:
- Each device storage behind the tensors of a tag is resized to 0 bytes (the tensors keep their
  Python objects, shapes and strides: the merged decoder's q|k|v weight and the row views the
  checkpoint's Linear modules hold of it, a tied head, the compiled body's references). Waking
  resizes it back and fills it: the weights with their host copy, byte for byte (the values are
  exactly those before); the KV pool with zeros (the pool as allocated: nothing cached).
- A storage the allocator cannot resize (a checkpoint tensor that maps the file, on the CPU) is
  first moved into an ordinary one (`_adopt`), with every tensor found over it re-pointed at
  the same offset, size and stride. A tensor over it that the walk does not find (none known
  today) would keep the old storage: its memory is then not freed, but its values stay right.
- Captured CUDA graphs hold raw device pointers, which a resize changes: the runner drops its
  graphs at sleep and captures them again once both tags are awake (ModelRunner.wake_up).

Invariant: a runner with any tag asleep, or with weights a level-2 sleep discarded and no update
has filled yet, never runs a forward (ModelRunner.execute raises EngineAsleepError), so no kernel
reads a 0-byte storage or a zero-filled weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch

#: vLLM's memory tags, in the order sleep(level=1) releases them
SLEEP_TAGS = ("weights", "kv_cache")
#: the sleep levels this engine takes (module doc)
SLEEP_LEVELS = (1, 2)


class EngineAsleepError(RuntimeError):
    """The engine (or a runner) is asleep: no request is taken and no forward runs until
    wake_up() restores every tag."""


def check_level(level) -> tuple[str, ...]:
    """The tags sleep(level) releases (both, at either level); a ValueError naming `level` for
    anything but 1 or 2."""
    if isinstance(level, int) and not isinstance(level, bool) and level in SLEEP_LEVELS:
        return SLEEP_TAGS
    raise ValueError(
        f"level must be one of {list(SLEEP_LEVELS)} (1: weights to host memory; 2: weights "
        f"discarded, for load_weights / reload_weights to refill; both free the KV cache), got {level!r}"
    )


def check_filled(unfilled: set) -> None:
    """EngineAsleepError naming what is missing while weights a level-2 sleep discarded are not
    all filled again (module doc)."""
    if unfilled:
        some = sorted(unfilled)[:3]
        raise EngineAsleepError(
            f"the weights were discarded by sleep(level=2) and {len(unfilled)} checkpoint tensor(s) "
            f"are not loaded yet (e.g. {some}): call load_weights() with them or reload_weights() first"
        )


def check_tags(tags) -> tuple[str, ...]:
    """wake_up's tags: None means every tag; else a list (or tuple) of SLEEP_TAGS' names, each
    once in the result. A ValueError naming `tags` otherwise (a bare string too: vLLM takes a
    list, and a string would read as its characters)."""
    if tags is None:
        return SLEEP_TAGS
    if isinstance(tags, (str, bytes)) or not isinstance(tags, (list, tuple)):
        raise ValueError(f"tags must be None or a list of {list(SLEEP_TAGS)}, got {tags!r}")
    unknown = [t for t in tags if t not in SLEEP_TAGS]
    if unknown:
        raise ValueError(f"tags must be among {list(SLEEP_TAGS)}, got {unknown}")
    return tuple(dict.fromkeys(tags))


def model_tensors(model) -> list[torch.Tensor]:
    """Every tensor on the model's device that its modules hold: parameters, buffers and plain
    tensor attributes, of the checkpoint's module tree and of the merged decoder's (which holds
    the merged weights). Each object once."""
    roots = [model.hf_model]
    merged = getattr(model, "merged", None)
    if merged is not None:
        roots.append(merged)
    device = torch.device(model.device)
    found: dict[int, torch.Tensor] = {}
    for root in roots:
        for module in root.modules():
            values = (*module._parameters.values(), *module._buffers.values(), *vars(module).values())
            for value in values:
                if isinstance(value, torch.Tensor) and value.device == device:
                    found.setdefault(id(value), value)
    return list(found.values())


@dataclass
class _Storage:
    """One device storage and the known tensors over it; `host` its bytes while asleep (weights
    only), `num_bytes` its size awake."""

    storage: torch.UntypedStorage
    tensors: list[torch.Tensor]
    num_bytes: int
    host: Optional[torch.Tensor] = None
    keep: bool = True  # copy the bytes to host memory first (else restore zero-fills)


def _group(tensors: Iterable[torch.Tensor]) -> list[_Storage]:
    """The tensors by the storage they view (a 0-byte one is skipped: nothing to free)."""
    groups: dict[int, _Storage] = {}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            continue
        key = storage.data_ptr()
        if key not in groups:
            groups[key] = _Storage(storage, [], storage.nbytes())
        groups[key].tensors.append(t)
    return list(groups.values())


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@torch.no_grad()
def _adopt(group: _Storage) -> None:
    """Move a storage the allocator cannot resize into an ordinary one, re-pointing every
    known tensor over it (module doc)."""
    fresh = torch.empty(group.num_bytes, dtype=torch.uint8, device=group.storage.device)
    fresh.copy_(_bytes(group.storage))
    storage = fresh.untyped_storage()
    for t in group.tensors:
        t.set_(storage, t.storage_offset(), t.size(), t.stride())
    group.storage = storage


def _release(group: _Storage, keep: bool) -> None:
    """One storage to 0 bytes, its bytes first copied to host memory when `keep` (group.keep)."""
    if not group.storage.resizable():
        _adopt(group)
    if keep:
        pin = group.storage.device.type == "cuda"
        group.host = torch.empty(group.num_bytes, dtype=torch.uint8, pin_memory=pin)
        group.host.copy_(_bytes(group.storage))
    group.storage.resize_(0)


@dataclass
class Asleep:
    """The storages of one tag while it sleeps. `keep`: their bytes are copied to host memory
    first and written back on restore (weights, but a level-2 sleep's parameters: release's
    `discard`); else restore zero-fills them (KV cache)."""

    keep: bool
    groups: list[_Storage] = field(default_factory=list)

    @classmethod
    def release(
        cls, tensors: Iterable[torch.Tensor], keep: bool, discard: frozenset = frozenset()
    ) -> "Asleep":
        """Free the device memory behind `tensors` (module doc); the returned object restores it.
        `discard`: ids of tensors whose values may be dropped even with `keep` (level 2's
        parameters): a storage every found tensor of which is among them gets no host copy.
        All or nothing: where one storage fails (host memory for its copy runs out, say), those
        released before it are restored and the error raised."""
        groups = _group(tensors)
        for group in groups:
            group.keep = keep and not all(id(t) in discard for t in group.tensors)
        done = cls(keep)
        try:
            for group in groups:
                _release(group, group.keep)
                done.groups.append(group)
        except BaseException:
            done.restore()
            raise
        return done

    def restore(self) -> None:
        """Give every storage its bytes back: the host copy's (keep) or zeros."""
        for group in self.groups:
            group.storage.resize_(group.num_bytes)
            view = _bytes(group.storage)
            if group.keep:
                view.copy_(group.host)
                group.host = None
            else:
                view.zero_()
        self.groups = []

    @property
    def num_bytes(self) -> int:
        """Device bytes this tag released."""
        return sum(g.num_bytes for g in self.groups)
