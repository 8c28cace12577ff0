"""``modelopt``: NVIDIA ModelOpt's own NVFP4 code (``NVFP4QTensor``), as a ModelOpt user
runs it on CPU (PyTorch tensors).

What the engine has, and the kernel each becomes:

* ``NVFP4QTensor(shape, dtype, weight).dequantize(dtype, scale=weight_scale,
  double_scale=weight_scale_2, block_sizes={-1: 16})`` -> :meth:`dequantize`: the decode
  global goes in as ``double_scale``, as ModelOpt's export (and a reader of its
  checkpoints) passes ``weight_scale_2``: ModelOpt multiplies it into the block scales in
  float32 and casts once to the asked dtype;
* ``NVFP4QTensor.quantize(x, 16, weights_scaling_factor_2=...)`` -> :meth:`quantize_activations`
  (the contract's only NVFP4 encoder: the spec's encoder rule is the same for weights and
  activations). The global is ModelOpt's: dynamic, ``weights_scaling_factor_2`` is left to
  ModelOpt, which takes ``amax(x) / (6 * 448)`` itself (``get_weights_scaling_factor_2``);
  static, the input scale is passed as ``weights_scaling_factor_2``, the decode global
  ModelOpt exports as ``input_scale`` / ``weight_scale_2``.

What it lacks is absent, not filled in: ModelOpt's NVFP4 GEMM (``nvfp4_gemm``) runs through
TensorRT-LLM's CUDA ops only, so there is no ``qmm`` / ``gather_qmm`` / ``qmm_w4a4`` here.

ModelOpt reads the planes of :func:`nvfp4.layouts.modelopt.to_modelopt`, which are its
own export layout byte for byte. ModelOpt exports each projection and each expert with its
own ``weight_scale_2``: a fused tensor is handed over one partition at a time, and an
expert stack with ``double_scale`` of shape ``(E, 1, 1)``, which ModelOpt broadcasts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from nvfp4.backend import Frontend
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import BLOCK_SIZE

from . import _torch
from ._common import (
    EngineKernels,
    activation_planes,
    cached_probe,
    require,
)
from ._modelopt_layout import modelopt_tensors

__all__ = ["DISTRIBUTION", "NAME", "ModeloptKernels", "ModeloptWeight", "backend"]

NAME: Final = "modelopt"
DISTRIBUTION: Final = "nvidia-modelopt"
#: The release certified (``NVFP4QTensor.quantize`` / ``dequantize`` on CPU tensors).
INSTALL: Final = "pip install 'nvidia-modelopt>=0.47'"


@dataclass(frozen=True)
class ModeloptPart:
    """One ModelOpt tensor: the ``NVFP4QTensor`` of its packed codes, its ``weight_scale``
    (float8_e4m3fn) and ``weight_scale_2`` (float32, ``()`` or ``(E, 1, 1)``)."""

    qtensor: Any
    scale: Any
    double_scale: Any


@dataclass(frozen=True)
class ModeloptWeight:
    """A prepared weight: one ModelOpt tensor per partition, in row order."""

    parts: tuple[ModeloptPart, ...]


def _check() -> str:
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    torch = _torch.torch()
    q, s, g = NVFP4QTensor.quantize(torch.ones((1, BLOCK_SIZE)), BLOCK_SIZE)
    q.dequantize(torch.float32, scale=s, double_scale=g, block_sizes={-1: BLOCK_SIZE})
    return _torch.cpu_device(DISTRIBUTION)


_probe = cached_probe("ModelOpt", DISTRIBUTION, INSTALL, "NVFP4QTensor", _check)


def _qtensor_class() -> Any:
    require(NAME, _probe())
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    return NVFP4QTensor


class ModeloptKernels(EngineKernels, _torch.TorchArrays):
    """The kernel contract over ModelOpt's ``NVFP4QTensor`` (``torch.Tensor`` in and out)."""

    NAME = NAME
    DISTRIBUTION = DISTRIBUTION
    probe = staticmethod(_probe)
    CAPABILITIES = frozenset({"dequantize", "fused_partitions", "quantize_activations"})
    NOTES = (
        "dequantize: NVFP4QTensor.dequantize(dtype, scale=weight_scale, "
        "double_scale=weight_scale_2, block_sizes={-1: 16}), one partition at a time",
        "quantize_activations: NVFP4QTensor.quantize(x, 16), weights_scaling_factor_2 "
        "left to ModelOpt (amax / 2688, dynamic) or the input scale (static)",
        "absent: ModelOpt's NVFP4 GEMM needs TensorRT-LLM's CUDA ops",
    )

    def prepare(self, planes: NVFP4Planes) -> ModeloptWeight:
        cls = _qtensor_class()
        torch = _torch.torch()
        return ModeloptWeight(
            tuple(
                ModeloptPart(
                    cls(torch.Size((*t.codes.shape[:-1], t.k)), torch.float32, t.codes),
                    t.scale,
                    t.global_scale,
                )
                for t in modelopt_tensors(planes)
            )
        )

    def dequantize(self, w: ModeloptWeight, *, dtype: str) -> Any:
        out = [
            p.qtensor.dequantize(
                _torch.torch_dtype(dtype),
                scale=p.scale,
                double_scale=p.double_scale,
                block_sizes={-1: BLOCK_SIZE},
            )
            for p in w.parts
        ]
        return _torch.cat_parts(out, dim=-2)

    def quantize_activations(self, x: Any, *, input_scale: float | None) -> NVFP4Planes:
        cls = _qtensor_class()
        g = None if input_scale is None else _torch.tensor(input_scale)
        q, scale, scale_2 = cls.quantize(x, BLOCK_SIZE, weights_scaling_factor_2=g)
        # ModelOpt's export layout is the canonical one: its bytes as they are
        return activation_planes(
            _torch.to_numpy(q._quantized_data),
            _torch.to_numpy(scale),
            _torch.to_numpy(scale_2.float()),
        )


def backend() -> Frontend:
    """Entry-point factory (``modelopt = "nvfp4_engines.modelopt:backend"``): cheap, never
    raises."""
    return Frontend(ModeloptKernels())
