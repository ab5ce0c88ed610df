"""benchmarks/overlap_probe.py: the half-batch ways compute what the serial chain computes (on
the CPU the kernels are interpreted; the stream ways run where CUDA is)."""

import pytest
import torch

from benchmarks import overlap_probe as probe

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU interprets (the repo conftest)
SHAPE = probe.Shape(hidden=64, q_heads=4, kv_heads=2, head_dim=16, inter=96, layers=2, block_size=16)


@pytest.fixture(scope="module")
def setup():
    num_blocks = 16
    model = probe.make_model(SHAPE, num_blocks, DEVICE)
    return model, probe.make_batch(SHAPE, rows=4, context=37, num_blocks=num_blocks, device=DEVICE)


def test_batch_rows_are_a_batch_of_their_own(setup):
    _, b = setup
    half = b.rows(2, 4)
    assert half.x.shape == (2, SHAPE.hidden) and half.query_start_loc.tolist() == [0, 1, 2]
    assert torch.equal(half.block_table, b.block_table[2:])
    # every row's new slot lies in its own last block, and no block is shared
    blocks = b.slot_mapping // SHAPE.block_size
    assert torch.equal(blocks, b.block_table[:, (b.context - 1) // SHAPE.block_size].long())
    assert b.block_table.unique().numel() == b.block_table.numel()


def test_halves_and_streams_compute_the_serial_chain(setup):
    model, b = setup
    fns = probe.ways(model, SHAPE, b)
    want = fns["serial"]().float()
    assert torch.isfinite(want).all() and want.abs().max() > 0
    names = ["halves", "free", "lockstep"] if DEVICE == "cuda" else ["halves"]
    for name in names:
        got = fns[name]()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05, msg=name)


def test_the_attention_matters_to_the_chain(setup):
    """The chain without its attention differs (the probe's `projections` way is not a no-op
    stand-in for the serial chain), so the comparison above can fail."""
    model, b = setup
    full = probe.run_serial(model, SHAPE, b).float()
    without = probe.run_serial(model, SHAPE, b, attention=False).float()
    assert (full - without).abs().max() > 0.1


def test_make_batch_refuses_a_pool_too_small():
    with pytest.raises(ValueError, match="num_blocks"):
        probe.make_batch(SHAPE, rows=4, context=64, num_blocks=8, device=DEVICE)


def test_folded_runs_the_chain_less_its_norms(setup):
    """The folded stand-in keeps the chain's shape and stays finite; it differs from serial (its
    row scales are left out), so the probe does not compare it."""
    model, b = setup
    got = probe.ways(model, SHAPE, b)["folded"]().float()
    want = probe.run_serial(model, SHAPE, b).float()
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert (got - want).abs().max() > 0
