"""The canonical block hash.

Every implementation must hash blocks exactly like this, because the conformance suite compares
`PoolState.block_hashes` and `PoolState.cached` between the impl under test and the reference.

Why BLAKE2b-128 and never Python's `hash()`: the prefix cache is shared by every request of every
tenant. A collision would hand one tenant the KV cache of another's text. 128 bits of a
cryptographic hash make that as unlikely as we can make it; `hash()` of a tuple of ints is 64
bits, salted per process (so it is not even stable across workers), and easy to collide on
purpose.

Why the parent digest goes in: a block's KV depends on every token before it, so two equal token
runs at different depths (or after different prefixes) must get different hashes. Chaining the
parent digest makes the hash of block i stand for the whole prefix up to and including block i.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable, Sequence

#: Parent marker of the first block of a request (it has no parent digest).
ROOT = b"enginespec/root-block"
DIGEST_SIZE = 16


def _encode_extra(item: object, out: bytearray) -> None:
    """Append a type-tagged, length-prefixed encoding of one extra key (unambiguous)."""
    if isinstance(item, bool):
        out += b"B" + (b"\x01" if item else b"\x00")
    elif isinstance(item, int):
        raw = item.to_bytes((item.bit_length() + 8) // 8 or 1, "little", signed=True)
        out += b"i" + struct.pack("<I", len(raw)) + raw
    elif isinstance(item, str):
        raw = item.encode("utf-8")
        out += b"s" + struct.pack("<I", len(raw)) + raw
    elif isinstance(item, (bytes, bytearray)):
        out += b"b" + struct.pack("<I", len(item)) + bytes(item)
    elif isinstance(item, (tuple, list)):
        out += b"t" + struct.pack("<I", len(item))
        for sub in item:
            _encode_extra(sub, out)
    elif item is None:
        out += b"n"
    else:
        raise TypeError(
            f"cache_key items must be str, int, bytes, bool, None or tuples of them; got {type(item).__name__}"
        )


def encode_extra(extra: Iterable[object]) -> bytes:
    """Canonical bytes of the extra keys (LoRA name, image hashes, tenant salt ...)."""
    out = bytearray()
    _encode_extra(tuple(extra), out)
    return bytes(out)


def hash_block(parent: bytes | None, tokens: Sequence[int], extra: Iterable[object] = ()) -> bytes:
    """Hash of one full block: BLAKE2b-128(parent or ROOT, tokens as <i8, extra keys).

    `parent` is the digest of the previous block of the same request, or None for block 0.
    `extra` is the request's `cache_key`; it is mixed into every block of the chain, so two
    requests with different cache keys never share a block, whatever their tokens.
    """
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    h.update(ROOT if parent is None else parent)
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    h.update(encode_extra(extra))
    return h.digest()


def hash_request_blocks(
    token_ids: Sequence[int],
    block_size: int,
    extra: Iterable[object] = (),
    start: int = 0,
    parent: bytes | None = None,
) -> list[bytes]:
    """Hashes of the full blocks of `token_ids` from block index `start` (chained on `parent`).

    A convenience for implementations: `hash_request_blocks(tokens, bs)` is the whole chain.
    """
    extra = tuple(extra)
    out: list[bytes] = []
    num_full = len(token_ids) // block_size
    for i in range(start, num_full):
        parent = hash_block(parent, token_ids[i * block_size : (i + 1) * block_size], extra)
        out.append(parent)
    return out
