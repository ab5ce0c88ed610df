"""vLLM's module path for request parameters: `from vllm.sampling_params import SamplingParams`
becomes `from enginespec.sampling_params import SamplingParams`, unchanged otherwise.

The same objects as the top-level names (`enginespec.SamplingParams` is
`enginespec.sampling_params.SamplingParams`): SamplingParams, RequestOutputKind and
StructuredOutputsParams live in the spec (spec/params.py), BeamSearchParams with the beam
search (beam_search.py). vLLM's older GuidedDecodingParams is not offered: vLLM V1 renamed it
StructuredOutputsParams.
"""

from __future__ import annotations

from enginespec.beam_search import BeamSearchParams
from enginespec.spec import RequestOutputKind, SamplingParams, StructuredOutputsParams

__all__ = ["BeamSearchParams", "RequestOutputKind", "SamplingParams", "StructuredOutputsParams"]
