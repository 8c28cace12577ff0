"""Helpers shared by the layout transcoders (private).

They turn the arrays a checkpoint reader hands over into the exact dtypes of the canonical
planes without changing a bit: uint8 bytes, E4M3 bytes (as ``float8_e4m3fn`` or raw uint8)
and float32 globals (float16 / bfloat16 convert exactly; float64 only when exactly
representable). Anything else is refused with a :class:`~nvfp4.planes.PlaneError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..planes import PlaneError, describe

__all__ = [
    "as_bytes",
    "as_float32_exact",
    "as_scale_bytes",
    "describe",
    "fetch",
    "per_expert_global",
    "refuse_partitions",
    "squeeze_global",
]

_F8 = np.dtype(ml_dtypes.float8_e4m3fn)
_EXACT_TO_F32 = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def fetch(tensors: Mapping[str, Any], key: str, name: str) -> npt.NDArray[Any]:
    """``tensors[key]`` as a numpy array, or a PlaneError naming the missing key."""
    if key not in tensors:
        raise PlaneError(name, f"tensor {key!r}", "present", f"missing (keys: {sorted(tensors)})")
    value = tensors[key]
    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError):
        raise PlaneError(name, key, "a numpy array", describe(value)) from None


def as_bytes(a: npt.NDArray[Any], name: str, what: str) -> npt.NDArray[np.uint8]:
    """A uint8 array, refused otherwise (packed codes are never reinterpreted silently)."""
    if a.dtype != np.uint8:
        raise PlaneError(name, f"{what} dtype", "uint8", a.dtype)
    return a


def as_scale_bytes(a: npt.NDArray[Any], name: str, what: str) -> npt.NDArray[np.uint8]:
    """E4M3 block scales as their raw bytes: a ``float8_e4m3fn`` array is viewed (no copy),
    a uint8 array is taken as it is."""
    if a.dtype == _F8:
        return a.view(np.uint8)
    if a.dtype == np.uint8:
        return a
    raise PlaneError(name, f"{what} dtype", "float8_e4m3fn or uint8 (E4M3 bytes)", a.dtype)


def as_float32_exact(a: npt.NDArray[Any], name: str, what: str) -> npt.NDArray[np.float32]:
    """A global scale as float32 without rounding: float32 as is, float16 / bfloat16
    converted (exact), float64 only when every value is a float32 value."""
    if a.dtype in _EXACT_TO_F32:
        return a.astype(np.float32, copy=False)
    if a.dtype == np.float64:
        f = a.astype(np.float32)
        same = (f.astype(np.float64) == a) | (np.isnan(a) & np.isnan(f))
        if bool(np.all(same)):
            return f
        raise PlaneError(
            name, f"{what} dtype", "float32 (float64 only when exactly a float32 value)", a.dtype
        )
    raise PlaneError(name, f"{what} dtype", "float32 (float16 / bfloat16 convert exactly)", a.dtype)


def squeeze_global(
    g: npt.NDArray[np.float32], experts: int | None, name: str, what: str
) -> npt.NDArray[np.float32]:
    """A stored global of shape ``()`` or ``(1,)`` -> ``()``; for expert-stacked tensors
    ``(E,)`` stays ``(E,)``. Other shapes are refused."""
    if g.shape in ((), (1,)):
        return g.reshape(())
    if experts is not None and g.shape == (experts,):
        return g
    allowed = "() or (1,)" + (f" or ({experts},) per expert" if experts is not None else "")
    raise PlaneError(name, f"{what} shape", allowed, tuple(g.shape))


def per_expert_global(g: npt.NDArray[np.float32], experts: int) -> npt.NDArray[np.float32]:
    """A scalar or ``(E,)`` global as a fresh contiguous ``(E,)`` float32 array."""
    return np.array(np.broadcast_to(g, (experts,)), dtype=np.float32)


def refuse_partitions(name: str, partitions: tuple[int, ...] | None, layout: str, why: str) -> None:
    """Refuse fused planes for layouts that store one tensor per linear layer."""
    if partitions is not None:
        raise PlaneError(
            name,
            f"partitions (fused tensor) for {layout}",
            f"an unfused tensor: {why}; call nvfp4.fusion.unfuse first",
            partitions,
        )
