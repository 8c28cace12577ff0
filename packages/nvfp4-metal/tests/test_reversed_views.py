"""Planes and activations that are reversed numpy views (negative strides, which MLX refuses
to import) are taken as any other: the same bits as the reference. The plane fuzzer found
the refusal; a reversed axis of length 1 is the case ``np.ascontiguousarray`` leaves as it is."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import nvfp4
import pytest


@pytest.mark.parametrize("rows", [1, 2, 33])
def test_reversed_planes_and_activations(backend: Any, rows: int) -> None:
    rng = np.random.default_rng(rows)
    planes = nvfp4.quantize(rng.standard_normal((rows, 64)).astype(np.float32))
    reversed_planes = dataclasses.replace(
        planes, codes=planes.codes[::-1], scales=planes.scales[::-1]
    )
    assert reversed_planes.codes.strides[0] < 0
    ref = nvfp4.get_backend("reference")
    got = backend.to_numpy(backend.dequantize(reversed_planes, "float32"))
    want = ref.to_numpy(ref.dequantize(reversed_planes, "float32"))
    np.testing.assert_array_equal(got, want)
    x = rng.standard_normal((3, 64)).astype(np.float32)[::-1, ::-1]
    y = backend.to_numpy(backend.qmm(x, reversed_planes))
    y_ref = ref.to_numpy(ref.qmm(x, reversed_planes))
    assert np.abs(y - y_ref).max() <= 1e-4 * max(np.abs(y_ref).max(), 1e-30)
