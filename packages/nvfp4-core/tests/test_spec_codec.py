"""T0 codec: the spec's E2M1 and E4M3 tables and roundings against ml_dtypes.

ml_dtypes implements ``float4_e2m1fn`` and ``float8_e4m3fn`` (the OCP formats) from their
bit layouts, independently of :mod:`nvfp4.spec`; every table entry and every rounding
boundary is checked against it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import numpy.typing as npt
from nvfp4.reference import e2m1_encode, pack_codes, unpack_codes
from nvfp4.spec import (
    E2M1_VALUES,
    E4M3_VALUES,
    e4m3_decode,
    e4m3_encode_exact,
    e4m3_round,
)

F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn


def _bits(a: npt.NDArray[np.float32]) -> npt.NDArray[np.uint32]:
    """float32 bit patterns (so -0.0 and 0.0 differ)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _e4m3_grid() -> npt.NDArray[np.float32]:
    """Every positive finite E4M3 value, increasing, decoded by ml_dtypes (bytes 0x01..0x7E)."""
    grid: npt.NDArray[np.float32] = np.arange(1, 0x7F, dtype=np.uint8).view(F8).astype(np.float32)
    return grid


def _with_ulps(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``x``, and the float32 neighbours one ulp below and above each value."""
    x = np.asarray(x, dtype=np.float32)
    down = np.nextafter(x, np.float32(-np.inf))
    up = np.nextafter(x, np.float32(np.inf))
    return np.concatenate([x, down, up]).astype(np.float32)


# ------------------------------------------------------------------------------- E2M1
def test_e2m1_table_matches_ml_dtypes_bit_for_bit() -> None:
    oracle = np.arange(16, dtype=np.uint8).view(F4).astype(np.float32)
    assert E2M1_VALUES.dtype == np.float32
    assert E2M1_VALUES.shape == (16,)
    np.testing.assert_array_equal(_bits(E2M1_VALUES), _bits(oracle))
    # code 8 is -0.0: the sign survives.
    assert np.signbit(E2M1_VALUES[8])
    assert E2M1_VALUES[8] == 0.0
    assert not np.signbit(E2M1_VALUES[0])


def _e2m1_oracle(q: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    codes = np.asarray(q, dtype=np.float32).astype(F4).view(np.uint8) & np.uint8(0x0F)
    return codes.astype(np.uint8)


def _e2m1_ties() -> npt.NDArray[np.float32]:
    """Midpoints of consecutive E2M1 magnitudes, derived from ml_dtypes' decoding."""
    mags: npt.NDArray[np.float32] = np.arange(8, dtype=np.uint8).view(F4).astype(np.float32)
    return ((mags[:-1] + mags[1:]) / np.float32(2)).astype(np.float32)


def test_e2m1_ties_are_the_seven_midpoints() -> None:
    np.testing.assert_array_equal(
        _e2m1_ties(), np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
    )


def test_e2m1_encode_matches_ml_dtypes_on_every_tie_and_neighbour() -> None:
    ties = _with_ulps(_e2m1_ties())
    q = np.concatenate([ties, -ties]).astype(np.float32)
    # ml_dtypes keeps the sign of a negative that rounds to zero (code 8): pass signbit.
    ours = e2m1_encode(q, np.signbit(q))
    np.testing.assert_array_equal(ours, _e2m1_oracle(q))
    # Round-half-to-even on the exact ties, spelled out.
    exact = e2m1_encode(_e2m1_ties(), np.zeros(7, dtype=bool))
    np.testing.assert_array_equal(exact, [0, 2, 2, 4, 4, 6, 6])


def test_e2m1_encode_matches_ml_dtypes_on_random_values() -> None:
    rng = np.random.default_rng(1)
    q = rng.uniform(-6.0, 6.0, size=200_000).astype(np.float32)
    q = np.concatenate([q, np.float32(6.0) * rng.random(1000, dtype=np.float32)]).astype(np.float32)
    q = np.concatenate([q, E2M1_VALUES, [6.0, -6.0]]).astype(np.float32)
    np.testing.assert_array_equal(e2m1_encode(q, np.signbit(q)), _e2m1_oracle(q))


def test_e2m1_encode_saturates_at_six() -> None:
    big = np.array(
        [np.nextafter(np.float32(6), np.float32(7)), 6.5, 7.0, 100.0, 3.0e38], dtype=np.float32
    )
    np.testing.assert_array_equal(e2m1_encode(big, np.zeros(big.shape, bool)), 7)
    np.testing.assert_array_equal(e2m1_encode(-big, np.ones(big.shape, bool)), 15)


def test_e2m1_encode_sign_comes_from_the_flag() -> None:
    # The encoder passes ``x < 0``: -0.0 gets code 0, a tiny negative gets code 8.
    q = np.array([-0.0, -0.1, -0.25, 0.0], dtype=np.float32)
    np.testing.assert_array_equal(e2m1_encode(q, q < 0), [0, 8, 8, 0])


# ------------------------------------------------------------------------------- E4M3
def test_e4m3_table_matches_ml_dtypes_for_all_256_bytes() -> None:
    oracle = np.arange(256, dtype=np.uint8).view(F8).astype(np.float32)
    assert E4M3_VALUES.dtype == np.float32
    assert E4M3_VALUES.shape == (256,)
    nan_ours, nan_oracle = np.isnan(E4M3_VALUES), np.isnan(oracle)
    np.testing.assert_array_equal(nan_ours, nan_oracle)
    np.testing.assert_array_equal(np.flatnonzero(nan_ours), [0x7F, 0xFF])
    np.testing.assert_array_equal(_bits(E4M3_VALUES[~nan_ours]), _bits(oracle[~nan_oracle]))
    assert E4M3_VALUES[0x7E] == 448.0
    assert E4M3_VALUES[0x01] == 2.0**-9


def test_e4m3_decode_uses_the_table() -> None:
    b = np.arange(256, dtype=np.uint8).reshape(16, 16)
    oracle = b.view(F8).astype(np.float32)
    got = e4m3_decode(b)
    assert got.shape == (16, 16)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, oracle)  # NaN == NaN for assert_array_equal


def test_e4m3_encode_exact_inverts_every_valid_byte() -> None:
    grid = np.arange(0x7F, dtype=np.uint8)
    values = grid.view(F8).astype(np.float32)
    np.testing.assert_array_equal(e4m3_encode_exact(values), grid)
    np.testing.assert_array_equal(values.astype(F8).view(np.uint8), grid)


def _e4m3_oracle(s: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    rounded: npt.NDArray[np.float32] = np.asarray(s, dtype=np.float32).astype(F8).astype(np.float32)
    return rounded


def test_e4m3_round_on_every_midpoint_and_neighbour() -> None:
    grid = _e4m3_grid()
    mids = ((grid[:-1] + grid[1:]) / np.float32(2)).astype(np.float32)
    # every midpoint is exact in float32 (E4M3 has 4 significant bits)
    np.testing.assert_array_equal(mids.astype(np.float64), (grid[:-1] + grid[1:]) / 2.0)
    s = np.concatenate([_with_ulps(mids), _with_ulps(grid)]).astype(np.float32)
    s = s[(s >= np.float32(2.0**-9)) & (s <= np.float32(448.0))]
    assert s.size > 3 * 125 + 2 * 126
    got = e4m3_round(s)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(_bits(got), _bits(_e4m3_oracle(s)))
    # On the exact midpoints, ties go to the even byte.
    np.testing.assert_array_equal(e4m3_encode_exact(e4m3_round(mids)) % 2, 0)


def test_e4m3_round_on_a_million_random_scales() -> None:
    rng = np.random.default_rng(2)
    lo = int(np.float32(2.0**-9).view(np.uint32))
    hi = int(np.float32(448.0).view(np.uint32))
    # half uniform over float32 bit patterns (log-uniform-ish), half uniform in value
    bits = rng.integers(lo, hi + 1, size=500_000, dtype=np.uint32)
    uni = rng.uniform(2.0**-9, 448.0, size=500_000).astype(np.float32)
    s = np.concatenate([bits.view(np.float32), uni]).astype(np.float32)
    assert s.min() >= 2.0**-9
    assert s.max() <= 448.0
    np.testing.assert_array_equal(_bits(e4m3_round(s)), _bits(_e4m3_oracle(s)))


# ------------------------------------------------------------------------------- pack
def test_pack_unpack_round_trip() -> None:
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, size=(3, 5, 64), dtype=np.uint8)
    packed = pack_codes(codes)
    assert packed.dtype == np.uint8
    assert packed.shape == (3, 5, 32)
    np.testing.assert_array_equal(unpack_codes(packed), codes)
    every_byte = np.arange(256, dtype=np.uint8).reshape(8, 32)
    np.testing.assert_array_equal(pack_codes(unpack_codes(every_byte)), every_byte)


def test_nibble_order_low_nibble_is_element_2j() -> None:
    codes = np.array([[0x1, 0x2, 0xF, 0x0, 0x8, 0x7]], dtype=np.uint8)
    np.testing.assert_array_equal(pack_codes(codes), [[0x21, 0x0F, 0x78]])
    b = np.arange(256, dtype=np.uint8)[None, :]
    un = unpack_codes(b)
    np.testing.assert_array_equal(un[0, 0::2], b[0] & 0x0F)
    np.testing.assert_array_equal(un[0, 1::2], b[0] >> 4)
