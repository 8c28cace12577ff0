"""nvfp4: the NVFP4 standard in code.

* :mod:`nvfp4.spec` - spec 1.0 as constants and tables (E2M1, E4M3, the swizzle formula);
* :class:`NVFP4Planes`, :func:`validate`, :class:`PlaneError` - the canonical planes;
* :func:`quantize`, :func:`dequantize` and :mod:`nvfp4.reference` - the bit-exact reference;
* :mod:`nvfp4.layouts` - lossless transcoders (ModelOpt, compressed-tensors, MLX, GGUF, 128x4);
* :mod:`nvfp4.fusion` and :mod:`nvfp4.sharding` - fused partitions, expert stacks, tensor parallelism;
* :mod:`nvfp4.fixtures` - the golden fixtures (checkpoint reading and writing, and the
  ``nvfp4`` CLI, are the separate package nvfp4-checkpoints: ``import nvfp4_checkpoints``);
* :func:`get_backend` and :mod:`nvfp4.backend` - the backend contract and its registry.
"""

from __future__ import annotations

from .backend import Availability, Backend, BackendInfo
from .planes import NVFP4Planes, PlaneError, validate
from .reference import dequantize, quantize
from .registry import BackendUnavailable, get_backend
from .spec import SPEC_VERSION, SUPPORTED_SPEC_VERSIONS, SpecVersionError, require_spec

__version__ = "0.1.0"

__all__ = [
    "SPEC_VERSION",
    "SUPPORTED_SPEC_VERSIONS",
    "Availability",
    "Backend",
    "BackendInfo",
    "BackendUnavailable",
    "NVFP4Planes",
    "PlaneError",
    "SpecVersionError",
    "__version__",
    "dequantize",
    "get_backend",
    "quantize",
    "require_spec",
    "validate",
]
