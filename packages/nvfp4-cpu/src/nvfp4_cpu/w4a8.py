"""W4A8 int8 (spec 1.1, "W4A8", capability ``w4a8``) on top of the C kernels, with an
explicit instruction-set level and thread count (the backend object fills those in).

* :func:`quantize_activations_q8` - ggml's Q8_0 of ``x [M, K]`` (blocks of 32 along K,
  ``d = amax / 127`` as float16, codes ``roundf(x * (1 / d))``), bit-identical to
  :func:`nvfp4.reference.quantize_activations_q8`;
* :func:`qmm_w4a8` - x quantized by the same C code, then exact int32 dot products per
  16-element weight block on the prepared (tiled) weight, one float32 step per block
  (``isum * e4m3 * d / 2``), the row's global once after accumulation;
* :func:`gather_qmm_w4a8` - MoE: rows grouped by expert; ids outside ``[0, E)`` give exactly
  zero rows and their x is never read.

W4A8 FP8 (capability ``w4a8_fp8``):

* :func:`quantize_activations_fp8` - ``e4m3(x / input_scale)`` in C, bit-identical to
  :func:`nvfp4.reference.quantize_activations_fp8` (dynamic scale: ``amax / 448`` over the
  finite values, one float32 division, 1.0 when 0);
* :func:`qmm_w4a8_fp8` - emulated: the FP8 codes decoded exactly (E4M3 values are float32
  values; NaN for the NaN byte), a float32 kernel with exact products and three-level
  accumulation (16-element blocks, 256 elements, the rest), then ``input_scale`` once.

Operands are checked by core (:mod:`nvfp4.contract`): x 2-D ``[M, K]``, M >= 1, K a
multiple of 32. float16 / bfloat16 x converts to float32 once (exactly).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4 import reference
from nvfp4.activations import FP8Activations, Q8Activations
from nvfp4.reference import fp8_input_scale_from_amax
from nvfp4.spec import E4M3_VALUES, Q8_BLOCK_SIZE, Q8_MAX

from ._native import ISA_LEVELS, Native, ptr
from .layout import PreparedWeight
from .ops import cast_output, finite_absmax, matmul_f32

__all__ = [
    "gather_qmm_w4a8",
    "qmm_w4a8",
    "qmm_w4a8_fp8",
    "quantize_activations_fp8",
    "quantize_activations_q8",
]


def quantize_activations_q8(
    native: Native, isa: str, threads: int, x: npt.NDArray[Any], *, name: str = "activation"
) -> Q8Activations:
    """Checked activations ``[M, K]`` -> :class:`~nvfp4.activations.Q8Activations` (codes
    int8 ``[M, K]``, d float16 ``[M, K/32]``; NaN d and zero codes for a block holding NaN
    or Inf)."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    m, k = a.shape
    codes = np.empty((m, k), dtype=np.int8)
    d = np.empty((m, k // Q8_BLOCK_SIZE), dtype=np.float16)
    rc = native.lib.nvfp4cpu_quantize_q8(
        ISA_LEVELS.index(isa), threads, ptr(a, ctypes.c_float), m, k, ptr(codes), ptr(d)
    )
    native.check(rc, f"quantize_activations_q8({name!r})")
    return Q8Activations(codes=codes, d=d, name=name)


def qmm_w4a8(
    native: Native,
    isa: str,
    threads: int,
    x: npt.NDArray[Any],
    w: PreparedWeight,
    *,
    out_dtype: str = "float32",
) -> npt.NDArray[Any]:
    """W4A8 int8 ``y = q8(x) @ decode(w).T`` (see the module docstring)."""
    y = matmul_f32(native, "nvfp4cpu_qmm_w4a8", isa, threads, x, w)
    return cast_output(_infinite_d_rows(native, threads, x, w, y), out_dtype)


def gather_qmm_w4a8(
    native: Native,
    isa: str,
    threads: int,
    x: npt.NDArray[Any],
    w: PreparedWeight,
    expert_ids: npt.NDArray[Any],
    *,
    out_dtype: str = "float32",
) -> npt.NDArray[Any]:
    """MoE W4A8 int8: row ``m`` of ``x`` times expert ``expert_ids[m]`` of ``w [E, N, K]``,
    sorted or not (a stable counting sort in C); an id outside ``[0, E)`` gives an exactly
    zero row and reads nothing."""
    y = matmul_f32(native, "nvfp4cpu_gather_qmm_w4a8", isa, threads, x, w, expert_ids)
    return cast_output(_infinite_d_rows(native, threads, x, w, y, expert_ids), out_dtype)


#: Below this ``amax`` a block's ``d = amax / 127`` rounds to a finite float16 (65504 the
#: largest); a little below the exact bound, so nothing past it is missed.
_D_FINITE_UP_TO = float(Q8_MAX) * 65504.0


def _infinite_d_rows(
    native: Native,
    threads: int,
    x: npt.NDArray[Any],
    w: PreparedWeight,
    y: npt.NDArray[np.float32],
    expert_ids: npt.NDArray[Any] | None = None,
) -> npt.NDArray[np.float32]:
    """``y`` with its rows of finite x but non-finite outputs recomputed by the reference.

    A block of finite x whose ``amax / 127`` is beyond float16's 65504 has ``d = inf``.
    Spec 1.1 multiplies ``d`` into each 16-element weight block's term, so that row's
    outputs are infinities of the terms' signs or NaN (``0 * inf``, or both infinities);
    the AVX-512, NEON and portable kernels add a 32-element block's two halves before
    multiplying by ``d`` and can give an infinity where the spec's terms give NaN. Such
    rows (activations past 8.3e6; found by the activation fuzz) are rare, so they are
    recomputed in float64 by :mod:`nvfp4.reference` (its encoder is bit-identical to this
    backend's); rows holding NaN or Inf are NaN either way and stay as they are."""
    a = np.asarray(x)
    if not float(np.fmax.reduce(np.abs(a), axis=None)) > _D_FINITE_UP_TO:  # NaN ignored
        return y  # every d finite: the kernels' grouping is a rounding difference only
    redo = np.isfinite(a).all(axis=1) & ~np.isfinite(y).all(axis=1)
    if not redo.any():
        return y
    planes = w.to_planes(native, threads)
    rows = np.ascontiguousarray(a[redo], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        if expert_ids is None:
            fixed = reference.qmm_w4a8_2d(rows, planes)
        else:
            ids = np.asarray(expert_ids, dtype=np.int64)[redo]
            fixed = reference.gather_qmm_w4a8_2d(rows, planes, ids)
        y[redo] = fixed.astype(np.float32)
    return y


def quantize_activations_fp8(
    native: Native,
    threads: int,
    x: npt.NDArray[Any],
    input_scale: float | None = None,
    *,
    name: str = "activation",
) -> FP8Activations:
    """Checked activations ``[M, K]`` -> :class:`~nvfp4.activations.FP8Activations`:
    ``input_scale`` (a decode multiplier) when given, else dynamic ``amax / 448`` over the
    finite values (1.0 where that is 0); NaN / Inf elements get the NaN byte 0x7F."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    if input_scale is None:
        s = fp8_input_scale_from_amax(finite_absmax(native, a))
    else:
        s = np.float32(input_scale)
    codes = np.empty(a.shape, dtype=np.uint8)
    rc = native.lib.nvfp4cpu_quantize_fp8(
        threads, ptr(a, ctypes.c_float), a.size, float(s), ptr(codes)
    )
    native.check(rc, f"quantize_activations_fp8({name!r})")
    return FP8Activations(codes=codes, input_scale=np.asarray(s, dtype=np.float32), name=name)


def qmm_w4a8_fp8(
    native: Native,
    isa: str,
    threads: int,
    x: npt.NDArray[Any],
    w: PreparedWeight,
    *,
    input_scale: float | None = None,
    out_dtype: str = "float32",
) -> npt.NDArray[Any]:
    """Emulated W4A8 FP8: x encoded by :func:`quantize_activations_fp8`, decoded exactly,
    multiplied in float32 (``nvfp4cpu_qmm_fp8``: blocked accumulation, the row global after
    it), then by ``input_scale`` once. ``isa`` is accepted for symmetry; the kernel is plain
    C."""
    xq = quantize_activations_fp8(native, threads, x, input_scale, name=f"{w.name}.input")
    xd = np.ascontiguousarray(E4M3_VALUES[xq.codes], dtype=np.float32)
    m = xd.shape[0]
    y = np.empty((m, w.n), dtype=np.float32)
    rc = native.lib.nvfp4cpu_qmm_fp8(
        threads,
        ptr(w.codes),
        ptr(w.scales),
        ptr(w.row_global, ctypes.c_float),
        w.n,
        w.k,
        ptr(xd, ctypes.c_float),
        m,
        ptr(y, ctypes.c_float),
    )
    native.check(rc, f"qmm_w4a8_fp8({w.name!r})")
    with np.errstate(over="ignore"):  # past float32's range: inf, as the reference's cast
        y *= np.float32(xq.input_scale)
    return cast_output(y, out_dtype)
