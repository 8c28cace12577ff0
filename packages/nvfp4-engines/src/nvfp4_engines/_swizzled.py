"""A weight as the Blackwell NVFP4 GEMMs of FlashInfer and vLLM take it: codes ``[N, K/2]``
uint8, the block scales in the 128x4 swizzled layout (:mod:`nvfp4.layouts.swizzle`) as a
float8_e4m3fn matrix ``[N', C']`` (rows padded to 128, scale columns to 4), and the ENCODE
global ``448 * 6 / amax`` (:func:`nvfp4.layouts.compressed_tensors.encode_global` of the decode global), the
one these engines take (``alpha = 1 / (input_global_scale * weight_global_scale)``). Every
plane comes from the lossless transcoders; nothing here decodes. One part per partition
and, within it, per expert: these GEMMs take one global per operand.

Both engines quantize activations and multiply the same way (:class:`Fp4Ops`): the
activations' ENCODE global is a static input scale's reciprocal or ``448 * 6 / amax(x)``,
their scales come back swizzled, and W4A4 is one GEMM per partition with ``alpha = 1 /
(input_global_scale * weight_global_scale)``, as vLLM passes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4.fusion import unfuse, unstack_experts
from nvfp4.layouts.compressed_tensors import (
    WEIGHT_GLOBAL_SCALE,
    WEIGHT_PACKED,
    decode_global,
    input_global_scale_from_input_scale,
    to_compressed_tensors,
)
from nvfp4.layouts.swizzle import swizzle_scales, unswizzle_scales
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import BLOCK_SIZE, E2M1_MAX, E4M3_MAX, swizzled_scale_shape

from . import _torch
from ._common import activation_planes as canonical_activations
from ._cuda import CudaKernels

__all__ = [
    "Fp4Kernels",
    "Fp4Ops",
    "SwizzledPart",
    "SwizzledWeight",
    "activation_planes",
    "input_encode_global",
    "prepare",
    "qmm_w4a4",
    "quantize_activations",
]

DEVICE = "cuda"


@dataclass(frozen=True)
class SwizzledPart:
    """One 2-D operand on the GPU: codes, linear scale bytes, swizzled scales
    (float8_e4m3fn ``[N', C']``), the ENCODE global (float32 ``[1]``)."""

    codes: Any
    scales: Any
    swizzled: Any
    encode: Any
    n: int
    k: int


@dataclass(frozen=True)
class SwizzledWeight:
    """Parts by partition, then expert (``experts`` is None for a 2-D weight)."""

    parts: tuple[tuple[SwizzledPart, ...], ...]
    experts: int | None


def _part(p: NVFP4Planes) -> SwizzledPart:
    ct = to_compressed_tensors(p)
    rows, cols = swizzled_scale_shape(p.n, p.k // BLOCK_SIZE)
    sw = swizzle_scales(p.scales).reshape(rows, cols)
    torch = _torch.torch()
    return SwizzledPart(
        codes=_torch.from_numpy(ct[WEIGHT_PACKED], DEVICE),
        scales=_torch.from_numpy(np.ascontiguousarray(p.scales), DEVICE),
        swizzled=_torch.from_numpy(sw, DEVICE).view(torch.float8_e4m3fn),
        encode=_torch.from_numpy(ct[WEIGHT_GLOBAL_SCALE].reshape(1), DEVICE),
        n=p.n,
        k=p.k,
    )


def prepare(planes: NVFP4Planes) -> SwizzledWeight:
    """Validated planes as swizzled GPU operands, one per partition and expert."""
    parts = []
    for part in unfuse(planes):
        mats = unstack_experts(part) if part.num_experts is not None else [part]
        parts.append(tuple(_part(m) for m in mats))
    return SwizzledWeight(tuple(parts), planes.num_experts)


def input_encode_global(input_scale: float) -> Any:
    """A static input scale (decode) as the activations' ENCODE global, float32 ``[1]``."""
    return _torch.tensor(input_global_scale_from_input_scale(input_scale, "activation"), DEVICE)


def activation_planes(codes: Any, swizzled: Any, encode: Any, m: int, k: int) -> NVFP4Planes:
    """An engine's quantized activations (codes, swizzled scales, ENCODE global) back to
    planes (:func:`nvfp4_engines._common.activation_planes`): the scales unswizzled, the global its reciprocal."""
    buf: npt.NDArray[Any] = _torch.to_numpy(
        swizzled.contiguous().view(-1).view(_torch.torch().uint8)
    )
    scales = unswizzle_scales(buf, m, k // BLOCK_SIZE, "activation")
    enc = np.asarray(_torch.to_numpy(encode.float()), np.float32).reshape(1)
    return canonical_activations(
        _torch.to_numpy(codes.view(_torch.torch().uint8)),
        scales,
        decode_global(enc, "activation").reshape(()),
    )


@dataclass(frozen=True)
class Fp4Ops:
    """An engine's NVFP4 quantizer and W4A4 GEMM, and the amax its dynamic global takes."""

    #: ``(x, encode_global) -> (codes, swizzled scales)``
    quantize: Callable[[Any, Any], tuple[Any, Any]]
    #: ``(a, a_scales, weight part, alpha, out torch dtype) -> y``
    matmul: Callable[[Any, Any, SwizzledPart, Any, Any], Any]
    #: ``x -> amax`` (a float32 scalar tensor)
    amax: Callable[[Any], Any]


def _encode_global(ops: Fp4Ops, x: Any, input_scale: float | None) -> Any:
    """The activations' ENCODE global, float32 ``[1]``: a static input scale's reciprocal,
    or ``448 * 6 / amax(x)``."""
    if input_scale is not None:
        return input_encode_global(input_scale)
    return (E4M3_MAX * E2M1_MAX) / ops.amax(x).reshape(1)


def quantize_activations(ops: Fp4Ops, x: Any, input_scale: float | None) -> NVFP4Planes:
    """x quantized by the engine, back as planes (:func:`activation_planes`)."""
    gs = _encode_global(ops, x, input_scale)
    q, sf = ops.quantize(x, gs)
    return activation_planes(q, sf, gs, int(x.shape[0]), int(x.shape[1]))


def qmm_w4a4(
    ops: Fp4Ops, x: Any, w: SwizzledWeight, input_scale: float | None, out_dtype: str
) -> Any:
    """x quantized once, then one GEMM per partition with ``alpha = 1 / (input_global_scale
    * weight_global_scale)``, the outputs side by side."""
    gs = _encode_global(ops, x, input_scale)
    a, a_sf = ops.quantize(x, gs)
    dtype = _torch.torch_dtype(out_dtype)
    ys = [ops.matmul(a, a_sf, p, 1.0 / (gs * p.encode), dtype) for (p,) in w.parts]
    return _torch.cat_parts(ys, dim=-1)


class Fp4Kernels(CudaKernels, _torch.TorchArrays):
    """The kernels the FlashInfer and vLLM adapters share, over the engine's :class:`Fp4Ops`
    (:meth:`engine_ops`; :meth:`ops`: the engine ready, or the adapter's "cannot run here"
    error): ``prepare``, ``quantize_activations`` and ``qmm_w4a4``, CUDA tensors in and out.
    The availability check is the engine's quantizer on one bfloat16 block of ones."""

    DEVICE = DEVICE

    def engine_ops(self) -> Fp4Ops:
        """The engine's :class:`Fp4Ops` (imports the engine; no availability check)."""
        raise NotImplementedError

    def check(self) -> None:
        torch = _torch.torch()
        x = torch.ones((1, BLOCK_SIZE), dtype=torch.bfloat16, device=DEVICE)
        self.engine_ops().quantize(x, torch.ones(1, device=DEVICE))

    def ops(self) -> Fp4Ops:
        self.ready()
        return self.engine_ops()

    def prepare(self, planes: NVFP4Planes) -> SwizzledWeight:
        self.ops()
        return prepare(planes)

    def quantize_activations(self, x: Any, *, input_scale: float | None) -> NVFP4Planes:
        return quantize_activations(self.ops(), x, input_scale)

    def qmm_w4a4(
        self, x: Any, w: SwizzledWeight, *, input_scale: float | None, out_dtype: str
    ) -> Any:
        return qmm_w4a4(self.ops(), x, w, input_scale, out_dtype)
