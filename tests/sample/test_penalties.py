"""sample/penalties.py's upload helpers: the 16-byte alignment Triton specialises on.

A device view that starts off a 16-byte boundary makes Triton compile another kernel variant,
in the middle of traffic (penalties.SEGMENT_ALIGN). These check the layout on the CPU: the
offsets and padding are the same on every device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from enginespec.sample.penalties import SEGMENT_ALIGN, aligned_rows, upload_packed


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.uint8, np.bool_])
@pytest.mark.parametrize("width", [1, 3, 4, 5, 16, 17])
def test_aligned_rows_pads_each_row_to_the_next_16_bytes_with_zeros(dtype, width):
    a = (np.arange(3 * width).reshape(3, width) % 7 + 1).astype(dtype)
    padded = aligned_rows(a)
    row_bytes = padded.shape[1] * padded.itemsize
    assert row_bytes % SEGMENT_ALIGN == 0
    assert row_bytes - a.shape[1] * a.itemsize < SEGMENT_ALIGN, "more padding than alignment needs"
    assert padded.dtype == a.dtype and padded.shape[0] == 3
    np.testing.assert_array_equal(padded[:, :width], a)
    assert not padded[:, width:].any()


def test_upload_packed_starts_every_segment_at_the_next_16_bytes_and_keeps_the_values():
    arrays = [
        np.array([1, 2, 3], dtype=np.int32),  # 12 bytes: the next segment must skip 4
        np.array([True, False, True]),
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([7], dtype=np.int64),
    ]
    views = upload_packed(arrays, "cpu")
    base = views[0].data_ptr()
    # each segment takes its bytes rounded up to 16 (12 -> 16, 3 -> 16, 24 -> 32), no more
    assert [v.data_ptr() - base for v in views] == [0, 16, 32, 64]
    for a, v in zip(arrays, views):
        assert v.shape == a.shape
        np.testing.assert_array_equal(v.numpy(), a)
    assert views[2].dtype is torch.float32 and views[1].dtype is torch.bool
