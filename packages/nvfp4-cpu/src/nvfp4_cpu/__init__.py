"""nvfp4-cpu: fused NVFP4 kernels for the CPU (AVX-512, AVX2, portable C), the ``cpu``
backend of :mod:`nvfp4`.

* :func:`backend` / :class:`CPUBackend` - core's verbs over :class:`CPUKernels` (the kernel contract);
* :class:`PreparedWeight` - a weight in the tiled layout (:mod:`nvfp4_cpu.layout`);
* :mod:`nvfp4_cpu.ops` - the same operations with an explicit ISA level and thread count.

Importing this package is cheap and never fails: the compiled library is loaded on first
use, and ``backend().availability()`` says why when it cannot be.
"""

from __future__ import annotations

from ._native import ISA_LEVELS, IsaUnavailable, NativeUnavailable
from ._version import __version__
from .backend import CPUBackend, CPUKernels, backend
from .layout import PreparedWeight

__all__ = [
    "ISA_LEVELS",
    "CPUBackend",
    "CPUKernels",
    "IsaUnavailable",
    "NativeUnavailable",
    "PreparedWeight",
    "__version__",
    "backend",
]
