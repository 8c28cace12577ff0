"""What the adapters over torch engines (ModelOpt, compressed-tensors, torchao and the
GPU-only ones) share: torch imported lazily, numpy <-> ``torch.Tensor`` conversion with
bfloat16 (``ml_dtypes``) and float8 kept bit for bit (nvfp4-torch's
:mod:`nvfp4_torch.arrays`, imported on first use; also as the kernels' ``from_numpy`` /
``to_numpy``, :class:`TorchArrays`), the spec dtype names as torch dtypes,
one output from the outputs of a weight's partitions, and the device line of a CPU torch
engine. Nothing here quantizes or decodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ._common import dist_version

__all__ = [
    "TorchArrays",
    "cat_parts",
    "cpu_device",
    "from_numpy",
    "tensor",
    "to_numpy",
    "torch",
    "torch_dtype",
]


def torch() -> Any:
    """The ``torch`` module (imported on first use)."""
    import torch as _torch

    return _torch


def torch_dtype(name: str) -> Any:
    """A spec dtype name (``"float32"``, ``"float16"``, ``"bfloat16"``) as a torch dtype."""
    t = torch()
    return {"float32": t.float32, "float16": t.float16, "bfloat16": t.bfloat16}[name]


def from_numpy(a: npt.NDArray[Any], device: str = "cpu") -> Any:
    """A numpy array as a contiguous tensor on ``device``, bits kept
    (:func:`nvfp4_torch.arrays.from_numpy`)."""
    from nvfp4_torch.arrays import from_numpy as convert

    return convert(a, device)


def tensor(value: Any, device: str = "cpu") -> Any:
    """A float32 tensor of ``value`` (a number or an array) on ``device``."""
    return from_numpy(np.asarray(value, dtype=np.float32), device)


def to_numpy(a: Any) -> npt.NDArray[Any]:
    """A tensor back to numpy, bits kept; a numpy array as it is
    (:func:`nvfp4_torch.arrays.to_numpy`)."""
    from nvfp4_torch.arrays import to_numpy as convert

    return convert(a)


def cat_parts(outputs: list[Any], dim: int) -> Any:
    """The outputs of a weight's partitions (or experts) joined along ``dim``; a weight of
    one partition's output as it is."""
    return torch().cat(outputs, dim=dim) if len(outputs) > 1 else outputs[0]


def cpu_device(distribution: str) -> str:
    """The device line of a torch engine that runs on the CPU:
    ``"torch <version> CPU (<distribution> <version>)"``, the engine's version that of its
    installed ``distribution``."""
    return f"torch {torch().__version__} CPU ({distribution} {dist_version(distribution)})"


class TorchArrays:
    """The kernels' ``from_numpy`` / ``to_numpy`` of an adapter whose engine takes
    ``torch.Tensor``: tensors on :attr:`DEVICE`, bits kept (:func:`from_numpy`,
    :func:`to_numpy`)."""

    DEVICE = "cpu"

    def from_numpy(self, a: npt.NDArray[Any]) -> Any:
        return from_numpy(a, self.DEVICE)

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        return to_numpy(a)
