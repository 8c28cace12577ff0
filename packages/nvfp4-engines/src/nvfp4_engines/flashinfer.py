"""``flashinfer``: FlashInfer's NVFP4 kernels (``flashinfer.fp4_quantize``, ``mm_fp4``,
``e2m1_and_ufp8sf_scale_to_float``), as vLLM and SGLang call them. GPU only: without a CUDA
device :meth:`availability` says "needs CUDA" and what to install, and nothing of
FlashInfer is imported.

What the engine has, and the kernel each becomes:

* ``fp4_quantize(x, global_scale, sf_vec_size=16, sf_use_ue8m0=False,
  is_sf_swizzled_layout=True)`` -> :meth:`quantize_activations`. FlashInfer takes the
  ENCODE global ``448 * 6 / amax``: dynamic, it is ``(448 * 6) /
  x.float().abs().nan_to_num().max()``, the global FlashInfer's own tests and benchmarks
  compute; static, the input scale's reciprocal (``input_global_scale``). The scales come
  back swizzled (128x4) and are unswizzled by the lossless transcoder;
* ``mm_fp4(a, b.T, a_sf, b_sf.T, alpha, out_dtype, block_size=16)`` on the output of
  ``fp4_quantize`` -> :meth:`qmm_w4a4`, with ``alpha = 1 / (input_global_scale *
  weight_global_scale)`` as vLLM passes it; one call per partition (one global each);
* ``e2m1_and_ufp8sf_scale_to_float(codes, scales, decode_global, 16, 1,
  is_sf_swizzled_layout=False)`` -> :meth:`dequantize` (float32, then cast), one partition
  and one expert at a time; FlashInfer's tests pass it the decode global ``1 / global_sf``
  and CPU tensors.

``mm_fp4`` returns bfloat16 or float16 only: a float32 ``out_dtype`` is handed to it as
asked and FlashInfer's answer is the result. There is no W4A16 ``qmm`` (``mm_bf16_fp4``
needs backend-specific weight preparation) and no ``gather_qmm``.
"""

from __future__ import annotations

from typing import Any, Final

from nvfp4.backend import Frontend
from nvfp4.layouts.compressed_tensors import decode_global
from nvfp4.spec import BLOCK_SIZE

from . import _swizzled, _torch
from ._swizzled import Fp4Ops, SwizzledPart, SwizzledWeight

__all__ = ["DISTRIBUTION", "NAME", "FlashinferKernels", "backend"]

NAME: Final = "flashinfer"
DISTRIBUTION: Final = "flashinfer-python"
INSTALL: Final = "pip install 'flashinfer-python>=0.7.2'"


def _fi() -> Any:
    """FlashInfer's three NVFP4 entry points, from the modules its docs name."""
    from types import SimpleNamespace

    from flashinfer.fp4_quantization import e2m1_and_ufp8sf_scale_to_float, fp4_quantize
    from flashinfer.gemm import mm_fp4

    return SimpleNamespace(
        fp4_quantize=fp4_quantize,
        mm_fp4=mm_fp4,
        e2m1_and_ufp8sf_scale_to_float=e2m1_and_ufp8sf_scale_to_float,
    )


def _ops(fi: Any) -> Fp4Ops:
    """``fp4_quantize`` (dynamic global: ``x.float().abs().nan_to_num().max()``, as
    FlashInfer's own tests and benchmarks compute it) and ``mm_fp4``."""
    return Fp4Ops(
        quantize=lambda x, gs: fi.fp4_quantize(x, gs, BLOCK_SIZE, False, True),
        matmul=lambda a, a_sf, p, alpha, dtype: fi.mm_fp4(
            a, p.codes.t(), a_sf, p.swizzled.t(), alpha, dtype, block_size=BLOCK_SIZE
        ),
        amax=lambda x: x.float().abs().nan_to_num().max(),
    )


class FlashinferKernels(_swizzled.Fp4Kernels):
    """The kernel contract over FlashInfer's NVFP4 kernels (CUDA ``torch.Tensor``):
    ``prepare``, ``quantize_activations`` and ``qmm_w4a4`` from :class:`_swizzled.Fp4Kernels`
    over :meth:`ops`."""

    NAME = NAME
    DISTRIBUTION = DISTRIBUTION
    ENGINE = "FlashInfer"
    INSTALL = INSTALL
    CAPABILITIES = frozenset({"dequantize", "fused_partitions", "quantize_activations", "w4a4"})
    NOTES = (
        "quantize_activations: fp4_quantize(x, 448 * 6 / max|x| or 1 / input_scale), "
        "swizzled scales unswizzled",
        "w4a4: fp4_quantize then mm_fp4 with alpha = 1 / (input_gs * weight_gs), "
        "one call per partition",
        "dequantize: e2m1_and_ufp8sf_scale_to_float(codes, linear scales, decode "
        "global), float32, then cast",
    )

    def engine_ops(self) -> Fp4Ops:
        return _ops(_fi())

    def dequantize(self, w: SwizzledWeight, *, dtype: str) -> Any:
        self.ready()
        fi = _fi()
        torch = _torch.torch()

        def one(p: SwizzledPart) -> Any:
            g = _torch.tensor(decode_global(_torch.to_numpy(p.encode)).reshape(1))
            return fi.e2m1_and_ufp8sf_scale_to_float(
                p.codes.cpu(), p.scales.cpu(), g, BLOCK_SIZE, 1, False
            ).reshape(p.n, p.k)

        rows = [
            torch.stack([one(p) for p in mats]) if w.experts is not None else one(mats[0])
            for mats in w.parts
        ]
        return _torch.cat_parts(rows, dim=-2).to(_torch.torch_dtype(dtype))


def backend() -> Frontend:
    """Entry-point factory (``flashinfer = "nvfp4_engines.flashinfer:backend"``): cheap,
    never raises."""
    return Frontend(FlashinferKernels())
