"""``torchao``: ``NVFP4Tensor`` of torchao's ``mx_formats`` prototype, as a torchao user runs
it on CPU (PyTorch tensors).

What the engine has, and the kernel each becomes:

* ``NVFP4Tensor(qdata, scale, 16, dtype, per_tensor_scale).dequantize(dtype)`` ->
  :meth:`dequantize`; torchao multiplies its ``per_tensor_scale`` (the decode global,
  ``amax / (448 * 6)``, :func:`per_tensor_amax_to_scale`) into the block scales in float32;
* ``F.linear(x, w)`` on an ``NVFP4Tensor`` weight without activation quantization (its
  weight-only path, ``nvfp4_linear``) -> :meth:`qmm`: the weight is first given x's dtype
  with ``w.to(x.dtype)`` (torchao's ``_to_copy``), as in a model whose weights and
  activations share one dtype; torchao then decodes it to that dtype and calls torch's
  ``linear``;
* ``NVFP4Tensor.to_nvfp4(x, per_tensor_scale=...)`` -> :meth:`quantize_activations` (the
  contract's only NVFP4 encoder): dynamic, the ``per_tensor_scale`` is
  ``per_tensor_amax_to_scale(torch.max(torch.abs(x)))``, what torchao's ``nvfp4_linear``
  computes with ``use_dynamic_per_tensor_scale``; static, the input scale is passed as the
  ``per_tensor_scale`` (torchao's ``act_per_tensor_scale``).

What it lacks on CPU is absent, not filled in: its W4A4 matmul (``act_quant_kwargs``)
calls ``torch._scaled_mm`` on float4 operands and its MoE matmul ``_grouped_mm`` needs
CUDA (MSLK kernels), so there is no ``qmm_w4a4`` and no ``gather_qmm``.

torchao reads the planes of :func:`nvfp4.layouts.modelopt.to_modelopt` (its ``qdata`` and
linear ``scale`` are those bytes; ``per_tensor_scale`` is the decode global, ``()`` or
``(E, 1, 1)`` for an expert stack). An ``NVFP4Tensor`` holds one ``per_tensor_scale``, as
a torchao model quantizes each projection on its own: a fused tensor is one
``NVFP4Tensor`` per partition, and ``qmm`` concatenates their outputs.
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

__all__ = ["DISTRIBUTION", "NAME", "TorchaoKernels", "TorchaoWeight", "backend"]

NAME: Final = "torchao"
DISTRIBUTION: Final = "torchao"
INSTALL: Final = "pip install 'torchao>=0.18'"


@dataclass(frozen=True)
class TorchaoWeight:
    """A prepared weight: one ``NVFP4Tensor`` (float32 ``orig_dtype``) per partition."""

    parts: tuple[Any, ...]


def _module() -> Any:
    from torchao.prototype.mx_formats import nvfp4_tensor

    return nvfp4_tensor


def _check() -> str:
    torch = _torch.torch()
    w = _module().NVFP4Tensor.to_nvfp4(torch.ones((1, BLOCK_SIZE)))
    torch.nn.functional.linear(torch.ones((1, BLOCK_SIZE)), w)
    return _torch.cpu_device(DISTRIBUTION)


_probe = cached_probe("torchao", DISTRIBUTION, INSTALL, "NVFP4Tensor", _check)


def _ready() -> Any:
    require(NAME, _probe())
    return _module()


class TorchaoKernels(EngineKernels, _torch.TorchArrays):
    """The kernel contract over torchao's ``NVFP4Tensor`` (``torch.Tensor`` in and out)."""

    NAME = NAME
    DISTRIBUTION = DISTRIBUTION
    probe = staticmethod(_probe)
    CAPABILITIES = frozenset({"dequantize", "qmm", "fused_partitions", "quantize_activations"})
    NOTES = (
        "dequantize: NVFP4Tensor(qdata, scale, 16, float32, per_tensor_scale).dequantize(dtype)",
        "qmm: F.linear(x, w.to(x.dtype)), torchao's weight-only path (decode to x's "
        "dtype, then torch's linear), one NVFP4Tensor per partition",
        "quantize_activations: NVFP4Tensor.to_nvfp4(x, per_tensor_scale="
        "per_tensor_amax_to_scale(max|x|)) (dynamic) or the input scale (static)",
        "absent on CPU: W4A4 (torch._scaled_mm on float4) and the MoE _grouped_mm",
    )

    def prepare(self, planes: NVFP4Planes) -> TorchaoWeight:
        m = _ready()
        torch = _torch.torch()
        return TorchaoWeight(
            tuple(
                m.NVFP4Tensor(t.codes, t.scale, BLOCK_SIZE, torch.float32, t.global_scale)
                for t in modelopt_tensors(planes)
            )
        )

    def dequantize(self, w: TorchaoWeight, *, dtype: str) -> Any:
        return _torch.cat_parts([p.dequantize(_torch.torch_dtype(dtype)) for p in w.parts], -2)

    def qmm(self, x: Any, w: TorchaoWeight, *, out_dtype: str) -> Any:
        torch = _torch.torch()
        ys = [torch.nn.functional.linear(x, p.to(x.dtype)) for p in w.parts]
        return _torch.cat_parts(ys, dim=-1).to(_torch.torch_dtype(out_dtype))

    def quantize_activations(self, x: Any, *, input_scale: float | None) -> NVFP4Planes:
        m = _ready()
        torch = _torch.torch()
        if input_scale is None:
            g = m.per_tensor_amax_to_scale(torch.max(torch.abs(x)))
        else:
            g = _torch.tensor(input_scale)
        q = m.NVFP4Tensor.to_nvfp4(x, BLOCK_SIZE, per_tensor_scale=g)
        # qdata and the linear scale are the canonical bytes, per_tensor_scale the decode global
        return activation_planes(
            _torch.to_numpy(q.qdata),
            _torch.to_numpy(q.scale),
            _torch.to_numpy(q.per_tensor_scale.float()),
        )


def backend() -> Frontend:
    """Entry-point factory (``torchao = "nvfp4_engines.torchao:backend"``): cheap, never
    raises."""
    return Frontend(TorchaoKernels())
