"""``vllm``: vLLM's NVFP4 CUDA kernels (``vllm._custom_ops.scaled_fp4_quant`` and
``cutlass_scaled_fp4_mm``), as its ModelOpt / compressed-tensors NVFP4 linear method calls
them. GPU only: without a CUDA device :meth:`availability` says "needs CUDA" and what to
install, and nothing of vLLM is imported.

What the engine has, and the kernel each becomes:

* ``scaled_fp4_quant(x, input_global_scale)`` -> :meth:`quantize_activations`: vLLM takes
  the ENCODE global ``448 * 6 / amax`` that a checkpoint's ``input_scale`` gives (its
  reciprocal, as vLLM's loader computes it): a static input scale goes in that way;
  dynamic, the global is ``(448 * 6) / max|x|`` of x, the static global a calibration
  would give for this x (vLLM's NVFP4 linear has no dynamic global of its own). The
  scales come back swizzled (128x4) and are unswizzled by the lossless transcoder;
* ``cutlass_scaled_fp4_mm(a, b, a_sf, b_sf, alpha, out_dtype)`` on the output of
  ``scaled_fp4_quant`` -> :meth:`qmm_w4a4`, with ``alpha = 1 / (input_global_scale *
  weight_global_scale)`` as vLLM's ``process_weights_after_loading`` sets it; one call per
  partition (vLLM requires one global per fused layer; the adapter keeps each
  partition's own).

What it lacks as separate kernels is absent: vLLM has no NVFP4 dequantize op (its W4A16
path is Marlin, with its own repacked layout), so no ``dequantize`` / ``qmm`` here, and
its MoE kernels take routing, not expert ids, so no ``gather_qmm``.
"""

from __future__ import annotations

from typing import Any, Final

from nvfp4.backend import Frontend

from . import _swizzled
from ._swizzled import Fp4Ops

__all__ = ["DISTRIBUTION", "NAME", "VllmKernels", "backend"]

NAME: Final = "vllm"
DISTRIBUTION: Final = "vllm"
INSTALL: Final = "pip install 'vllm>=0.33'"


def _custom_ops() -> Any:
    from vllm import _custom_ops

    return _custom_ops


def _ops() -> Fp4Ops:
    """``scaled_fp4_quant`` (dynamic global: ``max|x|``, the static global a calibration
    would give for this x) and ``cutlass_scaled_fp4_mm``."""
    ops = _custom_ops()
    return Fp4Ops(
        quantize=ops.scaled_fp4_quant,
        matmul=lambda a, a_sf, p, alpha, dtype: ops.cutlass_scaled_fp4_mm(
            a, p.codes, a_sf, p.swizzled, alpha, dtype
        ),
        amax=lambda x: x.float().abs().max(),
    )


class VllmKernels(_swizzled.Fp4Kernels):
    """The kernel contract over vLLM's NVFP4 custom ops (CUDA ``torch.Tensor``):
    ``prepare``, ``quantize_activations`` and ``qmm_w4a4`` from :class:`_swizzled.Fp4Kernels`
    over :meth:`ops`."""

    NAME = NAME
    DISTRIBUTION = DISTRIBUTION
    ENGINE = "vLLM"
    INSTALL = INSTALL
    CAPABILITIES = frozenset({"fused_partitions", "quantize_activations", "w4a4"})
    NOTES = (
        "quantize_activations: scaled_fp4_quant(x, 448 * 6 / max|x| or "
        "1 / input_scale), swizzled scales unswizzled",
        "w4a4: scaled_fp4_quant then cutlass_scaled_fp4_mm with alpha = "
        "1 / (input_gs * weight_gs), one call per partition",
        "absent: no NVFP4 dequantize op (W4A16 is Marlin's repacked layout), no expert-id gather",
    )

    def engine_ops(self) -> Fp4Ops:
        return _ops()


def backend() -> Frontend:
    """Entry-point factory (``vllm = "nvfp4_engines.vllm:backend"``): cheap, never raises."""
    return Frontend(VllmKernels())
