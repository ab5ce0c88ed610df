"""Two row gathers in one launch: a decode step's embedding rows and rope-table rows.

A fused-path decode step (worker/merged_decoder.py, at most fused_max_rows rows, run eagerly
and replayed as a CUDA graph) begins with two gathers: embed_tokens.weight[input_ids] and
rope_table[positions]. As torch's index_select they are two launches whose kernel loops over
the indices in each thread: about 1.3 + 0.54 x rows us a launch on the H200 (3.7, 6.9 and 19.8
us a step at 1, 4 and 16 rows; benchmarks/RESULTS.md, eighteenth session). Here one program
per (row, table) copies one row, so the launch's time does not grow with the rows.

Invariants: every index is in range for its table (the engine checks token ids against the
vocabulary when a request is added, async scheduling's placeholder ids are replaced on the
device before the forward (engine/async_scheduling.apply_patch), and positions stay below
max_model_len <= the rope table's length (max_positions, or a longer max_model_len allowed by
VLLM_ALLOW_LONG_MAX_MODEL_LEN: FlatModel.cover_positions); an index out of range
reads outside the table, as an unchecked CUDA gather would); out_a[i] == table_a[index_a[i]]
and out_b[i] == table_b[index_b[i]] bit for bit (a copy, no arithmetic).

With PDL (kernels/pdl.py) the launch lets the next kernel (the first layer's q|k|v GEMV, which
loads its weights before its wait) start at once, and waits before its first read: the indices
come from the step's input copies.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from enginespec.kernels.compile_pool import launcher
from enginespec.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_options, pdl_enabled

MAX_BLOCK = 4096  # elements a program copies per loop trip (an 8B-shape embedding row in one)


@triton.jit
def _copy_row(dst, src, width, BLOCK: tl.constexpr):
    """dst[:width] = src[:width], BLOCK elements a trip."""
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)  # [BLOCK]
        tl.store(dst + cols, tl.load(src + cols, mask=cols < width), mask=cols < width)


@triton.jit
def _gather_two_kernel(
    out_a_ptr,  # [R, A] rows of table_a
    out_b_ptr,  # [R, B] rows of table_b
    index_a_ptr,  # [R] integer: rows of table_a
    index_b_ptr,  # [R] integer: rows of table_b
    table_a_ptr,  # [Na, A]
    table_b_ptr,  # [Nb, B]
    width_a,
    width_b,
    stride_out_a,
    stride_out_b,
    stride_a,
    stride_b,
    BLOCK_A: tl.constexpr,
    BLOCK_B: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """Program (row, 0) copies table_a's row index_a[row], (row, 1) table_b's row index_b[row]."""
    row = tl.program_id(0).to(tl.int64)
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()  # the indices come from the step's input copies
    if tl.program_id(1) == 0:
        src = table_a_ptr + tl.load(index_a_ptr + row).to(tl.int64) * stride_a
        _copy_row(out_a_ptr + row * stride_out_a, src, width_a, BLOCK_A)
    else:
        src = table_b_ptr + tl.load(index_b_ptr + row).to(tl.int64) * stride_b
        _copy_row(out_b_ptr + row * stride_out_b, src, width_b, BLOCK_B)


def _check(name: str, index: torch.Tensor, table: torch.Tensor, rows: int) -> None:
    if tuple(index.shape) != (rows,):
        raise ValueError(f"gather_two: {name} index must be [{rows}], got shape {tuple(index.shape)}")
    if index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"gather_two: {name} index must be int32 or int64, got {index.dtype}")
    if table.dim() < 2 or index.device != table.device:
        raise ValueError(f"gather_two: {name} table must be [N, ...] on the index's device {index.device}")


def _block(width: int) -> int:
    return min(triton.next_power_of_2(max(width, 1)), MAX_BLOCK)


def gather_two(
    index_a: torch.Tensor, table_a: torch.Tensor, index_b: torch.Tensor, table_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(table_a[index_a], table_b[index_b]) in one launch: index_* [R] int32/int64, table_* [N, ...]
    (trailing dims gathered whole, any dtype) -> [R, ...] each, contiguous.

    Semantics: torch.index_select(table, 0, index) for each (kernels.reference.gather_two_ref)."""
    if index_a.dim() != 1:
        raise ValueError(f"gather_two: a index must be 1-D, got shape {tuple(index_a.shape)}")
    rows = index_a.shape[0]
    _check("a", index_a, table_a, rows)
    _check("b", index_b, table_b, rows)
    flat_a = table_a.reshape(table_a.shape[0], -1)
    flat_b = table_b.reshape(table_b.shape[0], -1)
    if flat_a.stride(-1) != 1 or flat_b.stride(-1) != 1:
        flat_a, flat_b = flat_a.contiguous(), flat_b.contiguous()
    out_a = flat_a.new_empty((rows, flat_a.shape[1]))
    out_b = flat_b.new_empty((rows, flat_b.shape[1]))
    if rows > 0:
        launcher(_gather_two_kernel, (rows, 2))(
            out_a,
            out_b,
            index_a,
            index_b,
            flat_a,
            flat_b,
            flat_a.shape[1],
            flat_b.shape[1],
            out_a.stride(0),
            out_b.stride(0),
            flat_a.stride(0),
            flat_b.stride(0),
            BLOCK_A=_block(flat_a.shape[1]),
            BLOCK_B=_block(flat_b.shape[1]),
            USE_PDL=(pdl := pdl_enabled(index_a.device)),
            num_warps=4,
            **launch_options(pdl),
        )
    return out_a.view(rows, *table_a.shape[1:]), out_b.view(rows, *table_b.shape[1:])
