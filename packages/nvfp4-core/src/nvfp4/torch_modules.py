"""``torch.nn`` modules over the NVFP4 torch operators (:mod:`nvfp4.torch_ops`).

* :class:`NVFP4Linear` - a linear layer whose weight is NVFP4 planes held as buffers (so
  ``state_dict``, ``.to(device)`` and ``torch.compile`` see ordinary tensors);
* :class:`NVFP4Experts` - a stack of expert weights ``[E, N, K]`` for MoE layers: row ``m``
  of x goes through expert ``expert_ids[m]``.

``activations`` selects the activation path of a linear: ``"w4a16"`` (default),
``"w4a8"`` (int8 Q8_0 blocks), ``"w4a8_fp8"`` and ``"w4a4"`` (with a static
``input_scale`` when given, else the dynamic per-tensor one), where the backend declares it.
"""

from __future__ import annotations

from typing import Any

import torch

from . import torch_ops
from .planes import NVFP4Planes

__all__ = ["ACTIVATION_MODES", "NVFP4Experts", "NVFP4Linear"]

#: The activation paths a module can take (spec capability names, w4a16 being the default).
ACTIVATION_MODES = ("w4a16", "w4a8", "w4a8_fp8", "w4a4")


def _check_mode(mode: str, allowed: tuple[str, ...]) -> str:
    if mode not in allowed:
        raise ValueError(f"activations: expected one of {', '.join(allowed)}, found {mode!r}")
    return mode


class NVFP4Linear(torch.nn.Module):  # type: ignore[misc]
    """``y = x @ decode(W).T (+ bias)`` through ``torch.ops.nvfp4``.

    Args:
        planes: the weight's canonical planes (2-D ``[N, K]``; fused partitions allowed).
        bias: an optional ``[N]`` tensor.
        activations: one of :data:`ACTIVATION_MODES`.
        input_scale: the static activation scale of ``w4a4`` / ``w4a8_fp8`` (a checkpoint's
            ``input_scale``), or ``None`` for the dynamic one.
    """

    def __init__(
        self,
        planes: NVFP4Planes,
        bias: torch.Tensor | None = None,
        *,
        activations: str = "w4a16",
        input_scale: float | None = None,
    ) -> None:
        super().__init__()
        if planes.num_experts is not None:
            raise ValueError(
                f"NVFP4Linear({planes.name!r}): expected a 2-D weight, found expert stack "
                f"{planes.shape} (use NVFP4Experts)"
            )
        codes, scales, global_scale = torch_ops.plane_tensors(planes)
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales)
        self.register_buffer("global_scale", global_scale)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.partitions = None if planes.partitions is None else list(planes.partitions)
        self.in_features = planes.k
        self.out_features = planes.n
        self.activations = _check_mode(activations, ACTIVATION_MODES)
        self.input_scale = None if input_scale is None else float(input_scale)
        self.name = planes.name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = torch.ops.nvfp4
        w = (self.codes, self.scales, self.global_scale)
        if self.activations == "w4a16":
            y = ops.qmm(x, *w, self.partitions)
        elif self.activations == "w4a8":
            y = ops.qmm_w4a8(x, *w, self.partitions)
        elif self.activations == "w4a8_fp8":
            y = ops.qmm_w4a8_fp8(x, *w, self.input_scale, self.partitions)
        else:
            y = ops.qmm_w4a4(x, *w, self.input_scale, self.partitions)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.name}: {self.in_features} -> {self.out_features}, NVFP4 "
            f"{self.activations}, bias={self.bias is not None}"
        )


class NVFP4Experts(torch.nn.Module):  # type: ignore[misc]
    """A stack of NVFP4 expert weights ``[E, N, K]`` (per-expert globals allowed):
    ``forward(x [M, K], expert_ids [M]) -> [M, N]``; ids outside ``[0, E)`` give zero rows.

    Args:
        planes: the stacked planes.
        activations: ``"w4a16"`` or ``"w4a8"``.
    """

    def __init__(self, planes: NVFP4Planes, *, activations: str = "w4a16") -> None:
        super().__init__()
        if planes.num_experts is None:
            raise ValueError(
                f"NVFP4Experts({planes.name!r}): expected an expert stack [E, N, K], found "
                f"shape {planes.shape}"
            )
        codes, scales, global_scale = torch_ops.plane_tensors(planes)
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales)
        self.register_buffer("global_scale", global_scale)
        self.num_experts = planes.num_experts
        self.in_features = planes.k
        self.out_features = planes.n
        self.activations = _check_mode(activations, ("w4a16", "w4a8"))
        self.name = planes.name

    def forward(
        self, x: torch.Tensor, expert_ids: torch.Tensor, sorted_indices: bool = False
    ) -> torch.Tensor:
        ops = torch.ops.nvfp4
        op: Any = ops.gather_qmm if self.activations == "w4a16" else ops.gather_qmm_w4a8
        return op(x, self.codes, self.scales, self.global_scale, expert_ids, sorted_indices)

    def extra_repr(self) -> str:
        return (
            f"{self.name}: {self.num_experts} experts, {self.in_features} -> "
            f"{self.out_features}, NVFP4 {self.activations}"
        )
