"""Incremental block hashing for the fast impl: the canonical spec.hash_block, computed once per
full block per request, with the per-request constant parts (extra-key bytes, struct layout)
prepared once instead of per block.

The digest is byte-for-byte spec.hash_block's: BLAKE2b-128 over parent-or-ROOT, the block's
tokens as little-endian int64, then spec.encode_extra(cache_key). The test in
test_fast_examples.py checks that equality on random inputs.
"""

from __future__ import annotations

import functools
import hashlib
import struct

from enginespec.spec import ROOT, encode_extra
from enginespec.spec.hashing import DIGEST_SIZE


@functools.lru_cache(maxsize=64)
def _packer(block_size: int) -> struct.Struct:
    return struct.Struct(f"<{block_size}q")


def _extra_bytes(request) -> bytes:
    """The request's encoded cache key: computed once at construction by FastRequest. (An
    earlier version memoised encode_extra on the key tuple with lru_cache, which compares
    keys with ==, so (1,) and (True,) shared one encoding although spec.hash_block keeps
    them apart.)"""
    extra = getattr(request, "_extra", None)
    return encode_extra(request.cache_key) if extra is None else extra


def extend_block_hashes(request, block_size: int) -> list[bytes]:
    """Make request.block_hashes cover every full block of its known tokens and return it.
    Only blocks not hashed yet are hashed (tokens never change, so old hashes stay valid)."""
    hashes = request.block_hashes
    start = len(hashes)
    token_ids = request.token_ids
    stop = len(token_ids) // block_size
    if start >= stop:
        return hashes
    pack = _packer(block_size).pack
    extra = _extra_bytes(request)
    blake = hashlib.blake2b
    parent = hashes[-1] if start else ROOT
    for i in range(start, stop):
        lo = i * block_size
        data = parent + pack(*token_ids[lo : lo + block_size]) + extra
        parent = blake(data, digest_size=DIGEST_SIZE).digest()
        hashes.append(parent)
    return hashes
