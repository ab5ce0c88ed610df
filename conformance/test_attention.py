"""Conformance point 7: the impl's AttentionBackend equals a dense causal softmax.

The oracle below never sees a block table: it attends each request's contiguous K/V directly,
in float64. The backend gets the same K/V scattered through shuffled block tables into a pool
poisoned with NaN (a real pool is torch.empty: unwritten slots hold garbage, and a backend that
reads one, even under a zero probability, turns the output into NaN).
"""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from enginespec.conformance.strategies import AttentionCase, attention_cases
from enginespec.spec import AttentionBackend, BatchMeta


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _meta(
    qsl: list[int], seq_lens: list[int], tables: list[list[int]], slots: list[int], block_size: int
) -> BatchMeta:
    width = max([len(t) for t in tables] + [1])
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32).reshape(-1, width)
    qsl_t = torch.tensor(qsl, dtype=torch.int32)
    seq_t = torch.tensor(seq_lens, dtype=torch.int32)
    q_lens = [qsl[i + 1] - qsl[i] for i in range(len(seq_lens))]
    return BatchMeta(
        query_start_loc=qsl_t,
        seq_lens=seq_t,
        block_table=table,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_size=block_size,
        query_start_loc_cpu=qsl_t.clone(),
        seq_lens_cpu=seq_t.clone(),
        max_query_len=max(q_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
    )


def _slot(table: list[int], p: int, bs: int) -> int:
    return table[p // bs] * bs + p % bs


class Built:
    """Tensors of one AttentionCase: contiguous K/V/Q per request, shuffled tables, and the
    metas of the history write (positions before this step) and of this step."""

    def __init__(self, case: AttentionCase):
        gen = torch.Generator().manual_seed(case.seed)
        self.dtype = torch.float64 if case.float64 else torch.float32
        bs = case.block_size
        need = [_cdiv(n, bs) for n in case.seq_lens]
        self.num_blocks = sum(need) + 2  # spare blocks that nobody owns stay poisoned
        order = torch.randperm(self.num_blocks, generator=gen).tolist()
        self.tables, at = [], 0
        for n in need:
            self.tables.append(order[at : at + n])
            at += n
        rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
        self.k = [rand(n, case.num_kv_heads, case.head_dim) for n in case.seq_lens]
        self.v = [rand(n, case.num_kv_heads, case.head_dim) for n in case.seq_lens]
        self.q = [rand(t, case.num_q_heads, case.head_dim) for t in case.query_lens]
        self.case = case
        self.history, self.step = self._history_meta(), self._step_meta()

    def _history_meta(self) -> BatchMeta:
        case, qsl, slots = self.case, [0], []
        for r, (n, t) in enumerate(zip(case.seq_lens, case.query_lens)):
            slots += [_slot(self.tables[r], p, case.block_size) for p in range(n - t)]
            qsl.append(len(slots))
        seq = [n - t for n, t in zip(case.seq_lens, case.query_lens)]
        return _meta(qsl, seq, self.tables, slots, case.block_size)

    def _step_meta(self) -> BatchMeta:
        case, qsl, slots = self.case, [0], []
        for r, (n, t) in enumerate(zip(case.seq_lens, case.query_lens)):
            slots += [_slot(self.tables[r], p, case.block_size) for p in range(n - t, n)]
            qsl.append(len(slots))
        for _ in range(case.num_pad_rows):
            slots.append(-1)
            qsl.append(len(slots))
        seq = list(case.seq_lens) + [0] * case.num_pad_rows
        return _meta(qsl, seq, self.tables + [[]] * case.num_pad_rows, slots, case.block_size)

    def rows(self, tensors: list[torch.Tensor], history: bool, pad_heads: int = 0) -> torch.Tensor:
        """Concatenate per-request rows (history: positions before the step, else the step's;
        a per-request tensor shorter than its context holds only the step's rows, as q does),
        then the padding rows (random values: they must not matter)."""
        case = self.case
        parts = [
            x[: n - t] if history else x[x.shape[0] - t :]
            for x, n, t in zip(tensors, case.seq_lens, case.query_lens)
        ]
        if not history and case.num_pad_rows:
            parts.append(torch.randn(case.num_pad_rows, pad_heads, case.head_dim, dtype=torch.float64))
        return torch.cat(parts).to(self.dtype)


def dense_oracle(case: AttentionCase, q: list, k: list, v: list, scale: float) -> list[torch.Tensor]:
    """Per request: query j at position seq_len - t + j sees keys at positions p <= its own and,
    with a window w > 0, p > position - w; query head h reads kv head h // (Hq // Hkv)."""
    group = case.num_q_heads // case.num_kv_heads
    outs = []
    for qr, kr, vr, n in zip(q, k, v, case.seq_lens):
        t = qr.shape[0]
        out = torch.empty_like(qr)
        for j in range(t):
            pos = n - t + j
            lo = max(0, pos - case.window + 1) if case.window > 0 else 0
            for h in range(case.num_q_heads):
                keys, vals = kr[lo : pos + 1, h // group], vr[lo : pos + 1, h // group]
                weights = torch.softmax(keys @ qr[j, h] * scale, dim=0)
                out[j, h] = weights @ vals
        outs.append(out)
    return outs


def _run(backend, built: Built, scale):
    case = built.case
    shape = (built.num_blocks + 1, case.block_size, case.num_kv_heads, case.head_dim)
    cache = backend.allocate(shape, built.dtype, "cpu")
    assert tuple(cache.shape) == (2, *shape) and cache.dtype == built.dtype
    cache.fill_(float("nan"))
    backend.write(cache, built.rows(built.k, True), built.rows(built.v, True), built.history)
    k_step = built.rows(built.k, False, case.num_kv_heads)
    v_step = built.rows(built.v, False, case.num_kv_heads)
    backend.write(cache, k_step, v_step, built.step)
    q_step = built.rows(built.q, False, case.num_q_heads)
    out = backend.forward(q_step, cache, built.step, scale=scale, window=case.window)
    return cache, out


def mismatch(case: AttentionCase, r: int, got: torch.Tensor, exp: torch.Tensor, tol: dict, scale) -> str:
    """The failure message of request r's rows: its context in blocks, the step's positions and
    settings, and which positions and query heads are wrong (NaN apart: a read of a slot never
    written, as the pool starts filled with NaN), so an author sees where the backend goes wrong."""
    n, t, bs = case.seq_lens[r], case.query_lens[r], case.block_size
    first = n - t
    bad = ~torch.isclose(got, exp, **tol)  # [t, Hq, D]; NaN is never close
    rows = bad.any(dim=(1, 2)).nonzero().flatten().tolist()
    heads = bad.any(dim=(0, 2)).nonzero().flatten().tolist()
    nan_rows = got.isnan().any(dim=(1, 2)).nonzero().flatten().tolist()
    err = (got - exp).abs().nan_to_num(nan=float("inf"))
    worst = int(err.amax(dim=(1, 2)).argmax())
    partial = f" + {n % bs} token(s) in a partial last block" if n % bs else " (no partial block)"
    lines = [
        f"request {r}: seq_len {n} = {n // bs} full blocks of {bs}{partial}, "
        f"{t} query rows at positions {first}..{n - 1}, window {case.window}, "
        f"scale {'head_dim**-0.5' if scale is None else scale}, "
        f"{case.num_q_heads} query heads over {case.num_kv_heads} kv heads (head h reads kv head "
        f"h // {case.num_q_heads // case.num_kv_heads})",
        f"wrong at positions {[first + i for i in rows]}, query heads {heads}; "
        f"max err {float(err.max()):.3g} at position {first + worst}",
    ]
    if nan_rows:
        lines.append(f"NaN at positions {[first + i for i in nan_rows]}: a slot never written was read")
    return "\n".join(lines)


@given(case=attention_cases(), explicit_scale=st.booleans())
def test_forward_matches_dense_oracle(impl, case, explicit_scale):
    backend = impl.attention_backend("cpu")
    built = Built(case)
    scale = 0.37 if explicit_scale else None
    cache, out = _run(backend, built, scale)
    assert out.shape == (sum(case.query_lens) + case.num_pad_rows, case.num_q_heads, case.head_dim)
    assert out.dtype == built.dtype
    expected = dense_oracle(case, built.q, built.k, built.v, scale or case.head_dim**-0.5)
    tol = dict(atol=1e-9, rtol=1e-9) if case.float64 else dict(atol=2e-5, rtol=2e-5)
    start = 0
    for r, exp in enumerate(expected):
        got = out[start : start + exp.shape[0]].double()
        if not torch.allclose(got, exp, **tol):  # raised: pytest's tensor reprs would bury the message
            raise AssertionError(mismatch(case, r, got, exp, tol, scale))
        start += exp.shape[0]
    pad = out[start:]
    assert torch.equal(pad, torch.zeros_like(pad)), "padding rows must output zeros"


def test_a_mismatch_names_the_positions_and_heads_that_differ():
    """A wrong forward's message tells the author where to look: the request's context in
    blocks, the wrong query rows by position and the wrong query heads (a last partial block
    read wrong shows as the rows whose keys reach into it; a GQA mapping as every other head)."""
    case = AttentionCase(
        block_size=16, num_kv_heads=2, num_q_heads=4, head_dim=8, window=7, seq_lens=(34,),
        query_lens=(3,), num_pad_rows=0, seed=0, float64=True,
    )  # fmt: skip
    exp = torch.zeros(3, 4, 8, dtype=torch.float64)
    got = exp.clone()
    got[1:, 1] = 0.5  # positions 32 and 33, query head 1
    got[2, 3] = float("nan")
    message = mismatch(case, 0, got, exp, dict(atol=1e-9, rtol=1e-9), None)
    assert "request 0: seq_len 34 = 2 full blocks of 16 + 2 token(s) in a partial last block" in message
    assert "3 query rows at positions 31..33, window 7, scale head_dim**-0.5" in message
    assert "4 query heads over 2 kv heads" in message
    assert "wrong at positions [32, 33], query heads [1, 3]" in message
    assert "NaN at positions [33]" in message


@given(case=attention_cases())
def test_write_stores_rows_at_their_slots_only(impl, case):
    backend = impl.attention_backend("cpu")
    built = Built(case)
    cache, _ = _run(backend, built, None)
    bs, owned = case.block_size, set()
    for r, n in enumerate(case.seq_lens):
        for p in range(n):
            block, off = built.tables[r][p // bs], p % bs
            owned.add((block, off))
            assert torch.equal(cache[0, block, off], built.k[r][p].to(built.dtype)), (
                f"K of request {r} pos {p}"
            )
            assert torch.equal(cache[1, block, off], built.v[r][p].to(built.dtype)), (
                f"V of request {r} pos {p}"
            )
    for block in range(built.num_blocks):  # every slot nobody wrote is still poisoned
        for off in range(bs):
            if (block, off) not in owned:
                assert torch.isnan(cache[:, block, off]).all(), f"stray write to block {block} offset {off}"


def test_padding_rows_write_only_the_scratch_block(impl):
    backend = impl.attention_backend("cpu")
    case = AttentionCase(
        block_size=4,
        num_kv_heads=2,
        num_q_heads=4,
        head_dim=8,
        window=0,
        seq_lens=(5,),
        query_lens=(2,),
        num_pad_rows=3,
        seed=3,
    )
    built = Built(case)
    cache, out = _run(backend, built, None)
    scratch = cache[:, -1]
    assert not torch.isnan(scratch).all(), "padding rows (slot -1) must land in the scratch block"
    assert torch.equal(out[2:], torch.zeros_like(out[2:]))


def test_backend_satisfies_protocol(impl):
    backend = impl.attention_backend("cpu")
    assert isinstance(backend, AttentionBackend)
    assert isinstance(backend.name, str) and backend.name


def test_window_one_sees_only_itself(impl):
    """window = 1: every query attends only its own key, so the output is its own V row."""
    backend = impl.attention_backend("cpu")
    case = AttentionCase(
        block_size=3,
        num_kv_heads=1,
        num_q_heads=2,
        head_dim=4,
        window=1,
        seq_lens=(7,),
        query_lens=(7,),
        num_pad_rows=0,
        seed=11,
        float64=True,
    )
    built = Built(case)
    _, out = _run(backend, built, None)
    expected = built.v[0][:, 0:1].expand(-1, 2, -1)
    assert torch.allclose(out, expected, atol=1e-12)
    assert math.isclose(float(out.abs().sum()), float(expected.abs().sum()), rel_tol=1e-9)
