"""A weight on a torch device: the canonical planes, validated, moved once.

The GPU kernels read the canonical layout directly (no repacking), so a
:class:`DeviceWeight` is the planes flattened to 2-D ``[rows, ...]`` (``rows = E * N`` for an
expert stack) plus ``row_g``, the float32 global of every row (per tensor, per fused
partition or per expert, expanded once with :meth:`nvfp4.NVFP4Planes.row_global`).
A backend may cache other layouts of the same weight in :attr:`DeviceWeight.extras` (the
CUDA backend keeps the 128x4-swizzled scales for its W4A4 GEMM there).

:func:`upload` is the only way the kernels get a weight: it runs
:func:`nvfp4.validate` with ``content=True`` (shapes, scale bytes, globals) first, and
:class:`DeviceWeight` re-checks its tensors' shapes, so no kernel ever sees a malformed
plane or reads past the scales.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4.planes import NVFP4Planes, PlaneError, validate
from nvfp4.shapes import PreparedFacts
from nvfp4.spec import BLOCK_SIZE

__all__ = ["DeviceWeight", "host_array", "upload"]


@dataclass(eq=False, frozen=True)
class DeviceWeight(PreparedFacts):
    """NVFP4 planes on a torch device: the facts of :class:`nvfp4.shapes.PreparedFacts`,
    then

    Attributes:
        codes: uint8 ``[rows, K/2]``; ``rows = E * N`` (expert ``e`` at rows ``e*N..``).
        scales: uint8 ``[rows, K/16]``, linear.
        row_g: float32 ``[rows]``, the global of every row.
        extras: layouts a backend derived from this weight (cached, backend-private).
    """

    codes: Any
    scales: Any
    row_g: Any
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """O(1) checks of the device tensors, so a hand-built weight cannot make a kernel
        read past a plane."""
        import torch

        name = self.name
        if not (isinstance(self.n, int) and self.n >= 1):
            raise PlaneError(name, "n", "an integer >= 1", self.n)
        if not (isinstance(self.k, int) and self.k >= BLOCK_SIZE and self.k % BLOCK_SIZE == 0):
            raise PlaneError(name, "k", f"a positive multiple of {BLOCK_SIZE}", self.k)
        if self.num_experts is not None and not (
            isinstance(self.num_experts, int) and self.num_experts >= 1
        ):
            raise PlaneError(name, "num_experts", "None or an integer >= 1", self.num_experts)
        rows = self.rows
        for what, t, dtype, shape in (
            ("codes", self.codes, torch.uint8, (rows, self.k // 2)),
            ("scales", self.scales, torch.uint8, (rows, self.k // BLOCK_SIZE)),
            ("row_g", self.row_g, torch.float32, (rows,)),
        ):
            if not isinstance(t, torch.Tensor):
                raise PlaneError(name, f"device {what}", "a torch.Tensor", type(t).__name__)
            if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous():
                raise PlaneError(
                    name,
                    f"device {what}",
                    f"contiguous {dtype} {shape}",
                    f"{'contiguous' if t.is_contiguous() else 'strided'} {t.dtype} "
                    f"{tuple(t.shape)}",
                )
        if not (self.codes.device == self.scales.device == self.row_g.device):
            raise PlaneError(
                name,
                "devices",
                "codes, scales and row_g on one device",
                (str(self.codes.device), str(self.scales.device), str(self.row_g.device)),
            )

    @property
    def rows(self) -> int:
        """Rows of the flattened planes: ``E * N`` or ``N``."""
        return self.n * (self.num_experts or 1)

    @property
    def device(self) -> Any:
        return self.codes.device

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape of the decoded tensor: ``(E?, N, K)``."""
        lead = () if self.num_experts is None else (self.num_experts,)
        return (*lead, self.n, self.k)

    def to_planes(self) -> NVFP4Planes:
        """The canonical planes, byte for byte (copied back to the host)."""
        lead = () if self.num_experts is None else (self.num_experts,)
        codes = self.codes.cpu().numpy().reshape(*lead, self.n, self.k // 2)
        scales = self.scales.cpu().numpy().reshape(*lead, self.n, self.k // BLOCK_SIZE)
        return NVFP4Planes(
            np.ascontiguousarray(codes),
            np.ascontiguousarray(scales),
            self.global_scale.copy(),
            self.partitions,
            self.name,
        )


def host_array(a: npt.ArrayLike) -> npt.NDArray[Any]:
    """``a`` C-contiguous with no negative stride, ready for ``torch.from_numpy`` /
    ``torch.tensor``. ``np.ascontiguousarray`` alone is not enough: numpy calls an array
    contiguous whatever the stride of a length-1 axis, so a one-row view with its rows
    reversed (stride -k/2) stays as it is, and torch refuses every negative stride."""
    arr = np.ascontiguousarray(a)
    return arr if all(s >= 0 for s in arr.strides) else arr.copy()


def upload(planes: NVFP4Planes, device: Any) -> DeviceWeight:
    """Validate ``planes`` (structure and content: scale bytes, globals) and move them to
    ``device`` once. Raises :class:`nvfp4.PlaneError` naming the tensor for any defect."""
    import torch

    validate(planes, content=True)
    k = planes.k
    rows = planes.n * (planes.num_experts or 1)
    codes = host_array(planes.codes.reshape(rows, k // 2))
    scales = host_array(planes.scales.reshape(rows, k // BLOCK_SIZE))
    row_g = np.array(planes.row_global().reshape(rows), dtype=np.float32, copy=True)
    return DeviceWeight(
        name=planes.name,
        n=planes.n,
        k=k,
        num_experts=planes.num_experts,
        partitions=planes.partitions,
        global_scale=np.array(planes.global_scale, dtype=np.float32, copy=True),
        # torch.tensor copies: the planes may be read-only (memory-mapped safetensors).
        codes=torch.tensor(codes, device=device),
        scales=torch.tensor(scales, device=device),
        row_g=torch.tensor(row_g, device=device),
    )
