"""The stop rules of spec/SCHEDULING.md as functions: the one definition the reference
scheduler and the engine's async path (which learns a sampled token one step late) share.

Checked after a token was appended (so num_output_tokens counts it), first match wins:
1. num_output_tokens > min_tokens and the token is in stop_token_ids: FINISHED_STOPPED with
   stop_reason = the token;
2. num_output_tokens > min_tokens, not ignore_eos, token == eos_token_id: FINISHED_STOPPED with
   stop_reason None;
3. num_output_tokens >= max_tokens, or num_tokens >= max_model_len (when set): FINISHED_LENGTH.
Rules 1 and 2 depend on the token's value, rule 3 only on counts. Stop strings are text and
belong to the engine's output processor.
"""

from __future__ import annotations

from typing import Optional

from enginespec.spec.request import Request, Status

Stop = tuple[Status, Optional[int]]  # (final status, stop_reason)


def token_stop(request: Request, token: int) -> Optional[Stop]:
    """Rules 1 and 2 for the newest token `token`; None when neither fires."""
    p = request.params
    if request.num_output_tokens <= p.min_tokens:
        return None
    if token in p.stop_token_ids:
        return Status.FINISHED_STOPPED, token
    if not p.ignore_eos and request.eos_token_id is not None and token == request.eos_token_id:
        return Status.FINISHED_STOPPED, None
    return None


def length_stop(request: Request, max_model_len: Optional[int]) -> Optional[Stop]:
    """Rule 3; None when it does not fire."""
    max_tokens = request.params.max_tokens
    assert max_tokens is not None  # a Request's is an int (spec.request.check_request_args)
    if request.num_output_tokens >= max_tokens or (
        max_model_len is not None and request.num_tokens >= max_model_len
    ):
        return Status.FINISHED_LENGTH, None
    return None


def stop_after_token(request: Request, token: int, max_model_len: Optional[int]) -> Optional[Stop]:
    """All three rules in order, for the newest token `token`; None: the request goes on."""
    return token_stop(request, token) or length_stop(request, max_model_len)
