"""nvfp4-rocm: NVFP4 on AMD GPUs, the ``rocm`` backend of :mod:`nvfp4`.

* :func:`backend` / :class:`ROCmBackend` - core's verbs over the kernel contract
  (priority 100): W4A16 ``qmm`` (decode GEMV for small M, dequantize + hipBLASLt for
  prefill, by :mod:`nvfp4_rocm.dispatch`), MoE ``gather_qmm``, exact ``dequantize``,
  bit-exact ``quantize_activations``, and W4A4 *emulated* (no AMD GPU has an NVFP4 matrix
  instruction);
* :mod:`nvfp4_rocm.configs` - AMD architecture families and their tiles;
* :mod:`nvfp4_rocm.device` - GPU detection (or the Triton interpreter).

The kernels are the Triton source shared with ``nvfp4-cuda`` (package ``nvfp4-triton``).
Importing this package needs no GPU and imports neither torch nor triton;
``backend().availability()`` says what runs here. With ``TRITON_INTERPRET=1`` the kernels
run on the CPU with one AMD architecture's tiles (``$NVFP4_ROCM_ARCH``, default gfx942) and
the device is reported as "Triton interpreter on CPU (AMD configuration ...)".
"""

from __future__ import annotations

from ._version import __version__
from .backend import ROCmBackend, ROCmKernels, backend

__all__ = ["ROCmBackend", "ROCmKernels", "__version__", "backend"]
