"""nvfp4-triton: the one Triton source shared by the NVFP4 GPU backends.

``nvfp4-cuda`` and ``nvfp4-rocm`` import everything that is the same on both vendors from
here; only tile configurations, dispatch crossovers, device detection and vendor GEMMs live
in each backend.

* :mod:`nvfp4_triton.config` - :class:`KernelConfig` and the per-kernel tiles a backend
  passes in (pure Python);
* :mod:`nvfp4_triton.codec` - E2M1 / E4M3 decoders and encoders as ``@triton.jit`` helpers;
* :mod:`nvfp4_triton.kernels` - dequantize, W4A16 split-K GEMV (decode), W4A16 tiled GEMM
  with in-loop dequantization (prefill), MoE gather (rows and grouped), activation
  quantization (linear or 128x4-swizzled scales);
* :mod:`nvfp4_triton.weights` - :class:`DeviceWeight`, the planes on a torch device;
* :mod:`nvfp4_triton.ops` - launch wrappers (torch tensors in and out);
* :mod:`nvfp4_triton.backend` - :class:`TritonKernels`, the
  :class:`nvfp4.backend.Frontend` contract over those ops, which each vendor backend
  specializes with its device facts.

Importing this package imports neither torch nor triton and never needs a GPU; the
submodules that hold kernels import triton when they are first imported. Set
``TRITON_INTERPRET=1`` before that to run every kernel on the CPU.
"""

from __future__ import annotations

from . import config
from ._version import __version__
from .config import *  # noqa: F403 (the tiles, re-exported under config.__all__)
from .interpret import INTERPRETER_DEVICE, interpreter_mode

__all__ = [*config.__all__, "INTERPRETER_DEVICE", "__version__", "interpreter_mode"]
