"""What the engine hands back: one RequestOutput per user request, one CompletionOutput per sample.

Names follow vLLM's offline API (`RequestOutput.outputs[i].token_ids / text / finish_reason`) so
its users feel at home. Outputs are cumulative: every RequestOutput carries all tokens and text
produced so far, not a delta, so a consumer may drop any of them and still see the whole result
in the last one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

# One position's logprobs: {token id: logprob}; the sampled token is always a key.
Logprobs = dict[int, float]


@dataclass
class CompletionOutput:
    """One sample (of n) of one request.

    - index: which of the request's n samples this is (0-based).
    - text: the detokenized output so far; "" without a tokenizer. A matched stop string is not
      part of it, nor the text of the stop token or EOS that ended the sample, unless the
      request asked include_stop_str_in_output (vLLM's rules).
    - token_ids: every sampled token so far, including those that spell a stop string and the
      stop token itself; none after the token that completed a stop string (speculative
      decoding may have accepted more in that step).
    - finish_reason: None while running, then "stop" (stop token, EOS, stop string), "length"
      (max_tokens or max_model_len), "abort", or "error" (a step it was part of failed; the
      engine served on).
    - error: for finish_reason "error", the exception's type and message; else None.
    - spec_decode: with speculative decoding on, this sample's drafted / accepted counts and
      acceptance by draft position so far (SpecDecodeStats); else None.
    - stop_reason: the stop token id or stop string that ended it, else None.
    - logprobs: per output position a dict {token id: logprob} (sampled token + top-k) when the
      request asked for logprobs, else None.
    """

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    logprobs: Optional[list[Logprobs]] = None
    error: Optional[str] = None
    spec_decode: Optional[Any] = None  # engine.spec_decode.SpecDecodeStats of this sample, or None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One user request: its prompt and its n completions.

    - prompt: the prompt text when the request came as text (else None).
    - prompt_logprobs: when asked for, one entry per prompt position: None for the first token
      (nothing predicts it), then {token id: logprob} with the actual prompt token a key.
    - finished: True once every completion has a finish_reason.
    """

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: Optional[list[Optional[Logprobs]]] = None

    @property
    def num_output_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)
