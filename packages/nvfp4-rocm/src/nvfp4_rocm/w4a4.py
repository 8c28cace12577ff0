"""W4A4 on AMD, **emulated**: the activations are quantized to NVFP4, then the product runs
on the W4A16 path.

AMD GPUs have no NVFP4 matrix instruction. gfx950 (CDNA4) has FP4 MFMA, but for MXFP4:
one E8M0 (power-of-two) scale per 32 elements. An NVFP4 block scale is an E4M3 value per
16 elements, which E8M0 cannot represent (E4M3 has 3 mantissa bits), so feeding NVFP4
into those instructions means re-quantizing - lossy, and not NVFP4. This module does not
do that. It computes exactly what spec 1.0 defines for W4A4:

``y[m, n] = (sum_k xq[m, k] * wq[n, k]) * g_x * g_w[n]``

1. ``g_x``: the static ``input_scale`` or ``amax / 2688`` (:func:`nvfp4_triton.ops.activation_global`);
2. ``xq``: x encoded by the shared, bit-exact activation kernel
   (:func:`nvfp4_triton.ops.quantize_activations`), then decoded by the shared dequantize
   kernel with a global of 1.0 - ``e2m1 * e4m3``, exact in float32; blocks whose x held
   NaN / Inf carry the NaN scale byte 0x7F and are decoded as NaN, so their output rows are
   non-finite;
3. the W4A16 product of those float32 activations with the weight by a kernel that
   applies the weight's globals after accumulation (``gemv`` or ``gemm``, see
   :func:`nvfp4_rocm.dispatch.w4a4_path`), then ``* g_x`` in float32 and the cast to the
   output dtype.

It is as accurate as a native W4A4 GEMM (float32 accumulation of exact products, globals
after accumulation) and slower than W4A16 (an activation round trip, then float32
activations): the point is W4A4 *numerics* (the activation rounding a W4A4 checkpoint was
calibrated for), not W4A4 speed. The backend declares the ``w4a4`` capability with an
"emulated" note.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nvfp4.reference import NONFINITE_BLOCK_SCALE
from nvfp4.spec import BLOCK_SIZE
from nvfp4_triton import ops
from nvfp4_triton.config import KernelConfig
from nvfp4_triton.weights import DeviceWeight

__all__ = ["NOTE", "decoded_activations", "matmul"]

#: What BackendInfo.notes says about W4A4.
NOTE = (
    "W4A4 emulated: activations quantized by the shared NVFP4 kernel, decoded exactly, then "
    "the W4A16 GEMV/GEMM kernels, globals after accumulation (AMD has no NVFP4 matrix "
    "instruction; gfx950's MXFP4 MFMA needs E8M0 scales, a lossy conversion that is not NVFP4)"
)


def decoded_activations(x: Any, g: Any, cfg: KernelConfig, name: str) -> Any:
    """x ``[M, K]`` quantized with global ``g`` and decoded *without* the global, float32:
    the exact ``e2m1 * e4m3`` values of the activation planes (NaN for non-finite blocks)."""
    import torch

    codes, scales = ops.quantize_activations(x, g, cfg)
    m, k = x.shape
    planes = DeviceWeight(
        name=name,
        n=m,
        k=k,
        num_experts=None,
        partitions=None,
        global_scale=np.ones((), dtype=np.float32),
        codes=codes,
        scales=scales,
        row_g=torch.ones(m, dtype=torch.float32, device=x.device),
    )
    xd = ops.dequantize(planes, torch.float32, cfg)
    nonfinite = (scales == NONFINITE_BLOCK_SCALE).repeat_interleave(BLOCK_SIZE, dim=1)
    return torch.where(nonfinite, torch.full_like(xd, float("nan")), xd)


def matmul(
    x: Any, w: DeviceWeight, input_scale: Any, out_dtype: Any, cfg: KernelConfig, path: str
) -> Any:
    """Emulated W4A4 ``x [M, K] @ w^T`` -> ``[M, N]`` in ``out_dtype``; ``path`` is the
    W4A16 path for the float32 decoded activations (:func:`nvfp4_rocm.dispatch.w4a4_path`)."""
    import torch

    if x.shape[0] == 0:
        return torch.empty((0, w.n), dtype=out_dtype, device=x.device)
    g = ops.activation_global(x, input_scale)  # float32, one element
    xd = decoded_activations(x, g, cfg, f"{w.name}.input")
    acc = ops.qmm(xd, w, torch.float32, cfg, path)  # (sum xq * wq) * g_w, float32
    return (acc * g).to(out_dtype)
