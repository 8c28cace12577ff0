"""A weight as GGUF holds it, for the engines that read GGUF bytes (gguf-py, ggml).

GGUF stores one NVFP4 tensor with one F32 ``.scale`` (``[1]``, or ``[E]`` for an expert
stack), so a fused tensor whose partitions carry different globals is held as GGUF files
hold it: one tensor per projection (q, k, v), each with its own ``.scale``. The bytes come
from the lossless transcoder :func:`nvfp4.layouts.gguf.to_gguf`; nothing here decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from nvfp4.fusion import unfuse
from nvfp4.layouts.gguf import to_gguf
from nvfp4.planes import NVFP4Planes

__all__ = ["GgufTensor", "GgufWeight", "to_gguf_weight"]


@dataclass(frozen=True)
class GgufTensor:
    """One GGUF NVFP4 tensor: ``data`` uint8 ``[E?, rows, K/64 * 36]`` and its ``.scale``
    float32 ``(1,)`` or ``(E,)``."""

    data: npt.NDArray[np.uint8]
    scale: npt.NDArray[np.float32]

    @property
    def rows(self) -> int:
        return int(self.data.shape[-2])


@dataclass(frozen=True)
class GgufWeight:
    """A prepared weight: its GGUF tensors in row order (one unless fused), K, experts."""

    name: str
    tensors: tuple[GgufTensor, ...]
    k: int
    num_experts: int | None


def to_gguf_weight(planes: NVFP4Planes) -> GgufWeight:
    """Validated planes as GGUF tensors (one per partition). Raises
    :class:`nvfp4.PlaneError` where GGUF cannot hold them (K not a multiple of 64)."""
    tensors = tuple(GgufTensor(*to_gguf(part)) for part in unfuse(planes))
    return GgufWeight(planes.name, tensors, planes.k, planes.num_experts)
