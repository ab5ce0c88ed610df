"""What the engine-core loop (engine/core_proc.py) and its front end say to each other.

Two one-way multiprocessing Connections (pickle), plain tuples on the hot path:

front end -> engine (the engine takes every pending one between two steps):
  ("add", token, [NewRequest, ...])  all or none; answered ("added", token, error or None)
  ("abort", [request ids])           no answer; the blocks are free before the next step
  ("call", token, name, *args)       name in CALLS; answered ("done", token, result): the
                                     call's result (reset_prefix_cache's and is_sleeping's bool;
                                     None for the others), or the ErrorInfo of what it raised
                                     (the loop goes on); args: start_profile's profile_prefix,
                                     sleep's level, wake_up's tags, reload_weights' path
  ("shutdown",)                      the loop ends, the engine exits

engine -> front end:
  ("ready", EngineInfo, EngineState) once, after the engine is built; or ("failed", ErrorInfo)
  ("out", deltas, failed, replies, EngineState, step_start)
      one message per loop turn that had news (a step ran, or commands were taken), where
      - deltas: SampleDelta-shaped plain tuples, only of samples with news since the last one;
      - failed: (request id, ErrorInfo) of requests the engine dropped with an error (the
        request gets a 500, or an error frame in a stream that started);
      - replies: the answers above;
      - step_start: time.monotonic() when this turn's step began (None without a step), for
        the queue-time metric (CLOCK_MONOTONIC is one clock for every process of the host).

Invariants: a request's deltas concatenate to its outputs (token ids, logprobs, text); a
sample's last delta is the only one with a finish_reason; an aborted request gets nothing more.
Deltas are plain tuples because pickle handles them about 10x faster than a NamedTuple or a
dataclass, and 256 of them go out every decode step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

from enginespec.engine.spec_decode.stats import SpecDecodeStats
from enginespec.outputs import Logprob
from enginespec.spec import SamplingParams

#: the names of ("call", token, name, *args): stop stepping, step again, fail the next step's
#: requests, forget the cached prefix blocks (EngineCore.reset_prefix_cache: False while blocks are
#: in use), start and stop a torch.profiler trace of the engine process (api/profiler.py), and
#: sleep mode's three (EngineCore.sleep(level), wake_up(tags), is_sleeping), and
#: reload_weights(weights_path) (tensors do not cross: load_weights is the in-process LLM's)
CALLS = (
    "pause", "resume", "fail_next", "reset_prefix_cache", "start_profile", "stop_profile",
    "sleep", "wake_up", "is_sleeping", "reload_weights",
)  # fmt: skip


@dataclass
class NewRequest:
    """One engine request: the prompt (text and ids), its params, and what rides beside them."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    cache_salt: Optional[str] = None


class SampleDelta(NamedTuple):
    """What one sample produced since its previous delta (the field order of the wire tuple).

    new_text is the engine's text, sent only for samples whose stop strings the engine matches
    (and then only text no later token can cut); None means the front end decodes the ids
    itself. prompt_logprobs rides on sample 0's first delta with output ids (the final one's when
    none went out live: core_proc.DeltaTracker), never twice; num_cached_tokens (the prompt
    tokens the prefix cache served, RequestOutput.num_cached_tokens) on every delta of sample 0
    once its first step has run (None before, and on other samples' deltas)."""

    request_id: str
    index: int
    new_token_ids: list[int]
    new_logprobs: Optional[list[dict[int, Logprob]]]
    new_text: Optional[str]
    finish_reason: Optional[str]
    stop_reason: Union[int, str, None]
    error: Optional[str]
    prompt_logprobs: Optional[list]
    num_cached_tokens: Optional[int]


@dataclass(frozen=True)
class ErrorInfo:
    """A picklable exception: its type name and text (a ValueError becomes a 400), and the
    names of every class it is an instance of (`kinds`, its type's MRO), so that a subclass
    such as the loader's CheckpointError still counts as the ValueError it is."""

    type_name: str
    message: str
    kinds: tuple[str, ...] = ()

    @classmethod
    def of(cls, exc: BaseException) -> "ErrorInfo":
        return cls(type(exc).__name__, str(exc), tuple(k.__name__ for k in type(exc).__mro__))

    def is_a(self, *names: str) -> bool:
        """Whether the exception was an instance of a class of one of these names."""
        return any(name == self.type_name or name in self.kinds for name in names)

    @property
    def is_value_error(self) -> bool:
        return self.is_a("ValueError")


@dataclass(frozen=True)
class EngineInfo:
    """What the front end needs to know of the engine once it is built."""

    vocab_size: int
    max_model_len: int
    num_blocks: int
    block_size: int
    max_num_seqs: int
    pid: int
    # the model's EOS (config.json's): what ends a beam search where there is no tokenizer
    eos_token_id: Optional[int] = None
    # EngineCore.num_draft_positions (speculative_config's num_speculative_tokens up to
    # max_model_len - 1; 0 without a drafter): the draft positions the server's spec-decode
    # metrics have a series for from the start (entrypoints/openai/metrics.py)
    num_speculative_tokens: int = 0


@dataclass(frozen=True)
class EngineState:
    """A snapshot the engine sends with every message: gauges, and cumulative counters (the
    front end turns their increments into Prometheus counters). Prefix-cache counts are tokens."""

    num_blocks: int = 0
    num_free_blocks: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_unfinished: int = 0
    num_steps: int = 0
    num_generated_tokens: int = 0
    kv_cache_usage: float = 0.0
    paused: bool = False
    num_preemptions: int = 0
    num_prefix_queries: int = 0
    num_prefix_hits: int = 0
    # samples' prompt tokens counted at their first tokens, and of them the prefix cache's
    # (EngineStats.num_prompt_tokens / num_prompt_cached_tokens): prompt_tokens_by_source
    num_prompt_tokens: int = 0
    num_prompt_cached_tokens: int = 0
    spec_decode: Optional[SpecDecodeStats] = None  # a copy of EngineStats.spec_decode (None: no drafter)
