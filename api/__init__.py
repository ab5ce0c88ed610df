"""enginespec: a test-driven specification of an LLM inference engine core, and its engine.

The one public import for users:

    from enginespec import LLM, SamplingParams, load_impl
    from enginespec import AsyncLLM          # vLLM's asyncio API (enginespec.async_llm)
    from enginespec import LLMEngine, EngineArgs  # vLLM's step-by-step API (enginespec.llm_engine)
    from enginespec import BeamSearchParams  # LLM.beam_search's params (enginespec.beam_search,
                                             # with BeamSearchOutput and BeamSearchSequence)
    from enginespec import RequestOutput, CompletionOutput  # what generate() returns (outputs.py)
    from enginespec import TextPrompt, TokensPrompt, PromptType  # the prompts it takes (inputs.py)
    from enginespec import AsyncEngineArgs   # vLLM's name for EngineArgs given to AsyncLLM

vLLM's examples import these from the top (`from vllm import EngineArgs, LLMEngine,
RequestOutput, SamplingParams`), so each stands here under vLLM's name.

The source tree maps onto this package by role (pyproject.toml's package-dir):

    enginespec              api/          LLM, LLMEngine, EngineArgs, outputs, beam search (this package)
    enginespec.spec         spec/         the contract: Protocols, value types, hash, batch layout
    enginespec.impls        impls/        implementations of the spec (reference, fast), nothing else
    enginespec.engine       engine/       engine loop and output processing
    enginespec.worker       worker/       model execution: flat model, loader, runner, graphs
    enginespec.sample       sample/       the sampler (its Triton kernels live in kernels/)
    enginespec.kernels      kernels/      Triton kernels, each with a plain-torch reference
    enginespec.entrypoints  entrypoints/  CLI, demo, simulate
    enginespec.testing      testing/      checkpoint writers, the fake model, workloads
    enginespec.conformance  conformance/  the pytest plugin and the suite that depends on --impl
"""

from typing import TYPE_CHECKING

from enginespec.inputs import PromptType, TextPrompt, TokensPrompt
from enginespec.outputs import CompletionOutput, RequestOutput
from enginespec.spec import RequestOutputKind, SamplingParams, StructuredOutputsParams, load_impl

if TYPE_CHECKING:  # what __getattr__ imports on first use, so that a type checker sees each type
    from enginespec.async_llm import AsyncLLM
    from enginespec.beam_search import BeamSearchParams
    from enginespec.engine_args import EngineArgs
    from enginespec.engine_args import EngineArgs as AsyncEngineArgs
    from enginespec.llm import LLM
    from enginespec.llm_engine import LLMEngine

__all__ = [
    "AsyncEngineArgs",
    "AsyncLLM",
    "BeamSearchParams",
    "CompletionOutput",
    "EngineArgs",
    "LLM",
    "LLMEngine",
    "PromptType",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "StructuredOutputsParams",
    "TextPrompt",
    "TokensPrompt",
    "load_impl",
]
# Written here alone: pyproject.toml takes the distribution's version from it (setuptools reads
# this line without importing the package), so `enginespec --version` and the metadata agree.
__version__ = "0.2.0"


def __getattr__(name: str):
    # LLM pulls in torch and transformers; `import enginespec` (the pytest plugin, the spec) must
    # stay light, so it is imported on first use.
    if name == "LLM":
        from enginespec.llm import LLM

        return LLM
    if name == "LLMEngine":
        from enginespec.llm_engine import LLMEngine

        return LLMEngine
    if name in ("EngineArgs", "AsyncEngineArgs"):  # imports torch; AsyncLLM takes EngineArgs as it is
        from enginespec.engine_args import EngineArgs

        return EngineArgs
    if name == "AsyncLLM":
        from enginespec.async_llm import AsyncLLM

        return AsyncLLM
    if name == "BeamSearchParams":  # light, but its module imports tqdm
        from enginespec.beam_search import BeamSearchParams

        return BeamSearchParams
    raise AttributeError(f"module 'enginespec' has no attribute {name!r}")
