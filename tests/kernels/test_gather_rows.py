"""kernels/gather_rows.py (a fused-path step's embedding and rope-table gathers in one launch)
against index_select: bit-for-bit copies, shuffled and repeated indices, both index dtypes,
rows wider than one loop trip. On CPU under TRITON_INTERPRET=1 on tiny shapes."""

import pytest
import torch

from enginespec.kernels import gather_rows
from enginespec.kernels.gather_rows import gather_two
from enginespec.kernels.reference import gather_two_ref

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_gather_two_matches_index_select(index_dtype, dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    embed = torch.randn(37, 24, generator=gen).to(dtype).to(DEVICE)  # [vocab, hidden]
    rope = torch.randn(50, 2, 8, generator=gen).to(dtype).to(DEVICE)  # [positions, 2, D]
    ids = torch.randint(0, 37, (rows,), generator=gen)
    ids[0] = 36  # the last row of the table
    positions = torch.randperm(50, generator=gen)[:rows]
    if rows > 2:
        ids[2] = ids[1]  # a repeated index
    ids, positions = ids.to(index_dtype).to(DEVICE), positions.to(index_dtype).to(DEVICE)
    hidden, both = gather_two(ids, embed, positions, rope)
    want_hidden, want_both = gather_two_ref(ids, embed, positions, rope)
    assert hidden.shape == (rows, 24) and both.shape == (rows, 2, 8)
    assert torch.equal(hidden, want_hidden) and torch.equal(both, want_both)


def test_rows_wider_than_one_block_loop(monkeypatch):
    """A row longer than MAX_BLOCK is copied in several trips, the last one masked."""
    monkeypatch.setattr(gather_rows, "MAX_BLOCK", 16)
    gen = torch.Generator().manual_seed(0)
    embed = torch.randn(9, 40, generator=gen).to(DEVICE)  # 40 = 16 + 16 + 8
    rope = torch.randn(11, 2, 12, generator=gen).to(DEVICE)  # 24 = 16 + 8
    ids = torch.tensor([8, 0, 3], device=DEVICE)
    positions = torch.tensor([10, 10, 1], device=DEVICE)
    hidden, both = gather_two(ids, embed, positions, rope)
    assert torch.equal(hidden, embed[ids.cpu()].to(DEVICE)) and torch.equal(
        both, rope[positions.cpu()].to(DEVICE)
    )


def test_no_rows_and_bad_indices():
    embed, rope = torch.zeros(4, 8, device=DEVICE), torch.zeros(5, 2, 4, device=DEVICE)
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    hidden, both = gather_two(empty, embed, empty, rope)
    assert hidden.shape == (0, 8) and both.shape == (0, 2, 4)
    one = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="b index must be \\[1\\]"):
        gather_two(one, embed, torch.zeros(2, dtype=torch.int64, device=DEVICE), rope)
    with pytest.raises(ValueError, match="a index must be 1-D"):
        gather_two(one[None], embed, one, rope)
    with pytest.raises(ValueError, match="int32 or int64"):
        gather_two(one.float(), embed, one, rope)
