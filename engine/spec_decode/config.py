"""SpeculativeConfig: vLLM's `speculative_config` names, validated on construction.

`LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
"prompt_lookup_min": 2, "prompt_lookup_max": 5})` as in vLLM. Only the n-gram (prompt lookup)
method is built; "draft_model" is refused with a ValueError naming what exists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

METHODS = ("ngram",)


def _check_int(name: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"speculative_config.{name} must be an int >= {low}, got {value!r}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """method: "ngram"; num_speculative_tokens: drafts per request per step (k >= 1);
    prompt_lookup_min / prompt_lookup_max: the n-gram lengths tried, longest first (vLLM's
    default min is 1 when only max is given, and max = min when only min is given)."""

    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: Optional[int] = None
    prompt_lookup_max: Optional[int] = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {list(METHODS)}, got {self.method!r}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo, hi = 1, 3
        elif lo is None:
            lo = 1
        elif hi is None:
            hi = lo
        _check_int("prompt_lookup_min", lo, 1)
        _check_int("prompt_lookup_max", hi, 1)
        if lo > hi:
            raise ValueError(
                f"speculative_config.prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})"
            )
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)

    @classmethod
    def of(cls, value: Union[None, "SpeculativeConfig", Mapping[str, Any]]) -> Optional["SpeculativeConfig"]:
        """None, a SpeculativeConfig, or a dict of vLLM's names (unknown names: ValueError)."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"speculative_config must be a dict or None, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(value))
