"""Scheduler.add's refusals (spec/SCHEDULING.md, Scheduler.add) as one function both impls call:
a request that can never run is a ValueError naming the bound, its value and the request's count,
before anything changes. The conformance suite states the same rule on its own
(conformance/strategies.py, Limits, checked against add by test_limits_match_add), so a mistake
here fails there rather than passing unnoticed in both impls."""

from __future__ import annotations

from enginespec.spec.config import SchedulerConfig


def check_add(
    num_prompt: int, max_tokens: int, config: SchedulerConfig, block_size: int, num_blocks: int
) -> None:
    """ValueError if the request can never run:
    - prompt + max_tokens over max_model_len, except a prompt of exactly max_model_len with
      max_tokens 1 (vLLM's rule: its one token is sampled at the last prompt position);
    - more blocks than the pool has for its tokens that need a KV slot (prompt + max_tokens,
      capped at max_model_len: the token sampled at max_model_len gets none);
    - with chunked prefill off, prompt + max_tokens - 1 over max_num_batched_tokens (a request
      recomputed after preemption must fit one step)."""
    total = num_prompt + max_tokens
    slots = total
    if config.max_model_len is not None:
        full = num_prompt == config.max_model_len and max_tokens == 1
        if total > config.max_model_len and not full:
            raise ValueError(
                f"prompt ({num_prompt}) + max_tokens ({max_tokens}) = {total} exceeds max_model_len "
                f"({config.max_model_len}) (a prompt of exactly max_model_len takes max_tokens 1)"
            )
        slots = min(total, config.max_model_len)
    need = -(-slots // block_size)
    if need > num_blocks:
        raise ValueError(
            f"prompt + max_tokens = {total} tokens ({slots} with a KV slot) needs {need} blocks, "
            f"over num_blocks ({num_blocks})"
        )
    if not config.enable_chunked_prefill and total - 1 > config.max_num_batched_tokens:
        raise ValueError(
            f"with chunked prefill off, prompt + max_tokens - 1 = {total - 1} must be "
            f"<= max_num_batched_tokens ({config.max_num_batched_tokens})"
        )
