"""Phase stamps for a Triton kernel's programs, shared by the probes that time phases inside one
launch (cut_draw_phases.py, decode_attention_phases.py): the Triton helpers to splice into a copy
of a kernel's module, and the loader of that edited copy.

`_stamp(times_ptr, idx, i)` waits at a CTA barrier, then writes %globaltimer (ns) to
times_ptr[idx * 16 + i]; `_smid(times_ptr, idx)` writes the program's SM to slot 15. A probe
edits its kernel to take `times_ptr` and call them at the phase boundaries it names.
"""

from __future__ import annotations

import importlib.util
import tempfile
import textwrap

_HELPERS = '''
@triton.jit
def _stamp(times_ptr, IDX, i: tl.constexpr):
    tl.debug_barrier()
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [IDX], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(times_ptr + IDX.to(tl.int64) * 16 + i, t)


@triton.jit
def _smid(times_ptr, IDX):
    s = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [IDX], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(times_ptr + IDX.to(tl.int64) * 16 + 15, s.to(tl.int64))
'''


def helpers(index: str, indent: str = "") -> str:
    """The _stamp and _smid definitions, their program index argument named `index`, indented
    by `indent` (a module's kernels may sit inside an `if triton is not None:` block)."""
    return textwrap.indent(_HELPERS.replace("IDX", index), indent, lambda line: line.strip() != "")


def load_edited(src: str, name: str):
    """src (a kernel module's edited source) imported as a module called `name`, from a file."""
    tmp = tempfile.NamedTemporaryFile("w", suffix=f"_{name}.py", delete=False)
    tmp.write(src)
    tmp.close()
    spec = importlib.util.spec_from_file_location(name, tmp.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
