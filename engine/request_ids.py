"""Internal request ids: the ids the scheduler, the pool and the runner see.

A user request with n = 1 keeps its own id, unless that id starts with the reserved character
SEP (U+001F, the unit separator): then it is escaped as SEP + SEP + id. Sample i of a request
with n > 1 is SEP + str(i) + SEP + id. The three forms start differently (no SEP; SEP SEP;
SEP digit), and each is injective, so no user id, whatever it holds, can equal another
request's internal id: the mapping is one-to-one from (user id, sample index, n).
"""

from __future__ import annotations

SEP = "\x1f"


def internal_id(user_id: str, index: int, n: int) -> str:
    """The scheduler-side id of sample `index` of user request `user_id` with n samples."""
    if n > 1:
        return f"{SEP}{index}{SEP}{user_id}"
    return SEP + SEP + user_id if user_id.startswith(SEP) else user_id
