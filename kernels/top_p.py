"""Exact top-p thresholds by bisection, without sorting the row (Triton; interpreter in tests).

The sampler finds most top-p cuts among a row's few hundred largest logits. A row whose
nucleus may lie beyond them ("unsure": a flat distribution with a loose top_p) needs the exact
cut over the whole row. Sorting the row for it costs a full sort per open row, paid on every
step because the device path cannot ask the host whether a row was unsure. This kernel instead
exits at once on rows that are not unsure, and on the unsure ones bisects the threshold:

    thr = the smallest logit value v >= base with M(v) < top_p * T,

where weights are w(x) = exp((x - x_max) * inv_t) over the survivors x >= base (the min-p
cut), T is their total and M(v) the weight of survivors strictly above v. That is the cut of
the sorted definition (keep the shortest prefix whose mass reaches top_p; ties with the
threshold stay): M(t) < top_p * T holds exactly for t >= thr, so bisecting t between the
row's max (true) and base (false) converges to thr; after NUM_STEPS halvings lo and hi are
adjacent float32 values and hi is thr. Each step is one pass over the row by one program, so
an unsure row costs NUM_STEPS reads of it (rare rows; a sort would be ~log V passes of all).
Masses are summed in another order than a cumsum over sorted values, so a token whose
boundary lies within float rounding (~1e-7 relative) of top_p may fall on the other side.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional on CPU
    triton = None

BLOCK = 2048
NUM_STEPS = 64  # halvings: past ~40 the interval is below one float32 ulp of any logit


if triton is not None:

    @triton.jit
    def _mass_above(row_ptr, vocab, t, base, x_max, inv_t, BLOCK: tl.constexpr):
        """Sum of exp((x - x_max) * inv_t) over x > t and x >= base."""
        lanes = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + lanes
            xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf"))
            keep = (xv > t) & (xv >= base)
            acc += tl.where(keep, tl.exp((xv - x_max) * inv_t), 0.0)
        return tl.sum(acc, axis=0)

    @triton.jit
    def _top_p_bisect_kernel(
        x_ptr,
        x_stride,
        rows_ptr,
        unsure_ptr,
        base_off_ptr,
        inv_t_ptr,
        top_p_ptr,
        thr_ptr,
        vocab,
        NUM_STEPS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # x_ptr: [S, x_stride] float32 (unit stride along the vocab); rows_ptr: [R] int64 rows
        # of x; unsure_ptr: [R] uint8 (0: leave thr_ptr[i] as it is); base_off_ptr, inv_t_ptr,
        # top_p_ptr: [R] float32 (min-p cut = row max + base_off); thr_ptr: [R] float32, in/out.
        i = tl.program_id(0)
        if tl.load(unsure_ptr + i) != 0:
            row_ptr = x_ptr + tl.load(rows_ptr + i) * x_stride
            lanes = tl.arange(0, BLOCK)
            top = tl.full([BLOCK], float("-inf"), tl.float32)
            low = tl.full([BLOCK], float("inf"), tl.float32)
            for start in range(0, vocab, BLOCK):
                cols = start + lanes
                xv = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf"))
                top = tl.maximum(top, xv)
                low = tl.minimum(low, tl.where(xv > float("-inf"), xv, float("inf")))
            x_max = tl.max(top, axis=0)
            base = x_max + tl.load(base_off_ptr + i)
            inv_t = tl.load(inv_t_ptr + i)
            target = tl.load(top_p_ptr + i) * _mass_above(
                row_ptr, vocab, float("-inf"), base, x_max, inv_t, BLOCK
            )
            lo = tl.maximum(base, tl.min(low, axis=0)) - 1.0  # below every survivor: M(lo) = T
            hi = x_max
            for _ in range(NUM_STEPS):
                mid = lo + (hi - lo) * 0.5
                below = _mass_above(row_ptr, vocab, mid, base, x_max, inv_t, BLOCK) < target
                hi = tl.where(below, mid, hi)
                lo = tl.where(below, lo, mid)
            tl.store(thr_ptr + i, hi)


def available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def top_p_bisect(
    x: torch.Tensor,
    rows: torch.Tensor,
    unsure: torch.Tensor,
    base_off: torch.Tensor,
    inv_t: torch.Tensor,
    top_p: torch.Tensor,
    thr: torch.Tensor,
) -> torch.Tensor:
    """thr [R] with the unsure rows replaced by their exact top-p cut (a new tensor). x [S, V]
    float32, unit stride along V; rows int64 [R]; unsure bool [R]; base_off, inv_t, top_p
    float32 [R] (the min-p cut is the row max + base_off = log(min_p) / inv_t, -inf for none).
    One launch, no host sync."""
    assert x.stride(1) == 1 and x.dtype == torch.float32
    out = thr.float().contiguous().clone()
    num_rows = rows.shape[0]
    if num_rows == 0:
        return out
    _top_p_bisect_kernel[(num_rows,)](
        x,
        x.stride(0),
        rows.contiguous(),
        unsure.to(torch.uint8).contiguous(),
        base_off.float().contiguous(),
        inv_t.float().contiguous(),
        top_p.float().contiguous(),
        out,
        x.shape[1],
        NUM_STEPS=NUM_STEPS,
        BLOCK=BLOCK,
        num_warps=8,
    )
    return out
