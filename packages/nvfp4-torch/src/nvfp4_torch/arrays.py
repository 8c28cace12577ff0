"""numpy <-> ``torch.Tensor`` with every bit kept: bfloat16 as ``ml_dtypes.bfloat16``,
float8_e4m3fn as its uint8 bytes (numpy has neither). The torch ops use it to hand tensors
to a backend whose native arrays are numpy, and nvfp4-engines' adapters over torch engines
use it for their operands."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["from_numpy", "to_numpy"]


def to_numpy(a: Any) -> npt.NDArray[Any]:
    """A tensor as a numpy array on the CPU, dtype preserved (bfloat16 as
    ``ml_dtypes.bfloat16``, float8_e4m3fn as its uint8 bytes); anything else as
    ``np.asarray`` makes it."""
    if not isinstance(a, torch.Tensor):
        return np.asarray(a)
    a = a.detach().cpu().contiguous()
    if a.dtype == torch.bfloat16:
        import ml_dtypes

        return np.asarray(a.view(torch.int16).numpy()).view(ml_dtypes.bfloat16)
    if a.dtype == torch.float8_e4m3fn:
        return np.asarray(a.view(torch.uint8).numpy())
    return np.asarray(a.numpy())


def from_numpy(a: npt.NDArray[Any], device: str | torch.device = "cpu") -> torch.Tensor:
    """A numpy array as a contiguous tensor on ``device`` (bfloat16 and float8_e4m3fn from
    ``ml_dtypes`` by their bits); a 0-d array stays 0-d."""
    a = np.ascontiguousarray(a).reshape(np.shape(a))
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    if a.dtype.name == "float8_e4m3fn":
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn).to(device)
    return torch.from_numpy(a).to(device)
