"""The tolerances of NVFP4 spec 1.0, as data.

This mirrors ``spec/1.0/tolerances.toml`` (the normative file, with the measurements
behind every number) so that an installed ``nvfp4-core`` needs no copy of the repository's
``spec/`` folder. ``tests/test_spec_drift.py`` keeps the two equal.

Matmul paths (``qmm``, ``gather_qmm``, ``w4a4``) give, per output dtype, the largest
allowed ``max|y - ref| / max|ref|`` against the float64 reference computed from the same x
(:mod:`nvfp4.reference`). ``dequantize`` is exact (0). ``quantize`` holds ``reference``
(0 disagreements), ``others`` (the largest fraction of elements another encoder may change,
each at a rounding boundary) and ``boundary_window`` (how close to a boundary, relative).
``w4a8`` is reserved: spec 1.0 defines no number for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from .dtypes import dtype_name

__all__ = ["METRIC", "TOLERANCES", "TOLERANCES_SPEC_VERSION", "tolerance"]

#: The spec version these numbers belong to.
TOLERANCES_SPEC_VERSION: Final = "1.0"
#: The matmul error measure the numbers bound.
METRIC: Final = "max|y - ref| / max|ref|"

_TABLES: dict[str, dict[str, float]] = {
    "dequantize": {"float32": 0.0, "float16": 0.0, "bfloat16": 0.0},
    "quantize": {"reference": 0.0, "others": 1e-5, "boundary_window": 2.0**-20},
    "qmm": {"float32": 1e-4, "float16": 1e-3, "bfloat16": 1e-2},
    "gather_qmm": {"float32": 1e-4, "float16": 1e-3, "bfloat16": 1e-2},
    "w4a4": {"float32": 3e-7, "float16": 1e-3, "bfloat16": 1e-2},
    "w4a8": {},
}

#: path -> (key -> number), read-only. Keys are output dtype names ("float32", "float16",
#: "bfloat16"), except for ``quantize`` ("reference", "others", "boundary_window").
TOLERANCES: Final[Mapping[str, Mapping[str, float]]] = MappingProxyType(
    {path: MappingProxyType(table) for path, table in _TABLES.items()}
)


def tolerance(path: str, dtype: Any) -> float:
    """The spec 1.0 number for ``path`` and ``dtype``.

    Args:
        path: ``"qmm"``, ``"gather_qmm"``, ``"w4a4"``, ``"dequantize"`` or ``"quantize"``.
        dtype: an output dtype name (``"float32"``, ``"float16"``, ``"bfloat16"``) or a
            numpy / ml_dtypes dtype; for ``quantize`` one of ``"reference"``, ``"others"``,
            ``"boundary_window"``.

    Raises:
        KeyError: for an unknown path, a reserved path (``w4a8``) or a key the path lacks;
            the message names what was asked and what exists.
    """
    if path not in TOLERANCES:
        raise KeyError(
            f"spec {TOLERANCES_SPEC_VERSION} tolerances: unknown path {path!r}; "
            f"expected one of {', '.join(sorted(TOLERANCES))}"
        )
    table = TOLERANCES[path]
    if not table:
        raise KeyError(
            f"spec {TOLERANCES_SPEC_VERSION} tolerances: path {path!r} is reserved and has no "
            "numbers in this spec version (a backend cannot be certified for it)"
        )
    key = dtype
    if not isinstance(dtype, str):
        try:
            key = dtype_name(dtype)
        except ValueError:
            key = repr(dtype)
    if key not in table:
        raise KeyError(
            f"spec {TOLERANCES_SPEC_VERSION} tolerances: path {path!r} has no entry {key!r}; "
            f"expected one of {', '.join(sorted(table))}"
        )
    return float(table[key])
