"""A weight in ModelOpt's export layout as torch tensors, one partition at a time: what
ModelOpt's ``NVFP4QTensor`` and torchao's ``NVFP4Tensor`` (which holds the same bytes) are
built from. The bytes are those of the lossless transcoder
:func:`nvfp4.layouts.modelopt.to_modelopt`; nothing here decodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvfp4.fusion import unfuse
from nvfp4.layouts.modelopt import WEIGHT, WEIGHT_SCALE, WEIGHT_SCALE_2, to_modelopt
from nvfp4.planes import NVFP4Planes

from . import _torch

__all__ = ["ModeloptTensors", "modelopt_tensors"]


@dataclass(frozen=True)
class ModeloptTensors:
    """One partition: ``weight`` (packed codes, uint8 ``[..., N, K/2]``), ``weight_scale``
    (float8_e4m3fn) and ``weight_scale_2`` (the float32 decode global), and K."""

    codes: Any
    scale: Any
    global_scale: Any
    k: int


def modelopt_tensors(planes: NVFP4Planes) -> list[ModeloptTensors]:
    """The partitions of ``planes`` in row order. ModelOpt exports, and torchao quantizes,
    each projection and each expert with its own global: ``weight_scale_2`` is ``()`` per
    tensor and ``(E, 1, 1)`` per expert, which both engines broadcast."""
    out = []
    for part in unfuse(planes):
        mo = to_modelopt(part)
        g = _torch.from_numpy(mo[WEIGHT_SCALE_2])
        g = g.reshape(-1, 1, 1) if part.num_experts is not None else g.reshape(())
        out.append(
            ModeloptTensors(
                _torch.from_numpy(mo[WEIGHT]), _torch.from_numpy(mo[WEIGHT_SCALE]), g, part.k
            )
        )
    return out
