"""vLLM's `vllm.distributed` module path, for the one name its offline examples import from it:
`cleanup_dist_env_and_memory()`, called after `del llm` and before the next LLM is built (its
prefix_caching example does so between its two LLMs).

There is no distributed environment to tear down between LLMs here: an engine's
tensor-parallel workers stop when the engine is collected (EngineCore's finalizer) or closed
(LLM.close()). What is left is vLLM's memory half: collect the garbage, so that a dropped LLM
held only by reference cycles goes now, and give torch's cached CUDA memory back to the driver,
so that the next LLM's profile run finds the device free.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["cleanup_dist_env_and_memory"]


def cleanup_dist_env_and_memory(shutdown_ray: bool = False) -> None:
    """Free what dropped LLMs still hold (module doc). shutdown_ray: vLLM's keyword, ignored
    (no Ray here: distributed_executor_backend="ray" is refused)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
