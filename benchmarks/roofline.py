"""The roofline floor of an offline generation workload, and the two device rates it divides by.

Floor (seconds) = (decode KV bytes + weight bytes) / copy bandwidth + prefill FLOPs / matmul rate.

- Decode KV bytes: a request with p prompt tokens and o output tokens gets its first output from
  the prefill; each of the o - 1 decode steps that follow feeds one token and reads the K and V
  of its whole context, of p + 1 .. p + o - 1 tokens. So it reads
  ((o - 1) * p + (o - 1) * o / 2) * kv_bytes_per_token, with kv_bytes_per_token =
  2 (K, V) * layers * kv_heads * head_dim * dtype bytes. Writes of new K/V are not counted.
- Weight bytes: every forward step streams every weight once: num_steps * weight_bytes_per_step.
  An untied input embedding is only gathered (a few rows), so it is left out; a tied one is the
  LM head's matrix and is counted. num_steps is what the engine reported when it does, else the
  fewest steps possible, max(output lengths) (every request in one batch).
- Prefill FLOPs: 2 * (weights a prompt token passes through: all but the input embedding and
  the LM head) * prompt tokens + 2 * vocab * hidden per request (the head runs on the last
  prompt row only) + causal attention, 2 * p^2 * q_heads * head_dim * layers per request
  (QK^T and PV, each p^2 * d per head over the causal half).

Decode matmul FLOPs are not added: at these batch sizes decode is bound by memory, and its
FLOPs overlap the byte stream. The floor is a lower bound no engine can beat on this device.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class ModelShape:
    """What the floor needs of a model. `num_params` counts a tied head once."""

    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    num_params: int
    tied: bool
    dtype_bytes: int = 2

    @classmethod
    def from_config(cls, config, dtype_bytes: int = 2) -> "ModelShape":
        """Read an HF config; parameters are counted on a meta-device model (no memory)."""
        from enginespec.testing.checkpoints import tensor_specs

        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_q_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=head_dim,
            vocab_size=config.vocab_size,
            num_params=sum(s.numel for s in tensor_specs(config)),
            tied=bool(getattr(config, "tie_word_embeddings", False)),
            dtype_bytes=dtype_bytes,
        )

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes_per_step(self) -> int:
        streamed = self.num_params if self.tied else self.num_params - self.embedding_params
        return streamed * self.dtype_bytes

    @property
    def body_params(self) -> int:
        """Weights every token passes through: all but the input embedding and the LM head."""
        heads = 1 if self.tied else 2
        return self.num_params - heads * self.embedding_params


def decode_kv_bytes(prompt_lens: Sequence[int], output_lens: Sequence[int], shape: ModelShape) -> int:
    """K/V bytes the decode steps read (see the module docstring)."""
    _check_lengths(prompt_lens, output_lens)
    tokens = sum((o - 1) * p + (o - 1) * o // 2 for p, o in zip(prompt_lens, output_lens))
    return tokens * shape.kv_bytes_per_token


def prefill_flops(prompt_lens: Sequence[int], shape: ModelShape) -> int:
    """Matmul and attention FLOPs of prefilling every prompt once (see the module docstring)."""
    dense = 2 * shape.body_params * sum(prompt_lens)
    head = 2 * shape.embedding_params * len(prompt_lens)
    attention = sum(2 * p * p * shape.num_q_heads * shape.head_dim * shape.num_layers for p in prompt_lens)
    return dense + head + attention


@dataclass(frozen=True)
class Roofline:
    """The floor and its terms. Bytes and FLOPs are totals over the workload."""

    kv_bytes: int
    weight_bytes: int
    prefill_flops: int
    num_steps: int
    copy_bytes_per_s: float
    matmul_flops_per_s: float
    memory_s: float
    compute_s: float
    floor_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def roofline(
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    shape: ModelShape,
    *,
    num_steps: int,
    copy_bytes_per_s: float,
    matmul_flops_per_s: float,
) -> Roofline:
    """The floor of a workload on a device with the given rates."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if copy_bytes_per_s <= 0 or matmul_flops_per_s <= 0:
        raise ValueError(
            f"copy_bytes_per_s and matmul_flops_per_s must be > 0, got "
            f"{copy_bytes_per_s} and {matmul_flops_per_s}"
        )
    kv = decode_kv_bytes(prompt_lens, output_lens, shape)
    weights = num_steps * shape.weight_bytes_per_step
    flops = prefill_flops(prompt_lens, shape)
    memory_s = (kv + weights) / copy_bytes_per_s
    compute_s = flops / matmul_flops_per_s
    return Roofline(
        kv,
        weights,
        flops,
        num_steps,
        copy_bytes_per_s,
        matmul_flops_per_s,
        memory_s,
        compute_s,
        memory_s + compute_s,
    )


def _check_lengths(prompt_lens: Sequence[int], output_lens: Sequence[int]) -> None:
    if len(prompt_lens) != len(output_lens):
        raise ValueError(
            f"prompt_lens and output_lens must have one entry per request, got "
            f"{len(prompt_lens)} and {len(output_lens)}"
        )
    if any(p < 1 for p in prompt_lens) or any(o < 1 for o in output_lens):
        raise ValueError("prompt_lens and output_lens must all be >= 1")


# ---- device rates -------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, iters: int, device: torch.device) -> float:
    """Seconds per call of `fn`, after one untimed warm-up call."""
    fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / iters


def measure_copy_bandwidth(device, nbytes: int, iters: int = 10) -> float:
    """Bytes per second of a large same-device copy, counting bytes read plus bytes written."""
    device = torch.device(device)
    if nbytes < 1 or iters < 1:
        raise ValueError(f"nbytes and iters must be >= 1, got {nbytes} and {iters}")
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    seconds = _timed(lambda: dst.copy_(src), iters, device)
    src = dst = None  # free the buffers before the next measurement
    return 2 * nbytes / seconds


def measure_matmul_rate(device, n: int, iters: int = 10, dtype=torch.bfloat16) -> float:
    """FLOP/s of an n x n x n matmul in `dtype` (2 n^3 FLOPs per product)."""
    device = torch.device(device)
    if n < 1 or iters < 1:
        raise ValueError(f"n and iters must be >= 1, got {n} and {iters}")
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = _timed(lambda: torch.matmul(a, b, out=out), iters, device)
    return 2 * n**3 / seconds
