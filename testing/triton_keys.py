"""Triton launches recorded by their cache keys, for tests of compile-only launches on the CPU.

Under TRITON_INTERPRET every @triton.jit kernel is an InterpretedFunction whose `run` takes the
launch's arguments and `warmup` (True for a compile-only launch). `record_launches` wraps it so a
test sees each launch's key parts: the kernel's name, Triton's own specialisation of every
argument (dtype and 16-byte alignment of pointers, == 1 / multiple of 16 of ints, constexpr
values) and the launch options, which is what a GPU's cache key is made of. A compile-only
launch and the real launch it stands for must give the same parts, or the real one would
compile a variant of its own.
"""

from __future__ import annotations

import inspect


def specialize(fn, args: tuple, kwargs: dict) -> tuple:
    """(kernel name, per-argument specialisation, launch options) of one launch of fn (an
    InterpretedFunction): the parts of Triton's cache key that the arguments decide."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    sig = inspect.signature(fn.fn)
    bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
    no_value = set(fn.kwargs.get("do_not_specialize") or ())
    no_align = set(fn.kwargs.get("do_not_specialize_on_alignment") or ())
    parts = []
    for name, param in sig.parameters.items():
        value = bound.arguments.get(name, param.default)
        if "constexpr" in str(param.annotation):
            parts.append((name, value))
        else:
            spec = native_specialize_impl(
                BaseBackend, value, False, name not in no_value, name not in no_align
            )
            parts.append((name, tuple(spec)))
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in sig.parameters))
    return fn.fn.__name__, tuple(parts), options


def record_launches(monkeypatch) -> dict:
    """Record every interpreted launch from now on (the real one still runs):
    {"real": [keys], "compile_only": [keys]}, keys as `specialize` gives them."""
    from triton.runtime.interpreter import InterpretedFunction

    seen: dict = {"real": [], "compile_only": []}
    run = InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):
        seen["compile_only" if warmup else "real"].append(specialize(self, args, kwargs))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording)
    return seen
