"""Planes for the layout tests: every code byte and every valid scale byte possible (no
quantizer), globals spread over powers of two."""

from __future__ import annotations

import numpy as np
from nvfp4 import NVFP4Planes


def random_planes(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    *,
    name: str = "w",
    log2_globals: tuple[float, float] = (-12, 2),
) -> NVFP4Planes:
    """Planes of ``shape`` (``[E?, N, K]``) with uniformly random code and scale bytes, one
    global per expert of ``2^u``, ``u`` uniform in ``log2_globals``."""
    *lead, n, k = shape
    codes = rng.integers(0, 256, size=(*lead, n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, size=(*lead, n, k // 16), dtype=np.uint8)
    g = np.exp2(rng.uniform(*log2_globals, size=tuple(lead))).astype(np.float32)
    return NVFP4Planes(codes, scales, g, name=name)
