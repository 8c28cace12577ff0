"""The MLX native ``mode="nvfp4"`` layout (``mx.quantize`` / ``mx.dequantize`` /
``mx.quantized_matmul`` / ``mx.gather_qmm``).

========== ======= ================== ==================================================
array      dtype   shape              content
========== ======= ================== ==================================================
``weight`` uint32  ``[E?, N, K/8]``   the canonical code bytes read as little-endian
                                      32-bit words: element ``i`` of a word (8 per word)
                                      sits at bits ``4i .. 4i+3``; word ``w`` of a row
                                      holds elements ``8w .. 8w+7``
``scales`` uint8   ``[E?, N, K/16]``  the canonical E4M3 scale bytes, unchanged
global     float32 as the planes'     a sidecar DECODE global, applied to the matmul
                                      output (``y = (x @ W^T) * global``)
========== ======= ================== ==================================================

The transcode is a view: on a little-endian host, contiguous codes are reinterpreted as
uint32 without a copy (``np.ndarray.view``), and the scales are the same array. MLX's
matmuls take no global at all, so the global stays a sidecar that the caller multiplies into
the output rows (per expert after ``gather_qmm``, per partition for fused planes).

MLX's own ``global_scale`` argument (``mx.quantize`` / ``mx.dequantize`` / ``mx.qqmm``) is
not a decode multiplier but the tensor's amax: MLX decodes with ``global_scale / 2688``.
:func:`mlx_global_scale_arg` converts a decode global to that argument (``decode * 2688``
in float32; MLX's own division by 2688 can then differ from the decode global by one ulp).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..planes import NVFP4Planes, PlaneError, check_global_shape, check_partitions, validate
from ..spec import BLOCK_SIZE, GLOBAL_AMAX_DIVISOR
from ._common import as_float32_exact, describe

__all__ = ["MLX_WORD", "MLXPlanes", "from_mlx", "mlx_global_scale_arg", "to_mlx"]

#: The dtype of MLX's packed words: little-endian uint32.
MLX_WORD = np.dtype("<u4")
#: Codes per uint32 word.
_CODES_PER_WORD = 8


@dataclass(frozen=True, eq=False)
class MLXPlanes:
    """An NVFP4 tensor in MLX's native layout, plus the sidecar decode global.

    Attributes:
        weight: uint32 ``[E?, N, K/8]`` (pass to ``mx.array`` for MLX's quantized ops).
        scales: uint8 ``[E?, N, K/16]`` E4M3 bytes.
        global_scale: float32 decode global, same shape as the planes' (``()``, ``(E,)``,
            ``(P,)`` or ``(E, P)``), applied to the matmul output.
        partitions: fused-partition row boundaries, or ``None``.
        name: the tensor's name.
    """

    weight: npt.NDArray[np.uint32]
    scales: npt.NDArray[np.uint8]
    global_scale: npt.NDArray[np.float32]
    partitions: tuple[int, ...] | None = None
    name: str = field(default="tensor")

    def __post_init__(self) -> None:
        name = self.name
        w, s = self.weight, self.scales
        if not isinstance(w, np.ndarray) or w.dtype.kind != "u" or w.dtype.itemsize != 4:
            raise PlaneError(name, "MLX weight", "ndarray uint32 [E?, N, K/8]", describe(w))
        if not isinstance(s, np.ndarray) or s.dtype != np.uint8:
            raise PlaneError(name, "MLX scales", "ndarray uint8 [E?, N, K/16]", describe(s))
        g = np.asarray(self.global_scale)
        if g.dtype != np.float32:
            g = as_float32_exact(g, name, "MLX global_scale")
        object.__setattr__(self, "global_scale", g)
        if self.partitions is not None:
            object.__setattr__(self, "partitions", tuple(self.partitions))
        if w.ndim not in (2, 3) or s.ndim != w.ndim or w.shape[:-1] != s.shape[:-1]:
            raise PlaneError(
                name,
                "MLX weight / scales shapes",
                "[E?, N, K/8] and [E?, N, K/16] with equal leading axes",
                f"{tuple(w.shape)} and {tuple(s.shape)}",
            )
        words_per_block = BLOCK_SIZE // _CODES_PER_WORD
        if s.shape[-1] * words_per_block != w.shape[-1]:
            raise PlaneError(
                name,
                "MLX scales.shape[-1]",
                f"K/16 = {w.shape[-1] // words_per_block} for weight {tuple(w.shape)}",
                s.shape[-1],
            )
        experts = int(w.shape[0]) if w.ndim == 3 else None
        check_partitions(self.partitions, int(w.shape[-2]), name)
        check_global_shape(g, experts, self.partitions, name)

    @property
    def k(self) -> int:
        """Contraction length K."""
        return int(self.weight.shape[-1]) * _CODES_PER_WORD


def to_mlx(planes: NVFP4Planes) -> MLXPlanes:
    """Canonical planes -> MLX layout: the code bytes viewed as little-endian uint32 words
    (no copy when the codes are contiguous), the same scale bytes, the global as a sidecar.
    The planes' content is validated first."""
    validate(planes, content=True)
    codes = np.ascontiguousarray(planes.codes)
    return MLXPlanes(
        weight=codes.view(MLX_WORD),
        scales=planes.scales,
        global_scale=planes.global_scale,
        partitions=planes.partitions,
        name=planes.name,
    )


def from_mlx(mp: MLXPlanes) -> NVFP4Planes:
    """MLX layout -> canonical planes: the words' little-endian bytes (a view when
    contiguous), the same scales and global; validated with ``content=True``."""
    if not isinstance(mp, MLXPlanes):
        raise PlaneError("<unnamed>", "MLX planes type", "nvfp4.layouts.MLXPlanes", describe(mp))
    words = np.ascontiguousarray(mp.weight, dtype=MLX_WORD)
    codes = words.view(np.uint8)
    planes = NVFP4Planes(
        codes=codes,
        scales=mp.scales,
        global_scale=mp.global_scale,
        partitions=mp.partitions,
        name=mp.name,
    )
    return validate(planes, content=True)


def mlx_global_scale_arg(decode_global: Any) -> npt.NDArray[np.float32]:
    """MLX's ``global_scale`` argument (the amax it decodes with ``/ 2688``) for a decode
    global: ``float32(decode * 2688)``. MLX accepts a single float32 value only."""
    g = as_float32_exact(np.asarray(decode_global), "mlx_global_scale_arg", "decode global")
    return np.asarray(g * np.float32(GLOBAL_AMAX_DIVISOR), dtype=np.float32)
