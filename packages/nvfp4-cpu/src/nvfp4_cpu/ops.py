"""The array-level operations on top of the C kernels, with an explicit instruction-set
level and thread count (the backend object fills those in).

Each function takes operands core has checked (:mod:`nvfp4.contract`: ``x`` 2-D ``[M, K]``
with M >= 1, a prepared weight of the right kind, a spec dtype name), converts activations
to float32 once, runs one C call and casts the float32 result to the requested dtype with
round-to-nearest-even.

* :func:`qmm` - W4A16 ``x @ decode(w).T``, float32 accumulation, the global applied once per
  output after accumulation;
* :func:`gather_qmm` - MoE: row m times expert ``ids[m]``; rows grouped by expert so each
  expert's weights stream once; ids outside ``[0, E)`` give exactly zero rows;
* :func:`dequantize` - exact (bit-identical to :func:`nvfp4.reference.dequantize`);
* :func:`quantize_activations` - bit-identical to :func:`nvfp4.reference.quantize_activations`;
* :func:`qmm_w4a4` - activations quantized by :func:`quantize_activations`, decoded exactly,
  then the W4A16 kernel (declared as emulated W4A4).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes
from nvfp4.reference import dequantize_unscaled, global_from_amax
from nvfp4.spec import BLOCK_SIZE

from ._native import ISA_LEVELS, Native, ptr
from .layout import PreparedWeight

__all__ = [
    "dequantize",
    "gather_qmm",
    "qmm",
    "qmm_w4a4",
    "quantize_activations",
]

_KIND = {"float32": 0, "float16": 1, "bfloat16": 2}


def cast_output(y: npt.NDArray[np.float32], out_dtype: str) -> npt.NDArray[Any]:
    """The float32 result as ``out_dtype`` (a spec dtype name), rounded to nearest even;
    a value beyond float16's range becomes +-inf, as the reference's cast gives."""
    if out_dtype == "float32":
        return y
    with np.errstate(over="ignore"):  # float16 overflow to +-inf is the cast's defined result
        return y.astype(OUTPUT_DTYPES[out_dtype])


def weight_args(isa: str, threads: int, w: PreparedWeight) -> tuple[Any, ...]:
    """The arguments every weight kernel starts with: the instruction-set level, the thread
    count, then the weight's codes, scale bytes and per-row globals."""
    return (ISA_LEVELS.index(isa), threads, *w.pointers)


def finite_absmax(native: Native, a: npt.NDArray[np.float32]) -> np.float32:
    """max |a| over the finite values of a C-contiguous float32 array (0 when none): the
    amax of a dynamic activation scale."""
    return np.float32(native.lib.nvfp4cpu_finite_absmax(ptr(a, ctypes.c_float), a.size))


def matmul_f32(
    native: Native,
    entry: str,
    isa: str,
    threads: int,
    x: npt.NDArray[Any],
    w: PreparedWeight,
    expert_ids: npt.NDArray[Any] | None = None,
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """One matmul entry point of the library on ``x [M, K]`` (converted to float32 once) ->
    float32 ``[M, N]`` (into ``out`` when given). ``entry``: ``nvfp4cpu_qmm`` or
    ``nvfp4cpu_qmm_w4a8`` (one matrix, ``expert_ids`` None), ``nvfp4cpu_gather_qmm`` or
    ``nvfp4cpu_gather_qmm_w4a8`` (an expert stack and one id per row); errors name the verb
    (the entry without its prefix) and the weight."""
    verb = f"{entry.removeprefix('nvfp4cpu_')}({w.name!r})"
    a = np.ascontiguousarray(x, dtype=np.float32)
    m = a.shape[0]
    if out is None:
        out = np.empty((m, w.n), dtype=np.float32)
    elif out.shape != (m, w.n) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(
            f"{verb}: out must be C-contiguous float32 {(m, w.n)}, found "
            f"{out.dtype} {out.shape}{'' if out.flags.c_contiguous else ' (not contiguous)'}"
        )
    if expert_ids is None:
        rows: tuple[Any, ...] = (w.n, w.k, ptr(a, ctypes.c_float), m)
    else:
        assert w.num_experts is not None  # core sends expert stacks only
        ids64 = np.ascontiguousarray(expert_ids, dtype=np.int64)
        rows = (w.num_experts, w.n, w.k, ptr(a, ctypes.c_float), m, ptr(ids64, ctypes.c_int64))
    if m:
        rc = getattr(native.lib, entry)(
            *weight_args(isa, threads, w), *rows, ptr(out, ctypes.c_float)
        )
        native.check(rc, verb)
    return out


def qmm_f32(
    native: Native,
    isa: str,
    threads: int,
    a: npt.NDArray[Any],
    w: PreparedWeight,
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """The W4A16 kernel on ``a [M, K]`` -> float32 ``[M, N]`` (into ``out`` when given)."""
    return matmul_f32(native, "nvfp4cpu_qmm", isa, threads, a, w, out=out)


def qmm(
    native: Native,
    isa: str,
    threads: int,
    x: npt.NDArray[Any],
    w: PreparedWeight,
    *,
    out_dtype: str = "float32",
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[Any]:
    """W4A16 ``y[m, n] = (sum_k x[m, k] * e2m1*e4m3[n, k]) * global[n]`` on a checked
    ``x [M, K]`` (float16 / bfloat16 converted to float32 once); float32 accumulation; the
    result cast to ``out_dtype``. ``out``: a pre-allocated C-contiguous float32 ``[M, N]``
    written in place and returned (float32 output only; the benchmark uses it)."""
    if out is not None and out_dtype != "float32":
        raise ValueError(f"qmm({w.name!r}): out= needs out_dtype float32")
    return cast_output(qmm_f32(native, isa, threads, x, w, out), out_dtype)


def gather_qmm(
    native: Native,
    isa: str,
    threads: int,
    x: npt.NDArray[Any],
    w: PreparedWeight,
    expert_ids: npt.NDArray[Any],
    *,
    out_dtype: str = "float32",
) -> npt.NDArray[Any]:
    """MoE W4A16: row ``m`` of ``x [M, K]`` times expert ``expert_ids[m]`` of ``w [E, N, K]``.

    Sorted or not, the kernel groups rows by expert (a stable counting sort in C) and streams
    each expert's weights once for all its rows. An id outside ``[0, E)`` gives an exactly
    zero row and reads nothing."""
    y = matmul_f32(native, "nvfp4cpu_gather_qmm", isa, threads, x, w, expert_ids)
    return cast_output(y, out_dtype)


def dequantize(
    native: Native, isa: str, threads: int, w: PreparedWeight, dtype: str = "float32"
) -> npt.NDArray[Any]:
    """Exact decode: ``(e2m1 * e4m3) * global`` in float32, then one nearest-even cast."""
    kind = _KIND[dtype]
    storage = np.float32 if kind == 0 else np.uint16
    out = np.empty((w.experts, w.n, w.k), dtype=storage)
    rc = native.lib.nvfp4cpu_dequantize(
        *weight_args(isa, threads, w),
        w.experts,
        w.n,
        w.k,
        kind,
        out.ctypes.data_as(ctypes.c_void_p),
    )
    native.check(rc, f"dequantize({w.name!r})")
    return out.view(OUTPUT_DTYPES[dtype]).reshape(w.shape)


def quantize_activations(
    native: Native,
    threads: int,
    x: npt.NDArray[Any],
    input_scale: float | None = None,
    *,
    name: str = "activation",
) -> NVFP4Planes:
    """Checked activations ``[M, K]`` -> NVFP4 planes, bit-identical to the reference.

    Global: ``input_scale`` (a decode multiplier) when given, else ``amax / 2688`` over the
    finite values. A block with NaN or Inf gets scale byte 0x7F and zero codes."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    m, k = a.shape
    if input_scale is None:
        g = global_from_amax(finite_absmax(native, a))  # 1.0 where amax / 2688 is 0
    else:
        g = np.asarray(input_scale, dtype=np.float32).reshape(())
    codes = np.empty((m, k // 2), dtype=np.uint8)
    scales = np.empty((m, k // BLOCK_SIZE), dtype=np.uint8)
    rc = native.lib.nvfp4cpu_quantize_activations(
        threads, ptr(a, ctypes.c_float), m, k, float(g), ptr(codes), ptr(scales)
    )
    native.check(rc, f"quantize_activations({name!r})")
    return NVFP4Planes(
        codes=codes, scales=scales, global_scale=np.asarray(g, np.float32), name=name
    )


def qmm_w4a4(
    native: Native,
    isa: str,
    threads: int,
    x: npt.NDArray[Any],
    w: PreparedWeight,
    *,
    input_scale: float | None = None,
    out_dtype: str = "float32",
) -> npt.NDArray[Any]:
    """Emulated W4A4: ``x`` quantized as :func:`quantize_activations`, decoded exactly
    (``e2m1 * e4m3``, NaN for a 0x7F block), multiplied by the W4A16 kernel, then by the
    activation global once."""
    xp = quantize_activations(native, threads, x, input_scale, name=f"{w.name}.input")
    y = qmm_f32(native, isa, threads, dequantize_unscaled(xp), w)
    with np.errstate(over="ignore"):  # past float32's range: inf, as the reference's cast
        y *= np.float32(xp.global_scale)
    return cast_output(y, out_dtype)
