"""The jit codecs against nvfp4.spec / nvfp4.reference: every code, every byte, every
rounding boundary."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from nvfp4 import reference, spec
from nvfp4_triton.codec import (
    E2M1_UNSCALE,
    clamp_scale,
    e2m1_code_scaled,
    e2m1_rne_index,
    e2m1_to_f32,
    e4m3_rne,
    e4m3_to_f32,
    e4m3_valid_to_f32,
    round_out,
)
from triton_helpers import bits


@triton.jit
def _decode_all(byte_ptr, e2m1_ptr, e4m3_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    b = tl.load(byte_ptr + i).to(tl.int32)
    tl.store(e2m1_ptr + i, e2m1_to_f32(b & 15))
    tl.store(e4m3_ptr + i, e4m3_to_f32(b))


@triton.jit
def _decode_words(word_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    word = tl.load(word_ptr + i)
    for r in tl.static_range(8):
        tl.store(out_ptr + 8 * i + r, e2m1_code_scaled(word, r))


@triton.jit
def _decode_valid(byte_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, e4m3_valid_to_f32(tl.load(byte_ptr + i).to(tl.int32)))


@triton.jit
def _encode(s_ptr, byte_ptr, value_ptr, index_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    s = tl.load(s_ptr + i)
    byte, value = e4m3_rne(clamp_scale(s))
    tl.store(byte_ptr + i, byte)
    tl.store(value_ptr + i, value)
    tl.store(index_ptr + i, e2m1_rne_index(tl.abs(s)))


@triton.jit
def _round(x_ptr, bf16_ptr, f16_ptr, f32_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    tl.store(bf16_ptr + i, round_out(x, bf16_ptr.dtype.element_ty))
    tl.store(f16_ptr + i, round_out(x, f16_ptr.dtype.element_ty))
    tl.store(f32_ptr + i, round_out(x, f32_ptr.dtype.element_ty))


def _pad_pow2(a: np.ndarray, fill: float) -> np.ndarray:
    n = 1 << int(np.ceil(np.log2(max(len(a), 2))))
    out = np.full(n, fill, dtype=np.float32)
    out[: len(a)] = a
    return out


def test_decoders_every_code_and_byte() -> None:
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    e2m1, e4m3 = torch.empty(256), torch.empty(256)
    _decode_all[(1,)](b, e2m1, e4m3, 256)
    want = spec.E2M1_VALUES[np.arange(256) & 15]
    np.testing.assert_array_equal(bits(e2m1.numpy()), bits(want))  # -0.0 for code 8 too
    got = e4m3.numpy()
    nan = np.isnan(spec.E4M3_VALUES)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(bits(got[~nan]), bits(spec.E4M3_VALUES[~nan]))


def test_word_decoder_every_byte_in_every_position() -> None:
    """The word decoder of the streaming kernels: every byte value in each of the 4 byte
    positions of a little-endian int32 word (the other bytes random), all 8 codes bit for
    bit the spec's values times 2^-14 (signs and -0.0 included), in element order."""
    rng = np.random.default_rng(11)
    raw = rng.integers(0, 256, (4, 256, 4), dtype=np.uint8)  # [position, value, byte]
    for pos in range(4):
        raw[pos, :, pos] = np.arange(256)
    raw = raw.reshape(-1, 4)
    words = torch.from_numpy(raw.copy().view("<i4").reshape(-1))
    out = torch.empty(words.numel() * 8)
    _decode_words[(1,)](words, out, words.numel())
    assert E2M1_UNSCALE.value == 2.0**14
    codes = np.stack([raw & 15, raw >> 4], axis=-1).reshape(-1)  # element order
    scaled = (spec.E2M1_VALUES.astype(np.float32) * np.float32(2.0**-14)).astype(np.float32)
    np.testing.assert_array_equal(bits(out.numpy()), bits(scaled[codes]))
    restored = out.numpy() * np.float32(E2M1_UNSCALE.value)
    np.testing.assert_array_equal(bits(restored), bits(spec.E2M1_VALUES[codes]))


def test_valid_scale_decoder_every_valid_byte() -> None:
    """The float16-bits decoder of the inner loops, on all 127 valid bytes (subnormals
    included) plus one padding byte."""
    b = torch.arange(128, dtype=torch.int32).to(torch.uint8)
    out = torch.empty(128)
    _decode_valid[(1,)](b, out, 128)
    np.testing.assert_array_equal(bits(out.numpy()[:0x7F]), bits(spec.E4M3_VALUES[:0x7F]))


def _scale_candidates() -> np.ndarray:
    """Every E4M3 value, every midpoint between neighbours, one ulp either side of both,
    the clamp edges beyond the range, and random values over the whole range."""
    v = spec.E4M3_VALUES[1:0x7F].astype(np.float32)
    mid = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)
    parts = [v, mid]
    for a in (v, mid):
        parts += [np.nextafter(a, np.float32(0)), np.nextafter(a, np.float32(1e4))]
    parts.append(np.array([0.0, 1e-30, 2.0**-10, 500.0, 1e30], np.float32))
    rng = np.random.default_rng(7)
    parts.append(np.exp2(rng.uniform(-10, 9.5, 20000)).astype(np.float32))
    return np.concatenate(parts).astype(np.float32)


def _run_encode(v: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_encode`` on ``v`` (a power-of-two length): the E4M3 byte and value of each
    element taken as a scale, and its E2M1 index taken as a scaled value."""
    n = len(v)
    byte, value, idx = (
        torch.empty(n, dtype=torch.int32),
        torch.empty(n),
        torch.empty(n, dtype=torch.int32),
    )
    _encode[(1,)](torch.from_numpy(v), byte, value, idx, n)
    return byte, value, idx


def test_e4m3_rne_matches_spec_at_every_boundary() -> None:
    s = _pad_pow2(_scale_candidates(), 1.0)
    byte, value, _ = _run_encode(s)
    clamped = np.clip(s, np.float32(spec.E4M3_MIN_SUBNORMAL), np.float32(spec.E4M3_MAX))
    want_v = spec.e4m3_round(clamped)
    want_b = spec.e4m3_encode_exact(want_v).astype(np.int32)
    bad = np.flatnonzero(value.numpy() != want_v)
    assert bad.size == 0, f"{bad.size} values differ, first s={s[bad[0]]!r}"
    np.testing.assert_array_equal(byte.numpy(), want_b)
    assert spec.E4M3_VALUES[byte.numpy()].tobytes() == value.numpy().tobytes()


def test_e2m1_rne_index_matches_reference() -> None:
    b = spec.E2M1_BOUNDS
    rng = np.random.default_rng(3)
    q = np.concatenate(
        [
            b,
            np.nextafter(b, np.float32(0)),
            np.nextafter(b, np.float32(9)),
            spec.E2M1_VALUES,
            [0.0, 5.999, 6.0, 7.0, 1e30, np.inf, np.nan],
            rng.uniform(0, 8, 4000),
        ]
    ).astype(np.float32)
    q = _pad_pow2(q, 0.0)
    _, _, idx = _run_encode(q)
    want = reference.e2m1_encode(np.abs(q), np.zeros(len(q), bool)).astype(np.int32)
    np.testing.assert_array_equal(idx.numpy(), want)


def test_round_out_is_round_to_nearest_even() -> None:
    """bfloat16 (rounded on the bits by round_out) and float16 (Triton's cast), including
    exact ties, subnormals, overflow to inf and NaN, against ml_dtypes / numpy."""
    rng = np.random.default_rng(5)
    with np.errstate(over="ignore"):
        x = rng.standard_normal(30000).astype(np.float32) * np.exp2(
            rng.integers(-140, 128, 30000)
        ).astype(np.float32)
    u = rng.integers(0, 1 << 16, 2000, dtype=np.uint32)
    ties = ((u << 16) | 0x8000).view(np.float32)  # exactly half-way between two bfloat16
    ties = ties[np.isfinite(ties)]
    f16_ties = (np.arange(1, 2000, dtype=np.float32) * 2.0**-11 + 1.0) + 2.0**-12
    extra = np.array(
        [0.0, -0.0, 65504.0, 65520.0, 1e38, -3.4e38, np.inf, -np.inf, 1e-45], np.float32
    )
    x = np.concatenate([x, ties, f16_ties.astype(np.float32), extra])
    x = _pad_pow2(x, 0.0)
    n = len(x)
    bf16 = torch.empty(n, dtype=torch.bfloat16)
    f16 = torch.empty(n, dtype=torch.float16)
    f32 = torch.empty(n)
    with np.errstate(over="ignore"):
        _round[(1,)](torch.from_numpy(x), bf16, f16, f32, n)
        want_bf16 = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        want_f16 = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(bf16.view(torch.int16).numpy().view(np.uint16), want_bf16)
    np.testing.assert_array_equal(f16.numpy().view(np.uint16), want_f16)
    np.testing.assert_array_equal(bits(f32.numpy()), bits(x))


@pytest.mark.parametrize("value", [float("nan")])
def test_round_out_keeps_nan(value: float) -> None:
    x = np.full(16, value, np.float32)
    bf16, f16, f32 = (
        torch.empty(16, dtype=torch.bfloat16),
        torch.empty(16, dtype=torch.float16),
        torch.empty(16),
    )
    _round[(1,)](torch.from_numpy(x), bf16, f16, f32, 16)
    assert torch.isnan(bf16.float()).all()
    assert torch.isnan(f16.float()).all()
