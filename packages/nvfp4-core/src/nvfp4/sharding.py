"""Slicing and tensor-parallel sharding of NVFP4 planes, without decoding.

* Along N (output rows) a cut may fall at any row: the codes and scales of a row are
  self-contained. Fused partitions are clipped to the kept rows; partitions left empty are
  dropped with their globals; what remains keeps ``partitions`` (possibly one).
* Along K (the contraction axis) a cut must fall on a 16-element block boundary, so each
  shard keeps whole blocks with their scale bytes. Globals and partitions are unchanged.

All results are views of the input planes (no copy). Decoding a slice gives exactly the
same numbers as slicing the decoded tensor.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from .planes import NVFP4Planes, PlaneError, validate
from .spec import BLOCK_SIZE

__all__ = ["clip_partitions", "shard", "shard_bounds", "slice_k", "slice_rows"]


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_range(name: str, what: str, start: object, stop: object, size: int) -> tuple[int, int]:
    if not (
        isinstance(start, (int, np.integer))
        and isinstance(stop, (int, np.integer))
        and not isinstance(start, bool)
        and not isinstance(stop, bool)
    ):
        raise PlaneError(name, f"{what} start/stop", "integers", (start, stop))
    a, b = int(start), int(stop)
    if not 0 <= a < b <= size:
        raise PlaneError(name, f"{what} range", f"0 <= start < stop <= {size}", (a, b))
    return a, b


def slice_rows(planes: NVFP4Planes, start: int, stop: int) -> NVFP4Planes:
    """Rows ``[start, stop)`` of every expert. Partitions are clipped to the range,
    partitions outside it dropped together with their globals."""
    validate(planes)
    start, stop = _check_range(planes.name, "row slice", start, stop, planes.n)
    codes = planes.codes[..., start:stop, :]
    scales = planes.scales[..., start:stop, :]
    if planes.partitions is None:
        return NVFP4Planes(codes, scales, planes.global_scale, name=planes.name)
    new_bounds, new_g = clip_partitions(planes.partitions, planes.global_scale, start, stop)
    return NVFP4Planes(codes, scales, new_g, partitions=new_bounds, name=planes.name)


def clip_partitions(
    partitions: tuple[int, ...], global_scale: npt.NDArray[np.float32], start: int, stop: int
) -> tuple[tuple[int, ...], npt.NDArray[np.float32]]:
    """The partition bounds and globals of rows ``[start, stop)`` of a fused tensor:
    bounds clipped to the range and counted from ``start``, the partitions left empty
    dropped with their globals (a scalar global is kept). :func:`slice_rows` uses it, and
    so does a loader that reads only a rank's rows (nvfp4-checkpoints' rank loading)."""
    bounds = np.asarray(partitions, dtype=np.int64)
    lo = np.clip(bounds[:-1], start, stop)
    hi = np.clip(bounds[1:], start, stop)
    keep = np.flatnonzero(hi > lo)
    new_bounds = (0, *(int(b) - start for b in hi[keep]))
    g = global_scale
    return new_bounds, (g if g.ndim == 0 else np.ascontiguousarray(g[..., keep]))


def slice_k(planes: NVFP4Planes, start: int, stop: int) -> NVFP4Planes:
    """Columns ``[start, stop)`` of K; both must be multiples of 16 (whole blocks).
    Globals and partitions are carried unchanged."""
    validate(planes)
    start, stop = _check_range(planes.name, "K slice", start, stop, planes.k)
    if start % BLOCK_SIZE or stop % BLOCK_SIZE:
        raise PlaneError(
            planes.name,
            "K slice bounds",
            f"multiples of {BLOCK_SIZE} (whole blocks)",
            f"start={start}, stop={stop}",
        )
    return NVFP4Planes(
        planes.codes[..., start // 2 : stop // 2],
        planes.scales[..., start // BLOCK_SIZE : stop // BLOCK_SIZE],
        planes.global_scale,
        partitions=planes.partitions,
        name=planes.name,
    )


def shard_bounds(
    planes: NVFP4Planes, axis: Literal["n", "k"], rank: int, world_size: int
) -> tuple[int, int]:
    """``(start, stop)`` of ``rank``'s even shard along ``axis`` (see :func:`shard`)."""
    name = planes.name
    if not (_is_int(world_size) and world_size >= 1):
        raise PlaneError(name, "world_size", "an integer >= 1", world_size)
    if not (_is_int(rank) and 0 <= rank < world_size):
        raise PlaneError(name, "rank", f"an integer in [0, {world_size})", rank)
    rank, world_size = int(rank), int(world_size)
    if axis not in ("n", "k"):
        raise PlaneError(name, "shard axis", "'n' or 'k'", axis)
    size = planes.n if axis == "n" else planes.k
    if size % world_size:
        raise PlaneError(
            name,
            f"{axis.upper()} for an even split",
            f"a multiple of world_size = {world_size}",
            size,
        )
    per = size // world_size
    if axis == "k" and per % BLOCK_SIZE:
        raise PlaneError(
            name,
            "per-rank K",
            f"a multiple of {BLOCK_SIZE} (K = {size}, world_size = {world_size})",
            per,
        )
    return rank * per, (rank + 1) * per


def shard(planes: NVFP4Planes, axis: Literal["n", "k"], rank: int, world_size: int) -> NVFP4Planes:
    """``rank``'s shard of an even split along ``axis`` into ``world_size`` parts.

    ``"n"`` (column-parallel, output rows) needs N % world_size == 0 and cuts at any row
    (fused partitions are clipped, see :func:`slice_rows`). ``"k"`` (row-parallel) needs the
    per-rank K to be a multiple of 16. Anything else is a :class:`~nvfp4.PlaneError`.
    """
    validate(planes)
    start, stop = shard_bounds(planes, axis, rank, world_size)
    if axis == "n":
        return slice_rows(planes, start, stop)
    return slice_k(planes, start, stop)
