"""The accumulation floor of the matmul bound (spec 1.3, "Tolerances"), computed.

Spec 1.0-1.2 allow float32 accumulation "in any order" and hold every call to
``max|y - ref| / max|ref|``; where an output's sum cancels no float32 order can meet that. From
1.3 an output element ``(m, n)`` of a matmul path also conforms when

    |y[m, n] - ref[m, n]| <= factor * sqrt(K) * 2^-24 * S[m, n] + spacing(|ref[m, n]|)
    S[m, n] = sum_k |a[m, k] * w[n, k]|

in float64, ``a`` being what the path multiplies and ``w`` the weight decoded with its
global; ``spacing`` is one spacing of a float16 / bfloat16 output (0 for float32), and an
output with ``S = 0`` must be exact. The factor and the paths are the spec version's
(:func:`nvfp4.tolerances.accumulation_floor`); this module computes ``S``
(:func:`absolute_sums`) and the bound (:func:`allowance`). The comparison that uses the
bound is :func:`nvfp4.testing.assert_within` (``allowance=``); the measurement behind the
factor is ``scripts/measure_cancellation.py``.
"""

from __future__ import annotations

from typing import Any, Final

import ml_dtypes
import numpy as np
import numpy.typing as npt

from .activations import FP8Activations, Q8Activations
from .dtypes import OUTPUT_DTYPES, dtype_name
from .planes import NVFP4Planes
from .reference import dequantize_unscaled, per_expert
from .spec import E4M3_VALUES
from .tolerances import AccumulationFloor

__all__ = ["FLOAT32_UNIT", "absolute_sums", "allowance", "output_spacing", "unit"]

F64 = npt.NDArray[np.float64]

#: One unit of a float32 rounding, relative: 2^-24.
FLOAT32_UNIT: Final = 2.0**-24


def unit(k: int) -> float:
    """The floor's unit per ``S``: ``sqrt(K) * 2^-24``. Rounding errors of a float32 sum
    behave like a random walk, so the error of K additions grows like ``sqrt(K)`` (every
    rounding going one way, ``K * 2^-24``, is not met in practice)."""
    return float(np.sqrt(k)) * FLOAT32_UNIT


def _unscaled(a: Any) -> tuple[F64, F64]:
    """``(|a| without its global [M, K], the global of each row [M])``, exactly in float64,
    for what a matmul path multiplies: an array (x itself: global 1), the NVFP4 activation
    planes of W4A4, or the int8 / FP8 activations of W4A8."""
    if isinstance(a, NVFP4Planes):
        values = dequantize_unscaled(a).astype(np.float64)
        return np.abs(values), np.abs(a.row_global().astype(np.float64))
    if isinstance(a, Q8Activations):  # d is per 32-value block: part of the values
        values = a.decoded()
        return np.abs(values), np.ones(values.shape[0])
    if isinstance(a, FP8Activations):
        values = E4M3_VALUES[a.codes].astype(np.float64)
        return np.abs(values), np.full(values.shape[0], abs(float(a.input_scale)))
    values = np.asarray(a)
    if values.ndim < 1:
        raise ValueError(f"absolute sums: x must be [..., K], found shape {values.shape}")
    if values.dtype.name == "bfloat16":
        values = values.astype(np.float32)
    rows = np.abs(values.astype(np.float64)).reshape(-1, values.shape[-1])
    return rows, np.ones(rows.shape[0])


def absolute_sums(a: Any, w: NVFP4Planes, expert_ids: Any = None) -> F64:
    """``S[m, n] = sum_k |a[m, k] * w[n, k]|`` in float64 ``[M, N]``, each factor with its
    global, in the reference's own form (the unscaled products summed, then times the
    globals).

    Args:
        a: what the path multiplies: x ``[..., K]`` (W4A16, any float dtype; ``S`` is then
            ``[..., N]``), or the
            activations the path quantized, decoded here: :class:`~nvfp4.planes.NVFP4Planes`
            (W4A4), :class:`~nvfp4.activations.Q8Activations` (W4A8 int8: an infinite ``d``
            gives an infinite ``S``), :class:`~nvfp4.activations.FP8Activations`.
        w: the weight, ``[N, K]``, or ``[E, N, K]`` with ``expert_ids``.
        expert_ids: ``[M]`` for ``gather_qmm``: row m's expert; a row whose id is outside
            ``[0, E)`` has ``S = 0`` (its output must be exactly 0).
    """
    values, row_global = _unscaled(a)

    def unscaled(rows: npt.NDArray[Any], we: NVFP4Planes) -> F64:
        wd = np.abs(dequantize_unscaled(we).astype(np.float64))
        with np.errstate(invalid="ignore"):  # an infinite d times a zero weight column
            y: F64 = rows @ wd.T
        return y

    if expert_ids is None:
        sums = unscaled(values, w) * np.abs(w.row_global().astype(np.float64))
    else:
        ids = np.asarray(expert_ids, dtype=np.int64).reshape(-1)
        sums = np.abs(per_expert(values, w, ids, unscaled))
    with np.errstate(invalid="ignore"):
        out = np.asarray(sums * row_global[:, None], np.float64)
    activations = isinstance(a, (NVFP4Planes, Q8Activations, FP8Activations))
    lead = out.shape[:1] if activations else np.shape(a)[:-1]
    return out.reshape(*lead, out.shape[-1])


def output_spacing(v: Any, dtype: Any) -> F64:
    """One spacing of output dtype ``dtype`` at ``|v|`` (its subnormal spacing below the
    normal range), in float64; 0 for float32, whose spacing the floor does not add."""
    name = dtype_name(dtype)
    size = np.shape(v)
    if name == "float32":
        return np.zeros(size)
    info = ml_dtypes.finfo(OUTPUT_DTYPES[name])  # type: ignore[no-untyped-call]
    magnitude = np.abs(np.asarray(v, np.float64))
    exponent = np.floor(np.log2(np.maximum(magnitude, float(info.tiny))))
    return np.asarray(2.0 ** (exponent - int(info.nmant)), np.float64)


def allowance(floor: AccumulationFloor, sums: Any, ref: Any, dtype: Any, k: int) -> F64:
    """The floor of every output element: ``floor.factor * sqrt(k) * 2^-24 * S +
    spacing(|ref|)`` where ``S > 0``, and 0 where ``S = 0`` (that output must be exact).
    ``sums`` is :func:`absolute_sums`; ``ref`` the float64 reference of the same shape;
    ``dtype`` the output dtype. An infinite ``S`` (a W4A8 row whose ``d`` is infinite) gives
    an infinite floor: its reference is not finite either, and such outputs are compared by
    their own rule (spec, "W4A8")."""
    s = np.asarray(sums, np.float64)
    r = np.asarray(ref, np.float64)
    if s.shape != r.shape:
        raise ValueError(f"accumulation floor: S has shape {s.shape}, the reference {r.shape}")
    with np.errstate(invalid="ignore", over="ignore"):
        bound = floor.factor * unit(k) * s + output_spacing(np.where(np.isfinite(r), r, 0), dtype)
    return np.asarray(np.where(s > 0, bound, 0.0), np.float64)
