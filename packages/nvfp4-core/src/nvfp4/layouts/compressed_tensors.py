"""The compressed-tensors ``nvfp4-pack-quantized`` layout (vLLM / llm-compressor).

A compressed-tensors NVFP4 linear layer ``<prefix>`` is stored as:

===================================== ======== ============ ==================================
tensor                                dtype    shape        content
===================================== ======== ============ ==================================
``<prefix>.weight_packed``            U8       ``[N, K/2]`` the canonical codes, byte for byte
``<prefix>.weight_scale``             F8_E4M3  ``[N, K/16]`` the canonical scale bytes
``<prefix>.weight_global_scale``      F32      ``[1]``      the ENCODE global = 1 / decode
``<prefix>.input_global_scale``       F32      ``[1]``      the activations' ENCODE global
                                                            (static activation global only)
===================================== ======== ============ ==================================

The codes and scale bytes are the canonical planes unchanged (a view). The only difference
from ModelOpt is the global's direction: compressed-tensors stores the ENCODE multiplier
(``6 * 448 / amax``) and decodes with ``e2m1(code) * e4m3(scale) / weight_global_scale``.
This module converts with one correctly rounded reciprocal each way:

* ``encode = float32(1 / float64(decode))`` (:func:`encode_global`);
* ``decode = float32(1 / float64(encode))`` (:func:`decode_global`).

A round trip decode -> encode -> decode returns the decode global within 1 ulp (usually
exactly); the bytes are always identical. Expert-stacked planes ``[E, N, K]`` carry
``weight_global_scale`` of shape ``(E,)``. Fused planes are refused (compressed-tensors
stores one global per projection): unfuse first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..planes import NVFP4Planes, PlaneError, validate
from ._common import (
    as_bytes,
    as_float32_exact,
    as_scale_bytes,
    fetch,
    refuse_partitions,
    squeeze_global,
)
from .modelopt import WEIGHT_SCALE

__all__ = [
    "INPUT_GLOBAL_SCALE",
    "WEIGHT_GLOBAL_SCALE",
    "WEIGHT_PACKED",
    "WEIGHT_SCALE",
    "decode_global",
    "encode_global",
    "from_compressed_tensors",
    "input_global_scale_from_input_scale",
    "input_scale_from_input_global_scale",
    "to_compressed_tensors",
]

#: Suffix of the packed codes, U8 ``[N, K/2]``. The block scales are ModelOpt's
#: :data:`~nvfp4.layouts.modelopt.WEIGHT_SCALE`, F8_E4M3 ``[N, K/16]``.
WEIGHT_PACKED: Final = "weight_packed"
#: Suffix of the ENCODE global (1 / decode), F32 ``[1]``.
WEIGHT_GLOBAL_SCALE: Final = "weight_global_scale"
#: Suffix of the activations' ENCODE global (1 / ModelOpt ``input_scale``), F32 ``[1]``.
INPUT_GLOBAL_SCALE: Final = "input_global_scale"


_F32_TINY: Final = float(np.finfo(np.float32).tiny)


def _reciprocal(x: Any, what: str, name: str) -> npt.NDArray[np.float32]:
    a = as_float32_exact(np.asarray(x), name, what)
    if not bool(np.all(np.isfinite(a) & (a > 0))):
        raise PlaneError(name, what, "finite and > 0", a)
    with np.errstate(over="ignore"):
        r = np.asarray(1.0 / a.astype(np.float64)).astype(np.float32)
    if not bool(np.all(np.isfinite(r) & (r >= _F32_TINY))):
        raise PlaneError(
            name,
            f"reciprocal of {what}",
            f"a normal float32 (both the value and 1/value within [{_F32_TINY:.3g}, 3.4e38])",
            a,
        )
    return r


def encode_global(decode: Any, name: str = "tensor") -> npt.NDArray[np.float32]:
    """ENCODE global from a DECODE global: ``float32(1 / float64(decode))``, any shape.

    Refuses non-finite or non-positive values and those whose reciprocal is not a normal
    float32 (overflow, or a subnormal that would lose precision)."""
    return _reciprocal(decode, "decode global", name)


def decode_global(encode: Any, name: str = "tensor") -> npt.NDArray[np.float32]:
    """DECODE global from an ENCODE global: ``float32(1 / float64(encode))``, any shape."""
    return _reciprocal(encode, "encode global", name)


def input_global_scale_from_input_scale(
    input_scale: Any, name: str = "tensor"
) -> npt.NDArray[np.float32]:
    """ModelOpt ``input_scale`` (decode) -> compressed-tensors ``input_global_scale``
    (encode, shape ``(1,)`` for a scalar)."""
    r = encode_global(input_scale, name)
    return r.reshape(1) if r.ndim == 0 else r


def input_scale_from_input_global_scale(
    input_global_scale: Any, name: str = "tensor"
) -> npt.NDArray[np.float32]:
    """compressed-tensors ``input_global_scale`` (encode) -> ModelOpt ``input_scale``
    (decode, shape ``()`` for a ``(1,)`` input)."""
    r = decode_global(input_global_scale, name)
    return r.reshape(()) if r.shape == (1,) else r


def to_compressed_tensors(planes: NVFP4Planes) -> dict[str, npt.NDArray[Any]]:
    """Canonical planes -> compressed-tensors tensors (keys :data:`WEIGHT_PACKED`,
    :data:`WEIGHT_SCALE`, :data:`WEIGHT_GLOBAL_SCALE`, without the layer prefix).

    ``weight_packed`` is the codes, ``weight_scale`` the scale bytes viewed as
    ``float8_e4m3fn`` (no copy when contiguous), ``weight_global_scale`` the ENCODE global
    :func:`encode_global` of shape ``(1,)``, or ``(E,)`` for expert-stacked planes. The
    content is validated first; fused planes are refused.
    """
    validate(planes, content=True)
    refuse_partitions(
        planes.name,
        planes.partitions,
        "compressed-tensors",
        "compressed-tensors stores each projection with its own weight_global_scale",
    )
    e = planes.num_experts
    g = planes.global_scale
    shape = (e,) if e is not None else (1,)
    enc = encode_global(np.broadcast_to(g, shape), planes.name)
    return {
        WEIGHT_PACKED: np.ascontiguousarray(planes.codes),
        WEIGHT_SCALE: np.ascontiguousarray(planes.scales).view(ml_dtypes.float8_e4m3fn),
        WEIGHT_GLOBAL_SCALE: np.ascontiguousarray(enc, dtype=np.float32),
    }


def from_compressed_tensors(tensors: Mapping[str, Any], name: str = "tensor") -> NVFP4Planes:
    """compressed-tensors tensors -> canonical planes, validated with ``content=True``.

    ``weight_packed`` must be uint8, ``weight_scale`` ``float8_e4m3fn`` or raw uint8, and
    ``weight_global_scale`` float32 (float16 / bfloat16 convert exactly) of shape ``()`` or
    ``(1,)``, or ``(E,)`` for expert-stacked weights. The decode global is
    :func:`decode_global` of it.
    """
    codes = as_bytes(fetch(tensors, WEIGHT_PACKED, name), name, WEIGHT_PACKED)
    scales = as_scale_bytes(fetch(tensors, WEIGHT_SCALE, name), name, WEIGHT_SCALE)
    enc = as_float32_exact(fetch(tensors, WEIGHT_GLOBAL_SCALE, name), name, WEIGHT_GLOBAL_SCALE)
    experts = int(codes.shape[0]) if codes.ndim == 3 else None
    enc = squeeze_global(enc, experts, name, WEIGHT_GLOBAL_SCALE)
    g = decode_global(enc, name)
    planes = NVFP4Planes(codes=codes, scales=scales, global_scale=g, name=name)
    return validate(planes, content=True)
