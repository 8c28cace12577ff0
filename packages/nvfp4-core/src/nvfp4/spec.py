"""The NVFP4 spec in code, one table per released version.

This module is the single source of truth for every number and table that
``spec/<version>/nvfp4.md`` defines. :func:`for_version` returns a released version's
:class:`SpecTables` (immutable); the module-level names (:data:`E2M1_VALUES`,
:data:`BLOCK_SIZE`, ...) are the newest version's values, read from that table, never
restated. Other modules (the reference, the layouts, the backends) import from here;
nothing else restates a constant. A test (``tests/test_spec_drift.py``) keeps every
released folder under ``spec/`` and its table here from drifting apart.

Contents:

* versioning: :data:`SPEC_VERSION`, :data:`SUPPORTED_SPEC_VERSIONS`, :func:`require_spec`,
  :func:`for_version`, :class:`SpecTables`;
* the element format E2M1: :data:`E2M1_VALUES` (all 16 codes), :data:`E2M1_BOUNDS`;
* the block-scale format FP8 E4M3: :data:`E4M3_VALUES` (all 256 bytes),
  :func:`e4m3_decode`, :func:`e4m3_round`, :func:`e4m3_encode_exact`, :func:`e4m3_encode`
  (clamp, round, byte), :data:`E4M3_NAN_BYTE`;
* the reference encoder's block-scale step :func:`block_scale_encode`;
* the constants of the reference encoder and of the layouts;
* the 128x4 scale swizzle formula :func:`swizzle_128x4_offset` and its band
  :func:`swizzle_128x4_band`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "BLOCK_SIZE",
    "E2M1_BOUNDS",
    "E2M1_MAX",
    "E2M1_ODD_BOUNDS",
    "E2M1_VALUES",
    "E4M3_BIAS",
    "E4M3_INVALID_BYTES",
    "E4M3_MAX",
    "E4M3_MIN_SUBNORMAL",
    "E4M3_NAN_BYTE",
    "E4M3_VALUES",
    "ENCODER_CONSTANTS",
    "GGUF_BLOCK_BYTES",
    "GGUF_SUPER_BLOCK",
    "GGUF_TYPE_NVFP4",
    "GLOBAL_AMAX_DIVISOR",
    "Q8_BLOCK_SIZE",
    "Q8_MAX",
    "RESERVED_PATHS",
    "SPEC_VERSION",
    "SUPPORTED_SPEC_VERSIONS",
    "SWIZZLE_COL_TILE",
    "SWIZZLE_ROW_GROUP",
    "SWIZZLE_ROW_TILE",
    "SWIZZLE_TILE_BYTES",
    "WEIGHT_FORMAT_VERSION",
    "SpecTables",
    "SpecVersionError",
    "block_scale_encode",
    "block_scale_unrounded",
    "e4m3_decode",
    "e4m3_encode",
    "e4m3_encode_exact",
    "e4m3_round",
    "for_version",
    "released",
    "require_spec",
    "swizzle_128x4_band",
    "swizzle_128x4_offset",
    "swizzled_scale_shape",
    "version_key",
]

# --------------------------------------------------------------------------------------
# One released version's tables
# --------------------------------------------------------------------------------------


def _frozen(values: list[float]) -> npt.NDArray[np.float32]:
    a = np.array(values, dtype=np.float32)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class SpecTables:
    """Every constant and table of one released spec version (``spec/<version>/nvfp4.md``).

    Immutable: the attributes cannot be rebound and the arrays are read-only.
    """

    #: The version, ``MAJOR.MINOR``.
    version: str
    #: Elements per block along K (the contraction axis); one E4M3 scale byte per block.
    block_size: int
    #: Value of each of the 16 E2M1 codes. Bit 3 is the sign; bits 0-2 index the
    #: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. Code 8 is -0.0.
    e2m1_values: npt.NDArray[np.float32]
    #: Midpoints between consecutive E2M1 magnitudes. A magnitude strictly between two
    #: bounds rounds to the nearer value; a magnitude equal to a bound is a tie.
    e2m1_bounds: npt.NDArray[np.float32]
    #: The ties whose even neighbour is the upper one (0.75 -> 1, 1.75 -> 2, 3.5 -> 4).
    e2m1_odd_bounds: npt.NDArray[np.float32]
    #: The E4M3 exponent bias.
    e4m3_bias: int
    #: The byte an encoder writes for a block holding NaN or Inf (it decodes to NaN).
    e4m3_nan_byte: int
    #: Scale bytes a conforming plane never holds: every byte with bit 7 set (negative
    #: scales and 0xFF) and the NaN byte. Content validation refuses them.
    e4m3_invalid_bytes: frozenset[int]
    #: ggml type id of NVFP4.
    gguf_type_nvfp4: int
    #: Elements per GGUF NVFP4 super-block (K must be a multiple of it).
    gguf_super_block: int
    #: Bytes per GGUF NVFP4 super-block: 4 scale bytes then 32 bytes of nibbles.
    gguf_block_bytes: int
    #: The 128x4 swizzle tiles rows by this many ...
    swizzle_row_tile: int
    #: ... and scale columns (K/16) by this many.
    swizzle_col_tile: int
    #: Rows of one 32-row group inside a 128-row tile (``n % 32``, ``(n % 128) // 32``).
    swizzle_row_group: int
    #: Bytes of one tile: ``swizzle_row_tile * swizzle_col_tile``.
    swizzle_tile_bytes: int
    #: Tolerance paths the version names but defines no number for (a backend cannot be
    #: certified for them).
    reserved_paths: frozenset[str]
    #: W4A8 int8 activations (from 1.1): elements per activation block along K (ggml's
    #: ``QK8_0``); ``None`` where the version defines no W4A8.
    q8_block_size: int | None = None
    #: W4A8 int8 activations (from 1.1): the largest code magnitude, ``d = amax / q8_max``.
    q8_max: int | None = None

    @property
    def e2m1_max(self) -> float:
        """Largest E2M1 magnitude."""
        return float(self.e2m1_values.max())

    @property
    def e4m3_values(self) -> npt.NDArray[np.float32]:
        """Value of each of the 256 E4M3 bytes (bytes 0x00..0x7E are the valid scales,
        increasing); read-only."""
        return _e4m3_table(self.e4m3_bias, self.e4m3_nan_byte)

    @property
    def e4m3_max(self) -> float:
        """Largest finite E4M3 value (the byte below the NaN byte)."""
        return float(self.e4m3_values[self.e4m3_nan_byte - 1])

    @property
    def e4m3_min_subnormal(self) -> float:
        """Smallest positive E4M3 value (byte 0x01, a subnormal)."""
        return float(self.e4m3_values[0x01])

    @property
    def global_amax_divisor(self) -> float:
        """``global = amax / global_amax_divisor`` (= E2M1 max * E4M3 max)."""
        return self.e2m1_max * self.e4m3_max


_E4M3_CACHE: dict[tuple[int, int], npt.NDArray[np.float32]] = {}


def _e4m3_table(bias: int, nan_byte: int) -> npt.NDArray[np.float32]:
    """Decode all 256 E4M3 bytes (3 mantissa bits, no infinities, ``nan_byte`` and its
    negative twin NaN); cached, read-only."""
    key = (bias, nan_byte)
    if key not in _E4M3_CACHE:
        b = np.arange(256, dtype=np.int64)
        sign = np.where(b & 0x80, -1.0, 1.0)
        exponent = (b >> 3) & 0xF
        mantissa = b & 0x7
        # exponent 0: subnormal, value = mantissa/8 * 2^(1-bias)
        # otherwise: normal, value = (1 + mantissa/8) * 2^(exponent-bias)
        value = np.where(
            exponent == 0,
            mantissa / 8.0 * 2.0 ** (1 - bias),
            (1.0 + mantissa / 8.0) * np.exp2(exponent - float(bias)),
        )
        value = sign * value
        value[(b & 0x7F) == nan_byte] = np.nan
        table = value.astype(np.float32)
        table.setflags(write=False)
        _E4M3_CACHE[key] = table
    return _E4M3_CACHE[key]


def _spec_1_0() -> SpecTables:
    """Spec 1.0 (``spec/1.0/nvfp4.md``)."""
    return SpecTables(
        version="1.0",
        block_size=16,
        e2m1_values=_frozen(
            [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
        ),
        e2m1_bounds=_frozen([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]),
        e2m1_odd_bounds=_frozen([0.75, 1.75, 3.5]),
        e4m3_bias=7,
        e4m3_nan_byte=0x7F,
        e4m3_invalid_bytes=frozenset([0x7F, *range(0x80, 0x100)]),
        gguf_type_nvfp4=40,
        gguf_super_block=64,
        gguf_block_bytes=36,
        swizzle_row_tile=128,
        swizzle_col_tile=4,
        swizzle_row_group=32,
        swizzle_tile_bytes=512,
        reserved_paths=frozenset({"w4a8"}),
    )


def _spec_1_1() -> SpecTables:
    """Spec 1.1 (``spec/1.1/nvfp4.md``): 1.0's tables, and W4A8 (int8 activations in blocks
    of 32 along K, ``d = amax / 127``; FP8 E4M3 activations), with its numbers."""
    v10 = _spec_1_0()
    return replace(v10, version="1.1", reserved_paths=frozenset(), q8_block_size=32, q8_max=127)


def _spec_1_2() -> SpecTables:
    """Spec 1.2 (``spec/1.2/nvfp4.md``): 1.1's tables. What 1.2 adds (the shard plan,
    conformance classes and declared deviations, outputs below the normal range) has its
    code in :mod:`nvfp4.shard_plan`, :mod:`nvfp4.deviation_registry` and its numbers in
    ``tolerances.toml`` (``[row_parallel]``)."""
    return replace(_spec_1_1(), version="1.2")


def _spec_1_3() -> SpecTables:
    """Spec 1.3 (``spec/1.3/nvfp4.md``): 1.2's tables. What 1.3 adds, the accumulation floor
    of the matmul bound, is a number of ``tolerances.toml`` (``[accumulation_floor]``,
    :func:`nvfp4.tolerances.accumulation_floor`) computed by :mod:`nvfp4.accumulation_floor`."""
    return replace(_spec_1_2(), version="1.3")


def _spec_1_4() -> SpecTables:
    """Spec 1.4 (``spec/1.4/nvfp4.md``): 1.3's tables. What 1.4 adds, the accumulation floor
    on a row-parallel sum, is a path of ``tolerances.toml``'s ``[accumulation_floor]``
    (``row_parallel``)."""
    return replace(_spec_1_3(), version="1.4")


def _spec_1_5() -> SpecTables:
    """Spec 1.5 (``spec/1.5/nvfp4.md``): 1.4's tables and numbers. What 1.5 adds, a declared
    deviation of T7 and its bound kind, is registry data (``spec/1.5/deviations.toml``, read
    by :mod:`nvfp4.deviation_registry`)."""
    return replace(_spec_1_4(), version="1.5")


#: Every released version's table, by version. A release adds one; none is ever removed or
#: edited (a released folder under ``spec/`` is immutable, and so is its table).
_RELEASED: dict[str, SpecTables] = {
    "1.0": _spec_1_0(),
    "1.1": _spec_1_1(),
    "1.2": _spec_1_2(),
    "1.3": _spec_1_3(),
    "1.4": _spec_1_4(),
    "1.5": _spec_1_5(),
}


def version_key(version: str) -> tuple[int, ...]:
    """``"1.10"`` -> ``(1, 10)``: the order of spec versions (``(-1,)`` for a malformed one)."""
    try:
        return tuple(int(p) for p in version.split("."))
    except (AttributeError, ValueError):
        return (-1,)


# --------------------------------------------------------------------------------------
# Versioning
# --------------------------------------------------------------------------------------

#: Every spec version this package implements, oldest first (an engine pinned to 1.0 keeps
#: working after 1.1 ships, as long as 1.0 stays in this tuple).
SUPPORTED_SPEC_VERSIONS: Final = tuple(sorted(_RELEASED, key=version_key))
#: The newest spec version this package implements.
SPEC_VERSION: Final = SUPPORTED_SPEC_VERSIONS[-1]
#: The spec version that defines the weight format a checkpoint holds (codes, scales,
#: globals, layouts): unchanged since 1.0 (1.1 adds activation formats, 1.2 sharding and
#: conformance classes; neither changes a weight byte). Checkpoint
#: writers record it, so a reader pinned to 1.0 reads what any later tooling wrote.
WEIGHT_FORMAT_VERSION: Final = "1.0"


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


def for_version(version: str) -> SpecTables:
    """The constants and tables of released spec ``version`` (``"1.0"``).

    Raises:
        SpecVersionError: for a version this nvfp4-core has no table for; the one-line
            message names the versions it has.
    """
    return released(_RELEASED, version, "table")


_V = TypeVar("_V")


def released(by_version: Mapping[str, _V], version: object, what: str) -> _V:
    """``by_version[version]``, or a one-line :class:`SpecVersionError` naming ``what`` is
    missing for that version and the versions that have it."""
    found = by_version.get(version) if isinstance(version, str) else None
    if found is None:
        have = ", ".join(sorted(by_version, key=version_key))
        raise SpecVersionError(
            f"NVFP4 spec {version!r} has no {what} in this nvfp4-core; supported: {have}"
        )
    return found


# --------------------------------------------------------------------------------------
# The newest version's values, by name (read from its table, never restated)
# --------------------------------------------------------------------------------------

_NEWEST: Final = for_version(SPEC_VERSION)

#: Elements per block along K (the contraction axis); one E4M3 scale byte per block.
BLOCK_SIZE: Final = _NEWEST.block_size
#: Value of each of the 16 E2M1 codes (read-only).
E2M1_VALUES: Final = _NEWEST.e2m1_values
#: Largest E2M1 magnitude.
E2M1_MAX: Final = _NEWEST.e2m1_max
#: Midpoints between consecutive E2M1 magnitudes (read-only).
E2M1_BOUNDS: Final = _NEWEST.e2m1_bounds
#: The ties whose even neighbour is the upper one (read-only). At the other bounds
#: (0.25, 1.25, 2.5, 5) round-to-nearest-even goes down.
E2M1_ODD_BOUNDS: Final = _NEWEST.e2m1_odd_bounds
#: The E4M3 exponent bias.
E4M3_BIAS: Final = _NEWEST.e4m3_bias
#: Value of each of the 256 E4M3 bytes (read-only). Bytes 0x00..0x7E are the valid
#: scales, increasing.
E4M3_VALUES: Final = _NEWEST.e4m3_values
#: Largest finite E4M3 value (byte 0x7E).
E4M3_MAX: Final = _NEWEST.e4m3_max
#: Smallest positive E4M3 value (byte 0x01, a subnormal): 2^-9.
E4M3_MIN_SUBNORMAL: Final = _NEWEST.e4m3_min_subnormal
#: The scale byte of a block holding NaN or Inf (0x7F, NaN).
E4M3_NAN_BYTE: Final = _NEWEST.e4m3_nan_byte
#: Scale bytes a conforming plane never holds (bit 7 set, and the NaN byte).
E4M3_INVALID_BYTES: Final = _NEWEST.e4m3_invalid_bytes
#: ``global = amax / GLOBAL_AMAX_DIVISOR`` (= E2M1_MAX * E4M3_MAX = 6 * 448). The stored
#: global is the DECODE multiplier (ModelOpt's ``weight_scale_2``).
GLOBAL_AMAX_DIVISOR: Final = _NEWEST.global_amax_divisor
#: ggml type id of NVFP4.
GGUF_TYPE_NVFP4: Final = _NEWEST.gguf_type_nvfp4
#: Elements per GGUF NVFP4 super-block (K must be a multiple of it).
GGUF_SUPER_BLOCK: Final = _NEWEST.gguf_super_block
#: Bytes per GGUF NVFP4 super-block: 4 scale bytes then 32 bytes of nibbles.
GGUF_BLOCK_BYTES: Final = _NEWEST.gguf_block_bytes
#: The 128x4 swizzle tiles rows by 128 and scale columns (K/16) by 4.
SWIZZLE_ROW_TILE: Final = _NEWEST.swizzle_row_tile
SWIZZLE_COL_TILE: Final = _NEWEST.swizzle_col_tile
#: Rows of one group inside a swizzle tile (32) and bytes of one tile (512).
SWIZZLE_ROW_GROUP: Final = _NEWEST.swizzle_row_group
SWIZZLE_TILE_BYTES: Final = _NEWEST.swizzle_tile_bytes
#: Tolerance paths the newest version reserves (none since 1.1; 1.0 reserved ``w4a8``).
RESERVED_PATHS: Final = _NEWEST.reserved_paths
#: W4A8 int8 activations: elements per activation block along K (32; K must be a multiple).
Q8_BLOCK_SIZE: Final[int] = _NEWEST.q8_block_size or 32
#: W4A8 int8 activations: the largest code magnitude (127), ``d = amax / Q8_MAX``.
Q8_MAX: Final[int] = _NEWEST.q8_max or 127
#: The encoder's constants by name, as the compiled kernels receive them at init (nvfp4-cpu's
#: ``nvfp4cpu_init``): E2M1 max (6), E4M3 max (448), E4M3 min subnormal (2^-9), E4M3 bias (7)
#: and the NaN byte (0x7F).
ENCODER_CONSTANTS: Final = (E2M1_MAX, E4M3_MAX, E4M3_MIN_SUBNORMAL, E4M3_BIAS, E4M3_NAN_BYTE)

# --------------------------------------------------------------------------------------
# Formulas (identical in every 1.x version: a minor version never changes bits)
# --------------------------------------------------------------------------------------


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
    positive = E4M3_VALUES[:E4M3_NAN_BYTE]
    idx = np.searchsorted(positive, np.asarray(values, dtype=np.float32))
    return idx.astype(np.uint8)


def e4m3_encode(s: npt.ArrayLike) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """The E4M3 step of every encoder: ``s`` (any float array) in float32, clamped to
    ``[E4M3_MIN_SUBNORMAL, E4M3_MAX]`` (``[2^-9, 448]``), rounded to E4M3 nearest-even.
    Returns the bytes and their exact float32 values."""
    a = np.asarray(s, dtype=np.float32)
    clamped = np.clip(a, np.float32(E4M3_MIN_SUBNORMAL), np.float32(E4M3_MAX)).astype(np.float32)
    rounded = e4m3_round(clamped)
    return e4m3_encode_exact(rounded), rounded


def block_scale_unrounded(
    block_amax: npt.ArrayLike, row_global: npt.ArrayLike
) -> npt.NDArray[np.float32]:
    """Step 2 of the reference encoder before the E4M3 rounding
    (spec 1.0, "The reference encoder"): ``s = block_amax / (E2M1_MAX * global)`` in float32
    (the product first, then one division), ``s == 0`` becomes 1.0, clamped to ``[2^-9, 448]``. ``row_global``
    broadcasts against ``block_amax``."""
    amax = np.asarray(block_amax, dtype=np.float32)
    # float32 throughout, as the spec's order says: a global near float32's largest makes
    # the product +inf and s 0 (then 1.0), which is the defined result, not an error
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        denom = (np.float32(E2M1_MAX) * np.asarray(row_global, dtype=np.float32)).astype(np.float32)
        s = (amax / denom).astype(np.float32)
    s = np.where(s == 0, np.float32(1.0), s)
    return np.clip(s, np.float32(E4M3_MIN_SUBNORMAL), np.float32(E4M3_MAX)).astype(np.float32)


def block_scale_encode(
    block_amax: npt.ArrayLike, row_global: npt.ArrayLike
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """Step 2 of the reference encoder: :func:`block_scale_unrounded` then
    :func:`e4m3_encode`. Returns the scale bytes and their exact float32 values."""
    return e4m3_encode(block_scale_unrounded(block_amax, row_global))


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
    group = SWIZZLE_ROW_GROUP  # rows n % 32 step by 16 bytes, groups (n % 128) // 32 by 4
    row = (n % group) * (SWIZZLE_TILE_BYTES // group) + (n % SWIZZLE_ROW_TILE) // group * 4
    return tile * SWIZZLE_TILE_BYTES + row + k % SWIZZLE_COL_TILE


def swizzle_128x4_band(k_blocks: int) -> tuple[npt.NDArray[np.int64], int]:
    """The offsets of one 128-row band: :func:`swizzle_128x4_offset` of rows 0..127 x scale
    columns 0..k_blocks-1 (int64 ``[128 * k_blocks]``, row-major, read-only), and the byte
    stride between consecutive bands. Row ``n`` of any band lies at ``(n // 128) * stride``
    plus the band offset of row ``n % 128``, so a transform gathers or scatters through the
    band without building an index array larger than ``128 x k_blocks``."""
    rows = np.arange(SWIZZLE_ROW_TILE, dtype=np.int64)[:, None]
    cols = np.arange(k_blocks, dtype=np.int64)[None, :]
    band = np.ascontiguousarray(swizzle_128x4_offset(rows, cols, k_blocks).reshape(-1))
    band.setflags(write=False)
    stride = -(-k_blocks // SWIZZLE_COL_TILE) * SWIZZLE_TILE_BYTES
    return band, stride
