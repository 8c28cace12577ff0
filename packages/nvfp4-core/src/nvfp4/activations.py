"""Quantized activation planes of W4A8 (spec 1.1, section "W4A8").

* :class:`Q8Activations` - int8 activations in blocks of 32 along K, one float16 ``d`` per
  block (ggml's ``block_q8_0``, split into two planes): ``codes`` int8 ``[M, K]``, ``d``
  float16 ``[M, K/32]``. A block that held NaN or Inf has zero codes and ``d`` NaN.
* :class:`FP8Activations` - FP8 E4M3 activations with one per-tensor decode scale:
  ``codes`` uint8 ``[M, K]`` (``float8_e4m3fn`` bytes), ``input_scale`` float32 ``()``
  (finite and > 0). A NaN or Inf element is the NaN byte ``0x7F``.

Both are checked structurally when they are made (O(1)), like :class:`nvfp4.NVFP4Planes`,
and raise :class:`nvfp4.PlaneError` naming the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .planes import PlaneError, describe
from .spec import Q8_BLOCK_SIZE

__all__ = ["FP8Activations", "Q8Activations"]


def _check_2d(name: str, what: str, a: Any, dtype: Any) -> tuple[int, int]:
    if not isinstance(a, np.ndarray) or a.dtype != np.dtype(dtype):
        raise PlaneError(name, f"{what} dtype", f"ndarray {np.dtype(dtype)}", describe(a))
    if a.ndim != 2:
        raise PlaneError(name, f"{what} rank", "2 ([M, K])", f"shape {tuple(a.shape)}")
    m, k = (int(d) for d in a.shape)
    if m < 1 or k < 1:
        raise PlaneError(name, f"{what} shape", "M >= 1 and K >= 1", f"shape {(m, k)}")
    return m, k


@dataclass(frozen=True, eq=False)
class Q8Activations:
    """int8 W4A8 activations: ``value[m, k] = codes[m, k] * d[m, k // 32]``.

    Attributes:
        codes: int8 ``[M, K]``, each in ``[-127, 127]`` (K a multiple of 32).
        d: float16 ``[M, K/32]``, the block scales as ggml stores them.
        name: the tensor's name, used in every error message.
    """

    codes: npt.NDArray[np.int8]
    d: npt.NDArray[np.float16]
    name: str = field(default="activation")

    def __post_init__(self) -> None:
        m, k = _check_2d(self.name, "codes", self.codes, np.int8)
        if k % Q8_BLOCK_SIZE:
            raise PlaneError(self.name, "K", f"a multiple of {Q8_BLOCK_SIZE}", k)
        if not isinstance(self.d, np.ndarray) or self.d.dtype != np.float16:
            raise PlaneError(self.name, "d dtype", "ndarray float16", describe(self.d))
        if tuple(self.d.shape) != (m, k // Q8_BLOCK_SIZE):
            raise PlaneError(
                self.name, "d shape", (m, k // Q8_BLOCK_SIZE), tuple(int(s) for s in self.d.shape)
            )

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))

    def validate_content(self) -> Q8Activations:
        """O(n): every code in ``[-127, 127]`` (-128 is never written)."""
        if self.codes.size and int(self.codes.min()) < -127:
            idx = tuple(int(i) for i in np.argwhere(self.codes < -127)[0])
            raise PlaneError(self.name, f"code at {idx}", "-127..127", int(self.codes[idx]))
        return self

    def decoded(self) -> npt.NDArray[np.float64]:
        """``codes * d`` per element, exactly, in float64 ``[M, K]`` (NaN where ``d`` is)."""
        m, k = self.shape
        d = self.d.astype(np.float64)
        blocks = self.codes.astype(np.float64).reshape(m, k // Q8_BLOCK_SIZE, Q8_BLOCK_SIZE)
        with np.errstate(invalid="ignore"):
            return (blocks * d[..., None]).reshape(m, k)


@dataclass(frozen=True, eq=False)
class FP8Activations:
    """FP8 E4M3 W4A8 activations: ``value[m, k] = e4m3(codes[m, k]) * input_scale``.

    Attributes:
        codes: uint8 ``[M, K]``, ``float8_e4m3fn`` bytes (bit 7 the sign; ``0x7F`` and
            ``0xFF`` NaN).
        input_scale: float32 ``()``, the decode multiplier (finite and > 0).
        name: the tensor's name, used in every error message.
    """

    codes: npt.NDArray[np.uint8]
    input_scale: npt.NDArray[np.float32]
    name: str = field(default="activation")

    def __post_init__(self) -> None:
        g: Any = self.input_scale
        if isinstance(g, (float, int, np.floating)) and not isinstance(g, bool):
            object.__setattr__(self, "input_scale", np.asarray(g, dtype=np.float32))
        _check_2d(self.name, "codes", self.codes, np.uint8)
        s = self.input_scale
        if not isinstance(s, np.ndarray) or s.dtype != np.float32 or s.shape != ():
            raise PlaneError(self.name, "input_scale", "float32 of shape ()", describe(s))
        if not (np.isfinite(s) and s > 0):
            raise PlaneError(self.name, "input_scale", "finite and > 0", float(s))

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))
