"""``transformer-engine``: Transformer Engine's NVFP4 quantizer
(``transformer_engine.pytorch.NVFP4Quantizer``, the recipe ``NVFP4BlockScaling`` quantizes
with). GPU only: without a CUDA device :meth:`availability` says "needs CUDA" and what to
install, and nothing of Transformer Engine is imported.

What the engine has, and the kernel it becomes:

* ``NVFP4Quantizer(rowwise=True, columnwise=False, with_rht=False,
  stochastic_rounding=False)(x)`` -> :meth:`quantize_activations`: TE takes the global
  from the tensor itself (its ``amax``: decode global ``amax / (6 * 448)``), as its
  recipe does for every operand; a static ``input_scale`` has nowhere to go in TE, so it
  is not used and the planes carry TE's global. The row-wise data ``[M, K/2]`` is the
  canonical codes and the row-wise ``scale_inv`` holds the E4M3 block scales, padded to
  128 rows and 4 columns (swizzled for the GEMM where TE says so; unswizzled by the
  lossless transcoder then).

What it lacks as a callable on our planes is absent: TE's GEMMs take its own quantized
tensors from high-precision weights (``te.Linear`` under ``fp8_autocast``), not given
NVFP4 planes, so there is no ``dequantize`` / ``qmm`` / ``qmm_w4a4`` here.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
from nvfp4.backend import Frontend
from nvfp4.layouts.swizzle import unswizzle_scales
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import BLOCK_SIZE, GLOBAL_AMAX_DIVISOR

from . import _torch
from ._common import activation_planes
from ._cuda import CudaKernels

__all__ = ["DISTRIBUTION", "NAME", "TransformerEngineKernels", "backend"]

NAME: Final = "transformer-engine"
DISTRIBUTION: Final = "transformer-engine"
INSTALL: Final = "pip install 'transformer-engine[pytorch]>=2.20'"
DEVICE: Final = "cuda"


def _quantizer() -> Any:
    from transformer_engine.pytorch import NVFP4Quantizer

    return NVFP4Quantizer(rowwise=True, columnwise=False, with_rht=False, stochastic_rounding=False)


def _check() -> None:
    import transformer_engine.pytorch as te

    ok, reason = te.is_nvfp4_available(return_reason=True)
    if not ok:
        raise RuntimeError(reason)


class TransformerEngineKernels(CudaKernels, _torch.TorchArrays):
    """The kernel contract over Transformer Engine's ``NVFP4Quantizer`` (CUDA tensors)."""

    DEVICE = DEVICE
    NAME = NAME
    DISTRIBUTION = DISTRIBUTION
    ENGINE = "Transformer Engine"
    INSTALL = INSTALL
    CAPABILITIES = frozenset({"quantize_activations"})
    NOTES = (
        "quantize_activations: NVFP4Quantizer(rowwise, no RHT, no stochastic "
        "rounding)(x); TE's global from amax(x), input_scale not used",
        "absent: TE's GEMMs quantize high-precision operands themselves",
    )
    check = staticmethod(_check)

    def prepare(self, planes: NVFP4Planes) -> NVFP4Planes:
        self.ready()
        return planes

    def quantize_activations(self, x: Any, *, input_scale: float | None) -> NVFP4Planes:
        self.ready()
        q = _quantizer()(x)
        m, k = int(x.shape[0]), int(x.shape[1])
        cols = k // BLOCK_SIZE
        padded = _torch.to_numpy(q._rowwise_scale_inv.view(_torch.torch().uint8))
        if getattr(q, "_with_gemm_swizzled_scales", False):
            scales = unswizzle_scales(padded.reshape(-1), m, cols, "activation")
        else:
            scales = np.ascontiguousarray(padded[:m, :cols])
        amax = _torch.to_numpy(q._amax_rowwise.float()).reshape(())
        return activation_planes(
            _torch.to_numpy(q._rowwise_data.view(_torch.torch().uint8)),
            scales,
            np.float32(amax / np.float32(GLOBAL_AMAX_DIVISOR)),
        )


def backend() -> Frontend:
    """Entry-point factory (``transformer-engine =
    "nvfp4_engines.transformer_engine:backend"``): cheap, never raises."""
    return Frontend(TransformerEngineKernels())
