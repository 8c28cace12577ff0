"""The 128x4 swizzled block-scale layout of Blackwell kernels (cuBLASLt block scaling,
CUTLASS SM100/SM120, FlashInfer ``layout_128x4``, torch ``SWIZZLE_32_4_4``).

Only the scales change; the codes and the global are unchanged. The linear scales
``[N, K/16]`` are padded to ``[N', C']`` (N' = N rounded up to 128, C' = K/16 rounded up to 4;
pad bytes are 0x00) and cut into 512-byte tiles of 128 rows x 4 scale columns, stored
row-tile-major. Scale ``[n, k]`` lands at byte::

    ((n // 128) * (C' / 4) + k // 4) * 512 + (n % 32) * 16 + ((n % 128) // 32) * 4 + k % 4

(:func:`nvfp4.spec.swizzle_128x4_offset`, the single statement of the formula). Equivalently,
the padded matrix reshaped to ``(N'/128, 4, 32, C'/4, 4)`` and transposed to axes
``(0, 3, 2, 1, 4)`` is the buffer in order. Expert-stacked scales ``[E, N, K/16]`` become
``[E, N' * C']``, one buffer per expert.

The transform is a gather/scatter through the offsets of one 128-row tile band (the band
offsets repeat every row tile, :func:`nvfp4.spec.swizzle_128x4_band`), so no index array
larger than ``128 x K/16`` is built.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..planes import PlaneError
from ..spec import SWIZZLE_ROW_TILE, swizzle_128x4_band, swizzled_scale_shape
from ._common import describe

__all__ = ["swizzle_scales", "swizzled_size", "unswizzle_scales"]


def swizzled_size(n: int, k_blocks: int) -> int:
    """Bytes of the swizzled buffer of ``[n, k_blocks]`` scales (padding included)."""
    rows, cols = swizzled_scale_shape(n, k_blocks)
    return rows * cols


def swizzle_scales(scales: Any, name: str = "scales") -> npt.NDArray[np.uint8]:
    """Linear E4M3 scale bytes ``[N, K/16]`` (or ``[E, N, K/16]``) -> the flat 128x4 swizzled
    buffer of ``swizzled_size(N, K/16)`` bytes (or ``[E, that]``), pad bytes zero."""
    s = np.asarray(scales)
    if s.dtype != np.uint8 or s.ndim not in (2, 3) or 0 in s.shape:
        raise PlaneError(name, "scales", "non-empty uint8 [N, K/16] or [E, N, K/16]", describe(s))
    lead = s.shape[:-2]
    n, k_blocks = int(s.shape[-2]), int(s.shape[-1])
    rows_p, _ = swizzled_scale_shape(n, k_blocks)
    band, stride = swizzle_128x4_band(k_blocks)
    tiles = rows_p // SWIZZLE_ROW_TILE
    padded = np.zeros((*lead, rows_p, k_blocks), dtype=np.uint8)
    padded[..., :n, :] = s
    out = np.zeros((*lead, tiles, stride), dtype=np.uint8)
    out[..., band] = padded.reshape(*lead, tiles, SWIZZLE_ROW_TILE * k_blocks)
    return out.reshape(*lead, tiles * stride)


def unswizzle_scales(
    buf: Any, n: int, k_blocks: int, name: str = "scales"
) -> npt.NDArray[np.uint8]:
    """Inverse of :func:`swizzle_scales`: a flat swizzled buffer (or ``[E, size]``) ->
    linear scale bytes ``[n, k_blocks]`` (or ``[E, n, k_blocks]``). Pad bytes are dropped."""
    b = np.asarray(buf)
    if n <= 0 or k_blocks <= 0:
        raise PlaneError(name, "n and k_blocks", "positive", (n, k_blocks))
    size = swizzled_size(n, k_blocks)
    if b.dtype != np.uint8 or b.ndim not in (1, 2) or b.shape[-1] != size:
        raise PlaneError(
            name,
            "swizzled scale buffer",
            f"uint8 [{size}] or [E, {size}] for n={n}, k_blocks={k_blocks}",
            describe(b),
        )
    lead = b.shape[:-1]
    band, stride = swizzle_128x4_band(k_blocks)
    tiles = size // stride
    linear = b.reshape(*lead, tiles, stride)[..., band]
    out = linear.reshape(*lead, tiles * SWIZZLE_ROW_TILE, k_blocks)[..., :n, :]
    return np.ascontiguousarray(out)
