"""`enginespec collect-env`: what a bug report needs to know of the machine (vLLM's
`vllm collect-env`, smaller): Python, the libraries enginespec runs on and their versions, the
CUDA build and the GPUs torch sees, the CPU count, and the ENGINESPEC_* / TRITON_* / CUDA_*
settings in the environment. Reads only; imports nothing it reports as missing.

    enginespec collect-env            # "name: value" lines, paste them into the report
    enginespec collect-env --json     # the same as one JSON object
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

# The distributions whose versions a report names: the runtime's and the optional ones.
PACKAGES = ("enginespec", "torch", "triton", "transformers", "safetensors", "tokenizers", "numpy",
            "xgrammar", "fastapi", "uvicorn", "openai", "hypothesis", "pytest")  # fmt: skip
ENV_PREFIXES = ("ENGINESPEC_", "TRITON_", "CUDA_", "PYTORCH_", "TORCHINDUCTOR_")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _enginespec_version() -> str:
    """The enginespec this process runs: its own __version__ and the folder it was imported
    from. The installed distribution's metadata is not that where a source tree on sys.path
    (PYTHONPATH, tools/link_tree.py) shadows the install: the report named the installed
    version then, of code that was not running; it is shown beside it where the two differ."""
    import enginespec

    where = os.path.dirname(enginespec.__file__)
    installed = _version("enginespec")
    if installed == enginespec.__version__:
        return f"{installed} ({where})"
    return f"{enginespec.__version__} ({where}; installed distribution: {installed})"


def _torch_version() -> str:
    """torch.__version__: it carries the build's local tag (2.11.0+cu130), which a bug report
    needs and which a wheel's metadata may leave out (2.11.0 on a custom build)."""
    import torch

    return str(torch.__version__)


def _gpus() -> dict:
    """torch's view of the accelerators: the CUDA build, and each visible device's name,
    compute capability and memory."""
    import torch

    info: dict = {"cuda build": torch.version.cuda or "none (CPU build)"}
    if not torch.cuda.is_available():
        info["gpus"] = "none visible"
        return info
    info["gpus"] = f"{torch.cuda.device_count()} visible"
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        info[f"gpu {i}"] = (
            f"{props.name}, compute capability {props.major}.{props.minor}, "
            f"{props.total_memory / 2**30:.1f} GiB"
        )
    return info


def collect() -> dict:
    """Every entry the report shows, name -> text, in the order shown."""
    out = {
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "cpus": str(os.cpu_count()),
    }
    out.update({name: _version(name) for name in PACKAGES})
    out["enginespec"] = _enginespec_version()
    out["torch"] = _torch_version()
    out.update(_gpus())
    out.update({k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)})
    return out


def main(argv=None) -> int:
    import argparse
    import json

    # the docstring's whole first paragraph: its first line alone stopped inside a parenthesis
    description = " ".join(__doc__.split("\n\n")[0].split())
    parser = argparse.ArgumentParser(prog="enginespec collect-env", description=description)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    ns = parser.parse_args(argv)
    info = collect()
    if ns.json:
        print(json.dumps(info, indent=1))
    else:
        width = max(len(k) for k in info)
        for key, value in info.items():
            print(f"{key:<{width}}  {value}")
    return 0
