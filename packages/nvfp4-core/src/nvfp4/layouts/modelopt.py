"""The NVIDIA ModelOpt HF export layout (the canonical layout).

A ModelOpt NVFP4 linear layer ``<prefix>`` is stored as these safetensors tensors:

================================ ============ =============== ===============================
tensor                           dtype        shape           content
================================ ============ =============== ===============================
``<prefix>.weight``              U8           ``[N, K/2]``    two E2M1 codes a byte: element
                                                              ``2j`` in the low nibble,
                                                              ``2j+1`` in the high nibble
``<prefix>.weight_scale``        F8_E4M3      ``[N, K/16]``   one E4M3 byte per 16
                                                              consecutive elements along K,
                                                              row-major
``<prefix>.weight_scale_2``      F32          ``()``          the DECODE global (``amax /
                                                              2688`` from ModelOpt)
``<prefix>.input_scale``         F32          ``()``          the activations' static DECODE
                                                              global (W4A4), when present
================================ ============ =============== ===============================

These are the canonical planes byte for byte: ``weight`` is ``codes``, ``weight_scale`` is
``scales`` viewed as ``float8_e4m3fn`` and ``weight_scale_2`` is ``global_scale``. A
transcode is therefore a view (no copy of a contiguous plane). Decoding is
``e2m1(code) * e4m3(scale) * weight_scale_2``.

ModelOpt exports MoE experts one by one (``experts.<i>.<proj>.weight`` ...). For expert-stacked
planes ``[E, N, K]`` :func:`to_modelopt` returns the stacked arrays with ``weight_scale_2`` of
shape ``(E,)``; split them with :func:`nvfp4.fusion.unstack_experts` to write per-expert
tensors. Fused planes (q/k/v, gate/up with ``partitions``) are refused: ModelOpt stores each
projection separately; unfuse first.

Older exports store ``weight_scale_2`` as bfloat16 or float16 (TensorRT-LLM's loader notes
it): :func:`from_modelopt` converts those exactly to float32, and accepts the shapes
``()`` and ``(1,)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..planes import NVFP4Planes, validate
from ._common import (
    as_bytes,
    as_float32_exact,
    as_scale_bytes,
    fetch,
    per_expert_global,
    refuse_partitions,
    squeeze_global,
)

__all__ = [
    "INPUT_SCALE",
    "WEIGHT",
    "WEIGHT_SCALE",
    "WEIGHT_SCALE_2",
    "from_modelopt",
    "to_modelopt",
]

#: Suffix of the packed codes, U8 ``[N, K/2]``.
WEIGHT: Final = "weight"
#: Suffix of the block scales, F8_E4M3 ``[N, K/16]``.
WEIGHT_SCALE: Final = "weight_scale"
#: Suffix of the decode global, F32 scalar.
WEIGHT_SCALE_2: Final = "weight_scale_2"
#: Suffix of the activations' static decode global (W4A4), F32 scalar.
INPUT_SCALE: Final = "input_scale"


def to_modelopt(planes: NVFP4Planes) -> dict[str, npt.NDArray[Any]]:
    """Canonical planes -> ModelOpt tensors (keys :data:`WEIGHT`, :data:`WEIGHT_SCALE`,
    :data:`WEIGHT_SCALE_2`, without the layer prefix).

    ``weight`` is the codes (uint8 ``[E?, N, K/2]``), ``weight_scale`` the same scale bytes
    viewed as ``float8_e4m3fn`` ``[E?, N, K/16]`` (no copy when contiguous) and
    ``weight_scale_2`` the float32 decode global, shape ``()`` or ``(E,)`` for expert-stacked
    planes. The planes' content is validated first. Fused planes raise
    :class:`~nvfp4.PlaneError` (unfuse first).
    """
    validate(planes, content=True)
    refuse_partitions(
        planes.name,
        planes.partitions,
        "ModelOpt",
        "ModelOpt stores each projection with its own weight_scale_2",
    )
    g = planes.global_scale
    e = planes.num_experts
    scale_2 = per_expert_global(g, e) if e is not None else np.array(g, dtype=np.float32)
    scales = np.ascontiguousarray(planes.scales)
    return {
        WEIGHT: np.ascontiguousarray(planes.codes),
        WEIGHT_SCALE: scales.view(ml_dtypes.float8_e4m3fn),
        WEIGHT_SCALE_2: scale_2,
    }


def from_modelopt(tensors: Mapping[str, Any], name: str = "tensor") -> NVFP4Planes:
    """ModelOpt tensors (keys :data:`WEIGHT`, :data:`WEIGHT_SCALE`, :data:`WEIGHT_SCALE_2`)
    -> canonical planes, validated with ``content=True``.

    ``weight`` must be uint8; ``weight_scale`` ``float8_e4m3fn`` or raw uint8 bytes (viewed,
    not converted); ``weight_scale_2`` float32 (bfloat16 / float16 converted exactly) of
    shape ``()`` or ``(1,)``, or ``(E,)`` for expert-stacked ``[E, N, K/2]`` weights.
    Raises :class:`~nvfp4.PlaneError` naming ``name``, the expected and the found.
    """
    codes = as_bytes(fetch(tensors, WEIGHT, name), name, WEIGHT)
    scales = as_scale_bytes(fetch(tensors, WEIGHT_SCALE, name), name, WEIGHT_SCALE)
    g = as_float32_exact(fetch(tensors, WEIGHT_SCALE_2, name), name, WEIGHT_SCALE_2)
    experts = int(codes.shape[0]) if codes.ndim == 3 else None
    g = squeeze_global(g, experts, name, WEIGHT_SCALE_2)
    planes = NVFP4Planes(codes=codes, scales=scales, global_scale=g, name=name)
    return validate(planes, content=True)
