"""MLX layout: a uint32 view of the code bytes, byte-exact round trips, and cross-checks
against MLX's own nvfp4 dequantize / quantize / quantized_matmul."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from layout_planes import random_planes
from nvfp4 import NVFP4Planes, PlaneError, dequantize
from nvfp4.layouts import MLXPlanes, from_mlx, mlx_global_scale_arg, to_mlx
from nvfp4.reference import pack_codes, qmm
from nvfp4.spec import GLOBAL_AMAX_DIVISOR
from nvfp4.testing import relative_error


def every_code_every_scale() -> NVFP4Planes:
    """127 rows (one per valid scale byte) x 64 elements (all 16 codes, 4 times), plus the
    codes in a row-dependent rotation so that every code meets every scale in every slot."""
    rows = np.arange(0x7F)
    elems = (np.arange(64)[None, :] + rows[:, None]) % 16
    codes = pack_codes(elems.astype(np.uint8))
    scales = np.repeat(rows.astype(np.uint8)[:, None], 4, axis=1)
    return NVFP4Planes(codes, scales, np.asarray(1.0, np.float32), name="all")


def ulp_distance(a: Any, b: Any) -> Any:
    """ulps between float32 arrays of equal signs (zeros: 0 only when both are zero)."""
    ia = np.asarray(a, np.float32).view(np.int32).astype(np.int64) & 0x7FFFFFFF
    ib = np.asarray(b, np.float32).view(np.int32).astype(np.int64) & 0x7FFFFFFF
    return np.abs(ia - ib)


# ------------------------------------------------------------------------------- layout
@pytest.mark.parametrize("shape", [(3, 16), (40, 128), (2, 5, 64)])
def test_round_trip_is_byte_exact_and_a_view(shape: tuple[int, ...]) -> None:
    p = random_planes(np.random.default_rng(1), shape)
    m = to_mlx(p)
    assert m.weight.dtype == np.uint32
    assert m.weight.shape == (*shape[:-1], shape[-1] // 8)
    assert m.scales.shape == p.scales.shape
    assert m.scales.dtype == np.uint8
    assert np.shares_memory(m.weight, p.codes), "contiguous codes must be viewed, not copied"
    assert m.scales is p.scales
    assert np.array_equal(m.global_scale, p.global_scale)
    assert m.k == shape[-1]
    back = from_mlx(m)
    assert np.array_equal(back.codes, p.codes)
    assert np.array_equal(back.scales, p.scales)
    assert np.array_equal(back.global_scale, p.global_scale)
    assert back.name == p.name
    assert np.shares_memory(back.codes, p.codes)


def test_element_i_sits_at_bits_4i() -> None:
    rng = np.random.default_rng(2)
    elems = rng.integers(0, 16, size=(6, 96), dtype=np.uint8)
    p = NVFP4Planes(pack_codes(elems), np.full((6, 6), 0x38, np.uint8), np.asarray(1.0, np.float32))
    words = to_mlx(p).weight.astype(np.int64)
    for i in range(8):
        assert np.array_equal((words >> (4 * i)) & 0xF, elems[:, i::8])


def test_fused_planes_keep_partitions_and_globals() -> None:
    p = random_planes(np.random.default_rng(3), (10, 32))
    fused = p.replace(partitions=(0, 4, 10), global_scale=np.array([0.5, 2.0], np.float32))
    m = to_mlx(fused)
    assert m.partitions == (0, 4, 10)
    assert np.array_equal(m.global_scale, [0.5, 2.0])
    back = from_mlx(m)
    assert back.partitions == (0, 4, 10)
    assert np.array_equal(dequantize(back), dequantize(fused))


def test_non_contiguous_codes_are_copied_correctly() -> None:
    p = random_planes(np.random.default_rng(4), (8, 64))
    sliced = NVFP4Planes(p.codes[:, 8:24], p.scales[:, 1:3], p.global_scale)
    back = from_mlx(to_mlx(sliced))
    assert np.array_equal(back.codes, p.codes[:, 8:24])


def test_refusals() -> None:
    p = random_planes(np.random.default_rng(5), (4, 32))
    m = to_mlx(p)
    with pytest.raises(PlaneError, match="MLX weight"):
        MLXPlanes(m.weight.astype(np.int64), m.scales, m.global_scale)
    with pytest.raises(PlaneError, match=r"MLX scales\.shape"):
        MLXPlanes(m.weight, m.scales[:, :1], m.global_scale)
    with pytest.raises(PlaneError, match="global_scale shape"):
        MLXPlanes(m.weight, m.scales, np.ones(3, np.float32))
    bad = m.scales.copy()
    bad[0, 0] = 0x80
    with pytest.raises(PlaneError, match=r"scale byte at \(0, 0\)"):
        from_mlx(MLXPlanes(m.weight, bad, m.global_scale))
    with pytest.raises(PlaneError, match="MLX planes type"):
        from_mlx(p)  # type: ignore[arg-type]


def test_mlx_global_scale_arg_is_the_amax() -> None:
    # the anchors' worked example: amax 12 -> decode 12/2688 -> MLX global_scale 12 (1 ulp:
    # 12/2688 is not a float32)
    assert (
        ulp_distance(mlx_global_scale_arg(np.float32(12.0 / GLOBAL_AMAX_DIVISOR)), np.float32(12))
        <= 1
    )
    g = np.float32(0.001)
    assert mlx_global_scale_arg(g) == np.float32(g * np.float32(GLOBAL_AMAX_DIVISOR))
    assert mlx_global_scale_arg(g).dtype == np.float32


# ------------------------------------------------------------------------------ oracles
def mx_dequantize(mx: object, m: MLXPlanes, global_scale: np.ndarray | None = None) -> np.ndarray:
    kw = {} if global_scale is None else {"global_scale": mx.array(global_scale)}  # type: ignore[attr-defined]
    out = mx.dequantize(  # type: ignore[attr-defined]
        mx.array(m.weight),  # type: ignore[attr-defined]
        mx.array(m.scales),  # type: ignore[attr-defined]
        group_size=16,
        bits=4,
        mode="nvfp4",
        dtype=mx.float32,  # type: ignore[attr-defined]
        **kw,
    )
    return np.array(out)


@pytest.mark.parametrize("case", ["all_codes_all_scales", "random"])
def test_mlx_dequantize_without_global_equals_ours_exactly(case: str) -> None:
    mx = pytest.importorskip("mlx.core")
    if case == "random":
        p = random_planes(np.random.default_rng(6), (64, 256)).replace(global_scale=np.float32(1))
    else:
        p = every_code_every_scale()
    theirs = mx_dequantize(mx, to_mlx(p))
    ours = dequantize(p)
    assert theirs.dtype == np.float32
    assert theirs.shape == ours.shape
    assert np.array_equal(theirs, ours)
    assert np.array_equal(np.signbit(theirs), np.signbit(ours))  # -0.0 (code 8) too


def test_mlx_dequantize_with_global_scale_within_one_ulp(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """MLX decodes with global_scale / 2688; ours multiplies by the decode global. Both
    round in float32, so they may differ by an ulp: measure and bound it."""
    mx = pytest.importorskip("mlx.core")
    rng = np.random.default_rng(7)
    base = every_code_every_scale()
    worst, off, total = 0, 0, 0
    for g in np.exp2(rng.uniform(-14, 3, size=12)).astype(np.float32):
        p = base.replace(global_scale=g)
        theirs = mx_dequantize(mx, to_mlx(p), mlx_global_scale_arg(g))
        ours = dequantize(p)
        dist = ulp_distance(theirs, ours)
        worst = max(worst, int(dist.max()))
        off += int(np.count_nonzero(dist))
        total += dist.size
        assert np.array_equal(theirs == 0, ours == 0)
    with capsys.disabled():
        print(f"\n[mlx global_scale] {total} values: {off} differ by 1 ulp, max {worst} ulp")
    assert worst <= 1


def test_mlx_quantize_of_representable_data_round_trips_through_from_mlx() -> None:
    """Data that NVFP4 represents exactly (every block's amax is 6 * its scale), quantized
    by MLX without a global, comes back through from_mlx as the very same bytes. Code 8
    (-0.0) is excluded: MLX encodes -0.0 as code 0."""
    mx = pytest.importorskip("mlx.core")
    rng = np.random.default_rng(8)
    n, k = 127, 128
    elems = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    elems[elems == 8] = 0
    blocks = elems.reshape(n, k // 16, 16)
    blocks[..., rng.integers(0, 16)] = rng.choice([7, 15], size=(n, k // 16))  # |6| per block
    scales = rng.integers(1, 0x7F, size=(n, k // 16), dtype=np.uint8)
    scales[:, 0] = np.arange(n) % 0x7E + 1  # every valid nonzero scale byte 0x01..0x7E
    p = NVFP4Planes(pack_codes(elems), scales, np.asarray(1.0, np.float32))
    w = dequantize(p)
    wq, sq = mx.quantize(mx.array(w), group_size=16, bits=4, mode="nvfp4")
    back = from_mlx(MLXPlanes(np.array(wq), np.array(sq), np.asarray(1.0, np.float32)))
    assert np.array_equal(back.scales, p.scales)
    assert np.array_equal(back.codes, p.codes)


def test_mlx_quantized_matmul_with_sidecar_global_matches_reference() -> None:
    mx = pytest.importorskip("mlx.core")
    rng = np.random.default_rng(9)
    p = random_planes(rng, (24, 128)).replace(global_scale=np.float32(0.01))
    m = to_mlx(p)
    x = rng.standard_normal((5, 128)).astype(np.float32)
    y = mx.quantized_matmul(
        mx.array(x),
        mx.array(m.weight),
        mx.array(m.scales),
        transpose=True,
        group_size=16,
        bits=4,
        mode="nvfp4",
    )
    ours = np.array(y) * m.global_scale  # the sidecar global, applied after the matmul
    ref = qmm(x, p, out_dtype=None)
    assert relative_error(ours, ref) < 1e-5
