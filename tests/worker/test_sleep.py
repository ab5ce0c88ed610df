"""worker/sleep.py on plain tensors: a released storage is 0 bytes and every view over it
follows; restore gives the weights back byte for byte and the KV pool as zeros; a storage the
allocator cannot resize (a file mapping, as a CPU checkpoint's) is adopted first, its tensors
re-pointed with their offsets; the level and tag checks name what they refuse."""

from __future__ import annotations

import pytest
import torch

from enginespec.worker.sleep import SLEEP_TAGS, Asleep, check_level, check_tags


def test_weights_sleep_to_zero_bytes_and_wake_exactly_with_views_still_views():
    merged = torch.nn.Parameter(torch.randn(6, 4), requires_grad=False)
    row_view = merged.detach()[2:4]  # as a Linear's weight over the merged q|k|v weight
    want = merged.detach().clone()
    asleep = Asleep.release([merged, row_view], keep=True)
    assert merged.untyped_storage().nbytes() == 0 and row_view.untyped_storage().nbytes() == 0
    assert asleep.num_bytes == 6 * 4 * 4
    asleep.restore()
    assert torch.equal(merged, want) and torch.equal(row_view, want[2:4])
    row_view.fill_(7.0)  # still a view: writes reach the merged tensor
    assert torch.equal(merged[2:4], torch.full((2, 4), 7.0))


def test_a_kv_pool_sleeps_to_zero_bytes_and_wakes_zeroed():
    pool = torch.randn(2, 3, 4, 1, 2)
    asleep = Asleep.release([pool], keep=False)
    assert pool.untyped_storage().nbytes() == 0 and pool.shape == (2, 3, 4, 1, 2)
    asleep.restore()
    assert torch.equal(pool, torch.zeros(2, 3, 4, 1, 2))


def test_a_storage_that_cannot_resize_is_adopted_with_its_views(tmp_path):
    path = tmp_path / "mapped.bin"
    torch.arange(12, dtype=torch.float32).numpy().tofile(path)
    mapped = torch.from_file(str(path), shared=True, size=12, dtype=torch.float32)
    assert not mapped.untyped_storage().resizable()
    head, tail = mapped[:4], mapped[4:].view(2, 4)
    asleep = Asleep.release([head, tail], keep=True)
    assert head.untyped_storage().nbytes() == 0
    assert head.untyped_storage().data_ptr() == tail.untyped_storage().data_ptr()  # one storage still
    asleep.restore()
    assert torch.equal(head, torch.arange(4.0)) and torch.equal(tail, torch.arange(4.0, 12.0).view(2, 4))
    assert tail.storage_offset() == 4


def test_levels_1_and_2_are_both_tags_and_every_other_level_is_refused_by_name():
    assert check_level(1) == check_level(2) == SLEEP_TAGS == ("weights", "kv_cache")
    for bad in (0, 3, True, "1", 1.0):
        with pytest.raises(ValueError, match=r"level must be one of \[1, 2\]"):
            check_level(bad)


def test_tags_are_none_or_a_list_of_known_tags():
    assert check_tags(None) == SLEEP_TAGS
    assert check_tags(["kv_cache", "kv_cache"]) == ("kv_cache",)
    assert check_tags([]) == ()
    with pytest.raises(ValueError, match=r"tags must be among \['weights', 'kv_cache'\], got \['kv'\]"):
        check_tags(["weights", "kv"])
    for bad in ("weights", {"weights"}, 5, {"weights": True}):  # a list (or tuple), as vLLM's
        with pytest.raises(ValueError, match="tags must be None or a list"):
            check_tags(bad)


def test_a_release_that_fails_midway_restores_what_it_released(monkeypatch):
    """All or nothing: the host copy of the second storage fails (host memory ran out), so the
    first, already 0 bytes, gets its bytes back and the error is raised."""
    import enginespec.worker.sleep as sleep

    first, second = torch.randn(3), torch.randn(5)
    want = first.clone()
    real = sleep._release
    calls = []

    def failing(group, keep):
        calls.append(group.num_bytes)
        if len(calls) == 2:
            raise RuntimeError("host memory ran out")
        real(group, keep)

    monkeypatch.setattr(sleep, "_release", failing)
    with pytest.raises(RuntimeError, match="host memory ran out"):
        Asleep.release([first, second], keep=True)
    assert torch.equal(first, want) and second.untyped_storage().nbytes() == 20
