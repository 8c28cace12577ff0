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

From spec 1.3 an element also conforms within its accumulation floor
(:func:`nvfp4.accumulation_floor.allowance`): given ``allowance``, :func:`error_figures` adds
``max_rel_err_beyond_floor``, the same measure over the elements whose error is above their
floor (0 when none is), and ``floor_decides``, how many elements are above ``tol`` of
``max|ref|`` yet within their floor, and :func:`assert_within` judges the first.
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


def error_figures(
    y: Any, ref: Any, allowance: Any = None, tol: float | None = None
) -> dict[str, Any]:
    """The figures a certificate records for one comparison: ``max_abs_err``, ``max_ref``,
    ``max_rel_err`` (the relative error, module docstring) and ``worst_at`` (the index of
    the largest error; ``()`` for empty arrays). A non-finite ``y`` gives ``max_abs_err``
    and ``max_rel_err`` ``inf`` and ``nonfinite`` (how many of its elements are not finite)
    in place of ``worst_at``. With ``allowance`` (every element's accumulation floor, the
    shape of ``ref``): ``max_rel_err_beyond_floor`` and, with ``tol`` too, ``floor_decides``
    (module docstring)."""
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
        figs: dict[str, Any] = {
            "max_abs_err": float("inf"),
            "max_ref": max_ref,
            "max_rel_err": float("inf"),
            "nonfinite": int((~np.isfinite(f)).sum()),
        }
        if allowance is not None:
            figs["max_rel_err_beyond_floor"] = float("inf")
        return figs
    err = np.abs(f - r)
    max_err = float(err.max()) if err.size else 0.0
    at = tuple(int(v) for v in np.unravel_index(int(err.argmax()), err.shape)) if err.size else ()
    figs = {"max_abs_err": max_err, "max_ref": max_ref, "max_rel_err": _over(max_err, max_ref)}
    figs["worst_at"] = at
    if allowance is not None:
        floor = np.asarray(allowance, np.float64)
        if floor.shape != r.shape:
            raise ValueError(
                f"error measure: a floor of {floor.shape} for a reference of {r.shape}"
            )
        beyond = np.where(err > floor, err, 0.0)
        figs["max_rel_err_beyond_floor"] = _over(float(beyond.max(initial=0.0)), max_ref)
        if tol is not None:
            figs["floor_decides"] = int(((err > tol * max_ref) & (err <= floor)).sum())
    return figs


def _over(err: float, max_ref: float) -> float:
    """``err / max_ref``; for ``max_ref = 0``, 0 when ``err`` is 0 too, else infinite."""
    return err / max_ref if max_ref > 0 else (0.0 if err == 0 else float("inf"))


def relative_error(y: Any, ref: Any) -> float:
    """``max|y - ref| / max|ref|`` with the zero, empty and non-finite rules of the module
    docstring."""
    rel: float = error_figures(y, ref)["max_rel_err"]
    return rel


def assert_within(
    y: Any,
    ref: Any,
    tol: float,
    what: str,
    *,
    diagnose: Diagnose | None = None,
    allowance: Any = None,
) -> dict[str, Any]:
    """Fail (``AssertionError``) unless the relative error of ``y`` against ``ref`` is at
    most ``tol`` - over the elements beyond their accumulation floor, when ``allowance``
    gives it (module docstring); return :func:`error_figures` otherwise. The message names
    ``what``, the figures, where the worst error is or how many outputs are not finite,
    then the lines of ``diagnose()`` when given."""
    figs = error_figures(y, ref, allowance, tol)
    judged = "max_rel_err" if allowance is None else "max_rel_err_beyond_floor"
    if figs[judged] <= tol:
        return figs
    measure = (
        "max|err|/max|ref|"
        if allowance is None
        else ("max|err|/max|ref| over the outputs beyond their accumulation floor")
    )
    lines = [
        f"{what}: {measure} = {figs[judged]:.4g} > tolerance {tol:.4g} "
        f"(max|err| {figs['max_abs_err']:.4g}, max|ref| {figs['max_ref']:.4g}"
        + (f", worst at {figs.get('worst_at')})" if "worst_at" in figs else ")")
    ]
    if "nonfinite" in figs:
        lines.append(f"  {figs['nonfinite']} non-finite outputs")
    if diagnose is not None:
        lines.extend(diagnose())
    raise AssertionError("\n".join(lines))
