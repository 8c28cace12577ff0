"""Inputs the tiers feed to a backend: probe planes for the codec, random and realistic
weights (the builders of :mod:`nvfp4.testing.data`), and malformed planes.

Everything is seeded (``numpy.random.default_rng``) so every run of the suite, on every
backend, sees the same bytes and the certificate's figures are comparable.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes
from nvfp4.testing import activations, globals_for, random_planes, raw_planes, realistic_weight

__all__ = [
    "MalformedCase",
    "case_rng",
    "codes_probe",
    "content_malformed_cases",
    "globals_for",
    "nonfinite_rows_case",
    "random_planes",
    "raw_planes",
    "realistic_weight",
    "scales_probe",
    "structural_malformed_cases",
]


def case_rng(*key: object) -> np.random.Generator:
    """A generator seeded by a case's key (the CRC-32 of ``repr(key)``): the same numbers
    for that case on every run, machine and backend."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def nonfinite_rows_case(
    tag: str, inf: float = np.inf
) -> tuple[NVFP4Planes, npt.NDArray[np.float32]]:
    """The non-finite rows case of T4's ``qmm_<tag>``: realistic planes ``[16, 128]`` and
    float32 activations ``[6, 128]`` with NaN at ``x[1, 3]`` and ``inf`` (``+inf`` or
    ``-inf``) at ``x[4, 100]``; rows 0, 2, 3 and 5 finite."""
    rng = case_rng(f"{tag}_nan")
    planes = realistic_weight(rng, 16, 128, name=f"t4.{tag}_nan")
    x = activations(rng, 6, 128, "float32")
    x[1, 3] = np.nan
    x[4, 100] = inf
    return planes, x


#: The 127 valid E4M3 scale bytes (0x00..0x7E).
VALID_SCALE_BYTES = np.arange(0x7F, dtype=np.uint8)


def codes_probe(name: str = "codes_probe") -> tuple[NVFP4Planes, npt.NDArray[np.uint8]]:
    """Planes ``[16, 32]`` holding every code in every position parity: row ``r`` element
    ``j`` is code ``(j + r) % 16`` in block 0 and ``(r - j) % 16`` in block 1; scale byte
    0x38 (1.0), global 1.0. Returns the planes and the unpacked codes."""
    r = np.arange(16)[:, None]
    j = np.arange(16)[None, :]
    codes = np.concatenate([(j + r) % 16, (r - j) % 16], axis=1).astype(np.uint8)
    scales = np.full((16, 2), 0x38, dtype=np.uint8)
    planes = NVFP4Planes(
        reference.pack_codes(codes), scales, np.asarray(1.0, dtype=np.float32), name=name
    )
    return planes, codes


def scales_probe(name: str = "scales_probe") -> tuple[NVFP4Planes, npt.NDArray[np.uint8]]:
    """Planes ``[127, 32]``: row ``r`` has scale byte ``r`` in block 0 and ``0x7E - r`` in
    block 1 (every valid byte twice), codes cycling through every magnitude and sign,
    global 1.0. Returns the planes and the unpacked codes."""
    n = VALID_SCALE_BYTES.size
    r = np.arange(n)[:, None]
    j = np.arange(32)[None, :]
    codes = ((j + 3 * r) % 16).astype(np.uint8)
    scales = np.stack([VALID_SCALE_BYTES, 0x7E - VALID_SCALE_BYTES], axis=1).astype(np.uint8)
    planes = NVFP4Planes(
        reference.pack_codes(codes), scales, np.asarray(1.0, dtype=np.float32), name=name
    )
    return planes, codes


# ------------------------------------------------------------------------- malformed
@dataclass(frozen=True)
class MalformedCase:
    """A malformed plane: ``experts`` says whether it is expert-stacked (``gather_qmm``
    gets those), ``k`` the row length an ``x`` for it should have."""

    id: str
    planes: NVFP4Planes
    experts: bool
    k: int


def _u8(*shape: int, value: int = 0x11) -> npt.NDArray[np.uint8]:
    return np.full(shape, value, dtype=np.uint8)


def structural_malformed_cases() -> list[MalformedCase]:
    """Planes whose dtypes, ranks or shapes are wrong: every entry point (``prepare`` and
    every verb) must refuse them with :class:`nvfp4.PlaneError` naming the tensor."""
    g = np.float32(0.01)
    c, s = _u8(8, 16), _u8(8, 2, value=0x38)
    c3, s3 = _u8(3, 8, 16), _u8(3, 8, 2, value=0x38)
    g3 = np.full(3, 0.01, dtype=np.float32)
    cases = [
        (
            "codes_int8",
            raw_planes(c.view(np.int8), s, np.asarray(g), name="bad_codes_int8"),
            False,
            32,
        ),
        (
            "codes_uint16",
            raw_planes(c.astype(np.uint16), s, np.asarray(g), name="bad_codes_u16"),
            False,
            32,
        ),
        ("codes_list", raw_planes(c.tolist(), s, np.asarray(g), name="bad_codes_list"), False, 32),
        (
            "scales_float32",
            raw_planes(c, s.astype(np.float32), np.asarray(g), name="bad_scales_f32"),
            False,
            32,
        ),
        (
            "global_float64",
            raw_planes(c, s, np.asarray(0.01, np.float64), name="bad_global_f64"),
            False,
            32,
        ),
        ("codes_rank1", raw_planes(c.reshape(-1), s, np.asarray(g), name="bad_rank1"), False, 32),
        (
            "scales_rank_mismatch",
            raw_planes(c, s.reshape(-1), np.asarray(g), name="bad_scales_rank"),
            False,
            32,
        ),
        (
            "scales_rows_mismatch",
            raw_planes(c, _u8(7, 2, value=0x38), np.asarray(g), name="bad_scale_rows"),
            False,
            32,
        ),
        (
            "k_not_multiple_of_16",
            raw_planes(_u8(8, 4), _u8(8, 1, value=0x38), np.asarray(g), name="bad_k8"),
            False,
            8,
        ),
        (
            "scales_cols_mismatch",
            raw_planes(c, _u8(8, 3, value=0x38), np.asarray(g), name="bad_scale_cols"),
            False,
            32,
        ),
        (
            "zero_rows",
            raw_planes(_u8(0, 16), _u8(0, 2), np.asarray(g), name="bad_zero_rows"),
            False,
            32,
        ),
        (
            "global_shape",
            raw_planes(c, s, np.full(2, 0.01, np.float32), name="bad_global_shape"),
            False,
            32,
        ),
        (
            "partitions_start",
            raw_planes(c, s, np.full(2, 0.01, np.float32), (1, 4, 8), "bad_parts_start"),
            False,
            32,
        ),
        (
            "partitions_end",
            raw_planes(c, s, np.full(2, 0.01, np.float32), (0, 4, 9), "bad_parts_end"),
            False,
            32,
        ),
        (
            "partitions_order",
            raw_planes(c, s, np.full(3, 0.01, np.float32), (0, 5, 4, 8), "bad_parts_order"),
            False,
            32,
        ),
        (
            "partition_global_count",
            raw_planes(c, s, np.full(3, 0.01, np.float32), (0, 4, 8), "bad_parts_g"),
            False,
            32,
        ),
        (
            "experts_global_count",
            raw_planes(c3, s3, np.full(4, 0.01, np.float32), name="bad_experts_g"),
            True,
            32,
        ),
        (
            "experts_scales_mismatch",
            raw_planes(c3, _u8(2, 8, 2, value=0x38), g3, name="bad_experts_scales"),
            True,
            32,
        ),
        (
            "experts_codes_int8",
            raw_planes(c3.view(np.int8), s3, g3, name="bad_experts_int8"),
            True,
            32,
        ),
    ]
    return [MalformedCase(i, p, e, k) for i, p, e, k in cases]


def content_malformed_cases() -> list[MalformedCase]:
    """Well-shaped planes with invalid content (a scale byte with bit 7 set or 0x7F, a
    global that is not finite and > 0): ``prepare`` (content validation at load time) must
    refuse them with :class:`nvfp4.PlaneError`."""
    out = []
    for byte in (0x7F, 0x80, 0xB8, 0xFE, 0xFF):
        s = _u8(8, 2, value=0x38)
        s[5, 1] = byte
        out.append(
            MalformedCase(
                f"scale_byte_0x{byte:02X}",
                NVFP4Planes(
                    _u8(8, 16), s, np.asarray(0.01, dtype=np.float32), name=f"bad_scale_{byte:02x}"
                ),
                False,
                32,
            )
        )
    for label, value in (("zero", 0.0), ("negative", -0.01), ("nan", np.nan), ("inf", np.inf)):
        out.append(
            MalformedCase(
                f"global_{label}",
                NVFP4Planes(
                    _u8(8, 16),
                    _u8(8, 2, value=0x38),
                    np.asarray(value, dtype=np.float32),
                    name=f"bad_global_{label}",
                ),
                False,
                32,
            )
        )
    g = np.array([0.01, 0.02], dtype=np.float32)
    g[1] = np.nan
    out.append(
        MalformedCase(
            "partition_global_nan",
            NVFP4Planes(_u8(8, 16), _u8(8, 2, value=0x38), g, (0, 4, 8), "bad_part_nan"),
            False,
            32,
        )
    )
    g3 = np.array([0.01, 0.0, 0.02], dtype=np.float32)
    out.append(
        MalformedCase(
            "expert_global_zero",
            NVFP4Planes(_u8(3, 8, 16), _u8(3, 8, 2, value=0x38), g3, name="bad_expert_zero"),
            True,
            32,
        )
    )
    return out
