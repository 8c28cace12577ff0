"""A weight as the Blackwell NVFP4 GEMMs of FlashInfer and vLLM take it: codes ``[N, K/2]``
uint8, the block scales in the 128x4 swizzled layout (:mod:`nvfp4.layouts.swizzle`) as a
float8_e4m3fn matrix ``[N', C']`` (rows padded to 128, scale columns to 4), and the ENCODE
global ``448 * 6 / amax`` (:func:`nvfp4.layouts.compressed_tensors.encode_global` of the decode global), the
one these engines take (``alpha = 1 / (input_global_scale * weight_global_scale)``). Every
plane comes from the lossless transcoders; nothing here decodes. One part per partition
and, within it, per expert: these GEMMs take one global per operand."""

from __future__ import annotations

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
from nvfp4.spec import BLOCK_SIZE, swizzled_scale_shape

from . import _torch
from ._common import activation_planes as canonical_activations

__all__ = ["SwizzledPart", "SwizzledWeight", "activation_planes", "input_encode_global", "prepare"]

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
