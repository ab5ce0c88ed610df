"""Which code builds each part of the impl under test, and whether it is enginespec's own.

An outside impl usually replaces one part (its block manager, say) and keeps the rest from the
reference (docs/writing-a-backend.md); the suite then judges the whole, so its passes on the
scheduler, attention or batch-layout points are the reference's as much as the author's. The
header of a run and the conformance report say, per part, the class (or factory) that builds
it and whether that is enginespec's (`enginespec.impls.*` or `enginespec.spec.*`), so a
published report never reads as if the author wrote what they kept.
"""

from __future__ import annotations

from typing import Optional

#: part -> (the Implementation's factory, the PartsImpl attribute naming the class it builds)
ROLES = {
    "request": ("new_request", "request_cls"),
    "block_manager": ("new_block_manager", "block_manager_cls"),
    "scheduler": ("new_scheduler", "scheduler_cls"),
    "attention": ("attention_backend", None),
    "build_batch": ("build_batch", None),
}
PLAIN_BUILDER = "enginespec.spec.build_batch (none of its own)"
OURS = ("enginespec.impls.", "enginespec.spec.")


def dotted(obj) -> str:
    """module.qualname of a class or function (its type's for anything else)."""
    named = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"


def maker(impl, factory: str, cls_attr: Optional[str]) -> Optional[str]:
    """What builds one part: the `*_cls` class when the factory is PartsImpl's (which only
    constructs it), else the factory itself (set on the instance, or the class defining it);
    None when the impl has no such factory."""
    from enginespec.spec import PartsImpl

    if factory in getattr(impl, "__dict__", {}):
        return dotted(vars(impl)[factory])
    owner = next((k for k in type(impl).__mro__ if factory in vars(k)), None)
    if owner is None:
        return None
    made = getattr(impl, cls_attr, None) if cls_attr else None
    if owner is PartsImpl and isinstance(made, type):
        return dotted(made)
    return f"{dotted(owner)}.{factory}"


def impl_parts(impl) -> dict[str, dict]:
    """{part: {"by": what builds it, "enginespec": whether that is enginespec's own}} for each
    part the impl has (an impl without build_batch gets the spec's plain builder)."""
    parts = {}
    for role, (factory, cls_attr) in ROLES.items():
        by = maker(impl, factory, cls_attr)
        if by is None and role == "build_batch":
            by = PLAIN_BUILDER
        if by is not None:
            parts[role] = {"by": by, "enginespec": by.startswith(OURS)}
    return parts


def parts_line(impl) -> str:
    """The header line: the author's parts first, then those enginespec supplies."""
    parts = impl_parts(impl)
    groups = [
        (label, ", ".join(f"{role}={p['by']}" for role, p in parts.items() if p["enginespec"] is ours))
        for label, ours in (("yours", False), ("enginespec's own", True))
    ]
    return "parts of the impl under test: " + "; ".join(f"{label}: {text}" for label, text in groups if text)
