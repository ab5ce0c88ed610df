"""use_beam_search on /v1/completions and /v1/chat/completions: the request's rules and the
choices' shape, by vLLM's server (vllm/entrypoints/openai/serving_completion.py and
serving_chat.py take the branch; protocol.py's to_beam_search_params maps the body;
EngineClient.beam_search, later vllm/entrypoints/generate/beam_search/online.py, runs it). The
search is enginespec.beam_search's (run_beam_search_async), its steps engine requests that
serving.py submits; this module holds what does not touch the engine.

The body (vLLM's mapping):
- n is the beam width: the best n beams of each prompt are its n choices, best first.
- max_tokens (chat: max_completion_tokens) as without beam search: an unset one is 16 for a
  completion, the context's room for chat; each prompt's search also stops at max_model_len.
- temperature: the body's, else generation_config.json's, else 1.0 (vLLM's). Logprobs are of the
  raw distribution, so it changes only the token each step draws, which joins the candidates.
- ignore_eos, length_penalty (vLLM's extra, default 1.0) and include_stop_str_in_output go to
  BeamSearchParams; a bad value is a 400 naming the field (beam_width's is n's).
- seed seeds every step's draw (vLLM ignores it; here temperature > 0 is reproducible with it).
- logprobs (chat: top_logprobs with logprobs) are served, for each returned token, from the
  candidates of the step that chose it: the top k and the chosen token, as a request with that
  k would get them. Each step asks for 2 * n, so k must be in [0, 2 * n]; and 2 * n must be
  within the engine's max_logprobs and the vocabulary (a 400 naming n otherwise).
- Refused with a 400 naming the field, unless unset or a no-op (REFUSED): those a beam search
  cannot honour. vLLM ignores them silently (its latest releases filter the candidates by
  allowed_token_ids); an answer that looks as if it honoured top_p or stop but did not is worse
  than a refusal. Chat's tool_choice "required" or a named function (they
  force the reply by structured outputs) is refused the same way, in serving.py.

The output (vLLM's server rules):
- text: the generated tokens decoded (special tokens as skip_special_tokens and
  spaces_between_special_tokens ask, as every reply's text), never an ending EOS's;
  token_ids the generated ids, an ending EOS among them only with include_stop_str_in_output.
- finish_reason "stop" (stop_reason the EOS id) for a beam EOS ended, else "length". The EOS
  is LLM.beam_search's: the tokenizer's eos_token_id, else (no tokenizer) the model's.
- usage: every prompt's tokens once (not once per step) and the returned choices' token ids.
  prompt_tokens_details.cached_tokens (--enable-prompt-tokens-details): what the prefix cache
  served of each prompt at the search's first step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from enginespec.beam_search import BeamSearchInstance, BeamSearchParams, best_sequences
from enginespec.entrypoints.openai.errors import APIError
from enginespec.outputs import CompletionOutput, Logprob, RequestOutput
from enginespec.spec import SamplingParams

if TYPE_CHECKING:  # the server's request models need pydantic (the serve extra); AsyncLLM does not
    from enginespec.entrypoints.openai.protocol import _Sampling

# The body's fields a beam search cannot honour, each with the test of its no-op values: the
# engine's logprobs (the candidates) are of the raw distribution, before penalties, biases and
# cuts; a step generates one token, so stop strings, stop tokens and min_tokens never apply; no
# candidate set would follow a grammar or a token allow-list; prompt logprobs are not computed.
REFUSED: dict[str, Callable[[Any], bool]] = {
    "top_p": lambda value: value == 1.0,
    "top_k": lambda value: value in (0, -1),
    "min_p": lambda value: value == 0.0,
    "presence_penalty": lambda value: value == 0.0,
    "frequency_penalty": lambda value: value == 0.0,
    "repetition_penalty": lambda value: value == 1.0,
    "logit_bias": lambda value: not value,
    "bad_words": lambda value: not value,
    "stop": lambda value: not value,
    "stop_token_ids": lambda value: not value,
    "min_tokens": lambda value: value == 0,
    "allowed_token_ids": lambda value: False,
    "prompt_logprobs": lambda value: False,
    "response_format": lambda value: value.type == "text",
    "structured_outputs": lambda value: False,
}


def refused_field(body: _Sampling) -> Optional[str]:
    """The first field of REFUSED the body sets to something other than a no-op (None: none)."""
    for name, no_op in REFUSED.items():
        value = getattr(body, name)
        if value is not None and not no_op(value):
            return name
    return None


def beam_params(body: _Sampling, max_tokens: int, defaults: dict, max_tokens_name: str) -> BeamSearchParams:
    """The body's BeamSearchParams (module doc); a bad value is a 400 naming the body's field."""
    temperature = body.temperature if body.temperature is not None else defaults.get("temperature", 1.0)
    names = {"beam_width": "n", "max_tokens": max_tokens_name}
    try:
        return BeamSearchParams(
            beam_width=body.n,
            max_tokens=max_tokens,
            ignore_eos=body.ignore_eos,
            temperature=temperature,
            length_penalty=body.length_penalty,
            include_stop_str_in_output=body.include_stop_str_in_output,
        )
    except ValueError as exc:
        field = str(exc).split(" ", 1)[0].split(".", 1)[-1]
        param = names.get(field, field)
        raise APIError(400, str(exc) if param == field else f"{param}: {exc}", param) from None


def check_logprobs(
    params: BeamSearchParams, k: Optional[int], name: str, max_logprobs: int, vocab_size: int
) -> None:
    """2 * n within the engine's max_logprobs (-1: none) and the vocabulary (no more candidates
    than tokens, whatever --max-logprobs allows); the k asked for (None: none) in [0, 2 * n]."""
    asked = 2 * params.beam_width
    bound = vocab_size if max_logprobs == -1 else min(max_logprobs, vocab_size)
    if asked > bound:
        raise APIError(
            400,
            f"with use_beam_search, n must be <= {bound // 2}: each step asks for 2 * n logprobs, within "
            f"the engine's max_logprobs ({max_logprobs}, --max-logprobs; -1 lifts it) and the vocabulary "
            f"({vocab_size} tokens), got {params.beam_width}",
            "n",
        )
    if k is not None and not 0 <= k <= asked:
        raise APIError(
            400,
            f"with use_beam_search, {name} must be in [0, 2 * n = {asked}] (the candidates each step "
            f"asks for), got {k}",
            name,
        )


def eos_token_id(tokenizer, model_eos: Optional[int]) -> Optional[int]:
    """The id that ends a beam, as LLM.beam_search picks it: the tokenizer's eos_token_id, else
    the model's (config.json's: a checkpoint without a tokenizer, whose plain requests stop
    there too)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos if eos is not None else model_eos


def step_params(params: BeamSearchParams, seed: Optional[int]) -> SamplingParams:
    """One step's engine params: one token, the 2 * beam_width likeliest as candidates (ids only:
    nothing of a step is read as text)."""
    return SamplingParams(
        max_tokens=1,
        logprobs=2 * params.beam_width,
        temperature=params.temperature,
        seed=seed,
        detokenize=False,
    )


def instances(
    prompts: list[tuple[Optional[str], list[int]]],
    max_tokens: int,
    max_model_len: int,
    cache_salt: Optional[str],
) -> list[BeamSearchInstance]:
    """One search per prompt, each of at most max_tokens steps, fewer where max_model_len leaves
    less room (the front end has refused a prompt that leaves none)."""
    return [
        BeamSearchInstance(ids, min(max_tokens, max(max_model_len - len(ids), 1)), cache_salt)
        for _, ids in prompts
    ]


def request_output(
    request_id: str,
    prompt: tuple[Optional[str], list[int]],
    instance: BeamSearchInstance,
    params: BeamSearchParams,
    eos_token_id: Optional[int],
    decode: Callable[[list[int]], str],
    k: Optional[int],
    num_cached_tokens: Optional[int],
) -> RequestOutput:
    """A prompt's finished RequestOutput: its best beams as its samples, in rank order (module
    doc), as serving.py's full bodies and streams read them."""
    text, ids = prompt
    samples = []
    for index, seq in enumerate(best_sequences(instance, params, eos_token_id)):
        generated = seq.tokens[len(ids) :]
        shown = generated[:-1] if seq.finish_reason == "stop" else generated
        token_ids = generated if params.include_stop_str_in_output else shown
        samples.append(
            CompletionOutput(
                index,
                text=decode(shown),
                token_ids=token_ids,
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
                logprobs=None if k is None else top_logprobs(seq.logprobs, token_ids, k),
                cumulative_logprob=seq.cum_logprob,
            )
        )
    return RequestOutput(request_id, text, list(ids), samples, True, num_cached_tokens=num_cached_tokens)


def top_logprobs(steps: list[dict[int, Logprob]], token_ids: list[int], k: int) -> list[dict[int, Logprob]]:
    """Per token, its step's k likeliest candidates and the token itself (k + 1 entries where
    it is not among them), as an engine request with logprobs=k reports them."""
    out = []
    for token, candidates in zip(token_ids, steps):
        top = dict(sorted(candidates.items(), key=lambda kv: -kv[1])[:k])
        top.setdefault(token, candidates[token])
        out.append(top)
    return out


def decoder(tokenizer, body: _Sampling, keep_special: bool = False) -> Callable[[list[int]], str]:
    """ids -> text as the body's decoding fields ask ("" without a tokenizer, as every reply);
    keep_special: special tokens kept whatever skip_special_tokens says (the tool-call parser
    reads the reply: some checkpoints mark `<tool_call>` special)."""
    if tokenizer is None:
        return lambda ids: ""
    kwargs = {} if body.spaces_between_special_tokens else {"spaces_between_special_tokens": False}
    skip = body.skip_special_tokens and not keep_special

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=skip, **kwargs) if ids else ""

    return decode
