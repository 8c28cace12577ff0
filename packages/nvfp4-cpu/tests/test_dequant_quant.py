"""Exact dequantize, bit-exact activation quantization, and W4A4, against nvfp4.reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import nvfp4
import pytest
from cpu_helpers import check_close
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from nvfp4 import reference
from nvfp4.spec import E2M1_BOUNDS, E2M1_VALUES, E4M3_VALUES
from nvfp4_cpu import CPUBackend
from nvfp4_cpu._native import load
from nvfp4_cpu.ops import quantize_activations

DTYPES = ("float32", "float16", "bfloat16")


def _all_bytes_planes(n: int, global_scale: float, experts: int | None = None) -> nvfp4.NVFP4Planes:
    """Every code byte and every valid scale byte (0x00..0x7E, subnormals included)."""
    k = 16 * 127
    rows = np.arange(n)[:, None]
    codes = ((np.arange(k // 2)[None, :] + 37 * rows) % 256).astype(np.uint8)
    scales = ((np.arange(127)[None, :] + 5 * rows) % 127).astype(np.uint8)
    g = np.float32(global_scale)
    if experts is not None:
        codes = np.stack([np.roll(codes, e, axis=0) for e in range(experts)])
        scales = np.stack([np.roll(scales, e, axis=1) for e in range(experts)])
        g = (np.float32(global_scale) * np.arange(1, experts + 1)).astype(np.float32)
    return nvfp4.NVFP4Planes(codes, scales, g, name="all-bytes")


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype
    assert a.shape == b.shape
    view = np.uint32 if a.dtype == np.float32 else np.uint16
    np.testing.assert_array_equal(a.view(view), b.view(view))


@pytest.mark.parametrize("dtype", DTYPES)
# 1e-30: float32 subnormal results; 1e4 and 3e34: float16 overflow to inf, bfloat16 large
@pytest.mark.parametrize("g", [1.0, 0.3, 1e-30, 1e-6, 1e4, 3e34])
def test_dequantize_is_bit_exact(isa: str, dtype: str, g: float) -> None:
    p = _all_bytes_planes(19, g)  # 19 rows: one full tile and a ragged one
    b = CPUBackend(isa=isa, threads=2)
    _same_bits(b.dequantize(b.prepare(p), dtype), reference.dequantize(p, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_experts_and_partitions(isa: str, dtype: str) -> None:
    b = CPUBackend(isa=isa, threads=2)
    p = _all_bytes_planes(5, 0.01, experts=3)
    _same_bits(b.dequantize(b.prepare(p), dtype), reference.dequantize(p, dtype))
    rng = np.random.default_rng(1)
    q = nvfp4.quantize(rng.standard_normal((2, 40, 64)).astype(np.float32), partitions=(0, 16, 40))
    _same_bits(b.dequantize(q, dtype), reference.dequantize(q, dtype))
    with pytest.raises(ValueError, match="output dtype"):
        b.dequantize(q, "int8")


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_threads_agree(isa: str, dtype: str) -> None:
    """300 x 2048: both threads get tiles; the bytes are the reference's either way."""
    rng = np.random.default_rng(6)
    p = nvfp4.quantize(rng.standard_normal((300, 2048)).astype(np.float32))
    ref = reference.dequantize(p, dtype)
    for threads in (1, 2, 3):
        _same_bits(CPUBackend(isa=isa, threads=threads).dequantize(p, dtype), ref)


def test_float16_rounding_matches_numpy_on_every_exponent(isa: str) -> None:
    """The portable float16 converter (and vcvtps2ph) against numpy on values around every
    float16 binade, ties included: all products e2m1*e4m3 times globals 2^-30 .. 2^20."""
    b = CPUBackend(isa=isa)
    p = _all_bytes_planes(16, 1.0)
    pw = b.prepare(p)
    exact = reference.dequantize(p, "float32")
    for e in range(-30, 21, 3):
        for frac in (1.0, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-12, 1.5):  # ties and near-ties
            g = np.float32(2.0**e * frac)
            q = p.replace(global_scale=g)
            got = b.dequantize(b.prepare(q), "float16")
            with np.errstate(over="ignore"):  # large globals overflow float16 to inf, as intended
                want = (exact * g).astype(np.float16)
            _same_bits(got, want)
    assert pw.n == 16


# ------------------------------------------------------------------ activations (W4A4)


def _quant_equal(x: np.ndarray, input_scale: object = None) -> None:
    ref = reference.quantize_activations(x, input_scale)
    got = CPUBackend().quantize_activations(x, input_scale)
    np.testing.assert_array_equal(got.codes, ref.codes)
    np.testing.assert_array_equal(got.scales, ref.scales)
    np.testing.assert_array_equal(got.global_scale, ref.global_scale)
    assert got.global_scale.dtype == np.float32
    assert got.global_scale.shape == ()


def test_quantize_activations_random_and_scaled() -> None:
    rng = np.random.default_rng(0)
    for scale in (1e-30, 1e-6, 1.0, 1e3, 1e30):
        x = (rng.standard_normal((9, 256)) * scale).astype(np.float32)
        x[:, 16:32] *= 1e-4  # blocks far below the tensor's amax (subnormal E4M3 scales)
        _quant_equal(x)
        _quant_equal(x, np.float32(scale / 1000))


def test_quantize_activations_ties_zeros_and_signs() -> None:
    """Values exactly on every E2M1 rounding boundary (and just off it), zeros, -0.0,
    small negatives that round to zero (code 8), blocks of zeros (scale 1.0)."""
    g = np.float32(1.0)
    sr = np.float32(1.0)  # amax 6 -> s = 6 / (6 * 1) = 1 -> e4m3(1) = 1: q = x exactly
    bounds = np.asarray(E2M1_BOUNDS, np.float32)
    vals = np.concatenate(
        [bounds, np.nextafter(bounds, 0), np.nextafter(bounds, 10), -bounds, E2M1_VALUES]
    ).astype(np.float32)
    vals = np.concatenate([vals, np.float32([-0.0, 0.0, -0.1, -1e-30, 6.0])])
    pad = (-vals.size) % 15
    vals = np.concatenate([vals, np.zeros(pad, np.float32)]).reshape(-1, 15)
    blocks = np.concatenate([vals, np.full((vals.shape[0], 1), 6.0, np.float32)], axis=1)  # amax 6
    x = np.concatenate([blocks.reshape(1, -1), np.zeros((1, blocks.size), np.float32)])
    assert sr == 1.0
    _quant_equal(x, g)
    _quant_equal(x)  # dynamic global: amax 6 -> 6/2688


def test_quantize_activations_nonfinite_blocks_and_extreme_globals() -> None:
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 40] = np.inf
    x[2, 63] = -np.inf
    _quant_equal(x)
    _quant_equal(x, 0.05)
    # a global so small that e4m3(s) * g underflows to 0: q = x / 0 (inf, or NaN for x = 0)
    _quant_equal(np.float32([[0.0, 1.0, -1.0, 0.0] * 4]), np.float32(1e-45))
    _quant_equal(np.float32([[1.0] * 16]), np.float32(3e38))  # 6 * g overflows to inf
    _quant_equal(np.zeros((2, 16), np.float32))  # all zero: dynamic global 1.0
    # amax / 2688 == 0 in float32 (amax <= 1344 * 2^-149): global 1.0, as the reference
    tiny = np.float32(2.0**-149)
    _quant_equal(np.full((1, 16), 1344 * tiny, np.float32))
    assert CPUBackend().quantize_activations(np.full((1, 16), 1344 * tiny)).global_scale == 1.0
    _quant_equal(np.full((1, 16), 1345 * tiny, np.float32))  # global 2^-149


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_quantize_activations_input_dtypes(dtype: type) -> None:
    x = np.random.default_rng(3).standard_normal((4, 48)).astype(dtype)
    _quant_equal(x)


_floats = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@settings(max_examples=150, deadline=None)
@given(
    x=hnp.arrays(
        np.float32, st.tuples(st.integers(1, 4), st.sampled_from([16, 32, 64])), elements=_floats
    ),
    static=st.one_of(
        st.none(), st.floats(float(np.float32(1e-38)), float(np.float32(1e38)), width=32)
    ),
)
def test_quantize_activations_property(x: np.ndarray, static: float | None) -> None:
    _quant_equal(x, None if static is None else np.float32(static))


def test_quantize_activations_threads_and_refusals() -> None:
    native = load()
    # 300 x 1024: enough work for the kernel to use both threads (tiny work stays on one)
    x = np.random.default_rng(4).standard_normal((300, 1024)).astype(np.float32)
    one, two = (quantize_activations(native, t, x) for t in (1, 2))
    _quant_equal(x)
    np.testing.assert_array_equal(one.codes, two.codes)
    np.testing.assert_array_equal(one.scales, two.scales)
    b = CPUBackend()
    with pytest.raises(ValueError, match="K must be a positive multiple of 16"):
        b.quantize_activations(np.ones((2, 24), np.float32))
    with pytest.raises(ValueError, match=r"x must be \[M, K\]"):
        b.quantize_activations(np.ones(32, np.float32))
    with pytest.raises(ValueError, match="input_scale must be finite and > 0"):
        b.quantize_activations(np.ones((2, 32), np.float32), 0.0)
    with pytest.raises(ValueError, match="at least one row"):
        b.quantize_activations(np.ones((0, 32), np.float32))


@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 16), (3, 33, 48), (33, 100, 4096), (300, 1, 64)])
def test_qmm_w4a4_matches_reference(isa: str, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m + n + k)
    p = nvfp4.quantize(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = CPUBackend(isa=isa, threads=2)
    pw = b.prepare(p)
    for scale in (None, np.float32(0.002)):
        y = b.qmm_w4a4(x, pw, input_scale=scale)
        ref = reference.qmm_w4a4(x, p, input_scale=scale, out_dtype=None)
        check_close("w4a4", "float32", y, ref, f"{isa} {m}x{n}x{k} {scale}")
    y16 = b.qmm_w4a4(x.astype(np.float16), pw)
    assert y16.dtype == np.float16
    ref16 = reference.qmm_w4a4(x.astype(np.float16), p, out_dtype=np.float16)
    check_close("w4a4", "float16", y16, ref16, isa)


def test_qmm_w4a4_nonfinite_rows_and_refusals(isa: str) -> None:
    rng = np.random.default_rng(5)
    p = nvfp4.quantize(rng.standard_normal((7, 32)).astype(np.float32))
    x = rng.standard_normal((3, 32)).astype(np.float32)
    x[1, 2] = np.inf
    b = CPUBackend(isa=isa)
    y = b.qmm_w4a4(x, p)
    ref = reference.qmm_w4a4(x, p, out_dtype=None)
    np.testing.assert_array_equal(np.isfinite(y), np.isfinite(ref))
    assert not np.isfinite(y[1]).any()
    assert np.isfinite(y[[0, 2]]).all()
    moe = nvfp4.quantize(np.ones((2, 7, 32), np.float32))
    with pytest.raises(ValueError, match="expert-stacked"):
        b.qmm_w4a4(x, moe)


def test_e4m3_decode_of_every_valid_byte_in_every_level(isa: str) -> None:
    """One row per scale byte, all codes 1.0: the decoded block value is the table entry."""
    scales = np.arange(127, dtype=np.uint8)[:, None]
    codes = np.full((127, 8), 0x22, np.uint8)  # code 2 = 1.0 in both nibbles
    p = nvfp4.NVFP4Planes(codes, scales, np.float32(1.0))
    got = CPUBackend(isa=isa).dequantize(p)
    np.testing.assert_array_equal(got, np.repeat(E4M3_VALUES[:127, None], 16, axis=1))
