"""Compiling our Triton kernels for an NVIDIA H100/H200 (sm_90) with triton's bundled ptxas, on
any machine, CPU-only ones included: the interpreter tests check what a kernel computes, but the
interpreter accepts code the real compiler rejects. The compile runs in a subprocess because
TRITON_INTERPRET=1 (set by the repo conftest on CPU) turns every @triton.jit into an
interpreted function; the subprocess runs without it.

A script given to `compile_script` starts after PREAMBLE, which imports `sys`, `triton`,
`ASTSource` and `GPUTarget` and exits 3 (a skip, with the reason printed) where this triton has
no such API or no NVIDIA backend. `ptx_of(fn, sig, consts, options)` in the script compiles one
kernel and returns its PTX, exiting 3 where ASTSource takes another signature.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PREAMBLE = r"""
import sys
try:
    import triton
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as exc:
    print(f"no triton compiler API: {exc}"); sys.exit(3)
if "nvidia" not in backends:
    print("no nvidia backend"); sys.exit(3)


def ptx_of(fn, sig, consts, options):
    try:
        src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    except TypeError as exc:  # another triton's ASTSource signature: nothing to say about ours
        print(f"ASTSource API differs: {exc}"); sys.exit(3)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
"""


def compile_script(script: str) -> str:
    """Run PREAMBLE + script in a subprocess without the interpreter; its stdout. Skips the
    calling test where the script exits 3, fails it on any other error."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", PREAMBLE + script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode == 3:
        pytest.skip(proc.stdout.strip())
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout
