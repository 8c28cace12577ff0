"""nvfp4: the NVFP4 standard in code.

* :mod:`nvfp4.spec` - spec 1.0 as constants and tables (E2M1, E4M3, the swizzle formula);
* :class:`NVFP4Planes`, :func:`validate`, :class:`PlaneError` - the canonical planes;
* :func:`quantize`, :func:`dequantize` and :mod:`nvfp4.reference` - the bit-exact reference;
* :mod:`nvfp4.layouts` - lossless transcoders (ModelOpt, compressed-tensors, MLX, GGUF, 128x4);
* :mod:`nvfp4.fusion` and :mod:`nvfp4.sharding` - fused partitions, expert stacks, tensor parallelism;
* :mod:`nvfp4.fixtures` - the golden fixtures (checkpoint reading and writing, and the
  ``nvfp4`` CLI, are the separate package nvfp4-checkpoints: ``import nvfp4_checkpoints``);
* the verbs (:func:`prepare`, :func:`qmm`, :func:`gather_qmm`, :func:`dequantize`,
  :func:`quantize_activations`, :func:`qmm_w4a4`, and spec 1.1's W4A8 verbs
  :func:`qmm_w4a8`, :func:`gather_qmm_w4a8`, :func:`qmm_w4a8_fp8`) and :class:`Frontend`, which checks every
  argument once and calls a backend's kernels (:mod:`nvfp4.contract`, the narrow contract a
  backend implements); :func:`get_backend` and :mod:`nvfp4.registry` find the backends.
"""

from __future__ import annotations

from ._moved import renamed
from ._version import __version__
from .activations import FP8Activations, Q8Activations
from .backend import Frontend, Prepared
from .contract import Availability, BackendInfo, Kernels
from .planes import NVFP4Planes, PlaneError, validate
from .reference import quantize
from .registry import BackendUnavailable, get_backend
from .spec import SPEC_VERSION, SUPPORTED_SPEC_VERSIONS, SpecVersionError, require_spec
from .verbs import (
    dequantize,
    gather_qmm,
    gather_qmm_w4a8,
    prepare,
    qmm,
    qmm_w4a4,
    qmm_w4a8,
    qmm_w4a8_fp8,
    quantize_activations,
    to_planes,
)

__all__ = [
    "SPEC_VERSION",
    "SUPPORTED_SPEC_VERSIONS",
    "Availability",
    "BackendInfo",
    "BackendUnavailable",
    "FP8Activations",
    "Frontend",
    "Kernels",
    "NVFP4Planes",
    "PlaneError",
    "Prepared",
    "Q8Activations",
    "SpecVersionError",
    "__version__",
    "dequantize",
    "gather_qmm",
    "gather_qmm_w4a8",
    "get_backend",
    "prepare",
    "qmm",
    "qmm_w4a4",
    "qmm_w4a8",
    "qmm_w4a8_fp8",
    "quantize",
    "quantize_activations",
    "require_spec",
    "to_planes",
    "validate",
]

#: ``nvfp4.Backend``: :class:`Frontend`'s old name, one release (warns).
__getattr__ = renamed(__name__, {"Backend": ("Frontend", Frontend)})
