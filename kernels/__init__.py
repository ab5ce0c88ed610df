"""Triton kernels, each with a plain-torch reference in kernels/reference.py.

paged_attention (flat ragged batch over the paged pool, split-KV merge), kv_write, rms_norm
(fused residual add), rotary (neox), qkv_rope (q|k norm, rotary and the K/V write of a layer's
q|k|v rows), skinny_gemm (few-row GEMM with optional RMSNorm prologue, SiLU * up or residual
epilogue, single-launch split K), silu_mul (the MLP activation in one launch). Nothing here
imports the rest of enginespec; modules import triton, so import them lazily where a GPU may be
absent.

This package installs as `enginespec.kernels` only. In a checkout, though, the repository's root
is on sys.path (pytest, `python -m`, the benchmark scripts), and this folder would answer a
top-level `import kernels` meant for Hugging Face's `kernels` package, which transformers (5.25
and later: a required dependency) imports at import time: `from kernels import CUDAProperties`
failed, and with it every model. So when this file runs under the name `kernels` and another
`kernels` is installed, it puts that one in sys.modules in its place (the import statement
returns sys.modules' entry). Under `enginespec.kernels`, or with none installed, nothing changes.
"""

import sys


def _defer_to_installed(name: str, root: str) -> bool:
    """Load the `name` package found on sys.path outside `root` into sys.modules[name]; False
    when there is none. Another enginespec checkout's copy of this file is passed over, as its
    root is: with two checkouts on sys.path (one the current directory, one on PYTHONPATH) each
    deferred to the other, and the import ended in RecursionError, then KeyError, tracebacks."""
    import importlib.machinery
    import importlib.util
    import os

    skip = {root}
    while True:
        elsewhere = [p for p in sys.path if os.path.realpath(p or os.curdir) not in skip]
        spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        if spec is None or spec.loader is None:
            return False
        if not _is_checkout_copy(spec.origin):
            break
        skip.add(os.path.dirname(os.path.dirname(os.path.realpath(spec.origin))))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return True


def _is_checkout_copy(origin) -> bool:
    """Whether the file at `origin` is an enginespec checkout's kernels/__init__.py (any
    version of this file: they all define _defer_to_installed)."""
    try:
        with open(origin, "rb") as f:
            return b"def _defer_to_installed(" in f.read()
    except (OSError, TypeError):  # no file (a namespace package's origin is None)
        return False


if __name__ == "kernels":  # imported top-level from a checkout's root: not what the caller meant
    import os as _os

    _defer_to_installed(__name__, _os.path.dirname(_os.path.dirname(_os.path.realpath(__file__))))
