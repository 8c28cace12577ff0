"""The tolerances of every released NVFP4 spec version, as data.

This mirrors ``spec/<version>/tolerances.toml`` (the normative files, with the measurements
behind every number) so that an installed ``nvfp4-core`` needs no copy of the repository's
``spec/`` folder. ``tests/test_spec_drift.py`` keeps each released folder's TOML equal to
:func:`tolerances_for` of its version.

Matmul paths (``qmm``, ``gather_qmm``, ``w4a4``) give, per output dtype, the largest
allowed ``max|y - ref| / max|ref|`` against the float64 reference computed from the same x
(:mod:`nvfp4.reference`). ``dequantize`` is exact (0). ``quantize`` holds ``reference``
(0 disagreements), ``others`` (the largest fraction of elements another encoder may change,
each at a rounding boundary) and ``boundary_window`` (how close to a boundary, relative).
``w4a8`` is reserved in spec 1.0: it has no number. Spec 1.1 gives ``w4a8`` (int8
activations) and ``w4a8_fp8`` numbers per output dtype, and ``quantize_q8`` (``reference``,
``others``, ``boundary_window``) for int8 activation encoders.

A lookup names the version it certifies (``tolerance("qmm", "float16", spec="1.0")``): a
1.0 certificate made after 1.1 ships must use 1.0's numbers. Without ``spec`` it gets the
newest version's. :data:`TOLERANCES` is the newest version's table.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from .dtypes import dtype_name
from .spec import SPEC_VERSION, released, version_key

__all__ = ["METRIC", "TOLERANCES", "TOLERANCES_SPEC_VERSION", "tolerance", "tolerances_for"]

#: The matmul error measure the numbers bound (:func:`nvfp4.testing.relative_error`).
METRIC: Final = "max|y - ref| / max|ref|"

Table = Mapping[str, Mapping[str, float]]


def _freeze(tables: dict[str, dict[str, float]]) -> Table:
    return MappingProxyType({path: MappingProxyType(dict(t)) for path, t in tables.items()})


#: Every released version's numbers, by version. A release adds one; none is ever removed or
#: edited (a number changes only in a new spec version).
_V1_0: dict[str, dict[str, float]] = {
    "dequantize": {"float32": 0.0, "float16": 0.0, "bfloat16": 0.0},
    "quantize": {"reference": 0.0, "others": 1e-5, "boundary_window": 2.0**-20},
    "qmm": {"float32": 1e-4, "float16": 1e-3, "bfloat16": 1e-2},
    "gather_qmm": {"float32": 1e-4, "float16": 1e-3, "bfloat16": 1e-2},
    "w4a4": {"float32": 3e-7, "float16": 1e-3, "bfloat16": 1e-2},
    "w4a8": {},
}
_BY_VERSION: dict[str, Table] = {
    "1.0": _freeze(_V1_0),
    # a minor version: 1.0's numbers as they are, and the optional W4A8 capabilities
    "1.1": _freeze(
        {
            **_V1_0,
            "quantize_q8": {"reference": 0.0, "others": 1e-5, "boundary_window": 2.0**-20},
            "w4a8": {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2},
            "w4a8_fp8": {"float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2},
        }
    ),
}


def _newest() -> str:
    return max(_BY_VERSION, key=version_key)


def tolerances_for(version: str | None = None) -> Table:
    """The numbers of spec ``version`` (default: the newest this package has), read-only:
    path -> (key -> number). Keys are output dtype names (``"float32"``, ``"float16"``,
    ``"bfloat16"``), except for ``quantize`` (``"reference"``, ``"others"``,
    ``"boundary_window"``); a reserved path has an empty table.

    Raises:
        SpecVersionError: for a version without numbers here; the one-line message names
            the versions that have them.
    """
    return released(_BY_VERSION, _newest() if version is None else version, "tolerances")


def tolerance(path: str, dtype: Any, spec: str | None = None) -> float:
    """The number of spec ``spec`` (default: the newest) for ``path`` and ``dtype``.

    Args:
        path: ``"qmm"``, ``"gather_qmm"``, ``"w4a4"``, ``"dequantize"`` or ``"quantize"``.
        dtype: an output dtype name (``"float32"``, ``"float16"``, ``"bfloat16"``) or a
            numpy / ml_dtypes dtype; for ``quantize`` one of ``"reference"``, ``"others"``,
            ``"boundary_window"``.
        spec: the spec version being certified (``"1.0"``).

    Raises:
        SpecVersionError: for an unknown spec version.
        KeyError: for an unknown path, a reserved path (``w4a8``) or a key the path lacks;
            the message names what was asked and what exists.
    """
    tables = tolerances_for(spec)
    v = _newest() if spec is None else spec
    if path not in tables:
        raise KeyError(
            f"spec {v} tolerances: unknown path {path!r}; "
            f"expected one of {', '.join(sorted(tables))}"
        )
    table = tables[path]
    if not table:
        raise KeyError(
            f"spec {v} tolerances: path {path!r} is reserved and has no "
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
            f"spec {v} tolerances: path {path!r} has no entry {key!r}; "
            f"expected one of {', '.join(sorted(table))}"
        )
    return float(table[key])


#: The spec version of :data:`TOLERANCES` (the newest, :data:`nvfp4.spec.SPEC_VERSION`).
TOLERANCES_SPEC_VERSION: Final = SPEC_VERSION
#: The newest version's numbers (``tolerances_for(TOLERANCES_SPEC_VERSION)``), read-only.
TOLERANCES: Final[Table] = tolerances_for(TOLERANCES_SPEC_VERSION)
