""":class:`NVFP4Linear`, a ``torch.nn.Module`` whose matmul runs on an NVFP4 backend.

Imported lazily by :mod:`nvfp4_conformance.llm` (it needs torch, from the ``parity``
extra). Activations cross to the backend through ``backend.from_numpy`` and come back
through ``backend.to_numpy``, in float32, so any backend - numpy, torch, MLX - plugs in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["NVFP4Linear"]


class NVFP4Linear(torch.nn.Module):
    """``y = x @ decode(W).T (+ bias)`` with the product computed by ``backend.qmm`` on a
    handle from ``backend.prepare(planes)``."""

    def __init__(
        self,
        backend: Any,
        handle: Any,
        in_features: int,
        out_features: int,
        bias: torch.Tensor | None = None,
        name: str = "linear",
    ) -> None:
        super().__init__()
        self.backend = backend
        self.handle = handle
        self.in_features = in_features
        self.out_features = out_features
        self.name = name
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = tuple(x.shape[:-1])
        x2 = x.detach().reshape(-1, self.in_features).to(torch.float32).contiguous().numpy()
        y = self.backend.qmm(self.backend.from_numpy(x2), self.handle)
        y_np = np.ascontiguousarray(self.backend.to_numpy(y), dtype=np.float32)
        if y_np.shape != (x2.shape[0], self.out_features):
            raise RuntimeError(
                f"{self.name}: backend.qmm returned shape {y_np.shape}, expected "
                f"{(x2.shape[0], self.out_features)}"
            )
        out = torch.from_numpy(y_np).reshape(*lead, self.out_features)
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return (
            f"{self.name}: {self.in_features} -> {self.out_features}, "
            f"NVFP4 on {self.backend.info.name}"
        )
