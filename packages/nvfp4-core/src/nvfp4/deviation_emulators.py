"""The reference with declared deviations: what an engine that departs from the spec in
the declared ways computes (spec 1.2, "Conformance classes and declared deviations").

Each emulated deviation of the registry (:mod:`nvfp4.deviation_registry`, ``emulated =
true``) is one rule of the reference changed, at the step where the spec states it. The
encoder and the decoder here follow :func:`nvfp4.reference.quantize_activations` and
:func:`nvfp4.reference.dequantize` step by step; with no deviation they are bit-identical
to them (the tests hold this), and every deviation switches one step:

=========================== ====================================================
deviation                   the step it changes
=========================== ====================================================
``ct_encode_global``        steps 1-2: ENCODE global ``2688 / amax`` in x's dtype, decode
                            global ``float32(1 / float64(encode))`` (static: ``1 / (1 /
                            s)``); block scale ``encode * (amax / 6)``, the quotient in
                            x's dtype
``ct_nonfinite_global_one`` step 1: a tensor holding NaN / Inf, or whose 2688 / amax
                            overflows, gets global 1.0
``ggml_no_global``          step 1: global 1.0 whatever the amax or input scale
``mlx_float16_encoder``     step 2: ``(amax / 6) * (1 / global)`` in x's dtype
``ct_zero_scale_eps``       step 2: no 1.0 for 0, no 2^-9 floor; a scale byte 0 -> 0x20
``scale_byte_zero``         step 2: no 1.0 for 0, no 2^-9 floor (byte 0x00, codes 0)
``torchao_scale_floor``     step 2: clamp to ``[2^-6, 448]``, no 1.0 for 0
``torchao_reciprocal_scale`` step 3: ``q = x * ((1 / global) / scale)``
``mlx_negative_zero_code``  step 3: a negative value that rounds to 0 gets code 0
``scale_times_global_first`` decoding: ``e2m1 * float32(e4m3 * global)``
``ct_bfloat16_decompress``  decoding: the float32 value rounded to bfloat16 first
``k_multiple_of_64``        refuses K % 64 != 0 (encoder and decoder)
``mlx_k_multiple_of_32``    refuses K % 32 != 0 (encoder and decoder)
``torchao_no_float16``      the encoder refuses float16 x
``partials_in_activation_dtype`` row-parallel sum (spec 1.5's registry): each rank's
                            partial rounded to the output dtype before the sum
=========================== ====================================================

A ``partials_relative`` deviation has, besides its emulation (:func:`row_parallel_sum`),
the bound its registry entry states (:func:`partials_relative_bound`): T7 attributes a
failing row-parallel sum to it when every element is within that bound.

A refusal raises :class:`DeviationRefusal` (a ``ValueError``) naming the deviation. The
deviations not emulated (``emulated = false``: unsafe memory behaviour, non-finite
handling whose result is no valid plane) are named by :data:`NOT_EMULATED`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import ml_dtypes
import numpy as np
import numpy.typing as npt

from . import reference
from .deviation_registry import deviations as _registry
from .dtypes import resolve_dtype
from .frontend import activation_input, input_scale_value
from .planes import NVFP4Planes
from .spec import (
    BLOCK_SIZE,
    E2M1_MAX,
    E2M1_VALUES,
    E4M3_MAX,
    E4M3_MIN_SUBNORMAL,
    E4M3_VALUES,
    GLOBAL_AMAX_DIVISOR,
    e4m3_encode_exact,
    e4m3_round,
)

__all__ = [
    "DECODER_DEVIATIONS",
    "EMULATED",
    "ENCODER_DEVIATIONS",
    "NOT_EMULATED",
    "SUM_DEVIATIONS",
    "DeviationRefusal",
    "dequantize",
    "partials_relative_bound",
    "quantize_activations",
    "row_parallel_sum",
    "unit_roundoff",
]

#: Deviations of the encoder (:func:`quantize_activations`).
ENCODER_DEVIATIONS: Final = frozenset(
    {
        "ct_encode_global",
        "ct_nonfinite_global_one",
        "ggml_no_global",
        "mlx_float16_encoder",
        "ct_zero_scale_eps",
        "scale_byte_zero",
        "torchao_scale_floor",
        "torchao_reciprocal_scale",
        "mlx_negative_zero_code",
        "k_multiple_of_64",
        "mlx_k_multiple_of_32",
        "torchao_no_float16",
    }
)
#: Deviations of the decoder (:func:`dequantize`).
DECODER_DEVIATIONS: Final = frozenset(
    {
        "scale_times_global_first",
        "ct_bfloat16_decompress",
        "k_multiple_of_64",
        "mlx_k_multiple_of_32",
    }
)
#: Deviations of a row-parallel sum (:func:`row_parallel_sum`; spec 1.5's registry).
SUM_DEVIATIONS: Final = frozenset({"partials_in_activation_dtype"})
#: Every deviation emulated here.
EMULATED: Final = ENCODER_DEVIATIONS | DECODER_DEVIATIONS | SUM_DEVIATIONS
#: The registry's deviations that are not (``emulated = false``).
NOT_EMULATED: Final = frozenset(d.id for d in _registry() if not d.emulated)

_K_MULTIPLE: Final = {"k_multiple_of_64": 64, "mlx_k_multiple_of_32": 32}
_TORCHAO_SCALE_FLOOR: Final = np.float32(2.0**-6)  # finfo(float8_e4m3fn).tiny
_CT_EPS_BYTE: Final = np.uint8(0x20)  # E4M3 0.125, compressed-tensors' replacement of 0


class DeviationRefusal(ValueError):
    """The emulated engine refuses this input (a ``refuses`` deviation)."""


def _check(ids: Iterable[str], allowed: frozenset[str], what: str) -> frozenset[str]:
    chosen = frozenset(ids)
    unknown = sorted(chosen - allowed)
    if unknown:
        raise ValueError(
            f"{what}: deviation {unknown[0]!r} is not emulated here; expected some of "
            f"{', '.join(sorted(allowed))}"
        )
    return chosen


def _refuse_k(k: int, chosen: frozenset[str], what: str) -> None:
    for ident, multiple in _K_MULTIPLE.items():
        if ident in chosen and k % multiple:
            raise DeviationRefusal(f"{what}: {ident}: K = {k} is not a multiple of {multiple}")


def _reciprocal(v: Any) -> np.float32:
    """``float32(1 / float64(v))``: the compressed-tensors layout's conversion between an
    ENCODE global and a decode global (:mod:`nvfp4.layouts.compressed_tensors`)."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.float32(np.float64(1.0) / np.float64(v))


def _global(
    a: npt.NDArray[np.float32],
    clean: npt.NDArray[np.float32],
    x_dtype: np.dtype[Any],
    static: float | None,
    chosen: frozenset[str],
) -> tuple[np.float32, np.float32 | None]:
    """Step 1: the decode global (float32 scalar), and the ENCODE global where
    ``ct_encode_global`` computes the block scales with it (else ``None``)."""
    if "ggml_no_global" in chosen:
        return np.float32(1.0), None  # ggml_quantize_chunk takes no global
    if static is not None:
        g = np.float32(static)
        if "ct_encode_global" in chosen:  # stored as 1 / s, read back as 1 / (1 / s)
            encode = _reciprocal(g)
            return _reciprocal(encode), encode
        return g, None
    amax = np.float32(np.abs(clean).max()) if clean.size else np.float32(0.0)
    with np.errstate(divide="ignore", over="ignore"):
        overflows = amax > 0 and not np.isfinite(np.float32(GLOBAL_AMAX_DIVISOR) / amax)
    if "ct_nonfinite_global_one" in chosen and (not np.isfinite(a).all() or overflows):
        # generate_gparam: a NaN / infinite ENCODE global (x holding NaN / Inf, or 2688 /
        # amax beyond float32) becomes 1.0
        one = np.float32(1.0)
        return one, (one if "ct_encode_global" in chosen else None)
    if "ct_encode_global" in chosen and amax > 0:
        # generate_gparam: ENCODE global 2688 / amax in x's dtype, then float32; a reader
        # decodes with its reciprocal
        narrow = x_dtype if x_dtype != np.float64 else np.dtype(np.float32)
        with np.errstate(divide="ignore", over="ignore"):
            q = np.asarray(GLOBAL_AMAX_DIVISOR, narrow) / np.asarray(amax, narrow)
            encode = np.float32(q.astype(narrow))
        g = _reciprocal(encode)
        if np.isfinite(encode) and encode > 0 and np.isfinite(g) and g > 0:
            return g, encode
        # a non-finite ENCODE global: the spec's rule below (ct_nonfinite_global_one is the
        # deviation that replaces it by 1.0)
    return np.float32(reference.global_from_amax(amax)), None


def _scales(
    block_amax: npt.NDArray[np.float32],
    g: np.float32,
    encode: np.float32 | None,
    x_dtype: np.dtype[Any],
    chosen: frozenset[str],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """Step 2: the E4M3 block scale bytes and their float32 values."""
    narrow = x_dtype if x_dtype != np.float64 else np.dtype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        six_g = np.float32(np.float32(E2M1_MAX) * g)  # the product first, as the spec
        if encode is not None:
            # calculate_qparams: (amax / 6) in x's dtype, times the float32 ENCODE global
            per6 = (block_amax.astype(narrow) / np.asarray(E2M1_MAX, narrow)).astype(narrow)
            s = (encode * per6.astype(np.float32)).astype(np.float32)
        elif "mlx_float16_encoder" in chosen and x_dtype in (
            np.dtype(np.float16),
            np.dtype(ml_dtypes.bfloat16),
        ):
            # (amax / 6) * (1 / global), each step rounded to x's dtype (mx.quantize's
            # order), then widened
            per6 = (block_amax.astype(x_dtype) / np.asarray(E2M1_MAX, x_dtype)).astype(x_dtype)
            inv = np.asarray(np.float32(1.0) / g).astype(x_dtype)
            s = (per6 * inv).astype(x_dtype).astype(np.float32)
        else:
            s = (block_amax / six_g).astype(np.float32)
    top = np.float32(E4M3_MAX)
    if "torchao_scale_floor" in chosen:
        # clamp to [finfo(float8_e4m3fn).tiny, 448]: a zero scale becomes 2^-6, not 1.0
        s = np.clip(s, _TORCHAO_SCALE_FLOOR, top).astype(np.float32)
    elif "ct_zero_scale_eps" in chosen or "scale_byte_zero" in chosen:
        s = np.clip(s, np.float32(0.0), top).astype(np.float32)  # no 1.0 for 0, no 2^-9 floor
    else:
        s = np.where(s == 0, np.float32(1.0), s)
        s = np.clip(s, np.float32(E4M3_MIN_SUBNORMAL), top).astype(np.float32)
    rounded = e4m3_round(s)
    scale_bytes = e4m3_encode_exact(rounded)
    if "ct_zero_scale_eps" in chosen:
        scale_bytes = np.where(scale_bytes == 0, _CT_EPS_BYTE, scale_bytes).astype(np.uint8)
        rounded = E4M3_VALUES[scale_bytes]
    return scale_bytes, rounded


def _codes(
    blocks: npt.NDArray[np.float32],
    values: npt.NDArray[np.float32],
    g: np.float32,
    chosen: frozenset[str],
) -> npt.NDArray[np.uint8]:
    """Step 3: E2M1 codes of every element ``[M, K/16, 16]``."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if "torchao_reciprocal_scale" in chosen:
            factor = ((np.float32(1.0) / g).astype(np.float32) / values).astype(np.float32)
            q = (blocks * factor[..., None]).astype(np.float32)
        else:
            denom = (values * g).astype(np.float32)  # e4m3(s) * global, then one division
            q = (blocks / denom[..., None]).astype(np.float32)
    q = np.where(values[..., None] == 0, np.float32(0.0), q)  # a 0 scale byte: codes 0
    codes = reference.e2m1_encode(q, blocks < 0)
    if "mlx_negative_zero_code" in chosen:
        codes = np.where((codes & 0x7) == 0, np.uint8(0), codes).astype(np.uint8)
    return codes


def quantize_activations(
    x: Any,
    input_scale: Any = None,
    *,
    deviations: Iterable[str] = (),
    name: str = "activation",
) -> NVFP4Planes:
    """:func:`nvfp4.reference.quantize_activations` with the encoder ``deviations``
    (ids of :data:`ENCODER_DEVIATIONS`) applied; bit-identical to it with none.

    Raises:
        DeviationRefusal: where a chosen ``refuses`` deviation refuses ``x``.
        ValueError: for a deviation not emulated in the encoder, or bad input (as the
            reference).
    """
    what = f"quantize_activations({name!r})"
    chosen = _check(deviations, ENCODER_DEVIATIONS, what)
    x_dtype = np.asarray(x).dtype
    if "torchao_no_float16" in chosen and x_dtype == np.float16:
        raise DeviationRefusal(f"{what}: torchao_no_float16: x is float16")
    a = activation_input(x, what)
    static = input_scale_value(input_scale, what)
    m, k = a.shape
    _refuse_k(k, chosen, what)
    a = np.asarray(a, dtype=np.float32)
    finite = np.isfinite(a)
    clean = np.where(finite, a, np.float32(0.0)).astype(np.float32)
    g, encode = _global(a, clean, x_dtype, static, chosen)
    blocks = clean.reshape(m, k // BLOCK_SIZE, BLOCK_SIZE)
    scale_bytes, values = _scales(np.abs(blocks).max(axis=-1), g, encode, x_dtype, chosen)
    codes = _codes(blocks, values, g, chosen)
    bad_block = ~finite.reshape(m, k // BLOCK_SIZE, BLOCK_SIZE).all(axis=-1)
    if bad_block.any():  # spec: scale byte 0x7F (NaN) and codes 0
        scale_bytes = np.where(bad_block, reference.NONFINITE_BLOCK_SCALE, scale_bytes)
        codes = np.where(bad_block[..., None], np.uint8(0), codes)
    return NVFP4Planes(
        codes=reference.pack_codes(codes.reshape(m, k).astype(np.uint8)),
        scales=scale_bytes.astype(np.uint8),
        global_scale=np.asarray(g, dtype=np.float32),
        name=name,
    )


def dequantize(
    planes: NVFP4Planes, dtype: Any = np.float32, *, deviations: Iterable[str] = ()
) -> npt.NDArray[Any]:
    """:func:`nvfp4.reference.dequantize` with the decoder ``deviations`` (ids of
    :data:`DECODER_DEVIATIONS`) applied; bit-identical to it with none."""
    what = f"dequantize({planes.name!r})"
    chosen = _check(deviations, DECODER_DEVIATIONS, what)
    _refuse_k(planes.shape[-1], chosen, what)
    out_dtype = resolve_dtype(dtype)
    if "scale_times_global_first" in chosen:
        reference.dequantize(planes, np.float32)  # the same validation first
        codes = reference.unpack_codes(planes.codes)
        e2m1 = E2M1_VALUES[codes].reshape(*planes.scales.shape, BLOCK_SIZE)
        # e4m3 * global rounds once in float32, then the code multiplies: a second rounding
        sg = (E4M3_VALUES[planes.scales] * planes.row_global()[..., None]).astype(np.float32)
        v = (e2m1 * sg[..., None]).astype(np.float32).reshape(planes.shape)
    else:
        v = reference.dequantize(planes, np.float32)
    if "ct_bfloat16_decompress" in chosen:
        v = v.astype(ml_dtypes.bfloat16).astype(np.float32)  # unpacked to bfloat16 first
    if out_dtype == np.float32:
        return v
    with np.errstate(over="ignore"):
        return v.astype(out_dtype)


def unit_roundoff(dtype: Any) -> float:
    """Half the machine epsilon of an output dtype: the largest relative error of one
    round-to-nearest into it (2^-24 float32, 2^-11 float16, 2^-8 bfloat16)."""
    # the spacing of 1.0 is the machine epsilon (numpy's spacing works for bfloat16 too)
    return float(np.spacing(np.asarray(1.0, resolve_dtype(dtype)))) / 2


def row_parallel_sum(
    partials: Iterable[Any], dtype: Any, *, deviations: Iterable[str] = ()
) -> npt.NDArray[Any]:
    """The reduced sum of a row-parallel layer from its ranks' exact partials (float64, each
    ``[M, N]``), in ``dtype``: the reference's (the float64 sum, one cast: what the spec's
    float32 partials and all-reduce approximate) or, with ``partials_in_activation_dtype``,
    each partial first rounded to ``dtype`` as an engine that returns partials in x's dtype
    does (the sum then in float64: the rounding of the partials alone)."""
    chosen = _check(deviations, SUM_DEVIATIONS, "row_parallel_sum")
    out_dtype = resolve_dtype(dtype)
    parts = [np.asarray(p, dtype=np.float64) for p in partials]
    if not parts:
        raise ValueError("row_parallel_sum: expected the partials of at least one rank")
    with np.errstate(over="ignore", invalid="ignore"):
        if "partials_in_activation_dtype" in chosen:
            parts = [p.astype(out_dtype).astype(np.float64) for p in parts]
        out: npt.NDArray[Any] = np.sum(parts, axis=0).astype(out_dtype)
    return out


def partials_relative_bound(partials: Iterable[Any], dtype: Any, b: float) -> npt.NDArray[Any]:
    """A ``partials_relative`` bound (spec 1.5, "Conformance classes and declared
    deviations") per element: ``b * gamma_w * sum_r |p_r|``, with ``w`` the number of
    partials, ``gamma_w = w u / (1 - w u)`` and ``u`` the unit roundoff of ``dtype``
    (:func:`unit_roundoff`); it bounds rounding each partial to ``dtype`` and summing them in
    ``dtype`` in any order (or in float32, then one cast), to within ``b = 1``."""
    parts = [np.abs(np.asarray(p, dtype=np.float64)) for p in partials]
    if not parts:
        raise ValueError("partials_relative_bound: expected the partials of at least one rank")
    wu = len(parts) * unit_roundoff(dtype)
    if not 0 <= wu < 1:
        raise ValueError(f"partials_relative_bound: w * u = {wu} must be below 1")
    bound: npt.NDArray[np.float64] = float(b) * (wu / (1 - wu)) * np.sum(parts, axis=0)
    return bound
