"""W4A4 on Blackwell (compute capability 10.x and 12.x): FP4 tensor cores via torch.

``y = (xq @ wq^T) * g_x * g_w[n]`` where ``xq`` are the activations quantized with the
spec's block rule (the shared, bit-exact Triton kernel, writing its scales straight into the
128x4 swizzled layout), ``wq`` the weight's codes and scales, and the product of the decoded
4-bit operands is computed by ``torch._scaled_mm`` with ``float4_e2m1fn_x2`` operands and
``float8_e4m3fn`` block scales (cuBLASLt's NVFP4 GEMM, one E4M3 scale per 16 elements,
scales in the 128x4 layout, ``SWIZZLE_32_4_4`` in torch's terms).

The globals are applied as spec 1.0 says: once, after accumulation, in float32 - the
activation global times the weight row's global (per tensor, or per fused partition, so a
fused q/k/v keeps one global per partition). ``_scaled_mm`` is asked for a float32 result
so that multiplication happens before any rounding to the output dtype.

Shape rules of the FP4 GEMM (torch's checks): K a multiple of 32 and N a multiple of 16.
The weight is padded once (zero codes, zero scale bytes: padded columns decode to 0) and
cached on the :class:`~nvfp4_triton.weights.DeviceWeight`; x is padded in K per call (zero
columns quantize to zero codes, so they add nothing) and the output cut back to N columns.

**Unmeasured.** No Blackwell GPU was available when this was written: the glue (padding,
swizzle, operand layout, globals) is tested on the CPU against an emulation of
``torch._scaled_mm`` built from the spec tables; the GEMM call itself has not run.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from nvfp4.layouts import swizzle_scales
from nvfp4.spec import BLOCK_SIZE
from nvfp4_triton import ops
from nvfp4_triton.backend import Platform
from nvfp4_triton.config import KernelConfig
from nvfp4_triton.weights import DeviceWeight

__all__ = ["K_ALIGN", "N_ALIGN", "W4A4_CAPABILITY_MAJORS", "matmul", "prepare_weight", "supported"]

#: Compute capability majors with FP4 tensor cores (sm_100/103 and sm_120/121).
W4A4_CAPABILITY_MAJORS = (10, 12)
#: torch._scaled_mm's FP4 alignment: K (elements) and N.
K_ALIGN = 32
N_ALIGN = 16
_CACHE_KEY = "w4a4"


def _round_up(v: int, to: int) -> int:
    return -(-v // to) * to


def supported(platform: Platform) -> bool:
    """A Blackwell GPU (not the interpreter) and a torch with FP4 dtypes and ``_scaled_mm``."""
    if not platform.ok or platform.interpreter or platform.capability is None:
        return False
    if platform.capability[0] not in W4A4_CAPABILITY_MAJORS:
        return False
    import torch

    return hasattr(torch, "float4_e2m1fn_x2") and hasattr(torch, "_scaled_mm")


def prepare_weight(w: DeviceWeight) -> tuple[Any, Any, int, int]:
    """The weight padded to the FP4 GEMM's alignment: ``(codes [N', K'/2] uint8, swizzled
    scales uint8 flat, N', K')``, cached on ``w``. Scales are swizzled by
    :func:`nvfp4.layouts.swizzle_scales` (the one implementation of the layout)."""
    cached = w.extras.get(_CACHE_KEY)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    import torch

    n_p, k_p = _round_up(w.n, N_ALIGN), _round_up(w.k, K_ALIGN)
    codes = torch.zeros((n_p, k_p // 2), dtype=torch.uint8, device=w.device)
    codes[: w.n, : w.k // 2] = w.codes
    scales = np.zeros((n_p, k_p // BLOCK_SIZE), dtype=np.uint8)
    scales[: w.n, : w.k // BLOCK_SIZE] = w.scales.cpu().numpy()
    swizzled = torch.from_numpy(swizzle_scales(scales, w.name)).to(w.device)
    result = (codes, swizzled, n_p, k_p)
    w.extras[_CACHE_KEY] = result
    return result


_FLOAT32_REFUSED = False


def matmul(x: Any, w: DeviceWeight, input_scale: Any, out_dtype: Any, cfg: KernelConfig) -> Any:
    """W4A4 ``x [M, K] @ w^T`` -> ``[M, N]`` in ``out_dtype`` (see the module docstring)."""
    import torch

    global _FLOAT32_REFUSED
    codes_w, scales_w, _n_p, k_p = prepare_weight(w)
    g = ops.activation_global(x, input_scale)  # over the unpadded x
    if k_p != w.k:
        x = torch.nn.functional.pad(x, (0, k_p - w.k))
    codes_x, scales_x = ops.quantize_activations(x, g, cfg, swizzled=True)
    a = codes_x.view(torch.float4_e2m1fn_x2)
    b = codes_w.view(torch.float4_e2m1fn_x2).t()  # [K'/2, N'], column-major as required
    sa = scales_x.view(torch.float8_e4m3fn)
    sb = scales_w.view(torch.float8_e4m3fn)
    acc_dtype = torch.bfloat16 if _FLOAT32_REFUSED else torch.float32
    try:
        acc = torch._scaled_mm(a, b, sa, sb, out_dtype=acc_dtype)
    except RuntimeError as exc:
        if acc_dtype != torch.float32:
            raise
        _FLOAT32_REFUSED = True
        warnings.warn(
            f"torch._scaled_mm refused a float32 result for NVFP4 ({exc}); using bfloat16, "
            "which rounds the accumulator before the globals (float32 W4A4 results then "
            "exceed the spec's float32 tolerance)",
            RuntimeWarning,
            stacklevel=2,
        )
        acc = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    y = acc[:, : w.n].to(torch.float32) * (g * w.row_g)[None, :]
    return y.to(out_dtype)
