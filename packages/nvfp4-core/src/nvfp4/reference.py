"""The bit-exact numpy reference of spec 1.0.

Everything here is vectorized over elements and blocks (the only Python loops run over
experts). The functions are the definition the conformance suite measures backends
against:

* :func:`quantize` - the reference encoder, bit-identical to NVIDIA ModelOpt's
  ``NVFP4QTensor.quantize`` on float32 input (spec 1.0, "The reference encoder");
* :func:`dequantize` - exact decoding to float32 / float16 / bfloat16;
* :func:`qmm`, :func:`gather_qmm` - W4A16 matmuls accumulated in float64 on the exactly
  decoded weights, the global applied once after accumulation;
* :func:`quantize_activations`, :func:`qmm_w4a4` - W4A4 emulation;
* :func:`quantize_activations_q8`, :func:`qmm_w4a8`, :func:`gather_qmm_w4a8` - W4A8 with
  int8 activations (spec 1.1, "W4A8");
* :func:`quantize_activations_fp8`, :func:`qmm_w4a8_fp8` - W4A8 with FP8 E4M3 activations.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from .activations import FP8Activations, Q8Activations
from .dtypes import as_float32_input, dtype_name, resolve_dtype
from .frontend import (
    MatmulOperands,
    activation_input,
    check_q8_k,
    input_scale_value,
    matmul_operands,
)
from .planes import (
    NVFP4Planes,
    PlaneError,
    check_decoded_size,
    check_global_shape,
    check_partitions,
    expand_row_global,
    validate,
)
from .spec import (
    BLOCK_SIZE,
    E2M1_BOUNDS,
    E2M1_ODD_BOUNDS,
    E2M1_VALUES,
    E4M3_MAX,
    E4M3_NAN_BYTE,
    E4M3_VALUES,
    GLOBAL_AMAX_DIVISOR,
    Q8_BLOCK_SIZE,
    Q8_MAX,
    block_scale_encode,
    e4m3_encode_exact,
    e4m3_round,
)

__all__ = [
    "block_scale_bytes",
    "decoded_operand",
    "dequantize",
    "dequantize_unscaled",
    "e2m1_encode",
    "fp8_input_scale_from_amax",
    "gather_qmm",
    "gather_qmm_2d",
    "gather_qmm_w4a8",
    "gather_qmm_w4a8_2d",
    "global_from_amax",
    "output",
    "pack_codes",
    "per_expert",
    "qmm",
    "qmm_2d",
    "qmm_w4a4",
    "qmm_w4a4_2d",
    "qmm_w4a8",
    "qmm_w4a8_2d",
    "qmm_w4a8_fp8",
    "qmm_w4a8_fp8_2d",
    "quantize",
    "quantize_activations",
    "quantize_activations_2d",
    "quantize_activations_fp8",
    "quantize_activations_fp8_2d",
    "quantize_activations_q8",
    "quantize_activations_q8_2d",
    "round_half_away",
    "unpack_codes",
    "w4a4_from_activations",
    "w4a8_fp8_from_activations",
    "w4a8_from_activations",
]

#: Scale byte written for an activation block holding NaN or Inf: 0x7F decodes to NaN,
#: so the output rows that read it are non-finite instead of silently wrong.
NONFINITE_BLOCK_SCALE = E4M3_NAN_BYTE


# ------------------------------------------------------------------------------ codes
def pack_codes(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """``[..., K]`` codes (0..15) -> ``[..., K/2]`` bytes, element 2j in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_codes(packed: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """``[..., K/2]`` bytes -> ``[..., K]`` codes (inverse of :func:`pack_codes`)."""
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def e2m1_encode(
    q: npt.NDArray[np.float32], negative: npt.NDArray[np.bool_]
) -> npt.NDArray[np.uint8]:
    """Round scaled values to E2M1 codes: magnitude to nearest, ties to even, saturating at 6.

    ``searchsorted(bounds, |q|, 'left')`` counts the bounds strictly below ``|q|``, which
    is the nearest magnitude index and rounds every tie down; the ties whose even
    neighbour is above (0.75, 1.75, 3.5) get +1. The sign bit is ``negative`` (the
    encoder passes ``x < 0``, so -0.0 encodes as code 0).
    """
    mag = np.abs(q)
    idx = np.searchsorted(E2M1_BOUNDS, mag, side="left").astype(np.uint8)
    idx += np.isin(mag, E2M1_ODD_BOUNDS).astype(np.uint8)
    return (idx | (negative.astype(np.uint8) << np.uint8(3))).astype(np.uint8)


# ---------------------------------------------------------------------------- globals
def global_from_amax(amax: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Decode global of a tensor (or partition, or expert) with this amax: ``amax / 2688``
    in float32; where that quotient is 0 - an amax of 0, or one of at most 1344 * 2^-149
    (about 3.77e-42), whose quotient underflows - the global is 1.0 (spec 1.0, encoder
    step 1 and its erratum; ModelOpt would give NaN scale bytes)."""
    a = np.asarray(amax, dtype=np.float32)
    g = (a / np.float32(GLOBAL_AMAX_DIVISOR)).astype(np.float32)
    return np.where(g == 0, np.float32(1.0), g).astype(np.float32)


def _first_nonfinite(x: npt.NDArray[np.float32], what: str) -> None:
    finite = np.isfinite(x)
    if not finite.all():
        idx = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(
            f"{what}: non-finite value {x[idx]!r} at index {idx}; NVFP4 cannot encode it"
        )


def block_scale_bytes(
    block_amax: npt.NDArray[np.float32], row_global: npt.NDArray[np.float32]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """E4M3 block scales of the reference encoder, steps 2 of spec 1.0:

    ``s = block_amax / (6 * global)`` in float32 (the product first); ``s == 0`` becomes
    1.0; clamp to ``[2^-9, 448]``; round to E4M3, nearest-even. Returns the bytes and
    their exact float32 values. ``row_global`` broadcasts against ``block_amax`` (it has
    a trailing axis of 1 for the blocks of a row).
    """
    return block_scale_encode(block_amax, row_global)


# --------------------------------------------------------------------------- quantize
def quantize(
    w: Any,
    global_scale: Any = None,
    *,
    partitions: tuple[int, ...] | list[int] | None = None,
    name: str = "tensor",
) -> NVFP4Planes:
    """The reference NVFP4 encoder (spec 1.0, "The reference encoder").

    Args:
        w: ``[N, K]`` or ``[E, N, K]`` float32 (float16 / bfloat16 convert exactly; float64
            is first rounded to float32). K must be a multiple of 16. NaN or Inf is refused
            with a ``ValueError`` naming the first bad index.
        global_scale: the decode global to use (scalar, ``(E,)``, ``(P,)`` or ``(E, P)``,
            finite and > 0). ``None`` computes it as ``amax / 2688`` per expert and per
            partition (1.0 where the amax is 0). Pass the shared global of a fused
            layer to reproduce ModelOpt's bytes for q/k/v or gate/up.
        partitions: row boundaries ``(0, ..., N)`` of fused partitions, each with its own
            global.
        name: the tensor name carried by the planes and their errors.

    Every operation is float32, in this order (identical to ModelOpt):
    ``s = block_amax / (6 * global)``; ``s == 0 -> 1``; clamp ``[2^-9, 448]``; E4M3
    nearest-even; ``q = x / (e4m3(s) * global)``; E2M1 nearest-even, saturating at 6;
    sign bit ``x < 0``.
    """
    x = as_float32_input(w, f"quantize({name!r})")
    if x.ndim not in (2, 3):
        raise ValueError(f"quantize({name!r}): expected [N, K] or [E, N, K], found shape {x.shape}")
    k = x.shape[-1]
    if k == 0 or k % BLOCK_SIZE:
        raise ValueError(f"quantize({name!r}): K must be a positive multiple of 16, found {k}")
    _first_nonfinite(x, f"quantize({name!r})")
    if any(d == 0 for d in x.shape[:-1]):
        raise ValueError(
            f"quantize({name!r}): expected at least one row and expert, found shape {x.shape}"
        )
    parts = tuple(partitions) if partitions is not None else None
    n = x.shape[-2]
    check_partitions(parts, n, name)

    if global_scale is None:
        # amax per expert (axis 0 of a 3-D tensor) and per partition (row ranges).
        absx = np.abs(x)
        row_amax = absx.max(axis=-1)  # [E?, N]
        if parts is None:
            amax = row_amax.max(axis=-1)  # [E?] or ()
        else:
            amax = np.stack(
                [row_amax[..., a:b].max(axis=-1) for a, b in itertools.pairwise(parts)],
                axis=-1,
            )
        g = global_from_amax(amax)
    else:
        g = np.asarray(global_scale, dtype=np.float32)
        if not (np.isfinite(g).all() and (g > 0).all()):
            raise ValueError(
                f"quantize({name!r}): global_scale must be finite and > 0, found {g!r}"
            )
    experts = x.shape[0] if x.ndim == 3 else None
    check_global_shape(g, experts, parts, name)
    row_g = expand_row_global(g, parts, experts, n)  # [E?, N]

    blocks = x.reshape(*x.shape[:-1], k // BLOCK_SIZE, BLOCK_SIZE)
    block_amax = np.abs(blocks).max(axis=-1)  # [E?, N, K/16]
    scale_bytes, scale_values = block_scale_bytes(block_amax, row_g[..., None])
    # q = x / (e4m3(s) * global): the product in float32 first, then one division.
    # A quotient beyond float32 (a tiny static input scale against large x) is +-inf, which
    # the E2M1 rounding saturates to +-6 as the spec says: not an error.
    denom = (scale_values * row_g[..., None]).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = (blocks / denom[..., None]).astype(np.float32)
    codes = e2m1_encode(q, blocks < 0).reshape(x.shape)
    return NVFP4Planes(
        codes=pack_codes(codes),
        scales=scale_bytes.reshape(*x.shape[:-1], k // BLOCK_SIZE),
        global_scale=g,
        partitions=parts,
        name=name,
    )


# ------------------------------------------------------------------------- dequantize
def dequantize_unscaled(planes: NVFP4Planes) -> npt.NDArray[np.float32]:
    """``e2m1(code) * e4m3(scale)`` for every element, without the global: exact in float32
    (an E2M1 value times an E4M3 value has at most 6 significant bits)."""
    check_decoded_size(planes.name, planes.shape)
    try:
        codes = unpack_codes(planes.codes)
        values = E2M1_VALUES[codes].reshape(*planes.scales.shape, BLOCK_SIZE)
        values *= E4M3_VALUES[planes.scales][..., None]
    except MemoryError:
        raise PlaneError(
            planes.name,
            "decoded size",
            "a weight whose float32 decode fits in memory",
            planes.shape,
        ) from None
    return values.reshape(planes.shape)


def dequantize(planes: NVFP4Planes, dtype: Any = np.float32) -> npt.NDArray[Any]:
    """Decode planes exactly (spec 1.0, "Decoding").

    ``value = e2m1(code) * e4m3(scale) * global``: the first product is exact, the multiply
    by the (per-row) global rounds once in float32, and float16 / bfloat16 outputs are
    that float32 result cast with round-to-nearest-even.
    """
    validate(planes)
    check_decoded_size(planes.name, planes.shape)  # before the content is read
    validate(planes, content=True)
    out_dtype = resolve_dtype(dtype)
    v = dequantize_unscaled(planes)
    v *= planes.row_global()[..., None]
    if out_dtype == np.float32:
        return v
    with np.errstate(over="ignore"):  # float16 overflow to +-inf is the cast's defined result
        return v.astype(out_dtype)


# ----------------------------------------------------------------------------- matmul
def output(y: npt.NDArray[np.float64], out_dtype: Any) -> npt.NDArray[Any]:
    """A float64 result as ``out_dtype``: float64 (or ``None``) as is; otherwise rounded to
    float32, then to ``out_dtype`` (float16 overflow to +-inf is the cast's defined result)."""
    if out_dtype is None or dtype_name(out_dtype) == "float64":
        return y
    with np.errstate(over="ignore"):
        return y.astype(np.float32).astype(resolve_dtype(out_dtype))


def _operands(verb: str, x: Any, w: NVFP4Planes, **options: Any) -> MatmulOperands:
    """The planes validated (content too, as the spec's Validation section asks of every
    entry point), then the verb's operands checked as core's verbs check them. Every
    matmul here decodes the weight, so its decoded size is checked before anything is read."""
    validate(w)
    check_decoded_size(w.name, w.shape)
    validate(w, content=True)
    return matmul_operands(verb, w.name, w.shape, x, **options)


def _finish(
    ops: MatmulOperands, w: NVFP4Planes, y: npt.NDArray[np.float64], out_dtype: Any
) -> npt.NDArray[Any]:
    """The float64 ``[M, N]`` result back to x's leading axes, as ``out_dtype``."""
    return output(y.reshape(*ops.x.lead, w.n), out_dtype)


def qmm(x: Any, w: NVFP4Planes, *, out_dtype: Any = np.float32) -> npt.NDArray[Any]:
    """W4A16 reference: ``y[..., n] = (sum_k x[..., k] * e2m1*e4m3[n, k]) * global[n]``.

    The weights are decoded exactly, the sum is accumulated in float64, and the per-row
    global is applied once after accumulation. ``out_dtype=None`` (or float64) returns the
    float64 result the tolerances are measured against; otherwise it is rounded to float32
    and then to ``out_dtype``.
    """
    ops = _operands("qmm", x, w)
    return _finish(ops, w, qmm_2d(ops.x.x, decoded_operand(w)), out_dtype)


def decoded_operand(w: NVFP4Planes) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The exactly decoded, unscaled weight as a C-contiguous float64 ``[K, N]`` matrix, and
    the float64 per-row global: what :func:`qmm` multiplies by. The reference backend keeps
    it per prepared weight so repeated matmuls skip the decode."""
    wd_t = np.ascontiguousarray(dequantize_unscaled(w).astype(np.float64).T)
    return wd_t, w.row_global().astype(np.float64)


def qmm_2d(
    a: npt.NDArray[Any], operand: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
) -> npt.NDArray[np.float64]:
    """The arithmetic of :func:`qmm` on a checked ``a [M, K]`` and an operand from
    :func:`decoded_operand`: float64 accumulation, the global after it."""
    wd_t, row_global = operand
    y: npt.NDArray[np.float64] = a.astype(np.float64) @ wd_t
    y *= row_global
    return y


def gather_qmm(
    x: Any,
    w: NVFP4Planes,
    expert_ids: Any,
    *,
    sorted_indices: bool = False,
    out_dtype: Any = np.float32,
) -> npt.NDArray[Any]:
    """MoE W4A16 reference: row ``m`` of ``x`` times expert ``expert_ids[m]`` of ``w``.

    ``w`` is ``[E, N, K]`` with a scalar, ``(E,)`` or ``(E, P)`` global. An expert id outside
    ``[0, E)`` gives an exactly zero output row. ``sorted_indices`` is accepted for interface
    parity (the reference result does not depend on it; a sorted hint that is false is
    refused so backends that trust it are tested against honest callers).
    """
    ops = _operands("gather_qmm", x, w, expert_ids=expert_ids, sorted_indices=sorted_indices)
    return _finish(ops, w, gather_qmm_2d(ops.x.x, w, ops.expert_ids), out_dtype)


def gather_qmm_2d(
    a: npt.NDArray[Any], w: NVFP4Planes, ids: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """The arithmetic of :func:`gather_qmm` on checked operands (``ids`` int64 ``[M]``)."""

    def unscaled(rows: npt.NDArray[Any], we: NVFP4Planes) -> npt.NDArray[np.float64]:
        wd = dequantize_unscaled(we).astype(np.float64)
        y: npt.NDArray[np.float64] = rows.astype(np.float64) @ wd.T
        return y

    return per_expert(a, w, ids, unscaled)


def per_expert(
    a: npt.NDArray[Any],
    w: NVFP4Planes,
    ids: npt.NDArray[np.int64],
    matmul: Callable[[npt.NDArray[Any], NVFP4Planes], npt.NDArray[np.float64]],
) -> npt.NDArray[np.float64]:
    """Every MoE matmul: for each expert ``e`` that an id in ``[0, E)`` names, ``matmul`` of
    the rows of ``a`` routed to it and expert ``e``'s planes with a global of 1, then times
    expert ``e``'s row globals (after accumulation); rows whose id is outside ``[0, E)``
    stay exactly zero and are never read."""
    y = np.zeros((a.shape[0], w.n), dtype=np.float64)
    row_g = w.row_global().astype(np.float64)
    one = np.ones((), np.float32)
    for expert in np.unique(ids[(ids >= 0) & (ids < w.shape[0])]):
        rows = ids == expert
        we = NVFP4Planes(w.codes[expert], w.scales[expert], one, name=w.name)
        y[rows] = matmul(a[rows], we) * row_g[expert]
    return y


# ------------------------------------------------------------------------ activations
def quantize_activations(
    x: Any, input_scale: Any = None, *, name: str = "activation"
) -> NVFP4Planes:
    """Quantize activations ``[M, K]`` to NVFP4 with the weight block rule (W4A4).

    The global is the checkpoint's static ``input_scale`` (a decode multiplier, as ModelOpt
    stores it) when given, else dynamic: ``amax / 2688`` over the finite values (1.0 where
    that quotient is 0, spec 1.0's erratum). A block holding NaN or Inf gets scale byte 0x7F
    (NaN) and zero codes, so it decodes to NaN and the output rows that read it are
    non-finite; nothing raises.
    """
    what = f"quantize_activations({name!r})"
    a = activation_input(x, what)
    return quantize_activations_2d(a, input_scale_value(input_scale, what), name=name)


def quantize_activations_2d(
    x: npt.NDArray[Any], input_scale: float | None, *, name: str = "activation"
) -> NVFP4Planes:
    """The arithmetic of :func:`quantize_activations` on a checked ``x [M, K]`` and a
    checked static global (``None``: dynamic)."""
    a = np.asarray(x, dtype=np.float32)
    m, k = a.shape
    finite = np.isfinite(a)
    clean = np.where(finite, a, np.float32(0.0))
    if input_scale is None:
        g = global_from_amax(np.abs(clean).max() if clean.size else np.float32(0.0))
    else:
        g = np.asarray(input_scale, dtype=np.float32).reshape(())
    p = quantize(clean, g, name=name)
    bad_block = ~finite.reshape(m, k // BLOCK_SIZE, BLOCK_SIZE).all(axis=-1)
    if bad_block.any():
        scales = p.scales.copy()
        scales[bad_block] = NONFINITE_BLOCK_SCALE
        codes = unpack_codes(p.codes).reshape(m, k // BLOCK_SIZE, BLOCK_SIZE)
        codes[bad_block] = 0
        p = p.replace(scales=scales, codes=pack_codes(codes.reshape(m, k)))
    return p


def qmm_w4a4(
    x: Any, w: NVFP4Planes, *, input_scale: Any = None, out_dtype: Any = np.float32
) -> npt.NDArray[Any]:
    """W4A4 reference: activations quantized by :func:`quantize_activations`, then
    ``(sum_k xq*wq) * global_x * global_w[n]`` accumulated in float64."""
    ops = _operands("qmm_w4a4", x, w, input_scale=input_scale)
    return _finish(ops, w, qmm_w4a4_2d(ops.x.x, w, ops.input_scale), out_dtype)


def qmm_w4a4_2d(
    a: npt.NDArray[Any], w: NVFP4Planes, input_scale: float | None
) -> npt.NDArray[np.float64]:
    """The arithmetic of :func:`qmm_w4a4` on checked operands."""
    return _with_activations(
        a,
        w,
        lambda x, name: quantize_activations_2d(x, input_scale, name=name),
        w4a4_from_activations,
    )


def w4a4_from_activations(xp: NVFP4Planes, w: NVFP4Planes) -> npt.NDArray[np.float64]:
    """W4A4 product of given activation planes and a 2-D weight, in float64:
    ``(sum_k xq * wq) * global_x * global_w[n]`` (both globals after accumulation)."""
    xd = dequantize_unscaled(xp).astype(np.float64)
    wd = dequantize_unscaled(w).astype(np.float64)
    gx = np.float64(np.asarray(xp.global_scale).reshape(()))  # a scalar, or a 1-element array
    y: npt.NDArray[np.float64] = (xd @ wd.T) * (w.row_global().astype(np.float64) * gx)
    return y


_A = TypeVar("_A")


def _with_activations(
    a: npt.NDArray[Any],
    w: NVFP4Planes,
    quantize_x: Callable[[npt.NDArray[Any], str], _A],
    product: Callable[[_A, NVFP4Planes], npt.NDArray[np.float64]],
) -> npt.NDArray[np.float64]:
    """Every matmul on quantized activations (W4A4, W4A8 int8 and FP8): ``x [M, K]``
    quantized by ``quantize_x`` (named after the weight's input), then ``product`` of those
    activations and the weight; M = 0 gives ``[0, N]`` without quantizing."""
    if a.shape[0] == 0:
        return np.zeros((0, w.n), dtype=np.float64)
    return product(quantize_x(a, f"{w.name}.input"), w)


# ------------------------------------------------------------------------------ W4A8
def round_half_away(v: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """C's ``roundf``: nearest integer, halfway cases away from zero. Computed in float64,
    where ``|v| + 0.5`` is exact for every float32 ``|v| < 2^23``."""
    a = np.abs(v.astype(np.float64))
    return np.copysign(np.floor(a + 0.5), v.astype(np.float64))


def quantize_activations_q8(x: Any, *, name: str = "activation") -> Q8Activations:
    """int8 W4A8 activations of ``x [M, K]`` (K a multiple of 32), as ggml's
    ``quantize_row_q8_0_ref`` computes them (spec 1.1, "W4A8").

    Per block of 32 along K, in float32: ``amax`` the largest ``|x|``; ``d = amax / 127``;
    ``id = 1 / d`` (0 where ``d == 0``); ``code = roundf(x * id)`` (half away from zero);
    ``d`` stored as float16 (RNE). A block holding NaN or Inf gets zero codes and ``d``
    NaN, so the outputs of its row are NaN; nothing raises.
    """
    what = f"quantize_activations_q8({name!r})"
    a = activation_input(x, what)
    check_q8_k(int(a.shape[1]), what)
    return quantize_activations_q8_2d(a, name=name)


def quantize_activations_q8_2d(x: npt.NDArray[Any], *, name: str = "activation") -> Q8Activations:
    """The arithmetic of :func:`quantize_activations_q8` on a checked ``x [M, K]``."""
    a = np.asarray(x, dtype=np.float32)
    m, k = a.shape
    blocks = a.reshape(m, k // Q8_BLOCK_SIZE, Q8_BLOCK_SIZE)
    finite = np.isfinite(blocks)
    bad_block = ~finite.all(axis=-1)
    clean = np.where(finite, blocks, np.float32(0.0))
    amax = np.abs(clean).max(axis=-1)  # float32 [M, K/32]
    d = (amax / np.float32(Q8_MAX)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0.0), np.float32(1.0) / d).astype(np.float32)
    v = (clean * inv[..., None]).astype(np.float32)
    q = np.clip(round_half_away(v), -Q8_MAX, Q8_MAX).astype(np.int8)
    with np.errstate(over="ignore"):  # amax above 127 * 65504 gives d = inf, as in ggml
        d16 = d.astype(np.float16)
    q[bad_block] = 0
    d16[bad_block] = np.float16(np.nan)
    return Q8Activations(codes=q.reshape(m, k), d=d16, name=name)


def w4a8_from_activations(xq: Q8Activations, w: NVFP4Planes) -> npt.NDArray[np.float64]:
    """W4A8 int8 product of given activation planes and a 2-D weight, in float64:
    ``(sum_k code * d * e2m1 * e4m3) * global`` (every product exact; spec 1.1, "W4A8").

    A row with an infinite ``d`` (a finite block whose ``amax / 127`` is beyond float16's
    65504) takes the spec's block form instead, :func:`w4a8_block_form`: per element,
    ``code * inf`` would be NaN wherever a code or a weight is 0, where the spec's terms
    ``isum_j * (e4m3 / 2) * d`` are infinite unless the block's integer sum is 0."""
    xd = xq.decoded()
    wd = dequantize_unscaled(w).astype(np.float64)
    g = w.row_global().astype(np.float64)
    with np.errstate(invalid="ignore"):
        y: npt.NDArray[np.float64] = (xd @ wd.T) * g
    infinite: npt.NDArray[np.bool_] = np.asarray(np.isinf(xq.d.astype(np.float64)).any(axis=1))
    if infinite.any():
        with np.errstate(invalid="ignore"):
            y[infinite] = w4a8_block_form(xq, w, infinite) * g
    return y


def w4a8_block_form(
    xq: Q8Activations, w: NVFP4Planes, rows: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    """Spec 1.1's W4A8 product for the rows ``rows`` of ``xq``, before the global:
    ``sum over j of isum_j * (e4m3(s_j) / 2) * d[m, j // 2]``, ``isum_j`` the integer sum
    over weight block j of ``2 * e2m1 * code`` (exact in float64), each term exact in
    float64 (or an infinity, or NaN for ``0 * inf``)."""
    nb = w.k // BLOCK_SIZE
    codes = xq.codes[rows].astype(np.float64).reshape(-1, nb, BLOCK_SIZE)  # [R, nb, 16]
    twice = 2.0 * E2M1_VALUES[unpack_codes(w.codes)].astype(np.float64)
    isum = np.einsum("rjt,njt->rnj", codes, twice.reshape(w.n, nb, BLOCK_SIZE))  # [R, N, nb]
    half_scale = E4M3_VALUES[w.scales].astype(np.float64) / 2.0  # [N, nb]
    d = np.repeat(xq.d[rows].astype(np.float64), 2, axis=1)  # [R, nb]: block j uses d[j // 2]
    terms = isum * half_scale[None, :, :] * d[:, None, :]
    out: npt.NDArray[np.float64] = terms.sum(axis=2)
    return out


def qmm_w4a8(x: Any, w: NVFP4Planes, *, out_dtype: Any = np.float32) -> npt.NDArray[Any]:
    """W4A8 int8 reference: activations quantized by :func:`quantize_activations_q8`, then
    ``sum over 16-blocks of (int sum of 2*e2m1 x code) * e4m3 / 2 * d``, accumulated in
    float64, times the global of the row after accumulation."""
    ops = _operands("qmm_w4a8", x, w, q8=True)
    return _finish(ops, w, qmm_w4a8_2d(ops.x.x, w), out_dtype)


def qmm_w4a8_2d(a: npt.NDArray[Any], w: NVFP4Planes) -> npt.NDArray[np.float64]:
    """The arithmetic of :func:`qmm_w4a8` on checked operands."""
    return _with_activations(
        a, w, lambda x, name: quantize_activations_q8_2d(x, name=name), w4a8_from_activations
    )


def gather_qmm_w4a8(
    x: Any,
    w: NVFP4Planes,
    expert_ids: Any,
    *,
    sorted_indices: bool = False,
    out_dtype: Any = np.float32,
) -> npt.NDArray[Any]:
    """MoE W4A8 int8 reference: row ``m`` of ``x`` times expert ``expert_ids[m]``; ids
    outside ``[0, E)`` give exactly zero rows (their x is never read)."""
    ops = _operands(
        "gather_qmm_w4a8", x, w, expert_ids=expert_ids, sorted_indices=sorted_indices, q8=True
    )
    return _finish(ops, w, gather_qmm_w4a8_2d(ops.x.x, w, ops.expert_ids), out_dtype)


def gather_qmm_w4a8_2d(
    a: npt.NDArray[Any], w: NVFP4Planes, ids: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """The arithmetic of :func:`gather_qmm_w4a8` on checked operands."""
    return per_expert(a, w, ids, qmm_w4a8_2d)


def quantize_activations_fp8(
    x: Any, input_scale: Any = None, *, name: str = "activation"
) -> FP8Activations:
    """FP8 E4M3 W4A8 activations (ModelOpt's ``W4A8_NVFP4_FP8``; spec 1.1, "W4A8").

    ``code = e4m3(x / input_scale)``: one float32 division, the magnitude clamped to 448,
    rounded to E4M3 nearest-even (subnormals included, step 2^-9), the sign bit that of the
    quotient. ``input_scale`` is the checkpoint's static decode scale, else dynamic:
    ``amax / 448`` over the finite values (1.0 where that quotient is 0). A NaN or Inf
    element gets the NaN byte 0x7F, so its row's outputs are NaN; nothing raises.
    """
    what = f"quantize_activations_fp8({name!r})"
    a = activation_input(x, what)
    return quantize_activations_fp8_2d(a, input_scale_value(input_scale, what), name=name)


def fp8_input_scale_from_amax(amax: float | np.floating[Any]) -> np.float32:
    """The dynamic FP8 input scale of activations with this (finite) amax: ``amax / 448``,
    one float32 division; 1.0 where that quotient is 0 (spec 1.1, "W4A8")."""
    s = np.float32(np.float32(amax) / np.float32(E4M3_MAX))
    return np.float32(1.0) if s == 0 else s


def fp8_input_scale(a: npt.NDArray[np.float32]) -> np.float32:
    """The dynamic FP8 input scale of ``a``: :func:`fp8_input_scale_from_amax` of the amax
    over its finite values."""
    clean = np.where(np.isfinite(a), a, np.float32(0.0))
    return fp8_input_scale_from_amax(np.abs(clean).max() if clean.size else np.float32(0.0))


def quantize_activations_fp8_2d(
    x: npt.NDArray[Any], input_scale: float | None, *, name: str = "activation"
) -> FP8Activations:
    """The arithmetic of :func:`quantize_activations_fp8` on a checked ``x [M, K]`` and a
    checked static scale (``None``: dynamic)."""
    a = np.asarray(x, dtype=np.float32)
    s = fp8_input_scale(a) if input_scale is None else np.float32(input_scale)
    finite = np.isfinite(a)
    with np.errstate(over="ignore", invalid="ignore"):
        v = (np.where(finite, a, np.float32(0.0)) / s).astype(np.float32)
    mag = np.minimum(np.abs(v), np.float32(E4M3_MAX)).astype(np.float32)
    codes = e4m3_encode_exact(e4m3_round(mag)) | (np.signbit(v).astype(np.uint8) << np.uint8(7))
    codes = np.where(finite, codes, np.uint8(E4M3_NAN_BYTE)).astype(np.uint8)
    return FP8Activations(codes=codes, input_scale=np.asarray(s, dtype=np.float32), name=name)


def w4a8_fp8_from_activations(xq: FP8Activations, w: NVFP4Planes) -> npt.NDArray[np.float64]:
    """FP8 W4A8 product of given activation planes and a 2-D weight, in float64:
    ``(sum_k e4m3(code) * e2m1 * e4m3) * input_scale * global`` (spec 1.1, "W4A8")."""
    xd = E4M3_VALUES[xq.codes].astype(np.float64)
    wd = dequantize_unscaled(w).astype(np.float64)
    g = w.row_global().astype(np.float64) * np.float64(xq.input_scale)
    with np.errstate(invalid="ignore"):
        y: npt.NDArray[np.float64] = (xd @ wd.T) * g
    return y


def qmm_w4a8_fp8(
    x: Any, w: NVFP4Planes, *, input_scale: Any = None, out_dtype: Any = np.float32
) -> npt.NDArray[Any]:
    """W4A8 FP8 reference: activations quantized by :func:`quantize_activations_fp8`, then
    the float64 product, ``input_scale`` and the row's global applied after accumulation."""
    ops = _operands("qmm_w4a8_fp8", x, w, input_scale=input_scale)
    return _finish(ops, w, qmm_w4a8_fp8_2d(ops.x.x, w, ops.input_scale), out_dtype)


def qmm_w4a8_fp8_2d(
    a: npt.NDArray[Any], w: NVFP4Planes, input_scale: float | None
) -> npt.NDArray[np.float64]:
    """The arithmetic of :func:`qmm_w4a8_fp8` on checked operands."""
    return _with_activations(
        a,
        w,
        lambda x, name: quantize_activations_fp8_2d(x, input_scale, name=name),
        w4a8_fp8_from_activations,
    )
