"""The prepared weight: canonical planes rewritten once into row tiles.

Layout (the C side documents the same in ``csrc/nvfp4cpu.h``). Rows are grouped into tiles
of :data:`TILE` = 16; within a tile the bytes of the 16 rows are interleaved::

    codes  [E?][tiles][K/2][16]   codes[..., t, j, r]  = canonical codes[..., 16t + r, j]
    scales [E?][tiles][K/16][16]  scales[..., t, b, r] = canonical scales[..., 16t + r, b]

Rows past N in the last tile are padding (code 0, scale byte 0, global 0: they decode to
0 and are never written out). One 16-byte load is then "element pair j of 16 rows": a
decoded SIMD vector holds one element of 16 output rows, multiplies a broadcast activation,
and feeds every row of x without being decoded again. The per-row global (expanded from the
scalar / per-partition / per-expert global) is kept next to it, zero-padded to whole tiles.

The arrays are 64-byte aligned. A prepared weight holds only the tiled bytes (not the
canonical planes too): :meth:`PreparedWeight.to_planes` rebuilds those byte for byte.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.shapes import PreparedFacts
from nvfp4.spec import BLOCK_SIZE

from ._native import Native, ptr

__all__ = ["TILE", "PreparedWeight", "aligned_empty", "prepare", "tile_layout_reference"]

#: Output rows per tile (one 512-bit vector of float32).
TILE = 16


def aligned_empty(shape: tuple[int, ...], dtype: Any, align: int = 64) -> npt.NDArray[Any]:
    """An uninitialised C-contiguous array whose data starts on an ``align``-byte boundary."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dt.itemsize + align, dtype=np.uint8)
    offset = (-raw.ctypes.data) % align
    out: npt.NDArray[Any] = raw[offset : offset + count * dt.itemsize].view(dt).reshape(shape)
    return out


@dataclass(frozen=True, eq=False)
class PreparedWeight(PreparedFacts):
    """A weight in the CPU backend's tiled layout (see the module docstring): the facts of
    :class:`nvfp4.shapes.PreparedFacts`, then

    Attributes:
        codes: uint8 ``[E or 1, tiles, K/2, 16]``.
        scales: uint8 ``[E or 1, tiles, K/16, 16]``.
        row_global: float32 ``[E or 1, tiles * 16]``, the global of every output row.
    """

    codes: npt.NDArray[np.uint8]
    scales: npt.NDArray[np.uint8]
    row_global: npt.NDArray[np.float32]

    @functools.cached_property
    def pointers(self) -> tuple[int, int, int]:
        """The addresses of :attr:`codes`, :attr:`scales` and :attr:`row_global` (uint8,
        uint8, float32), as every weight kernel takes them; computed once (the arrays are
        owned by this frozen weight and never reallocated)."""
        return (ptr(self.codes), ptr(self.scales), ptr(self.row_global, ctypes.c_float))

    def __post_init__(self) -> None:
        """O(1) structural checks, so the C kernels can trust every size they are given
        (:func:`prepare` builds consistent weights; this guards hand-built ones)."""
        name, n, k = self.name, self.n, self.k
        if not (isinstance(n, int) and n >= 1 and isinstance(k, int) and k >= 16 and k % 16 == 0):
            raise PlaneError(
                name, "prepared n, k", "n >= 1 and k a positive multiple of 16", (n, k)
            )
        e = 1 if self.num_experts is None else self.num_experts
        tiles = -(-n // TILE)
        expected = {
            "codes": (self.codes, np.uint8, (e, tiles, k // 2, TILE)),
            "scales": (self.scales, np.uint8, (e, tiles, k // BLOCK_SIZE, TILE)),
            "row_global": (self.row_global, np.float32, (e, tiles * TILE)),
        }
        for plane, (arr, dtype, shape) in expected.items():
            if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != shape:
                found = (
                    f"{arr.dtype} {arr.shape}"
                    if isinstance(arr, np.ndarray)
                    else type(arr).__name__
                )
                raise PlaneError(name, f"prepared {plane}", f"{np.dtype(dtype)} {shape}", found)
            if not arr.flags.c_contiguous:
                raise PlaneError(name, f"prepared {plane}", "C-contiguous", "a strided view")

    @property
    def tiles(self) -> int:
        return int(self.codes.shape[1])

    @property
    def experts(self) -> int:
        """Matrices stored (1 for an unstacked weight)."""
        return int(self.codes.shape[0])

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape of the decoded tensor: ``(E?, N, K)``."""
        return (self.n, self.k) if self.num_experts is None else (self.num_experts, self.n, self.k)

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scales.nbytes + self.row_global.nbytes)

    def to_planes(self, native: Native, threads: int = 1) -> NVFP4Planes:
        """The canonical planes again, byte for byte (the inverse of :func:`prepare`)."""
        e = self.experts
        codes = np.empty((e, self.n, self.k // 2), dtype=np.uint8)
        scales = np.empty((e, self.n, self.k // BLOCK_SIZE), dtype=np.uint8)
        rc = native.lib.nvfp4cpu_unpack(
            threads, ptr(self.codes), ptr(self.scales), e, self.n, self.k, ptr(codes), ptr(scales)
        )
        native.check(rc, f"unpack({self.name!r})")
        if self.num_experts is None:
            codes, scales = codes[0], scales[0]
        return NVFP4Planes(
            codes=codes,
            scales=scales,
            global_scale=self.global_scale.copy(),
            partitions=self.partitions,
            name=self.name,
        )


def prepare(planes: NVFP4Planes, native: Native, threads: int = 1) -> PreparedWeight:
    """Tile ``planes`` (validated by core, structure and content) into the row tiles."""
    e = planes.num_experts or 1
    n, k = planes.n, planes.k
    tiles = -(-n // TILE)
    codes = aligned_empty((e, tiles, k // 2, TILE), np.uint8)
    scales = aligned_empty((e, tiles, k // BLOCK_SIZE, TILE), np.uint8)
    src_codes = np.ascontiguousarray(planes.codes)
    src_scales = np.ascontiguousarray(planes.scales)
    rc = native.lib.nvfp4cpu_pack(
        threads, ptr(src_codes), ptr(src_scales), e, n, k, ptr(codes), ptr(scales)
    )
    native.check(rc, f"prepare({planes.name!r})")
    row_global = aligned_empty((e, tiles * TILE), np.float32)
    row_global[:, n:] = 0.0
    row_global[:, :n] = planes.row_global().reshape(e, n)
    return PreparedWeight(
        name=planes.name,
        n=n,
        k=k,
        num_experts=planes.num_experts,
        partitions=planes.partitions,
        global_scale=np.array(planes.global_scale, dtype=np.float32, copy=True),
        codes=codes,
        scales=scales,
        row_global=row_global,
    )


def tile_layout_reference(
    planes: NVFP4Planes,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """The tiled layout computed with numpy (the definition the C packer is tested against)."""
    e = planes.num_experts or 1
    n = planes.n
    tiles = -(-n // TILE)
    pad = tiles * TILE - n

    def tile(a: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        a = a.reshape(e, n, a.shape[-1])
        a = np.concatenate([a, np.zeros((e, pad, a.shape[-1]), np.uint8)], axis=1)
        return np.ascontiguousarray(a.reshape(e, tiles, TILE, -1).transpose(0, 1, 3, 2))

    return tile(planes.codes), tile(planes.scales)
