"""The reference Request: a token list, a compute cursor, and bookkeeping. Plain Python.

Invariants (spec.Request): `token_ids == prompt_token_ids + output_token_ids`;
`0 <= num_cached_tokens <= num_computed_tokens <= num_tokens`; `block_hashes` only grows (but
for the engine's async placeholder, spec/SCHEDULING.md).
`block_hashes` is extended by the block manager, which knows the block size.
"""

from __future__ import annotations

from typing import Optional, Sequence

from enginespec.spec import SamplingParams, Status, check_request_args, check_token_id


class Request:
    """One generation request. `token_ids` is the prompt followed by the outputs, in one list."""

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

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """A copy of the generated tokens (the part of token_ids after the prompt)."""
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_tokens_with_spec(self) -> int:
        """Known tokens plus speculative draft tokens (those are not in token_ids)."""
        return len(self.token_ids) + len(self.spec_token_ids)

    def append(self, token: int) -> None:
        """Append one sampled token; ValueError unless it is a non-negative int."""
        self.token_ids.append(check_token_id("Request.token_ids", token))

    def replace_last_token(self, token: int) -> None:
        """Overwrite the newest output token (the engine's async-scheduling placeholder) with the
        sampled one. ValueError if there is no output token or `token` is not a non-negative int."""
        if self.num_output_tokens == 0:
            raise ValueError(f"request {self.request_id!r} has no output token to replace")
        self.token_ids[-1] = check_token_id("Request.token_ids", token)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
