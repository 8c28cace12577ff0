"""The spec's matmul error measure, ``max|y - ref| / max|ref|`` (:data:`nvfp4.tolerances.METRIC`),
in one place: the conformance suite records it in certificates, the package tests and the
benchmarks compare against it.

``y`` and ``ref`` must have the same shape; both are read as float64, exactly (bfloat16
included). Then the relative error is, in this order:

* ``ValueError`` when ``ref`` holds a NaN or an infinity: a reference is computed in
  float64 and a non-finite one is the caller's bug (compare the finite part instead);
* ``inf`` when ``y`` holds a NaN or an infinity: a non-finite output is never within a
  tolerance;
* 0 for empty arrays: nothing is out of tolerance;
* for an all-zero ``ref``: 0 when ``y`` is all zero too, else ``inf``;
* otherwise ``max|y - ref| / max|ref|``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Diagnose", "as_float64", "assert_within", "error_figures", "relative_error"]

#: Extra lines for a failure message, computed only when the comparison fails.
Diagnose = Callable[[], Iterable[str]]


def as_float64(a: Any) -> npt.NDArray[np.float64]:
    """Any float array (including ``ml_dtypes.bfloat16``) as float64, exactly."""
    arr = np.asarray(a)
    if arr.dtype.kind == "V" or arr.dtype.name == "bfloat16":
        arr = arr.astype(np.float32)
    return arr.astype(np.float64)


def error_figures(y: Any, ref: Any) -> dict[str, Any]:
    """The figures a certificate records for one comparison: ``max_abs_err``, ``max_ref``,
    ``max_rel_err`` (the relative error, module docstring) and ``worst_at`` (the index of
    the largest error; ``()`` for empty arrays). A non-finite ``y`` gives ``max_abs_err``
    and ``max_rel_err`` ``inf`` and ``nonfinite`` (how many of its elements are not finite)
    in place of ``worst_at``."""
    f, r = as_float64(y), as_float64(ref)
    if f.shape != r.shape:
        raise ValueError(f"error measure: shape {f.shape} against a reference of {r.shape}")
    if not np.isfinite(r).all():
        raise ValueError(
            f"error measure: the reference holds {int((~np.isfinite(r)).sum())} non-finite "
            "values; compare its finite part"
        )
    max_ref = float(np.max(np.abs(r))) if r.size else 0.0
    if not np.isfinite(f).all():
        return {
            "max_abs_err": float("inf"),
            "max_ref": max_ref,
            "max_rel_err": float("inf"),
            "nonfinite": int((~np.isfinite(f)).sum()),
        }
    err = np.abs(f - r)
    max_err = float(err.max()) if err.size else 0.0
    rel = max_err / max_ref if max_ref > 0 else (0.0 if max_err == 0 else float("inf"))
    at = tuple(int(v) for v in np.unravel_index(int(err.argmax()), err.shape)) if err.size else ()
    return {"max_abs_err": max_err, "max_ref": max_ref, "max_rel_err": rel, "worst_at": at}


def relative_error(y: Any, ref: Any) -> float:
    """``max|y - ref| / max|ref|`` with the zero, empty and non-finite rules of the module
    docstring."""
    rel: float = error_figures(y, ref)["max_rel_err"]
    return rel


def assert_within(
    y: Any, ref: Any, tol: float, what: str, *, diagnose: Diagnose | None = None
) -> dict[str, Any]:
    """Fail (``AssertionError``) unless the relative error of ``y`` against ``ref`` is at
    most ``tol``; return :func:`error_figures` otherwise. The message names ``what``, the
    figures, where the worst error is or how many outputs are not finite, then the lines
    of ``diagnose()`` when given."""
    figs = error_figures(y, ref)
    if figs["max_rel_err"] <= tol:
        return figs
    lines = [
        f"{what}: max|err|/max|ref| = {figs['max_rel_err']:.4g} > tolerance {tol:.4g} "
        f"(max|err| {figs['max_abs_err']:.4g}, max|ref| {figs['max_ref']:.4g}"
        + (f", worst at {figs.get('worst_at')})" if "worst_at" in figs else ")")
    ]
    if "nonfinite" in figs:
        lines.append(f"  {figs['nonfinite']} non-finite outputs")
    if diagnose is not None:
        lines.extend(diagnose())
    raise AssertionError("\n".join(lines))
