"""``mlx.nn`` modules for engines: :class:`NVFP4Linear` and :class:`NVFP4SwitchLinear` (MoE).

Both hold MLX arrays as module parameters (frozen), so ``model.parameters()``,
``mx.eval``, ``tree_flatten`` and ``load_weights`` see them like any other weight:

========================= ====================== ==============================================
parameter                 native (default)       affine rollback
========================= ====================== ==============================================
``weight``                uint32 ``[E?, N, K/8]`` MLX affine-packed uint32
``scales``                uint8 E4M3 bytes        float32 per group
``global_scale``          float32 decode global:  (absent: folded into the re-quantized bytes)
                          ``()`` or ``(N,)``;
                          ``(E, 1)`` or ``(E, N)``
``biases``                (absent)                float32 per group
``bias``                  optional, ``[N]`` / ``[E, N]`` in the model's dtype
========================= ====================== ==============================================

:class:`NVFP4Linear` is a drop-in for ``mlx.nn.Linear`` (``x [..., K] -> [..., N]``);
:class:`NVFP4SwitchLinear` for mlx-lm's ``SwitchLinear`` (``__call__(x, indices,
sorted_indices=False)``, as ``SwitchGLU`` / ``SwitchMLP`` call it). Their forward pass is the
compiled graph of :mod:`nvfp4_metal.ops` (quantized matmul, then the sidecar global);
outputs come back in x's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import mlx.core as mx
from mlx.nn.layers.base import Module
from nvfp4.planes import NVFP4Planes

from . import ops
from .settings import Impl
from .transcode import MetalWeight, prepare, requantize_dense

__all__ = ["LayerInfo", "NVFP4Linear", "NVFP4SwitchLinear"]


@dataclass(frozen=True)
class LayerInfo:
    """Static facts of an NVFP4 layer (kept out of the parameter tree)."""

    name: str
    shape: tuple[int, ...]
    impl: Impl
    source: str
    group_size: int
    partitions: tuple[int, ...] | None


def _weight_from(planes: NVFP4Planes, impl: Impl | str | None, transcode: str) -> MetalWeight:
    if transcode == "direct":
        return prepare(planes, impl=impl)
    if transcode == "dense":
        return requantize_dense(planes)
    raise ValueError(f"transcode: expected 'direct' or 'dense', found {transcode!r}")


_Layer = TypeVar("_Layer", bound="_NVFP4Base")


class _NVFP4Base(Module):
    """Shared storage: the arrays as parameters, the facts in :attr:`info`."""

    def __init__(self, w: MetalWeight, bias: mx.array | None) -> None:
        super().__init__()
        self.info = LayerInfo(w.name, w.shape, w.impl, w.source, w.group_size, w.partitions)
        self.weight = w.weight
        self.scales = w.scales
        if w.impl == "native":
            assert w.row_global is not None
            self.global_scale = w.row_global
        else:
            assert w.biases is not None
            self.biases = w.biases
        if bias is not None:
            self.bias = bias
        self.freeze()

    @classmethod
    def from_planes(
        cls: type[_Layer],
        planes: NVFP4Planes,
        bias: mx.array | None = None,
        *,
        impl: Impl | str | None = None,
        transcode: str = "direct",
    ) -> _Layer:
        """Build from canonical planes (expert-stacked for :class:`NVFP4SwitchLinear`):
        ``transcode="direct"`` (default) reinterprets the bytes; ``"dense"`` re-quantizes
        through float16 (the comparison path); ``impl`` (default ``$NVFP4_METAL_IMPL``)
        selects the affine rollback."""
        return cls(_weight_from(planes, impl, transcode), bias)

    def _extra(self) -> mx.array:
        extra: mx.array = self["global_scale"] if self.info.impl == "native" else self["biases"]
        return extra

    @property
    def input_dims(self) -> int:
        return self.info.shape[-1]

    @property
    def output_dims(self) -> int:
        return self.info.shape[-2]

    def _extra_repr(self) -> str:
        return (
            f"{self.info.name}: {self.input_dims} -> {self.output_dims}, NVFP4 "
            f"({self.info.impl}, {self.info.source}"
            + (f", partitions {self.info.partitions}" if self.info.partitions else "")
            + f"), bias={'bias' in self}"
        )


class NVFP4Linear(_NVFP4Base):
    """``y = x @ decode(W).T (+ bias)`` with NVFP4 weights (see the module docstring).

    Args:
        weight: a 2-D :class:`~nvfp4_metal.transcode.MetalWeight` (use :meth:`from_planes`).
        bias: optional ``[N]`` bias, added in x's dtype.
    """

    def __init__(self, weight: MetalWeight, bias: mx.array | None = None) -> None:
        if weight.num_experts is not None:
            raise ValueError(
                f"NVFP4Linear({weight.name!r}): expert-stacked weights {weight.shape} belong "
                "in NVFP4SwitchLinear"
            )
        super().__init__(weight, bias)

    def __call__(self, x: mx.array) -> mx.array:
        y = ops.linear_arrays(
            x,
            self["weight"],
            self["scales"],
            self._extra(),
            impl=self.info.impl,
            group_size=self.info.group_size,
        )
        if "bias" in self:
            y = y + self["bias"]
        return y

    def extra_repr(self) -> str:
        return self._extra_repr()


class NVFP4SwitchLinear(_NVFP4Base):
    """MoE experts ``[E, N, K]`` in NVFP4, called like mlx-lm's ``SwitchLinear``:
    ``x [..., 1, K]`` broadcast against ``indices`` gives ``indices.shape + (1, N)``; each
    row times its expert's weights and (per-partition) global. Indices outside ``[0, E)``
    give zero rows.

    Args:
        weight: a 3-D :class:`~nvfp4_metal.transcode.MetalWeight` (use :meth:`from_planes`).
        bias: optional ``[E, N]`` bias.
    """

    def __init__(self, weight: MetalWeight, bias: mx.array | None = None) -> None:
        if weight.num_experts is None:
            raise ValueError(
                f"NVFP4SwitchLinear({weight.name!r}): weights must be [E, N, K], found "
                f"{weight.shape} (use NVFP4Linear)"
            )
        super().__init__(weight, bias)

    @property
    def num_experts(self) -> int:
        return self.info.shape[0]

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        y = ops.switch_arrays(
            x,
            self["weight"],
            self["scales"],
            self._extra(),
            indices,
            impl=self.info.impl,
            group_size=self.info.group_size,
            sorted_indices=sorted_indices,
        )
        if "bias" in self:
            y = y + mx.expand_dims(self["bias"][indices], -2)
        return y

    def extra_repr(self) -> str:
        return f"{self.num_experts} experts, " + self._extra_repr()
