"""nvfp4-cpu: fused NVFP4 kernels for the CPU (AVX-512, AVX2, portable C), the ``cpu``
backend of :mod:`nvfp4`.

* :func:`backend` / :class:`CPUBackend` - the :class:`nvfp4.backend.Backend` contract;
* :class:`PreparedWeight` - a weight in the tiled layout (:mod:`nvfp4_cpu.layout`);
* :mod:`nvfp4_cpu.ops` - the same operations with an explicit ISA level and thread count.

Importing this package is cheap and never fails: the compiled library is loaded on first
use, and ``backend().availability()`` says why when it cannot be.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._native import ISA_LEVELS, IsaUnavailable, NativeUnavailable
from .backend import CPUBackend, backend
from .layout import PreparedWeight

__all__ = [
    "ISA_LEVELS",
    "CPUBackend",
    "IsaUnavailable",
    "NativeUnavailable",
    "PreparedWeight",
    "__version__",
    "backend",
]
