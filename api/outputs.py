"""What the engine hands back: one RequestOutput per user request, one CompletionOutput per sample.

Names follow vLLM's offline API (`RequestOutput.outputs[i].token_ids / text / finish_reason`,
`.logprobs[i][token_id].logprob / .rank / .decoded_token`) so its users feel at home. Outputs
are cumulative: every RequestOutput carries all tokens and text produced so far, not a delta,
so a consumer may drop any of them and still see the whole result in the last one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from enginespec.spec import RequestOutputKind


class Logprob(float):
    """One token's log-probability at one position: the float itself (so `lp + 1`, comparisons,
    sorting and `math.isclose(lp, x)` work as on a plain float, which it used to be) with the
    attributes of vLLM's `Logprob`:

    - logprob: the value, as a plain float (of the RAW distribution: log_softmax of the model's
      logits before any penalty, bias, temperature or cut; see sample/sampler.py).
    - rank: its 1-based rank in the position's distribution: the k top entries of a position have
      ranks 1..k (best first); the sampled (or, for prompt logprobs, the actual) token has the
      number of vocabulary entries whose logprob is >= its own, itself included, so ties rank
      it after every token it ties with (vLLM V1's count; counted on the raw logits, which order
      the tokens as their logprobs do, so every sampling path and device agrees). A token that
      is both sampled (or actual) and in the top k shows its top-k entry (vLLM's rule).
    - decoded_token: the token's text (`tokenizer.decode([token_id])`, as vLLM and the server
      decode it) when the engine has a tokenizer and the request detokenizes; else None.

    Equality and hashing are the float's: rank and decoded_token do not take part.
    """

    __slots__ = ("rank", "decoded_token")
    rank: Optional[int]
    decoded_token: Optional[str]

    def __new__(cls, logprob: float, rank: Optional[int] = None, decoded_token: Optional[str] = None):
        self = super().__new__(cls, logprob)
        self.rank = rank
        self.decoded_token = decoded_token
        return self

    @property
    def logprob(self) -> float:
        return float(self)

    def __repr__(self) -> str:
        return f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, decoded_token={self.decoded_token!r})"

    __str__ = float.__repr__  # str() and f"{lp}" print the number, as they did on the plain float

    def __reduce__(self):  # pickles in half the time of the default reduce (engine-core deltas)
        return (Logprob, (float(self), self.rank, self.decoded_token))


# One position's logprobs: {token id: Logprob}; the sampled (or actual prompt) token is always a key.
Logprobs = dict[int, Logprob]


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
      (max_tokens or max_model_len), "abort", or "error" (a step it was part of failed, or a
      fault of its own, or of a sibling sample of its request; the engine served on).
    - error: for finish_reason "error", the exception's type and message; else None.
    - spec_decode: with speculative decoding on, this sample's drafted / accepted counts and
      acceptance by draft position so far (SpecDecodeStats); else None.
    - stop_reason: the stop token id or stop string that ended it, else None.
    - logprobs: per output position a dict {token id: Logprob} (sampled token + top-k) when the
      request asked for logprobs, else None.
    - cumulative_logprob: the sum of the sampled tokens' logprobs (those of token_ids, raw
      distribution) when the request asked for logprobs (any k, 0 included), else None (vLLM's).
    """

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    logprobs: Optional[list[Logprobs]] = None
    error: Optional[str] = None
    spec_decode: Optional[Any] = None  # engine.spec_decode.SpecDecodeStats of this sample, or None
    cumulative_logprob: Optional[float] = None

    # vLLM's attribute of a feature enginespec does not have (LoRA): always None, a class
    # attribute and not a field, so it costs nothing per output or pickle.
    lora_request = None

    def finished(self) -> bool:
        """Whether this sample has its finish_reason: a method, as vLLM's (code written for
        vLLM calls `c.finished()`; RequestOutput.finished is the field)."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One user request: its prompt and its n completions.

    - prompt: the prompt text when the request came as text (else None).
    - prompt_logprobs: when asked for, one entry per prompt position: None for the first token
      (nothing predicts it), then {token id: Logprob} with the actual prompt token a key.
    - finished: True once every completion has a finish_reason.
    - num_cached_tokens: how many prompt tokens the prefix cache served (vLLM's): the first
      sample's request.num_cached_tokens at its first admission (a later preemption and
      re-admission does not change it); 0 until it is first scheduled, or with prefix caching
      off or prompt_logprobs asked (the front end's outputs, AsyncLLM's and the server's, read
      0 too before the first step). None only where the output's maker gave no count.
    """

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: Optional[list[Optional[Logprobs]]] = None
    num_cached_tokens: Optional[int] = None

    # vLLM's attributes of features enginespec does not have (LoRA, encoder-decoder models,
    # KV transfer) or does not fill (per-request metrics: the server's /metrics has them): always
    # None, so code written for vLLM reads them; class attributes, not fields (no cost per output).
    lora_request = None
    encoder_prompt = None
    encoder_prompt_token_ids = None
    metrics = None
    kv_transfer_params = None

    @property
    def num_output_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)


class OutputView:
    """One streaming consumer's view of one request's cumulative outputs, by output kind
    (spec.RequestOutputKind): `view(out)` is what to hand over after a step, or None.

    - CUMULATIVE: a new RequestOutput and new CompletionOutputs over `out`'s fields as of now
      (text, finish reasons, cumulative_logprob); the token id and logprob lists are shared
      with `out` and keep growing, as vLLM's cumulative outputs do.
    - DELTA: only the samples with news since this view's previous output, each with only its
      new token ids, text and logprobs (cumulative_logprob stays the running sum, as vLLM's);
      a sample appears one last time with its finish_reason. Concatenating a sample's deltas
      gives its cumulative output. prompt_logprobs likewise: only the positions not handed
      over before (vLLM pops them into the first output that has them), else None, so the
      deltas' lists concatenate to the request's.
    - FINAL_ONLY: None until the request is finished, then the final output.

    Invariant: the last output a request produces is never None under any kind (it is finished,
    and under DELTA it carries every sample that finished in that step)."""

    def __init__(self, kind: RequestOutputKind = RequestOutputKind.CUMULATIVE):
        self.kind = kind
        self._sent: dict[int, tuple[int, int, int]] = {}  # sample index -> (ids, text chars, logprobs)
        self._num_prompt_sent = 0  # prompt_logprobs positions handed over (DELTA)

    def view(self, out: RequestOutput) -> Optional[RequestOutput]:
        if self.kind == RequestOutputKind.FINAL_ONLY:
            return _snapshot(out) if out.finished else None
        if self.kind == RequestOutputKind.CUMULATIVE:
            return _snapshot(out)
        samples = [d for d in (self._delta(c) for c in out.outputs) if d is not None]
        if not samples and not out.finished:
            return None
        return dataclasses.replace(out, outputs=samples, prompt_logprobs=self._prompt_delta(out))

    def _prompt_delta(self, out: RequestOutput) -> Optional[list]:
        """The prompt_logprobs positions of `out` not handed over yet (None when none is new)."""
        found = out.prompt_logprobs
        if found is None or len(found) <= self._num_prompt_sent:
            return None
        new = found[self._num_prompt_sent :]
        self._num_prompt_sent = len(found)
        return new

    def _delta(self, c: CompletionOutput) -> Optional[CompletionOutput]:
        sent = self._sent.get(c.index, (0, 0, 0))
        if sent is _DONE:
            return None
        num_ids, num_chars, num_lps = sent
        if len(c.token_ids) == num_ids and len(c.text) == num_chars and c.finish_reason is None:
            return None
        self._sent[c.index] = (
            _DONE if c.finished() else (len(c.token_ids), len(c.text), len(c.logprobs or ()))
        )
        return dataclasses.replace(
            c,
            token_ids=c.token_ids[num_ids:],
            text=c.text[num_chars:],
            logprobs=None if c.logprobs is None else c.logprobs[num_lps:],
        )


_DONE = (-1, -1, -1)  # a sample whose finished delta was handed over


def _snapshot(out: RequestOutput) -> RequestOutput:
    """A new RequestOutput (and CompletionOutputs) over `out`'s current fields; the token id and
    logprob lists are shared, not copied."""
    return dataclasses.replace(out, outputs=[dataclasses.replace(c) for c in out.outputs])
