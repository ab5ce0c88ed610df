"""The structured-outputs mask on the logits: xgrammar's token bitmask applied in plain torch.

Layout (xgrammar's, vLLM's): int32 [R, ceil(V / 32)], token t allowed iff bit t % 32 of word
t // 32 is set. Applied to the raw logits (out of place: the model's logits are inference
tensors, and the sampler never writes them either) of the constrained rows before any other
edit (vLLM applies it in the model runner, before its sampler's allowed_token_ids, bad words,
min_tokens, logit_bias, penalties and temperature), so the sampler's logprobs see it too.
Plain torch on any device: no xgrammar import here (engine/structured_output.py is the only
module that imports it), and the serial and speculative paths share this one function.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from enginespec.sample.penalties import upload_packed

_BITS: dict[torch.device, torch.Tensor] = {}  # 0..31 on each device, made once


def _bits(device: torch.device) -> torch.Tensor:
    if device not in _BITS:
        _BITS[device] = torch.arange(32, dtype=torch.int32, device=device)
    return _BITS[device]


def unpack_bitmask(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """bool [R, width]: which tokens each row allows (tokens past the bitmask's 32 * words,
    e.g. a padded logits column, are not)."""
    words = bitmask.to(torch.int32)
    bits = (words.unsqueeze(-1) >> _bits(words.device)) & 1
    allowed = bits.bool().reshape(words.shape[0], -1)
    if allowed.shape[1] >= width:
        return allowed[:, :width]
    pad = torch.zeros((words.shape[0], width - allowed.shape[1]), dtype=torch.bool, device=words.device)
    return torch.cat([allowed, pad], dim=1)


def apply_token_bitmask(logits: torch.Tensor, rows: Sequence[int], bitmask: torch.Tensor) -> torch.Tensor:
    """logits with row rows[i] at -inf wherever bitmask row i does not allow a token (a new
    tensor; logits itself when `rows` is empty). Rows not listed are unchanged.

    The host never waits for the device here: the rows and a host bitmask go up in one copy
    through pinned memory (penalties.upload_packed). A plain copy from pageable memory waits for
    the stream first, i.e. for the step's forward, which undid async scheduling's overlap on
    every constrained step."""
    if not len(rows):
        return logits
    dev = logits.device
    host_rows = np.asarray(list(rows), dtype=np.int64)
    if bitmask.device.type == "cpu":
        index, words = upload_packed([host_rows, bitmask.to(torch.int32).numpy()], dev)
    else:
        (index,), words = upload_packed([host_rows], dev), bitmask
    allowed = unpack_bitmask(words, logits.shape[1])
    sub = logits.index_select(0, index).masked_fill(~allowed, float("-inf"))
    return logits.index_copy(0, index, sub)
