"""FastRequest: the fast impl's request, a __slots__ object with its stop rules precomputed.

Invariants (spec.Request): token_ids == prompt_token_ids + output_token_ids; the newest token is
never computed while running. `block_hashes` is extended lazily (only by the block manager, and
only for full blocks it has not hashed yet), so a request never rehashes a block (but for the
engine's async placeholder, whose block's hash the engine drops: spec/SCHEDULING.md).
"""

from __future__ import annotations

from typing import Optional, Sequence

from enginespec.spec import SamplingParams, Status, check_request_args, check_token_id, encode_extra


class FastRequest:
    """One generation request. `_stop_ids`, `_stoppers` (stop ids plus EOS unless ignore_eos),
    `_min_tokens` and `_out_limit` are the params' stop rules taken once, so the per-token stop
    check reads plain attributes."""

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "token_ids",
        "_output",
        "params",
        "eos_token_id",
        "priority",
        "arrival_time",
        "cache_key",
        "status",
        "num_computed_tokens",
        "num_cached_tokens",
        "num_preemptions",
        "spec_token_ids",
        "block_hashes",
        "swapped_out",
        "stop_reason",
        "_num_prompt",
        "_stop_ids",
        "_stoppers",
        "_min_tokens",
        "_out_limit",
        "_key",
        "_capacity",
        "_publish_at",
        "_extra",
        "__weakref__",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: Optional[SamplingParams] = None,
        *,
        eos_token_id: Optional[int] = None,
        priority: int = 0,
        arrival_time: Optional[float] = None,
        cache_key: tuple = (),
    ):
        args = check_request_args(
            request_id, prompt_token_ids, params, eos_token_id, priority, arrival_time, cache_key
        )
        request_id, prompt, params, eos_token_id, priority, arrival_time, cache_key = args
        self.request_id = request_id
        self.prompt_token_ids = prompt
        self.token_ids = list(prompt)
        self._output: list[int] = []
        self.params = params
        self.eos_token_id = eos_token_id
        self.priority = priority
        self.arrival_time = arrival_time
        self.cache_key = cache_key
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.num_preemptions = 0
        self.spec_token_ids: list[int] = []
        self.block_hashes: list[bytes] = []
        self.swapped_out = False
        self.stop_reason: object = None
        self._num_prompt = len(prompt)
        self._stop_ids = frozenset(params.stop_token_ids)
        eos = None if params.ignore_eos else eos_token_id
        self._stoppers = self._stop_ids if eos is None else self._stop_ids | {eos}  # ids that may stop
        self._min_tokens = params.min_tokens
        assert params.max_tokens is not None  # check_request_args refuses None
        self._out_limit = params.max_tokens  # outputs that finish it by length (the scheduler
        self._key = None  # lowers it to max_model_len - prompt; sets the key)
        self._capacity = self._publish_at = 0  # block manager mirrors (0 = "ask it")
        self._extra = encode_extra(cache_key)  # the cache key's bytes in every block hash

    @property
    def num_prompt_tokens(self) -> int:
        return self._num_prompt

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output)

    @property
    def output_token_ids(self) -> list[int]:
        """A copy of the generated tokens."""
        return list(self._output)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.token_ids) + len(self.spec_token_ids)

    def append(self, token: int) -> None:
        """Append one sampled token (to token_ids and to the output); ValueError unless it is a
        non-negative int."""
        if type(token) is not int or token < 0:
            token = check_token_id("Request.token_ids", token)
        self.token_ids.append(token)
        self._output.append(token)

    def replace_last_token(self, token: int) -> None:
        """Overwrite the newest output token (the engine's async-scheduling placeholder) with the
        sampled one. ValueError if there is no output token or `token` is not a non-negative int."""
        if not self._output:
            raise ValueError(f"request {self.request_id!r} has no output token to replace")
        if type(token) is not int or token < 0:
            token = check_token_id("Request.token_ids", token)
        self.token_ids[-1] = token
        self._output[-1] = token

    def __repr__(self) -> str:
        return (
            f"FastRequest({self.request_id!r}, status={self.status.name}, "
            f"tokens={len(self.token_ids)}, computed={self.num_computed_tokens})"
        )
