"""nvfp4-cuda: NVFP4 on NVIDIA GPUs, the ``cuda`` backend of :mod:`nvfp4`.

* :func:`backend` / :class:`CUDABackend` - core's verbs over the kernel contract
  (priority 100): W4A16 ``qmm`` (decode GEMV, prefill GEMM, or dequantize + cuBLAS, by the
  table in :mod:`nvfp4_cuda.dispatch`), MoE ``gather_qmm``, exact ``dequantize``,
  bit-exact ``quantize_activations``, and W4A4 on compute capability 10.x / 12.x;
* :mod:`nvfp4_cuda.configs` - tiles per compute capability;
* :mod:`nvfp4_cuda.device` - GPU detection (or the Triton interpreter).

The kernels are the Triton source shared with ``nvfp4-rocm`` (package ``nvfp4-triton``).
Importing this package needs no GPU and imports neither torch nor triton;
``backend().availability()`` says what runs here. With ``TRITON_INTERPRET=1`` the kernels
run on the CPU and the device is reported as "Triton interpreter on CPU".
"""

from __future__ import annotations

from ._version import __version__
from .backend import CUDABackend, CUDAKernels, backend

__all__ = ["CUDABackend", "CUDAKernels", "__version__", "backend"]
