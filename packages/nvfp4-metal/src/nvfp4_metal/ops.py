"""NVFP4 operations on ``mx.array``: ``qmm``, ``gather_qmm``, ``dequantize``,
``quantize_activations`` and (where MLX supports it) ``qmm_w4a4``.

**Matmul.** ``qmm`` is ``mx.quantized_matmul(mode="nvfp4", transpose=True)`` followed by the
sidecar multiply (the decode global, per row for fused partitions), built as one graph and
compiled with ``mx.compile``. ``gather_qmm`` is ``mx.gather_qmm(mode="nvfp4")`` with the
per-expert (and per-partition) global gathered per row, sorted and unsorted. Expert ids
outside ``[0, E)`` are clamped for the gather (so nothing is read out of bounds) and their
output rows replaced by exact zeros with ``mx.where`` - not a multiply, so a NaN or Inf in
such a row of ``x`` cannot leak.

**Compute dtype.** The product is always computed in float32 and cast once to the output
dtype (x's dtype by default):

* float16 cannot hold the product before the global is applied (the codes times the E4M3
  scales reach ``6 * 448 * sum|x|``: the global, often ~1e-4, is what brings it back);
* on MLX's CPU device the float32 kernels are also the fast ones: measured on this project's
  2-core x86 VM, a 2048 x 2048 weight at M = 1 took 2.9 ms with float32 activations and
  29 ms with bfloat16 (M = 32: 105 ms vs 839 ms).

**No decode/prefill split.** A second path for large M (decode the weight densely, then a
dense matmul) was measured against the fused kernel on MLX's CPU device and lost at every M
tried (2048 x 2048, float32: M = 32 fused 105 ms vs 207 ms; M = 128: 519 vs 669 ms; M = 512:
1927 vs 2760 ms), so there is one path. On Metal it has not been measured by this project;
MLX's own kernels already switch between ``qmv`` and ``qmm`` by M.

**Dequantize** is exact per spec 1.0: ``mx.dequantize`` without a global gives
``e2m1(code) * e4m3(scale)`` exactly in float32 (checked against the spec tables for every
code and scale byte by the tests); the global is multiplied here in float32 (one rounding),
then cast with round-to-nearest-even. MLX's CPU dequantize needs K % 32 == 0: a K % 32 == 16
weight is padded with zero code words and zero scale bytes for the call and the padding
dropped (:func:`nvfp4_metal.transcode.pad_k32`).

**Activations.** :func:`quantize_activations` re-implements the reference encoder with MLX
element-wise ops in the reference's float32 order (no ``mx.quantize``, whose CPU path
breaks ties toward zero): bit-identical to :func:`nvfp4.reference.quantize_activations`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import mlx.core as mx
import numpy as np
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import (
    BLOCK_SIZE,
    E2M1_BOUNDS,
    E2M1_ODD_BOUNDS,
    E4M3_MAX,
    E4M3_MIN_SUBNORMAL,
    E4M3_NAN_BYTE,
    GLOBAL_AMAX_DIVISOR,
)

from .transcode import MetalWeight, decode_native

__all__ = [
    "MX_DTYPES",
    "dequantize",
    "gather_qmm",
    "linear",
    "linear_arrays",
    "mx_dtype",
    "qmm",
    "qmm_w4a4",
    "quantize_activations",
    "switch_arrays",
]

#: Output dtypes by spec name.
MX_DTYPES: dict[str, mx.Dtype] = {
    "float32": mx.float32,
    "float16": mx.float16,
    "bfloat16": mx.bfloat16,
}
#: Scale byte of an activation block holding NaN or Inf (as the reference writes it).
NONFINITE_BLOCK_SCALE = E4M3_NAN_BYTE
_F32 = mx.float32


# ---------------------------------------------------------------------- conversions
def mx_dtype(x: mx.array, out_dtype: str | None) -> mx.Dtype:
    """A spec dtype name as an MLX dtype; ``None`` means x's dtype."""
    return x.dtype if out_dtype is None else MX_DTYPES[out_dtype]


# ------------------------------------------------------------------------- compiling
@functools.lru_cache(maxsize=1)
def compile_works() -> bool:
    """Whether ``mx.compile`` runs here (on MLX's CPU device it builds C++ with the system
    compiler). When it does not, the same graphs run uncompiled."""
    try:
        f = mx.compile(lambda a, b: (a * b).astype(mx.float16))
        mx.eval(f(mx.ones((2, 3)), mx.array(0.5, dtype=mx.float32)))
    except Exception:
        return False
    return True


def _compiled(fn: Callable[..., mx.array]) -> Callable[..., mx.array]:
    return mx.compile(fn) if compile_works() else fn


@functools.cache
def _linear_graph(impl: str, group_size: int, out: mx.Dtype) -> Callable[..., mx.array]:
    """``x -> (qmm(x in float32) * sidecar).astype(out)`` (native) or the affine qmm."""
    if impl == "native":

        def native(x: mx.array, w: mx.array, s: mx.array, g: mx.array) -> mx.array:
            y = mx.quantized_matmul(
                x.astype(_F32), w, s, transpose=True, group_size=BLOCK_SIZE, bits=4, mode="nvfp4"
            )
            return (y * g).astype(out)

        return _compiled(native)

    def affine(x: mx.array, w: mx.array, s: mx.array, b: mx.array) -> mx.array:
        y = mx.quantized_matmul(
            x.astype(_F32), w, s, b, transpose=True, group_size=group_size, bits=4, mode="affine"
        )
        return y.astype(out)

    return _compiled(affine)


@functools.cache
def _gather_graph(impl: str, group_size: int, out: mx.Dtype, sort: bool) -> Callable[..., mx.array]:
    """``(x, ids) -> gather_qmm`` with clamped ids, the gathered sidecar, and exact zeros
    (``mx.where``) for ids outside ``[0, E)``. ``x`` is ``[..., 1, K]`` broadcast against
    ``ids`` (mlx-lm's SwitchLinear convention); the output is ``ids.shape + (1, N)``."""

    def gather(x: mx.array, w: mx.array, s: mx.array, extra: mx.array, ids: mx.array) -> mx.array:
        e = w.shape[0]
        valid = (ids >= 0) & (ids < e)
        idc = mx.clip(ids, 0, e - 1).astype(mx.uint32)
        native = impl == "native"  # extra: the row-global sidecar, else the affine biases
        y = mx.gather_qmm(
            x.astype(_F32),
            w,
            s,
            None if native else extra,
            rhs_indices=idc,
            transpose=True,
            group_size=BLOCK_SIZE if native else group_size,
            bits=4,
            mode="nvfp4" if native else "affine",
            sorted_indices=sort,
        )
        if native:
            y = y * mx.expand_dims(extra[idc], -2)
        y = mx.where(mx.expand_dims(valid, (-1, -2)), y, mx.array(0.0, dtype=_F32))
        return y.astype(out)

    return _compiled(gather)


# ------------------------------------------------------------------------ the verbs
def linear_arrays(
    x: mx.array,
    w: mx.array,
    s: mx.array,
    extra: mx.array,
    *,
    impl: str,
    group_size: int,
    out: mx.Dtype | None = None,
) -> mx.array:
    """The compiled W4A16 graph, no validation (the modules' hot path): ``x [..., K] ->
    [..., N]`` in ``out`` (default x's dtype). ``extra`` is the global sidecar (native) or
    the affine biases."""
    fn = _linear_graph(impl, group_size, out if out is not None else x.dtype)
    return fn(x, w, s, extra)


def switch_arrays(
    x: mx.array,
    w: mx.array,
    s: mx.array,
    extra: mx.array,
    indices: mx.array,
    *,
    impl: str,
    group_size: int,
    sorted_indices: bool = False,
    out: mx.Dtype | None = None,
) -> mx.array:
    """The compiled MoE graph, no validation (the modules' hot path): ``x [..., 1, K]``
    broadcast against ``indices`` -> ``indices.shape + (1, N)`` in ``out`` (default x's)."""
    fn = _gather_graph(impl, group_size, out if out is not None else x.dtype, bool(sorted_indices))
    return fn(x, w, s, extra, indices)


def _extra(w: MetalWeight) -> mx.array:
    extra = w.row_global if w.impl == "native" else w.biases
    assert extra is not None
    return extra


def linear(x: mx.array, w: MetalWeight, out: mx.Dtype | None = None) -> mx.array:
    """:func:`linear_arrays` on a :class:`~nvfp4_metal.transcode.MetalWeight`."""
    return linear_arrays(
        x, w.weight, w.scales, _extra(w), impl=w.impl, group_size=w.group_size, out=out
    )


def qmm(x: mx.array, w: MetalWeight, *, out_dtype: str | None = None) -> mx.array:
    """W4A16 ``y = (x @ (e2m1*e4m3)(w).T) * global`` for a 2-D prepared weight; ``x [M, K]``
    as core checked it, the output ``[M, N]`` in ``out_dtype`` (default x's)."""
    return linear(x, w, mx_dtype(x, out_dtype))


def gather_qmm(
    x: mx.array,
    w: MetalWeight,
    expert_ids: mx.array,
    *,
    sorted_indices: bool = False,
    out_dtype: str | None = None,
) -> mx.array:
    """MoE W4A16: row ``m`` of ``x [M, K]`` times expert ``expert_ids[m]`` of ``w
    [E, N, K]``, times that expert's (per-partition) global. Ids outside ``[0, E)`` give
    exactly zero rows and read nothing out of bounds. MLX trusts a sorted hint, so a hint
    the ids do not honour is dropped here (the result never depends on it)."""
    ids = expert_ids
    if sorted_indices and ids.size > 1 and not bool(mx.all(ids[1:] >= ids[:-1]).item()):
        sorted_indices = False
    y = switch_arrays(
        mx.expand_dims(x, -2),
        w.weight,
        w.scales,
        _extra(w),
        ids,
        impl=w.impl,
        group_size=w.group_size,
        sorted_indices=sorted_indices,
        out=mx_dtype(x, out_dtype),
    )
    return mx.squeeze(y, -2)


def dequantize(w: MetalWeight, dtype: str = "float32") -> mx.array:
    """Decode a prepared weight densely: exact for native weights (module docstring); the
    affine rollback decodes its own (lossy) bytes."""
    out = MX_DTYPES[dtype]
    if w.impl == "affine":
        d = mx.dequantize(
            w.weight, w.scales, w.biases, group_size=w.group_size, bits=4, mode="affine", dtype=_F32
        )
        return d.astype(out)
    return decode_native(w).astype(out)


# ----------------------------------------------------------------------- activations
def _e4m3_round_bytes(s: mx.array) -> tuple[mx.array, mx.array]:
    """Round float32 values in ``[2^-9, 448]`` to E4M3 (nearest, ties to even) and give
    ``(bytes, values)``. The binade's step ``2^(max(e, -6) - 3)`` is a power of two, so
    ``round(s / step) * step`` is exact (``mx.round`` rounds half to even); the byte is
    ``(max(e, -6) + 6) * 8 + round(s / step)``, which also covers the subnormals and a
    value rounding up into the next binade."""
    bits = s.view(mx.uint32)
    e = ((bits >> 23) & 0xFF).astype(mx.int32) - 127
    ee = mx.maximum(e, -6)
    step = ((ee - 3 + 127).astype(mx.uint32) << 23).view(mx.float32)
    r = mx.round(s / step)
    values = r * step
    byte = ((ee + 6) * 8 + r.astype(mx.int32)).astype(mx.uint8)
    return byte, values


def _e2m1_codes(q: mx.array, negative: mx.array) -> mx.array:
    """E2M1 codes of scaled values: the count of bounds strictly below ``|q|`` (ties round
    down), plus one at the ties whose even neighbour is above (0.75, 1.75, 3.5); sign bit
    ``negative``."""
    mag = mx.abs(q)
    idx = mx.zeros(q.shape, dtype=mx.uint8)
    for b in E2M1_BOUNDS.tolist():
        idx = idx + (mag > b).astype(mx.uint8)
    for b in E2M1_ODD_BOUNDS.tolist():
        idx = idx + (mag == b).astype(mx.uint8)
    return idx | (negative.astype(mx.uint8) << 3)


def quantize_activations(
    x: mx.array, input_scale: float | None = None, *, name: str = "activation"
) -> NVFP4Planes:
    """Quantize activations ``[M, K]`` with the reference's rule, in MLX ops, in the
    reference's float32 order (spec 1.0 "The reference encoder"):

    global = ``input_scale`` (a decode multiplier) or ``amax / 2688`` over the finite values
    (1.0 where that quotient is 0, as for amax 0 or one that underflows it);
    ``s = block_amax / (6 * global)``; ``s == 0 -> 1``; clamp to
    ``[2^-9, 448]``; E4M3 nearest-even; ``q = x / (e4m3(s) * global)``; E2M1 nearest-even,
    saturating; sign ``x < 0``. A block holding NaN or Inf gets scale byte 0x7F and zero
    codes. ``x [M, K]`` and ``input_scale`` as core checked them. Returns canonical planes
    (numpy)."""
    a = x.astype(_F32)
    m, k = a.shape
    finite = mx.isfinite(a)
    clean = mx.where(finite, a, mx.array(0.0, dtype=_F32))
    if input_scale is None:
        amax = mx.max(mx.abs(clean)) if clean.size else mx.array(0.0, dtype=_F32)
        g = amax / mx.array(float(GLOBAL_AMAX_DIVISOR), _F32)
        g = mx.where(g == 0, mx.array(1.0, dtype=_F32), g)
    else:
        g = mx.array(np.float32(input_scale))
    blocks = clean.reshape(m, k // BLOCK_SIZE, BLOCK_SIZE)
    block_amax = mx.max(mx.abs(blocks), axis=-1)
    s = block_amax / (mx.array(6.0, dtype=_F32) * g)
    s = mx.where(s == 0, mx.array(1.0, dtype=_F32), s)
    s = mx.clip(s, E4M3_MIN_SUBNORMAL, E4M3_MAX)
    byte, value = _e4m3_round_bytes(s)
    q = blocks / mx.expand_dims(value * g, -1)
    codes = _e2m1_codes(q, blocks < 0)
    bad = mx.logical_not(mx.all(finite.reshape(m, k // BLOCK_SIZE, BLOCK_SIZE), axis=-1))
    byte = mx.where(bad, mx.array(NONFINITE_BLOCK_SCALE, dtype=mx.uint8), byte)
    codes = mx.where(mx.expand_dims(bad, -1), mx.array(0, dtype=mx.uint8), codes).reshape(m, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    mx.eval(packed, byte, g)
    return NVFP4Planes(
        codes=np.array(packed, dtype=np.uint8),
        scales=np.array(byte, dtype=np.uint8),
        global_scale=np.asarray(np.array(g), dtype=np.float32).reshape(()),
        name=name,
    )


def qmm_w4a4(
    x: mx.array, w: MetalWeight, *, input_scale: float | None = None, out_dtype: str | None = None
) -> mx.array:
    """W4A4 through ``mx.qqmm`` (MLX quantizes the activations itself), where MLX takes
    global scales: the Metal GPU (the backend declares ``w4a4`` only there, so core runs this
    nowhere else). MLX's globals are amaxes: the activations' is ``global_x * 2688``; the
    weight is passed with amax 2688 (decode 1.0) and its sidecar applied to the output, as in
    :func:`qmm`. ``x [M, K]`` as core checked it."""
    if mx.default_device().type != mx.gpu or w.impl != "native":
        raise NotImplementedError(
            f"qmm_w4a4({w.name!r}): MLX's qqmm takes global scales on the GPU only, for "
            "native weights"
        )
    out = mx_dtype(x, out_dtype)
    a2 = x.astype(_F32)
    if input_scale is None:
        clean = mx.where(mx.isfinite(a2), a2, mx.array(0.0, dtype=_F32))
        amax = mx.max(mx.abs(clean))
        # MLX divides this amax by 2688; where that is 0 the spec's global is 1.0 (amax 2688)
        underflow = amax / mx.array(float(GLOBAL_AMAX_DIVISOR), _F32) == 0
        gx_amax = mx.where(underflow, mx.array(float(GLOBAL_AMAX_DIVISOR), _F32), amax)
    else:
        gx_amax = mx.array(
            float(np.float32(input_scale) * np.float32(GLOBAL_AMAX_DIVISOR)), dtype=_F32
        )
    y = mx.qqmm(
        a2,
        w.weight,
        w.scales,
        group_size=BLOCK_SIZE,
        bits=4,
        mode="nvfp4",
        global_scale_x=gx_amax,
        global_scale_w=mx.array(float(GLOBAL_AMAX_DIVISOR), dtype=_F32),
    )
    assert w.row_global is not None
    return (y.astype(_F32) * w.row_global).astype(out)
