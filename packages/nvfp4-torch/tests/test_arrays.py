"""numpy <-> torch with every bit kept (:mod:`nvfp4_torch.arrays`): bfloat16 and
float8_e4m3fn, which numpy lacks, go through ``ml_dtypes`` by their bits, NaN payloads and
negative zero included."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from nvfp4_torch.arrays import from_numpy, to_numpy


@pytest.mark.parametrize(
    ("np_dtype", "bits"),
    [(np.float32, np.uint32), (ml_dtypes.bfloat16, np.uint16), (ml_dtypes.float8_e4m3fn, np.uint8)],
)
def test_round_trip_keeps_every_bit(np_dtype: object, bits: type) -> None:
    width = np.dtype(bits).itemsize * 8
    raw = np.arange(0, 2**width, max(1, 2**width // 4096), dtype=np.uint64).astype(bits)
    a = raw.view(np_dtype).reshape(-1, 2)
    t = from_numpy(a)
    assert t.shape == a.shape
    assert t.is_contiguous()
    back = to_numpy(t)
    if np_dtype is ml_dtypes.float8_e4m3fn:
        assert t.dtype == torch.float8_e4m3fn
        assert back.dtype == np.uint8  # float8 comes back as its bytes
        np.testing.assert_array_equal(back, a.view(np.uint8))
    else:
        assert back.dtype == np.dtype(np_dtype)
        np.testing.assert_array_equal(back.view(bits), a.view(bits))


def test_zero_d_non_contiguous_and_non_tensors() -> None:
    g = from_numpy(np.asarray(np.float32(0.5)))
    assert g.shape == ()
    assert float(g) == 0.5
    a = np.arange(12, dtype=np.float32).reshape(3, 4).T  # not C-contiguous
    np.testing.assert_array_equal(to_numpy(from_numpy(a)), a)
    np.testing.assert_array_equal(
        to_numpy(torch.arange(6.0).reshape(2, 3).T), [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    )
    assert to_numpy([1.0, 2.0]).tolist() == [1.0, 2.0]
