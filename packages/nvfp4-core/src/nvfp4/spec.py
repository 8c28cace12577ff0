"""NVFP4 spec 1.0 in code.

This module is the single source of truth for every number and table that
``spec/1.0/nvfp4.md`` defines. Other modules (the reference, the layouts, the
backends) import from here; nothing else restates a constant. A test
(``tests/test_spec_drift.py``) keeps this module, the prose and
``spec/1.0/tolerances.toml`` from drifting apart.

Contents:

* versioning: :data:`SPEC_VERSION`, :data:`SUPPORTED_SPEC_VERSIONS`, :func:`require_spec`;
* the element format E2M1: :data:`E2M1_VALUES` (all 16 codes), :data:`E2M1_BOUNDS`;
* the block-scale format FP8 E4M3: :data:`E4M3_VALUES` (all 256 bytes),
  :func:`e4m3_decode`, :func:`e4m3_round`, :func:`e4m3_encode_exact`;
* the constants of the reference encoder and of the layouts;
* the 128x4 scale swizzle formula :func:`swizzle_128x4_offset`.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "BLOCK_SIZE",
    "E2M1_BOUNDS",
    "E2M1_MAX",
    "E2M1_ODD_BOUNDS",
    "E2M1_VALUES",
    "E4M3_INVALID_BYTES",
    "E4M3_MAX",
    "E4M3_MIN_SUBNORMAL",
    "E4M3_VALUES",
    "GGUF_BLOCK_BYTES",
    "GGUF_SUPER_BLOCK",
    "GGUF_TYPE_NVFP4",
    "GLOBAL_AMAX_DIVISOR",
    "SPEC_VERSION",
    "SUPPORTED_SPEC_VERSIONS",
    "SWIZZLE_COL_TILE",
    "SWIZZLE_ROW_TILE",
    "SpecVersionError",
    "e4m3_decode",
    "e4m3_encode_exact",
    "e4m3_round",
    "require_spec",
    "swizzle_128x4_offset",
    "swizzled_scale_shape",
]

# --------------------------------------------------------------------------------------
# Versioning
# --------------------------------------------------------------------------------------

#: The newest spec version this package implements.
SPEC_VERSION: Final = "1.0"
#: Every spec version this package implements (an engine pinned to 1.0 keeps working
#: after 1.1 ships, as long as 1.0 stays in this tuple).
SUPPORTED_SPEC_VERSIONS: Final = ("1.0",)


class SpecVersionError(RuntimeError):
    """Raised by :func:`require_spec` when a requested spec version is not implemented."""


def require_spec(version: str) -> str:
    """Pin an NVFP4 spec version at run time.

    Engines call ``nvfp4.require_spec("1.0")`` once at start-up. It returns the version
    when this installation implements it and raises :class:`SpecVersionError` naming the
    supported versions otherwise.
    """
    if not isinstance(version, str):
        raise SpecVersionError(
            f"spec version must be a string like '1.0', found {version!r}; "
            f"supported: {', '.join(SUPPORTED_SPEC_VERSIONS)}"
        )
    if version not in SUPPORTED_SPEC_VERSIONS:
        raise SpecVersionError(
            f"NVFP4 spec {version!r} is not implemented by this nvfp4-core; "
            f"supported: {', '.join(SUPPORTED_SPEC_VERSIONS)}. "
            "Install an nvfp4-core release that implements it."
        )
    return version


# --------------------------------------------------------------------------------------
# Block structure
# --------------------------------------------------------------------------------------

#: Elements per block along K (the contraction axis); one E4M3 scale byte per block.
BLOCK_SIZE: Final = 16

# --------------------------------------------------------------------------------------
# E2M1 (the 4-bit element)
# --------------------------------------------------------------------------------------

#: Value of each of the 16 E2M1 codes. Bit 3 is the sign; bits 0-2 index the magnitudes
#: 0, 0.5, 1, 1.5, 2, 3, 4, 6. Code 8 is -0.0.
E2M1_VALUES: Final[npt.NDArray[np.float32]] = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)
E2M1_VALUES.setflags(write=False)
#: Largest E2M1 magnitude.
E2M1_MAX: Final = 6.0
#: Midpoints between consecutive E2M1 magnitudes. A magnitude strictly between two bounds
#: rounds to the nearer value; a magnitude equal to a bound is a tie.
E2M1_BOUNDS: Final[npt.NDArray[np.float32]] = np.array(
    [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32
)
E2M1_BOUNDS.setflags(write=False)
#: The ties whose even neighbour is the upper one (0.75 -> 1, 1.75 -> 2, 3.5 -> 4). At the
#: other bounds (0.25, 1.25, 2.5, 5) round-to-nearest-even goes down.
E2M1_ODD_BOUNDS: Final[npt.NDArray[np.float32]] = np.array([0.75, 1.75, 3.5], dtype=np.float32)
E2M1_ODD_BOUNDS.setflags(write=False)

# --------------------------------------------------------------------------------------
# FP8 E4M3 (the block scale)
# --------------------------------------------------------------------------------------

#: Largest finite E4M3 value (byte 0x7E).
E4M3_MAX: Final = 448.0
#: Smallest positive E4M3 value (byte 0x01, a subnormal): 2^-9.
E4M3_MIN_SUBNORMAL: Final = 2.0**-9
#: Scale bytes a conforming plane never holds: every byte with bit 7 set (negative scales
#: and 0xFF) and 0x7F (NaN). Content validation refuses them.
E4M3_INVALID_BYTES: Final = frozenset([0x7F, *range(0x80, 0x100)])


def _build_e4m3_table() -> npt.NDArray[np.float32]:
    """Decode all 256 E4M3 bytes (bias 7, 3 mantissa bits, no infinities, 0x7F/0xFF NaN)."""
    b = np.arange(256, dtype=np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exponent = (b >> 3) & 0xF
    mantissa = b & 0x7
    # exponent 0: subnormal, value = mantissa * 2^-9 (= mantissa/8 * 2^(1-7))
    # otherwise: normal, value = (1 + mantissa/8) * 2^(exponent-7)
    value = np.where(
        exponent == 0,
        mantissa * 2.0**-9,
        (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0),
    )
    value = sign * value
    value[(b & 0x7F) == 0x7F] = np.nan
    return value.astype(np.float32)


#: Value of each of the 256 E4M3 bytes. Bytes 0x00..0x7E are the valid scales, increasing.
E4M3_VALUES: Final[npt.NDArray[np.float32]] = _build_e4m3_table()
E4M3_VALUES.setflags(write=False)


def e4m3_decode(scale_bytes: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Decode E4M3 scale bytes (any shape, uint8) to float32 through :data:`E4M3_VALUES`."""
    return E4M3_VALUES[np.asarray(scale_bytes, dtype=np.uint8)]


def e4m3_round(s: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Round positive float32 values in ``[2^-9, 448]`` to E4M3, nearest, ties to even.

    The caller clamps first (the reference encoder does). Within one binade the E4M3
    grid is uniform with step ``2^(e-3)`` (``e`` = the binade's exponent, at least -6
    because of the subnormals), so ``rint(s / step) * step`` rounds exactly: both the
    division and the multiplication are by a power of two, and ``rint`` rounds half to
    even. A value that rounds up to the next binade lands on a representable value too.
    """
    s = np.asarray(s, dtype=np.float32)
    _, exp = np.frexp(s)  # s = m * 2^exp with m in [0.5, 1): the binade exponent is exp - 1
    step = np.ldexp(np.float32(1.0), np.maximum(exp - 1, -6) - 3).astype(np.float32)
    rounded: npt.NDArray[np.float32] = (np.rint(s / step) * step).astype(np.float32)
    return rounded


def e4m3_encode_exact(values: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """Byte of non-negative values that are exactly representable in E4M3 (after
    :func:`e4m3_round`). Positive bytes 0x00..0x7E are monotonic in value, so a binary
    search over the table finds them."""
    positive = E4M3_VALUES[:0x7F]
    idx = np.searchsorted(positive, np.asarray(values, dtype=np.float32))
    return idx.astype(np.uint8)


# --------------------------------------------------------------------------------------
# The reference encoder
# --------------------------------------------------------------------------------------

#: ``global = amax / GLOBAL_AMAX_DIVISOR`` (= E2M1_MAX * E4M3_MAX = 6 * 448). The stored
#: global is the DECODE multiplier (ModelOpt's ``weight_scale_2``).
GLOBAL_AMAX_DIVISOR: Final = E2M1_MAX * E4M3_MAX

# --------------------------------------------------------------------------------------
# Layout constants
# --------------------------------------------------------------------------------------

#: ggml type id of NVFP4.
GGUF_TYPE_NVFP4: Final = 40
#: Elements per GGUF NVFP4 super-block (K must be a multiple of it).
GGUF_SUPER_BLOCK: Final = 64
#: Bytes per GGUF NVFP4 super-block: 4 scale bytes then 32 bytes of nibbles.
GGUF_BLOCK_BYTES: Final = 36

#: The 128x4 swizzle tiles rows by 128 and scale columns (K/16) by 4.
SWIZZLE_ROW_TILE: Final = 128
SWIZZLE_COL_TILE: Final = 4


def swizzled_scale_shape(n: int, k_blocks: int) -> tuple[int, int]:
    """Padded (rows, scale columns) of the 128x4 swizzled scale buffer."""
    rows = -(-n // SWIZZLE_ROW_TILE) * SWIZZLE_ROW_TILE
    cols = -(-k_blocks // SWIZZLE_COL_TILE) * SWIZZLE_COL_TILE
    return rows, cols


def swizzle_128x4_offset(
    n: npt.NDArray[np.int64], k: npt.NDArray[np.int64], k_blocks: int
) -> npt.NDArray[np.int64]:
    """Byte offset of scale ``[n, k]`` (row ``n``, scale column ``k``) in the 128x4 layout.

    The buffer is a grid of 512-byte tiles, each covering 128 rows x 4 scale columns,
    tiles ordered row-tile-major. Inside a tile, row ``n`` sits at ``(n % 32) * 16 +
    ((n % 128) // 32) * 4`` and column ``k`` adds ``k % 4``:

        ((n // 128) * ceil(k_blocks / 4) + k // 4) * 512
        + (n % 32) * 16 + ((n % 128) // 32) * 4 + k % 4

    This is the layout of cuBLASLt's block-scaling factors, CUTLASS SM100/SM120,
    FlashInfer ``layout_128x4`` and torch's ``SWIZZLE_32_4_4``.
    """
    n = np.asarray(n, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    col_tiles = -(-k_blocks // SWIZZLE_COL_TILE)
    tile = (n // SWIZZLE_ROW_TILE) * col_tiles + k // SWIZZLE_COL_TILE
    return tile * 512 + (n % 32) * 16 + ((n % SWIZZLE_ROW_TILE) // 32) * 4 + k % SWIZZLE_COL_TILE
