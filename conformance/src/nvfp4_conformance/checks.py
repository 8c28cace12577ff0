"""Comparisons the tiers make, with failure messages that point at the cause.

* :func:`exact_mismatches` / :func:`assert_exact` - bit-exact tiers (T0-T3): how many
  elements differ, the first few with found and expected values, and a caller-supplied
  explanation of each (the code, scale byte and global behind a decoded element);
* :func:`error_figures` / :func:`assert_within` - T4: ``max|y - ref|``, ``max|ref|`` and
  their ratio against a tolerance (from spec 1.3 over the outputs beyond their accumulation
  floor) (the one measure of :mod:`nvfp4.testing.errors`, with
  its rules for zero, empty and non-finite arrays), with a diagnosis per row group
  (partition, expert) that names the group whose error is out of line and the factor it
  is off by (a dropped or misapplied global shows up as a constant ratio);
  :func:`record_within` records a case's figures in the certificate, pass or fail, before
  it asserts them;
* :func:`is_reference` - whether the backend under test is the reference itself, which
  every encoder comparison holds to exact agreement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4 import testing
from nvfp4.testing import as_float64, error_figures

__all__ = [
    "as_float64",
    "assert_exact",
    "assert_within",
    "error_figures",
    "exact_mismatches",
    "global_mixup_hint",
    "group_diagnosis",
    "is_reference",
    "record_within",
]

Explain = Callable[[tuple[int, ...]], str]


def is_reference(backend: Any) -> bool:
    """Whether ``backend`` is the reference itself: an encoder comparison then allows no
    boundary disagreement at all (another backend gets its tolerance's fraction)."""
    return bool(backend.info.name == "reference")


def exact_mismatches(found: npt.NDArray[Any], expected: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """Elementwise "not the same value": NaN matches NaN, ``-0.0`` matches ``0.0``."""
    f, e = as_float64(found), as_float64(expected)
    same = (f == e) | (np.isnan(f) & np.isnan(e))
    return np.asarray(~same)


def assert_exact(
    found: Any,
    expected: npt.NDArray[Any],
    what: str,
    *,
    explain: Explain | None = None,
    dtype: Any = None,
    show: int = 5,
) -> None:
    """Fail unless ``found`` has ``expected``'s shape (and ``dtype``, when given) and the
    same values everywhere."""
    f = np.asarray(found)
    if f.shape != expected.shape:
        raise AssertionError(f"{what}: shape {f.shape}, expected {expected.shape}")
    if dtype is not None and f.dtype != np.dtype(dtype):
        raise AssertionError(f"{what}: dtype {f.dtype}, expected {np.dtype(dtype)}")
    bad = exact_mismatches(f, expected)
    if not bad.any():
        return
    idx = np.argwhere(bad)
    lines = [f"{what}: {len(idx)} of {bad.size} elements differ (exact match required)"]
    for i in idx[:show]:
        t = tuple(int(v) for v in i)
        line = f"  at {t}: found {f[t]!r}, expected {expected[t]!r}"
        if explain is not None:
            line += f" <- {explain(t)}"
        lines.append(line)
    if len(idx) > show:
        lines.append(f"  ... {len(idx) - show} more")
    raise AssertionError("\n".join(lines))


def group_diagnosis(
    found: Any,
    ref: npt.NDArray[Any],
    groups: Mapping[str, tuple[npt.NDArray[np.bool_] | slice, ...]],
    tol: float,
) -> list[str]:
    """For each named group of output elements (an index tuple into ``found``), the relative
    error and, when it is out of tolerance, the median ratio ``found / ref`` there: a
    constant ratio other than 1 means a scale (a global) was applied wrongly."""
    f, r = as_float64(found), as_float64(ref)
    max_ref = float(np.max(np.abs(r))) if r.size else 0.0
    out = []
    for label, index in groups.items():
        fg, rg = f[index], r[index]
        if fg.size == 0:
            continue
        g_ref = float(np.max(np.abs(rg)))
        g_err = float(np.max(np.abs(fg - rg)))
        if max_ref == 0 or g_err / max_ref <= tol:
            continue
        nz = np.abs(rg) > 1e-3 * max(g_ref, 1e-300)
        ratio = float(np.median(fg[nz] / rg[nz])) if nz.any() else float("nan")
        out.append(
            f"  {label}: max|err| {g_err:.4g} ({g_err / max_ref:.3g} of max|ref|), "
            f"median found/expected ratio {ratio:.6g}"
        )
    return out


def assert_within(
    found: Any,
    ref: npt.NDArray[Any],
    tol: float,
    what: str,
    *,
    groups: Mapping[str, tuple[tuple[npt.NDArray[np.bool_] | slice, ...], float]] | None = None,
    allowance: npt.NDArray[np.float64] | None = None,
) -> dict[str, Any]:
    """Fail unless ``max|found - ref| / max|ref| <= tol`` (and ``found`` is finite) - over
    the outputs beyond their accumulation floor when ``allowance`` gives it (spec 1.3,
    :meth:`~nvfp4_conformance.spec_tolerances.SpecBounds.allowance`); return the error
    figures otherwise. ``groups`` (label -> (index, global)) names row groups - partitions,
    experts - for the diagnosis of a failure."""

    def diagnose() -> list[str]:
        assert groups is not None
        lines = []
        diag = group_diagnosis(found, ref, {k: v[0] for k, v in groups.items()}, tol)
        if diag:
            lines.append("  out-of-tolerance groups:")
            lines.extend(diag)
        lines.extend(global_mixup_hint(found, ref, groups))
        return lines

    return testing.assert_within(
        found, ref, tol, what, diagnose=diagnose if groups else None, allowance=allowance
    )


def record_within(
    record: Callable[..., None],
    case: str,
    found: Any,
    ref: npt.NDArray[Any],
    tol: float,
    what: str,
    *,
    groups: Mapping[str, tuple[tuple[npt.NDArray[np.bool_] | slice, ...], float]] | None = None,
    for_information: Mapping[str, Any] | None = None,
    allowance: npt.NDArray[np.float64] | None = None,
    **case_figures: Any,
) -> None:
    """Record ``case`` in the certificate (``record``: the ``nvfp4_record`` fixture) - its
    ``case_figures`` (dtype, shape, ...), the tolerance ``tol``, ``for_information`` (figures
    that are not judged) and :func:`error_figures` of ``found`` against ``ref`` (with the
    accumulation floor's figures where ``allowance`` is given) - pass or fail, then
    :func:`assert_within` them."""
    figs = error_figures(found, ref, allowance, tol)
    record(case, **case_figures, tolerance=tol, **(for_information or {}), **figs)
    assert_within(found, ref, tol, what, groups=groups, allowance=allowance)


def global_mixup_hint(
    found: Any,
    ref: npt.NDArray[Any],
    groups: Mapping[str, tuple[tuple[npt.NDArray[np.bool_] | slice, ...], float]],
) -> list[str]:
    """Name the likely cause when whole groups of rows (partitions, experts) are off by a
    constant factor: ``groups`` maps a label to (index, that group's global). A ratio
    ``found / expected`` equal to ``global_j / global_i`` means group i was scaled with group
    j's global; a ratio of ``1 / global_i`` means its global was not applied at all."""
    f, r = as_float64(found), as_float64(ref)
    hints = []
    for label, (index, g) in groups.items():
        fg, rg = f[index], r[index]
        nz = np.abs(rg) > 1e-6 * max(float(np.max(np.abs(rg), initial=0.0)), 1e-300)
        if not nz.any() or not np.isfinite(fg).all():
            continue
        ratio = float(np.median(fg[nz] / rg[nz]))
        if abs(ratio - 1.0) < 1e-2:
            continue
        cause = ""
        for other, (_, g2) in groups.items():
            if other != label and g2 != g and abs(ratio - g2 / g) <= 1e-3 * abs(g2 / g):
                cause = f"= global of {other} / global of {label}: {label} was scaled by {other}'s global"
                break
        if not cause and abs(ratio - 1.0 / g) <= 1e-3 / g:
            cause = f"= 1 / global ({g!r}): the global of {label} was not applied"
        if not cause and abs(ratio) < 1e-6:
            cause = f": {label} came out zero"
        hints.append(f"  {label}: found/expected = {ratio:.6g} {cause}".rstrip())
    return hints
