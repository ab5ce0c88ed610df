"""The Implementation protocol and `load_impl`, the one way to reach an implementation."""

from __future__ import annotations

import importlib
import os
import sys
from importlib import metadata
from typing import Optional, Protocol, Sequence, runtime_checkable

from enginespec.spec.attention import AttentionBackend
from enginespec.spec.block_manager import BlockManager
from enginespec.spec.config import SchedulerConfig
from enginespec.spec.params import SamplingParams
from enginespec.spec.request import Request
from enginespec.spec.scheduler import Scheduler

ENTRY_POINT_GROUP = "enginespec.impls"
BUILTIN = {"reference": "enginespec.impls.reference:IMPL", "fast": "enginespec.impls.fast:IMPL"}
ENV_VAR = "ENGINESPEC_IMPL"


@runtime_checkable
class Implementation(Protocol):
    """A set of parts the engine composes: requests, block manager, scheduler, attention.

    Optional: `build_batch(output, block_manager, device="cpu", pad_to=None) -> spec.Batch`;
    the engine uses its own plain builder when an impl has none.
    `capabilities`: a frozenset of strings such as {"swap", "cuda_graphs"}.
    """

    name: str
    capabilities: frozenset

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: Optional[SamplingParams] = None,
        *,
        eos_token_id: Optional[int] = None,
        priority: int = 0,
        arrival_time: Optional[float] = None,
        cache_key: tuple = (),
    ) -> Request: ...

    def new_block_manager(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True
    ) -> BlockManager: ...

    def new_scheduler(self, config: SchedulerConfig, block_manager: BlockManager) -> Scheduler: ...

    def attention_backend(self, device) -> AttentionBackend: ...


class PartsImpl:
    """An Implementation whose first three factories construct three classes: subclasses set
    `name`, `capabilities`, `request_cls`, `block_manager_cls`, `scheduler_cls` and write
    `attention_backend`. Only construction is shared here, no decision: each impl's parts stay
    its own (the differential tests compare them), so a bug in one is never a bug in both."""

    name: str
    capabilities: frozenset = frozenset()  # no optional capability unless a subclass says so
    request_cls: type
    block_manager_cls: type
    scheduler_cls: type

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: Optional[SamplingParams] = None,
        *,
        eos_token_id: Optional[int] = None,
        priority: int = 0,
        arrival_time: Optional[float] = None,
        cache_key: tuple = (),
    ):
        return self.request_cls(
            request_id,
            prompt_token_ids,
            params,
            eos_token_id=eos_token_id,
            priority=priority,
            arrival_time=arrival_time,
            cache_key=cache_key,
        )

    def new_block_manager(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        return self.block_manager_cls(num_blocks, block_size, enable_prefix_caching)

    def new_scheduler(self, config: SchedulerConfig, block_manager):
        return self.scheduler_cls(config, block_manager)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


#: What `load_impl` (and so `--impl`) accepts, for error messages.
ACCEPTED_FORMS = (
    "a registered name (built-in or an `enginespec.impls` entry point), 'pkg.module' or a top-level "
    "'module' (its IMPL attribute), or 'pkg.module:attr'"
)


def _unknown(target: str, known: list[str], module_name: str = "") -> ValueError:
    """The error for a name that is neither registered nor an importable module; with a hint
    when the module sits in the current directory, which is not on sys.path (plain `pytest` and
    the `enginespec` script leave it off, `python -m pytest` and `python -m enginespec` put it on)."""
    return ValueError(
        f"unknown impl {target!r}: not a registered name (registered: {known}) and no importable "
        f"module of that name; --impl / load_impl accept {ACCEPTED_FORMS}{_cwd_hint(module_name)}"
    )


def _cwd_hint(module_name: str) -> str:
    top = module_name.split(".")[0]
    if not top or any(os.path.abspath(entry or ".") == os.getcwd() for entry in sys.path):
        return ""
    if not (os.path.isfile(f"{top}.py") or os.path.isfile(os.path.join(top, "__init__.py"))):
        return ""
    return (
        f" (module {top!r} is in the current directory, which is not on sys.path: run "
        f"`python -m pytest` or `python -m enginespec`, or set PYTHONPATH=.)"
    )


def _import(module_name: str, target: str, known: list[str]):
    """Import the module part of `target`. A module that does not exist at all is an unknown impl
    (the message lists the registered names); one that exists but fails to import (a missing
    dependency inside it) keeps its own error, so a backend's import bug is not reported as a typo."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise _unknown(target, known, module_name) from e
        raise ValueError(f"impl {target!r}: cannot import module {module_name!r}: {e}") from e
    except ImportError as e:
        raise ValueError(f"impl {target!r}: cannot import module {module_name!r}: {e}") from e


def _load_entry_point(ep: metadata.EntryPoint):
    """The object a registered entry point names. Its module failing to import (a dependency of
    the backend missing) or lacking the attribute is a ValueError naming the entry point and the
    cause, as for the module form (`_import`), so `--impl` reports it once as a usage error."""
    try:
        return ep.load()
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"impl {ep.name!r}: entry point {ep.name} = {ep.value} cannot be loaded: {e!r}"
        ) from e


def _resolve(target: str, known: list[str]):
    """The object `target` names: 'module:attr' (attr may be dotted) or 'module' (its IMPL)."""
    module_name, _, attr = target.partition(":")
    obj = _import(module_name, target, known)
    for part in (attr or "IMPL").split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(
                f"impl {target!r}: module {module_name!r} has no attribute {attr or 'IMPL'!r} "
                f"(registered names: {known}; accepted forms: {ACCEPTED_FORMS})"
            ) from None
    return obj


#: The methods every Implementation has (a class lacking one is not an Implementation class).
FACTORIES = ("new_request", "new_block_manager", "new_scheduler", "attention_backend")


def _instantiate(target: str, cls: type):
    """An instance of the Implementation class `cls`, made with no arguments. A class without
    the factory methods (a block manager or scheduler class named by mistake) is a ValueError
    naming what it lacks, before it is called; one whose constructor needs arguments is a
    ValueError saying so, not a bare TypeError."""
    missing = [a for a in FACTORIES if not hasattr(cls, a)]
    if missing:
        raise ValueError(
            f"impl {target!r}: class {cls.__qualname__} is not an Implementation (missing {missing}); "
            f"name an Implementation, the object whose new_block_manager / new_scheduler build the parts"
        )
    try:
        return cls()
    except TypeError as e:
        raise ValueError(
            f"impl {target!r}: class {cls.__qualname__} cannot be made with no arguments ({e}); "
            f"name an instance instead (e.g. its module's IMPL)"
        ) from e


def load_impl(name: Optional[str] = None) -> Implementation:
    """Return the Implementation named by `name` (default: $ENGINESPEC_IMPL, else "reference").

    Accepts "reference", "fast", the name of an entry point in the `enginespec.impls` group,
    "pkg.module:attr" (attr may be dotted; a class is instantiated with no arguments), or
    "pkg.module" / a top-level "module" (its IMPL attribute). A registered name wins over a module
    of the same name; any other name is tried as an importable module. An object (or class) is
    taken as it is, after the same check: one that lacks an Implementation's name or factories
    is a ValueError here, not an AttributeError deep in the engine that uses it.
    """
    name = name or os.environ.get(ENV_VAR) or "reference"
    if not isinstance(name, str):
        obj = name  # an Implementation (or its class) given as it is: checked as a named one
    elif name in BUILTIN:
        obj = _resolve(BUILTIN[name], sorted(BUILTIN))
    else:
        eps = {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
        obj = _load_entry_point(eps[name]) if name in eps else _resolve(name, sorted(set(BUILTIN) | set(eps)))
    if isinstance(obj, type):
        obj = _instantiate(name, obj)
    missing = [a for a in ("name", *FACTORIES) if not hasattr(obj, a)]
    if missing:
        raise ValueError(f"impl {name!r} is not an Implementation: missing {missing}")
    return obj
