""":class:`NVFP4Linear`, a ``torch.nn.Module`` whose matmul runs on an NVFP4 backend.

Imported lazily by :mod:`nvfp4_conformance.llm` (it needs torch, from the ``parity``
extra). Activations cross to the backend through ``backend.from_numpy`` and come back
through ``backend.to_numpy``, in float32, so any backend - numpy, torch, MLX - plugs in.

``activations`` picks the matmul verb (:data:`ACTIVATION_VERBS`): ``w4a16`` (``qmm``, float
activations, the default and what greedy parity certifies), or one of the quantized
activation modes T6 measures the quality of: ``w4a4`` (``qmm_w4a4``), ``w4a8``
(``qmm_w4a8``, int8 Q8_0 activations) and ``w4a8_fp8`` (``qmm_w4a8_fp8``); W4A4 and FP8
take the dynamic per-tensor scale of each call (the checkpoint has no ``input_scale``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["ACTIVATION_VERBS", "NVFP4Linear"]

#: activation mode -> the backend verb that computes the product (each quantized mode is
#: also the name of the capability that declares the verb).
ACTIVATION_VERBS = {
    "w4a16": "qmm",
    "w4a4": "qmm_w4a4",
    "w4a8": "qmm_w4a8",
    "w4a8_fp8": "qmm_w4a8_fp8",
}


class NVFP4Linear(torch.nn.Module):
    """``y = x @ decode(W).T (+ bias)`` with the product computed by ``backend.qmm`` (or the
    verb of :attr:`activations`) on a handle from ``backend.prepare(planes)``."""

    def __init__(
        self,
        backend: Any,
        handle: Any,
        in_features: int,
        out_features: int,
        bias: torch.Tensor | None = None,
        name: str = "linear",
        activations: str = "w4a16",
    ) -> None:
        super().__init__()
        self.backend = backend
        self.handle = handle
        self.in_features = in_features
        self.out_features = out_features
        self.name = name
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.activations = activations

    @property
    def activations(self) -> str:
        """The activation mode (a key of :data:`ACTIVATION_VERBS`)."""
        return self._activations

    @activations.setter
    def activations(self, mode: str) -> None:
        if mode not in ACTIVATION_VERBS:
            raise ValueError(
                f"{self.name}: activation mode {mode!r}; expected one of "
                f"{', '.join(ACTIVATION_VERBS)}"
            )
        self._activations = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = tuple(x.shape[:-1])
        x2 = x.detach().reshape(-1, self.in_features).to(torch.float32).contiguous().numpy()
        verb = ACTIVATION_VERBS[self._activations]
        y = getattr(self.backend, verb)(self.backend.from_numpy(x2), self.handle)
        y_np = np.ascontiguousarray(self.backend.to_numpy(y), dtype=np.float32)
        if y_np.shape != (x2.shape[0], self.out_features):
            raise RuntimeError(
                f"{self.name}: backend.{verb} returned shape {y_np.shape}, expected "
                f"{(x2.shape[0], self.out_features)}"
            )
        out = torch.from_numpy(y_np).reshape(*lead, self.out_features)
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return (
            f"{self.name}: {self.in_features} -> {self.out_features}, "
            f"NVFP4 {self._activations} on {self.backend.info.name}"
        )
