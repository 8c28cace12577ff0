"""The array-level operations on top of the C kernels, with an explicit instruction-set
level and thread count (the backend object fills those in).

Each function checks its arguments the way :mod:`nvfp4.reference` does (same refusals,
same messages where it makes sense), converts activations to float32 once, runs one C call
and casts the float32 result to the requested dtype with round-to-nearest-even.

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
from nvfp4.dtypes import OUTPUT_DTYPES, as_float32_input, resolve_dtype
from nvfp4.inputs import check_expert_ids, check_x
from nvfp4.planes import NVFP4Planes
from nvfp4.reference import dequantize_unscaled, global_from_amax
from nvfp4.spec import BLOCK_SIZE

from ._native import ISA_LEVELS, Native, ptr
from .layout import PreparedWeight, prepare

__all__ = [
    "dequantize",
    "gather_qmm",
    "qmm",
    "qmm_w4a4",
    "quantize_activations",
    "read_probe",
]

_KIND = {"float32": 0, "float16": 1, "bfloat16": 2}


def as_prepared(w: Any, native: Native, threads: int, what: str) -> PreparedWeight:
    """A :class:`PreparedWeight` as is; canonical planes validated (content too) and tiled."""
    if isinstance(w, PreparedWeight):
        return w
    if isinstance(w, NVFP4Planes):
        return prepare(w, native, threads)
    raise TypeError(
        f"{what}: expected a weight from CPUBackend.prepare() (or nvfp4.NVFP4Planes), "
        f"found {type(w).__name__}"
    )


def cast_output(y: npt.NDArray[np.float32], out_dtype: Any) -> npt.NDArray[Any]:
    """float32 result -> ``out_dtype`` (float64 widens; float16 / bfloat16 round to nearest
    even), as the reference's output rule."""
    if out_dtype is not None and np.dtype(out_dtype) == np.float64:
        return y.astype(np.float64)
    d = resolve_dtype(np.float32 if out_dtype is None else out_dtype)
    return y if d == np.float32 else y.astype(d)


def _qmm_f32(
    native: Native,
    isa: str,
    threads: int,
    a: npt.NDArray[np.float32],
    w: PreparedWeight,
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """The kernel on float32 ``a [M, K]`` -> float32 ``[M, N]`` (into ``out`` when given)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    m = a.shape[0]
    if out is None:
        out = np.empty((m, w.n), dtype=np.float32)
    elif out.shape != (m, w.n) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(
            f"qmm({w.name!r}): out must be C-contiguous float32 {(m, w.n)}, found "
            f"{out.dtype} {out.shape}{'' if out.flags.c_contiguous else ' (not contiguous)'}"
        )
    if m:
        rc = native.lib.nvfp4cpu_qmm(
            ISA_LEVELS.index(isa),
            threads,
            ptr(w.codes),
            ptr(w.scales),
            ptr(w.row_global, ctypes.c_float),
            w.n,
            w.k,
            ptr(a, ctypes.c_float),
            m,
            ptr(out, ctypes.c_float),
        )
        native.check(rc, f"qmm({w.name!r})")
    return out


def qmm(
    native: Native,
    isa: str,
    threads: int,
    x: Any,
    w: Any,
    *,
    out_dtype: Any = np.float32,
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[Any]:
    """W4A16 ``y[..., n] = (sum_k x[..., k] * e2m1*e4m3[n, k]) * global[n]``.

    ``x`` is ``[..., K]`` float32 (float16 / bfloat16 / float64 are converted once);
    accumulation is float32; the result is cast to ``out_dtype``. ``out``: a pre-allocated
    C-contiguous float32 ``[M, N]`` (M = the rows of x) written in place and returned (float32
    output only)."""
    pw = as_prepared(w, native, threads, "qmm")
    if pw.num_experts is not None:
        raise ValueError(f"qmm({pw.name!r}): expert-stacked weights go through gather_qmm")
    a = check_x(x, pw.k, f"qmm({pw.name!r})")
    lead = a.shape[:-1]
    if out is not None:
        if resolve_dtype(np.float32 if out_dtype is None else out_dtype) != np.float32:
            raise ValueError(f"qmm({pw.name!r}): out= needs out_dtype float32")
        return _qmm_f32(native, isa, threads, a.reshape(-1, pw.k), pw, out)
    y = _qmm_f32(native, isa, threads, a.reshape(-1, pw.k), pw)
    return cast_output(y.reshape(*lead, pw.n), out_dtype)


def gather_qmm(
    native: Native,
    isa: str,
    threads: int,
    x: Any,
    w: Any,
    expert_ids: Any,
    *,
    sorted_indices: bool = False,
    out_dtype: Any = np.float32,
) -> npt.NDArray[Any]:
    """MoE W4A16: row ``m`` of ``x [M, K]`` times expert ``expert_ids[m]`` of ``w [E, N, K]``.

    Sorted or not, the kernel groups rows by expert (a stable counting sort in C) and streams
    each expert's weights once for all its rows. An id outside ``[0, E)`` gives an exactly
    zero row and reads nothing. ``sorted_indices=True`` with unsorted ids is refused, as in
    the reference."""
    pw = as_prepared(w, native, threads, "gather_qmm")
    e = pw.num_experts
    if e is None:
        raise ValueError(f"gather_qmm({pw.name!r}): weights must be [E, N, K], found {pw.shape}")
    a = check_x(x, pw.k, f"gather_qmm({pw.name!r})")
    if a.ndim != 2:
        raise ValueError(f"gather_qmm({pw.name!r}): x must be [M, K], found shape {a.shape}")
    ids = check_expert_ids(
        expert_ids, a.shape[0], f"gather_qmm({pw.name!r})", sorted_indices=sorted_indices
    )
    # ids beyond int64 (uint64 >= 2^63) are out of range whatever they wrap to: map to -1
    ids64 = np.where(ids > np.iinfo(np.int64).max, -1, ids) if ids.dtype == np.uint64 else ids
    ids64 = np.ascontiguousarray(ids64, dtype=np.int64)
    a = np.ascontiguousarray(a, dtype=np.float32)
    m = a.shape[0]
    out = np.empty((m, pw.n), dtype=np.float32)
    if m:
        rc = native.lib.nvfp4cpu_gather_qmm(
            ISA_LEVELS.index(isa),
            threads,
            ptr(pw.codes),
            ptr(pw.scales),
            ptr(pw.row_global, ctypes.c_float),
            e,
            pw.n,
            pw.k,
            ptr(a, ctypes.c_float),
            m,
            ptr(ids64, ctypes.c_int64),
            ptr(out, ctypes.c_float),
        )
        native.check(rc, f"gather_qmm({pw.name!r})")
    return cast_output(out, out_dtype)


def dequantize(
    native: Native, isa: str, threads: int, w: Any, dtype: Any = "float32"
) -> npt.NDArray[Any]:
    """Exact decode: ``(e2m1 * e4m3) * global`` in float32, then one nearest-even cast."""
    pw = as_prepared(w, native, threads, "dequantize")
    d = resolve_dtype(dtype)
    kind = next(_KIND[name] for name, v in OUTPUT_DTYPES.items() if v == d)
    storage = np.float32 if kind == 0 else np.uint16
    out = np.empty((pw.experts, pw.n, pw.k), dtype=storage)
    rc = native.lib.nvfp4cpu_dequantize(
        ISA_LEVELS.index(isa),
        threads,
        ptr(pw.codes),
        ptr(pw.scales),
        ptr(pw.row_global, ctypes.c_float),
        pw.experts,
        pw.n,
        pw.k,
        kind,
        out.ctypes.data_as(ctypes.c_void_p),
    )
    native.check(rc, f"dequantize({pw.name!r})")
    return out.view(d).reshape(pw.shape)


def quantize_activations(
    native: Native, threads: int, x: Any, input_scale: Any = None, *, name: str = "activation"
) -> NVFP4Planes:
    """Activations ``[M, K]`` -> NVFP4 planes, bit-identical to the reference.

    Global: ``input_scale`` (a decode multiplier) when given, else ``amax / 2688`` over the
    finite values. A block with NaN or Inf gets scale byte 0x7F and zero codes."""
    what = f"quantize_activations({name!r})"
    a = as_float32_input(x, what)
    if a.ndim != 2:
        raise ValueError(f"{what}: x must be [M, K], found shape {a.shape}")
    m, k = a.shape
    if k == 0 or k % BLOCK_SIZE:
        raise ValueError(f"{what}: K must be a positive multiple of 16, found {k}")
    if m == 0:
        raise ValueError(f"{what}: expected at least one row, found shape {a.shape}")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if input_scale is None:
        amax = native.lib.nvfp4cpu_finite_absmax(ptr(a, ctypes.c_float), a.size)
        g = global_from_amax(np.float32(amax))  # 1.0 where amax / 2688 is 0
    else:
        g = np.asarray(input_scale, dtype=np.float32).reshape(())
        if not (np.isfinite(g) and g > 0):
            raise ValueError(f"{what}: input_scale must be finite and > 0, found {g!r}")
    codes = np.empty((m, k // 2), dtype=np.uint8)
    scales = np.empty((m, k // BLOCK_SIZE), dtype=np.uint8)
    rc = native.lib.nvfp4cpu_quantize_activations(
        threads, ptr(a, ctypes.c_float), m, k, float(g), ptr(codes), ptr(scales)
    )
    native.check(rc, what)
    return NVFP4Planes(
        codes=codes, scales=scales, global_scale=np.asarray(g, np.float32), name=name
    )


def qmm_w4a4(
    native: Native,
    isa: str,
    threads: int,
    x: Any,
    w: Any,
    *,
    input_scale: Any = None,
    out_dtype: Any = np.float32,
) -> npt.NDArray[Any]:
    """Emulated W4A4: ``x`` quantized as :func:`quantize_activations`, decoded exactly
    (``e2m1 * e4m3``, NaN for a 0x7F block), multiplied by the W4A16 kernel, then by the
    activation global once."""
    pw = as_prepared(w, native, threads, "qmm_w4a4")
    if pw.num_experts is not None:
        raise ValueError(f"qmm_w4a4({pw.name!r}): expert-stacked weights are not supported here")
    a = check_x(x, pw.k, f"qmm_w4a4({pw.name!r})")
    lead = a.shape[:-1]
    xp = quantize_activations(
        native, threads, a.reshape(-1, pw.k), input_scale, name=f"{pw.name}.input"
    )
    xd = dequantize_unscaled(xp)
    y = _qmm_f32(native, isa, threads, xd, pw)
    y *= np.float32(xp.global_scale)
    return cast_output(y.reshape(*lead, pw.n), out_dtype)


def read_probe(native: Native, isa: str, threads: int, buf: npt.NDArray[Any]) -> int:
    """Read every whole MiB of ``buf`` with ``threads`` threads and the level's
    widest loads (a STREAM-style read, for bandwidth measurements: time it); returns a
    checksum."""
    a = np.ascontiguousarray(buf)
    return int(
        native.lib.nvfp4cpu_read_probe(
            ISA_LEVELS.index(isa), threads, a.ctypes.data_as(ctypes.c_void_p), a.nbytes
        )
    )
