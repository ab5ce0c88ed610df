"""Repository-wide test setup.

Kernel tests run under Triton's interpreter when no GPU is present; the variable must be set
before anything imports triton, which is why it lives here and not in a kernel test module.
"""
import os

try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover - torch is a hard dependency
    pass
