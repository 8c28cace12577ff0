"""dequantize: bit-identical to nvfp4.reference.dequantize for every output dtype."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes
from nvfp4_triton import ops
from nvfp4_triton.config import KernelConfig
from nvfp4_triton.testing import DTYPES, NUMPY, TORCH, to_numpy
from nvfp4_triton.weights import upload
from triton_helpers import bits


def _random_planes(
    rng: np.random.Generator, lead: tuple[int, ...], k: int, g: np.ndarray, parts=None
) -> NVFP4Planes:
    codes = rng.integers(0, 256, (*lead, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, (*lead, k // 16), dtype=np.uint8)
    return NVFP4Planes(codes, scales, np.asarray(g, np.float32), parts, "deq")


CASES = {
    # N and K not multiples of the tiles (16 x 64): masks at both edges
    "ragged_2d": lambda r: _random_planes(r, (45,), 208, np.float32(0.0123)),
    "partitions": lambda r: _random_planes(
        r, (40,), 64, np.array([0.5, 3e-3, 7.0], np.float32), (0, 9, 33, 40)
    ),
    "experts_partitions": lambda r: _random_planes(
        r,
        (
            3,
            20,
        ),
        96,
        np.array([[1e-2, 2.0], [3e-4, 1.5], [9.0, 1e-3]], np.float32),
        (0, 7, 20),
    ),
    # 448 * 6 * 100 overflows float16 to inf; float32 / bfloat16 hold it
    "f16_overflow": lambda r: _random_planes(r, (17,), 32, np.float32(100.0)),
    # products below 2^-126: float32 subnormal outputs, no flush to zero
    "f32_subnormal": lambda r: _random_planes(r, (9,), 48, np.float32(2.0**-120)),
    # 1 + 2^-8: many products exactly half-way between two bfloat16 values
    "bf16_ties": lambda r: _random_planes(r, (16,), 64, np.float32(1 + 2**-8)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_dequantize_exact(any_cfg: KernelConfig, case: str, dtype: str) -> None:
    planes = CASES[case](np.random.default_rng(zlib.crc32(case.encode())))
    got = to_numpy(ops.dequantize(upload(planes, "cpu"), TORCH[dtype], any_cfg))
    with np.errstate(over="ignore"):
        want = reference.dequantize(planes, NUMPY[dtype])
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(bits(got), bits(want))
