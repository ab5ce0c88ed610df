"""A request body -> spec.SamplingParams. Every bad value is a ValueError naming the field.

Defaults of the fields a request leaves unset: the checkpoint's generation_config.json
sampling defaults where it has them (engine/generation_config.py, as vLLM's server applies
them), else OpenAI's: temperature 1, top_p 1, no top-k, min-p or penalties. vLLM's extras
skip_special_tokens and spaces_between_special_tokens (default true) go to SamplingParams as
they are, as do allowed_token_ids and bad_words; vllm_xargs becomes extra_args (vLLM's
mapping). response_format json_object / json_schema and vLLM's structured_outputs (a dict of
StructuredOutputsParams' fields) become SamplingParams.structured_outputs (one of them at most;
the engine compiles it on add: a constraint that does not compile is a 400 naming its field).
What SamplingParams lacks:
- cache_salt, priority: not sampling settings; passed beside the params to the engine.
- truncate_prompt_tokens, add_special_tokens, return_tokens_as_token_ids: the server applies
  them to the prompt and the response itself (serving.py).
"""

from __future__ import annotations

from typing import Optional

from enginespec.entrypoints.openai.protocol import _Sampling
from enginespec.spec import SamplingParams, StructuredOutputsParams

LOGIT_BIAS_BOUND = 100.0
_OPENAI_DEFAULTS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}


def _logit_bias(raw: Optional[dict[str, float]]) -> Optional[dict[int, float]]:
    """OpenAI's logit_bias (token id strings -> bias in [-100, 100]) as SamplingParams takes it;
    a ValueError named as SamplingParams' own, so that bad_request's param is the field."""
    if raw is None:
        return None
    out = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except ValueError:
            raise ValueError(
                f"SamplingParams.logit_bias keys must be token ids (ints as strings), got {key!r}"
            ) from None
        if not -LOGIT_BIAS_BOUND <= value <= LOGIT_BIAS_BOUND:
            raise ValueError(
                f"SamplingParams.logit_bias values must be in [-100, 100], got {value!r} for token {token}"
            )
        out[token] = float(value)
    return out


def structured_outputs(req: _Sampling) -> Optional[StructuredOutputsParams]:
    """The body's constraint: from response_format (json_object: any object; json_schema: its
    schema; text: none) or structured_outputs; both at once is a ValueError naming them."""
    fmt, raw = req.response_format, req.structured_outputs
    from_format = None
    if fmt is not None and fmt.type == "json_object":
        from_format = StructuredOutputsParams(json_object=True)
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise ValueError("SamplingParams.response_format: json_schema needs json_schema.schema")
        from_format = StructuredOutputsParams(json=fmt.json_schema.json_schema)
    if raw is None:
        return from_format
    if from_format is not None:
        raise ValueError("SamplingParams.structured_outputs: give it or a JSON response_format, not both")
    try:
        return StructuredOutputsParams.of(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"SamplingParams.structured_outputs: {exc}") from None


def to_sampling_params(
    req: _Sampling,
    *,
    max_tokens: int,
    logprobs: Optional[int],
    defaults: Optional[dict] = None,
    prompt_logprobs: Optional[int] = None,
) -> SamplingParams:
    """The engine's params for one request body (max_tokens and logprobs already resolved by
    the endpoint, since completions and chat name them differently). `defaults`: SamplingParams
    field -> value for the fields the body leaves unset (None). `prompt_logprobs`: the endpoint's
    (a completion's echo asks its logprobs of the prompt too) where the body sets none."""
    chosen = {**_OPENAI_DEFAULTS, **(defaults or {})}

    def pick(name: str):
        value = getattr(req, name)
        return chosen[name] if value is None else value

    if req.stop is None:
        stop: tuple[str, ...] = ()
    else:
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=pick("temperature"),
        top_k=pick("top_k"),
        top_p=pick("top_p"),
        min_p=pick("min_p"),
        seed=req.seed,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        stop=stop,
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        n=req.n,
        logprobs=logprobs,
        prompt_logprobs=req.prompt_logprobs if req.prompt_logprobs is not None else prompt_logprobs,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=pick("repetition_penalty"),
        logit_bias=_logit_bias(req.logit_bias),
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        allowed_token_ids=req.allowed_token_ids,
        bad_words=tuple(req.bad_words or ()),
        extra_args=req.vllm_xargs,
        structured_outputs=structured_outputs(req),
    )
