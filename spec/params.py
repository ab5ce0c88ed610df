"""SamplingParams: what the user asks of one request's output. Validated on construction.

Field names and meanings follow vLLM's `SamplingParams` so its users feel at home. Every bad
value raises a ValueError that names the field and the bound it broke.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional


def _check(cond: bool, name: str, bound: str, value: object) -> None:
    if not cond:
        raise ValueError(f"SamplingParams.{name} must be {bound}, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping settings of one request.

    temperature 0 means greedy (argmax); top_k 0 or -1 means no top-k cut; top_p 1 and min_p 0
    mean no cut. `max_tokens` counts output tokens. Stops: a token of `stop_token_ids`, the EOS
    token unless `ignore_eos`, a string of `stop` (the engine's detokenizer checks those, and the
    stop string is not part of the text), `max_tokens`, or the model's max length. No stop by
    token or string fires before `min_tokens` outputs. `n` > 1 makes sibling requests that
    share the prompt's blocks. `logprobs` = k returns the top-k log-probabilities of each sampled
    position; `prompt_logprobs` = k does so for prompt positions and turns prefix-cache hits off
    for that request (cached positions have no logits).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Optional[Mapping[int, float]] = None
    allowed_token_ids: Optional[tuple[int, ...]] = None

    def __post_init__(self) -> None:
        # Normalise sequences to tuples so the dataclass stays hashable-ish and immutable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop or ()))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        if self.allowed_token_ids is not None:
            object.__setattr__(self, "allowed_token_ids", tuple(self.allowed_token_ids))
        if self.logit_bias is not None:
            object.__setattr__(self, "logit_bias", dict(self.logit_bias))
        self._validate()

    def _validate(self) -> None:
        _check(
            isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", ">= 1", self.max_tokens
        )
        _check(self.temperature >= 0.0, "temperature", ">= 0", self.temperature)
        _check(isinstance(self.top_k, int) and self.top_k >= -1, "top_k", "-1, 0 (off) or >= 1", self.top_k)
        _check(0.0 < self.top_p <= 1.0, "top_p", "in (0, 1]", self.top_p)
        _check(0.0 <= self.min_p <= 1.0, "min_p", "in [0, 1]", self.min_p)
        _check(self.seed is None or isinstance(self.seed, int), "seed", "an int or None", self.seed)
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "non-negative ints",
            self.stop_token_ids,
        )
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "non-empty strings", self.stop)
        _check(
            isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens", ">= 0", self.min_tokens
        )
        _check(
            self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"<= max_tokens ({self.max_tokens})",
            self.min_tokens,
        )
        _check(isinstance(self.n, int) and self.n >= 1, "n", ">= 1", self.n)
        _check(
            self.logprobs is None or (isinstance(self.logprobs, int) and self.logprobs >= 0),
            "logprobs",
            "None or >= 0",
            self.logprobs,
        )
        _check(
            self.prompt_logprobs is None
            or (isinstance(self.prompt_logprobs, int) and self.prompt_logprobs >= 0),
            "prompt_logprobs",
            "None or >= 0",
            self.prompt_logprobs,
        )
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "in [-2, 2]", self.presence_penalty)
        _check(
            -2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "in [-2, 2]", self.frequency_penalty
        )
        _check(self.repetition_penalty > 0.0, "repetition_penalty", "> 0", self.repetition_penalty)
        if self.logit_bias is not None:
            _check(
                all(isinstance(k, int) and k >= 0 for k in self.logit_bias),
                "logit_bias",
                "keyed by non-negative token ids",
                self.logit_bias,
            )
        if self.allowed_token_ids is not None:
            _check(
                len(self.allowed_token_ids) > 0
                and all(isinstance(t, int) and t >= 0 for t in self.allowed_token_ids),
                "allowed_token_ids",
                "a non-empty list of non-negative ints",
                self.allowed_token_ids,
            )

    @property
    def greedy(self) -> bool:
        """True when sampling is argmax (temperature 0)."""
        return self.temperature == 0.0

    def validate_vocab(self, vocab_size: int) -> None:
        """Check token ids against the model's vocabulary (the engine calls this on add)."""
        for name, ids in (
            ("stop_token_ids", self.stop_token_ids),
            ("allowed_token_ids", self.allowed_token_ids or ()),
            ("logit_bias", tuple(self.logit_bias or ())),
        ):
            bad = [t for t in ids if t >= vocab_size]
            _check(not bad, name, f"token ids < vocab_size ({vocab_size})", bad)
