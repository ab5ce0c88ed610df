"""SpeculativeConfig: vLLM's `speculative_config` names, validated on construction.

`LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
"prompt_lookup_min": 2, "prompt_lookup_max": 5})` or `{"method": "draft_model", "model":
DRAFT_DIR, "num_speculative_tokens": 4}` as in vLLM; either takes vLLM's
`disable_by_batch_size`, and vLLM's other keys where their value changes nothing here
(ACCEPTED_VLLM_KEYS: `draft_tensor_parallel_size` 1, `disable_logprobs`, ...). Without
"method", a config naming a "model" is "draft_model" and one without is "ngram" (vLLM infers
the method from the model too); vLLM's "ngram" / "[ngram]" as model, and "[ngram]" as method,
are the "ngram" method. The prompt-lookup fields belong to "ngram" and "model" to "draft_model": a field of the
other method is a ValueError rather than silently ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

METHODS = ("ngram", "draft_model")
# vLLM's names of the n-gram drafter, as method or as model ("[ngram]": its old speculative_model value)
NGRAM_NAMES = ("ngram", "[ngram]")
# The n-gram length when neither prompt_lookup_min nor prompt_lookup_max is given (vLLM V1's)
NGRAM_DEFAULT_LOOKUP = 5


def _check_int(name: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"speculative_config.{name} must be an int >= {low}, got {value!r}")


# No drafts in a step that starts with this many running requests (SpeculativeConfig's doc).
DEFAULT_DISABLE_BY_BATCH_SIZE = 64

# vLLM speculative_config keys that deployments pass at values that change nothing here:
# name -> (the values accepted, why no other is). Accepted and dropped; any other value is a
# ValueError naming the key (as EngineArgs treats vLLM's engine arguments).
ACCEPTED_VLLM_KEYS = {
    "draft_tensor_parallel_size": ((None, 1), "the draft model runs unsharded, on one device"),
    "quantization": ((None,), "the draft loads unquantized, in the target's dtype"),
    "code_revision": ((None,), "the draft is a local directory, nothing is downloaded"),
    "max_model_len": ((None,), "drafts stop where the engine's max_model_len does"),
    "disable_logprobs": ((None, True, False), ""),  # requests asking for logprobs get no drafts
    "disable_log_stats": ((None, True, False), ""),  # the counters are kept either way
}


def _check_accepted(name: str, value) -> None:
    accepted, why = ACCEPTED_VLLM_KEYS[name]
    # 1 == True in Python: a bool is only accepted where the list holds bools
    if not any(value == a and type(value) is type(a) for a in accepted):
        reason = f" ({why})" if why else ""
        raise ValueError(
            f"speculative_config.{name}={value!r} is not supported by enginespec{reason}; "
            f"accepted: {list(accepted)}"
        )


@dataclass(frozen=True)
class SpeculativeConfig:
    """method: "ngram" or "draft_model" (None: inferred from `model`); num_speculative_tokens:
    drafts per request per step (k >= 1); prompt_lookup_min / prompt_lookup_max (ngram): the
    n-gram lengths tried, longest first (vLLM V1's defaults: 5 and 5 when neither is given,
    min = max when only max is given, max = min when only min is given); model (draft_model): the draft checkpoint's directory
    or a repo id in the local hub cache (resolved as EngineArgs.model), same vocabulary as the
    target; revision (draft_model, vLLM's name): the draft repo's branch, tag or commit in the
    cache (None: "main"; ignored for a directory, as EngineArgs.revision is), independent of
    the target's revision; disable_by_batch_size (either method): no drafts are
    proposed in a step that starts with at least this many running requests (None: never
    disabled; an int >= 2, as vLLM's bound). Default DEFAULT_DISABLE_BY_BATCH_SIZE.

    Why a cut-off by default (vLLM's default is None): measured on the H200 (benchmarks/
    RESULTS.md, 2026-12-01), n-gram speculation (k = 4) on the 256-request nano-vllm workload,
    greedy, ran at 0.77-0.82x of off's throughput although 85% of the drafts were accepted: at a
    large batch the step is compute- and host-bound, and a step with drafts loses the async
    overlap, so more tokens a step do not pay for the wider step. With the cut-off at 64 the same
    run gave 0.98x, while batch 1 kept its 2.8x. A deployment that knows its crossover batch sets
    its own; None turns the cut-off off (the adaptive drafting in decoder.py still backs off
    from requests whose drafts keep being rejected)."""

    method: Optional[str] = None
    num_speculative_tokens: int = 3
    prompt_lookup_min: Optional[int] = None
    prompt_lookup_max: Optional[int] = None
    model: Optional[str] = None
    revision: Optional[str] = None
    disable_by_batch_size: Optional[int] = DEFAULT_DISABLE_BY_BATCH_SIZE

    def __post_init__(self) -> None:
        method = self._resolve_method()
        if method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {list(METHODS)}, got {method!r}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        if self.disable_by_batch_size is not None:
            _check_int("disable_by_batch_size", self.disable_by_batch_size, 2)
        if method == "draft_model":
            self._check_draft_model()
        else:
            self._check_ngram()

    def _resolve_method(self) -> Optional[str]:
        """The method, with vLLM's spellings resolved: None is "draft_model" with a `model` and
        "ngram" without; "[ngram]" (the old speculative_model value) is "ngram", as method or as
        model. A model of NGRAM_NAMES under method None or "ngram" names no checkpoint (vLLM
        sets model to "ngram" itself for the n-gram drafter), so it becomes None."""
        method = "ngram" if self.method in NGRAM_NAMES else self.method
        if self.model in NGRAM_NAMES and method in (None, "ngram"):
            method = "ngram"
            object.__setattr__(self, "model", None)
        if method is None:
            method = "ngram" if self.model is None else "draft_model"
        object.__setattr__(self, "method", method)
        return method

    def _check_draft_model(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(
                f"speculative_config.model must name the draft checkpoint (a non-empty str) for "
                f"method 'draft_model', got {self.model!r}"
            )
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(self, name) is not None:
                raise ValueError(f"speculative_config.{name} is an 'ngram' field; method is 'draft_model'")
        revision = self.revision
        if revision is not None and not (isinstance(revision, str) and revision.strip()):
            raise ValueError(
                f"speculative_config.revision must be None or a branch, tag or commit hash, got {revision!r}"
            )

    def _check_ngram(self) -> None:
        for name in ("model", "revision"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"speculative_config.{name} is a 'draft_model' field; method is 'ngram' "
                    f"(got {name}={getattr(self, name)!r})"
                )
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if value is not None:  # each given value is judged under its own name
                _check_int(name, value, 1)
        if lo is None and hi is None:
            lo = hi = NGRAM_DEFAULT_LOOKUP
        elif lo is None:
            lo = hi
        elif hi is None:
            hi = lo
        if lo > hi:
            raise ValueError(
                f"speculative_config.prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})"
            )
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)

    @classmethod
    def of(cls, value: Union[None, "SpeculativeConfig", Mapping[str, Any]]) -> Optional["SpeculativeConfig"]:
        """None, a SpeculativeConfig, or a dict of vLLM's names: the fields, plus the keys of
        ACCEPTED_VLLM_KEYS at the values it accepts (dropped); anything else is a ValueError."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"speculative_config must be a dict or None, got {type(value).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - fields - set(ACCEPTED_VLLM_KEYS))
        if unknown:
            known = sorted(fields | set(ACCEPTED_VLLM_KEYS))
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; known: {known}")
        for name in sorted(set(value) & set(ACCEPTED_VLLM_KEYS)):
            _check_accepted(name, value[name])
        return cls(**{name: v for name, v in value.items() if name in fields})
