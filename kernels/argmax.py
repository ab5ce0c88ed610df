"""Row-wise argmax of logits in one launch: greedy decoding's token pick.

Why: torch.argmax over a [1, 151936] bf16 logits row took 8.8 us on the H200 (a reduction of a
few hundred programs, a memset before it) at the end of a 0.63 ms batch-1 step (issue 19). Here
every row is cut into chunks of BLOCK columns, one program a chunk, and the chunks meet through
two per-row atomics instead of a second launch:

- each program packs its chunk's best into one int64: the value's bits in an order-preserving
  int32 key (high half) and 0xFFFFFFFF - column (low half), so the largest packed value is the
  largest logit and, among equal ones, the first column: torch.argmax's answer;
- it folds that into the row's running best with atomic_max, then counts itself done with an
  acq_rel atomic_add; the program that counts last takes the row's best with atomic_xchg (reading
  it and putting the empty sentinel back), resets the count and stores the column.

Invariant between launches: every row's running best holds EMPTY and its count 0 (a launch
leaves them so), which is why the state is private to one stream (`_state`): two launches on
different streams must not share it.

Torch's rules kept: NaN is larger than everything (torch.argmax returns the first NaN), and
-0.0 equals +0.0 (the first of them wins).
"""

from __future__ import annotations

import torch

from enginespec.kernels.compile_pool import launcher

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional on CPU (argmax falls back to torch)
    triton = None

BLOCK = 2048  # columns a program (151,936-column rows: 75 programs a row)
EMPTY = -(2**63)  # the running best of a row no program has reached


if triton is not None:

    @triton.jit
    def _argmax_kernel(
        tokens_ptr,  # [S] int64 out: each row's argmax
        best_ptr,  # [>= S] int64: running packed best per row (EMPTY between launches)
        count_ptr,  # [>= S] int32: programs of the row done (0 between launches)
        x_ptr,  # [S, V] logits (float32, bf16 or fp16), unit column stride
        vocab,
        stride_x,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
        mask = cols < vocab
        x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=mask, other=float("-inf"))
        x = x.to(tl.float32)
        x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties +0.0 (torch compares them equal)
        bits = x.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed int order = float order
        key = tl.where(x != x, 0x7FFFFFFF, key)  # NaN above +inf
        packed = (key.to(tl.int64) << 32) | (0xFFFFFFFF - cols.to(tl.int64))  # [BLOCK]
        empty = tl.full([BLOCK], -9223372036854775807 - 1, tl.int64)
        best = tl.max(tl.where(mask, packed, empty), 0)
        tl.atomic_max(best_ptr + row, best)
        done = tl.atomic_add(count_ptr + row, 1, sem="acq_rel")
        if done == tl.num_programs(1) - 1:  # the row's last program: every best is folded in
            final = tl.atomic_xchg(best_ptr + row, -9223372036854775807 - 1)
            tl.atomic_xchg(count_ptr + row, 0)
            tl.store(tokens_ptr + row, 0xFFFFFFFF - (final & 0xFFFFFFFF))


_STATES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _state(device: torch.device, stream_id: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (best, count) buffers of one stream, at least `rows` long (grown by doubling)."""
    key = (device, stream_id)
    state = _STATES.get(key)
    if state is None or state[0].shape[0] < rows:
        size = max(rows, 2 * state[0].shape[0] if state is not None else 64)
        state = (
            torch.full((size,), EMPTY, dtype=torch.int64, device=device),
            torch.zeros(size, dtype=torch.int32, device=device),
        )
        _STATES[key] = state
    return state


def argmax(x: torch.Tensor, compile_only: bool = False) -> torch.Tensor:
    """x [S, V] logits -> int64 [S], torch.argmax(x, dim=1)'s answer (first max; NaN counts as
    the max). One Triton launch on CUDA or under the interpreter (module doc), torch.argmax
    elsewhere, for an empty batch and where triton is not installed. compile_only: compile the launch's variant (Triton's
    warmup, kernels/compile_pool.py) and launch nothing; the result is then uninitialised."""
    if x.dim() != 2:
        raise ValueError(f"argmax: x must be [S, V], got shape {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError("argmax: x has no columns (V = 0)")
    if triton is None or x.shape[0] == 0:
        return x.argmax(dim=1)
    from enginespec.kernels.skinny_gemm import interpreting

    if not (x.is_cuda or interpreting()):
        return x.argmax(dim=1)
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, vocab = x.shape
    stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0
    best, count = _state(x.device, stream, rows)
    tokens = torch.empty(rows, dtype=torch.int64, device=x.device)
    grid = (rows, triton.cdiv(vocab, BLOCK))
    launcher(_argmax_kernel, grid, compile_only)(tokens, best, count, x, vocab, x.stride(0), BLOCK=BLOCK)
    return tokens
