"""nvfp4-metal: NVFP4 on MLX, the ``metal`` backend of :mod:`nvfp4`.

On Apple silicon it runs on the Metal GPU; elsewhere on MLX's CPU device
(``pip install "mlx[cpu]"``), and :meth:`MetalBackend.availability` says which.

* :func:`backend` / :class:`MetalBackend` - core's verbs over :class:`MetalKernels` (the kernel contract);
* :func:`prepare` -> :class:`MetalWeight` - the direct transcode: canonical planes become
  MLX's native ``nvfp4`` arrays by reinterpreting bytes (no dense matrix), the decode
  global kept as a sidecar (:mod:`nvfp4_metal.transcode`);
* :mod:`nvfp4_metal.ops` - ``qmm``, ``gather_qmm``, ``dequantize``,
  ``quantize_activations`` on ``mx.array``;
* :mod:`nvfp4_metal.nn` - ``NVFP4Linear`` and ``NVFP4SwitchLinear`` (MoE) modules;
* :func:`load` - a ModelOpt / compressed-tensors NVFP4 checkpoint as an ``mlx_lm`` model.

Importing this package is cheap and never fails: MLX is imported on first use.
``NVFP4_METAL_IMPL=affine`` selects the comparison rollback (dense decode, then MLX affine
4-bit); ``native`` (the default) keeps the NVFP4 bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .backend import MetalBackend, MetalKernels, backend
from .settings import IMPL_ENV, W4A4_ENV, Impl, impl_from_env

if TYPE_CHECKING:
    from .loader import load
    from .transcode import MetalWeight, prepare

__all__ = [
    "IMPL_ENV",
    "W4A4_ENV",
    "Impl",
    "MetalBackend",
    "MetalKernels",
    "MetalWeight",
    "__version__",
    "backend",
    "impl_from_env",
    "load",
    "prepare",
]


def __getattr__(name: str) -> Any:
    """Lazy attributes: the modules behind them import MLX (and mlx-lm for :func:`load`)."""
    if name == "load":
        from .loader import load

        return load
    if name in ("MetalWeight", "prepare"):
        from . import transcode

        return getattr(transcode, name)
    raise AttributeError(f"module 'nvfp4_metal' has no attribute {name!r}")
