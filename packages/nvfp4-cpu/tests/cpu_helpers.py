"""Helpers shared by the nvfp4-cpu tests: tolerances and error measurement."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

#: Interim tolerances, max|y - ref| / max|ref| per output dtype, until nvfp4.tolerances exists.
INTERIM_TOLERANCE = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}

MEASURED: dict[str, list[float]] = defaultdict(list)


def tol(path: str, dtype: str = "float32") -> float:
    """Tolerance for ``path`` ("qmm", "gather_qmm", "w4a4") and an output dtype name."""
    try:
        from nvfp4.tolerances import tolerance  # type: ignore[import-not-found]
    except ImportError:
        return INTERIM_TOLERANCE[dtype]
    return float(tolerance(path, dtype))


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    """max|y - ref| / max|ref| over the finite reference values (0 for an all-zero ref)."""
    y64 = np.asarray(y, dtype=np.float64)
    r64 = np.asarray(ref, dtype=np.float64)
    scale = np.abs(r64).max() if r64.size else 0.0
    diff = np.abs(y64 - r64).max() if r64.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


def check_close(path: str, dtype: str, y: np.ndarray, ref: np.ndarray, label: str = "") -> float:
    """Assert ``y`` is within the tolerance of ``ref`` and record the error."""
    assert y.shape == ref.shape, (y.shape, ref.shape)
    err = rel_err(y, ref)
    MEASURED[f"{path}/{dtype}"].append(err)
    assert err <= tol(path, dtype), (
        f"{path} {dtype} {label}: rel err {err:.3e} > {tol(path, dtype):.1e}"
    )
    return err
