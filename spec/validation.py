"""Input validation shared by every implementation and the engine: one function per class of
value, so that all backends refuse the same inputs with the same ValueError.

Classes of value and their contract:
- token ids (`check_token_id`): any integral number (int, numpy integers, anything registered as
  numbers.Integral) that is >= 0, converted to a plain int; bool, float, str, None and negative
  values are refused. The engine knows the vocabulary and checks the upper bound itself
  (`check_token_ids(..., vocab_size=...)`). Prompt tokens at construction and every token
  appended later (append, replace_last_token) go through this one function.
- real numbers (`check_real`): int or float (numbers.Real, not bool) and finite: NaN and +-inf
  are refused everywhere, then the field's own range applies.
- integers (`check_int`): numbers.Integral, not bool, converted to int, within the field's range.
- cache keys (`check_cache_key`): a tuple or list (a str, bytes or any other single value is
  refused: it would be split into characters) of items that are str, bytes, bool, None, int or
  tuples/lists of those, recursively. Floats, numpy values and other objects are refused: their
  equality does not match their encoding (1.0 == 1 but they would hash differently).
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable, Optional

#: The most samples one request may ask for (n). Each sample is a request in the scheduler, so
#: an unbounded n lets one call take every seat and block of the engine.
MAX_N = 256
#: Largest |logit_bias| value (OpenAI's bound): a bias beyond it is no longer a bias but a ban,
#: and allowed_token_ids / stop_token_ids say that explicitly.
MAX_LOGIT_BIAS = 100.0


def check_token_id(name: str, token: object) -> int:
    """One token id as a plain int; ValueError naming `name` unless integral and >= 0."""
    if type(token) is int and token >= 0:
        return token
    if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
        raise ValueError(
            f"{name} must hold token ids (ints, not bool or float) in [0, vocab_size), got {token!r}"
        )
    return int(token)


def check_token_ids(name: str, tokens: object, vocab_size: Optional[int] = None) -> list[int]:
    """A list of plain-int token ids from an iterable (see check_token_id), each < vocab_size
    when given. A str, bytes or a non-iterable is refused."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
        raise ValueError(f"{name} must be a sequence of token ids, got {type(tokens).__name__}")
    out = [check_token_id(name, t) for t in tokens]
    if vocab_size is not None:
        bad = [t for t in out if t >= vocab_size]
        if bad:
            raise ValueError(f"{name} must be token ids < vocab_size ({vocab_size}), got {bad[:5]!r}")
    return out


def check_real(owner: str, name: str, value: object) -> float:
    """A finite real number as float; ValueError naming owner.name otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{owner}.{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{name} must be finite, got {value!r}")
    return value


def check_int(owner: str, name: str, value: object) -> int:
    """An integral number (not bool) as int; ValueError naming owner.name otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner}.{name} must be an int, got {value!r}")
    return int(value)


def check_count(owner: str, name: str, value: object) -> int:
    """A token or block count: an integral number (not bool) >= 0, as int; ValueError naming
    owner.name and the bound otherwise. Every count argument of the BlockManager goes through it
    (or an equivalent fast path that accepts exactly the same values)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{owner}: {name} must be an int >= 0, got {value!r}")
    return int(value)


def _check_key_item(item: object, depth: int) -> None:
    if depth > 8:
        raise ValueError("Request.cache_key nests deeper than 8 levels")
    if item is None or isinstance(item, (str, bytes, bool)) or type(item) is int:
        return
    if isinstance(item, (tuple, list)):
        for sub in item:
            _check_key_item(sub, depth + 1)
        return
    raise ValueError(
        "Request.cache_key items must be str, bytes, int, bool, None or tuples/lists of them, "
        f"got {type(item).__name__} ({item!r})"
    )


def check_cache_key(cache_key: object) -> tuple:
    """The cache key as a tuple (see the module docstring for what is accepted)."""
    if not isinstance(cache_key, (tuple, list)):
        raise ValueError(
            f"Request.cache_key must be a tuple (e.g. (salt,)), got {type(cache_key).__name__} "
            f"({cache_key!r}); a str is not split into characters"
        )
    _check_key_item(cache_key, 0)
    return tuple(cache_key)
