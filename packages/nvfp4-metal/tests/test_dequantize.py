"""dequantize is exact (spec 1.0 "Decoding"): every code times every scale byte exactly in
float32, the global multiplied once in float32, float16/bfloat16 by round-to-nearest-even.
The expected values come from nvfp4.spec's tables, not from MLX."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from metal_helpers import NP_DTYPES, to_np
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import E2M1_VALUES, E4M3_VALUES
from nvfp4.testing import random_planes
from nvfp4_metal import ops
from nvfp4_metal.transcode import transcode


def spec_decode(p: NVFP4Planes, dtype: str) -> np.ndarray:
    codes = reference.unpack_codes(p.codes)
    unscaled = (E2M1_VALUES[codes] * np.repeat(E4M3_VALUES[p.scales], 16, axis=-1)).astype(
        np.float32
    )
    with np.errstate(over="ignore", under="ignore"):
        v = (unscaled * p.row_global()[..., None]).astype(np.float32)
        return v.astype(NP_DTYPES[dtype])


def assert_same(found: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert found.shape == expected.shape, f"{what}: shape {found.shape} vs {expected.shape}"
    assert found.dtype == expected.dtype, f"{what}: dtype {found.dtype} vs {expected.dtype}"
    f, e = found.astype(np.float64), expected.astype(np.float64)
    bad = ~((f == e) | (np.isnan(f) & np.isnan(e)))
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} elements differ, first at {np.argwhere(bad)[0]}"
    )


def test_every_code_times_every_scale_byte_exact() -> None:
    """127 rows (every valid scale byte) x 32 columns cycling all 16 codes, global 1."""
    n = 127
    r = np.arange(n)[:, None]
    j = np.arange(32)[None, :]
    codes = ((j + 3 * r) % 16).astype(np.uint8)
    scales = np.stack([np.arange(n), 0x7E - np.arange(n)], axis=1).astype(np.uint8)
    p = NVFP4Planes(reference.pack_codes(codes), scales, np.float32(1.0), name="probe")
    assert_same(to_np(ops.dequantize(transcode(p), "float32")), spec_decode(p, "float32"), "probe")


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize(
    ("n", "k", "experts", "partitions"),
    [
        (7, 16, None, None),  # K = 16: MLX's CPU dequantize needs K % 32 == 0 (padded)
        (9, 48, None, None),
        (33, 272, None, None),
        (24, 64, 3, None),
        (40, 80, None, (0, 16, 24, 40)),
        (40, 32, 2, (0, 16, 24, 40)),
    ],
    ids=["K16", "K48", "N33_K272", "experts", "partitions_K80", "experts_partitions"],
)
def test_dequantize_exact(dtype: str, n: int, k: int, experts: int | None, partitions: Any) -> None:
    p = random_planes(np.random.default_rng(n * k), n, k, experts=experts, partitions=partitions)
    found = to_np(ops.dequantize(transcode(p), dtype))
    assert_same(found, spec_decode(p, dtype), f"{dtype} {p.shape}")
    assert_same(found, reference.dequantize(p, NP_DTYPES[dtype]), "vs nvfp4.reference")


@pytest.mark.parametrize(
    ("label", "scale_bytes", "global_scale"),
    [
        ("float16_overflow", (0x70, 0x7E), 100.0),
        ("bfloat16_ties", (0x30, 0x40), 1 + 2**-8),
        ("float16_ties", (0x30, 0x40), 1 + 2**-11),
        ("float32_subnormal_outputs", (0x00, 0x20), 2.0**-120),
    ],
)
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_dequantize_edges(
    label: str, scale_bytes: tuple[int, int], global_scale: float, dtype: str
) -> None:
    rng = np.random.default_rng(len(label))
    codes = rng.integers(0, 256, size=(8, 32), dtype=np.uint8)
    scales = rng.integers(scale_bytes[0], scale_bytes[1] + 1, size=(8, 4), dtype=np.uint8)
    p = NVFP4Planes(codes, scales, np.float32(global_scale), name=label)
    assert_same(to_np(ops.dequantize(transcode(p), dtype)), spec_decode(p, dtype), label)
