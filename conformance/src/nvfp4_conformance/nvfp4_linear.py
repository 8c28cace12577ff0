""":class:`NVFP4Linear`, a ``torch.nn.Module`` whose matmul runs on an NVFP4 backend.

Imported lazily by :mod:`nvfp4_conformance.llm` (it needs torch, from the ``parity``
extra). Activations cross to the backend through ``backend.from_numpy`` and come back
through ``backend.to_numpy``, in float32, so any backend - numpy, torch, MLX - plugs in.

``activations`` picks the matmul verb (:data:`ACTIVATION_VERBS`): ``w4a16`` (``qmm``, float
activations, the default and what greedy parity certifies), or one of the quantized
activation modes T6 measures the quality of: ``w4a4`` (``qmm_w4a4``), ``w4a8``
(``qmm_w4a8``, int8 Q8_0 activations) and ``w4a8_fp8`` (``qmm_w4a8_fp8``); W4A4 and FP8
take the dynamic per-tensor scale of each call (the checkpoint has no ``input_scale``).

:func:`attach_weights` gives every linear its prepared weight; with ``fuse=True``, sibling
projections the model calls with one input (:data:`FUSABLE`: q/k/v, gate/up) share one
product, :class:`SharedProduct`: their planes concatenated along N (:func:`nvfp4.fusion.fuse`,
lossless, each part keeping its own global), one backend call per input instead of three or
two, each member taking its columns. Each output row of a product depends only on its own
weight row, so the results are those of the separate calls (bit for bit on the reference and
cpu backends: tested); decode makes 4 calls per layer instead of 7.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["ACTIVATION_VERBS", "FUSABLE", "NVFP4Linear", "SharedProduct", "attach_weights"]

#: activation mode -> the backend verb that computes the product (each quantized mode is
#: also the name of the capability that declares the verb).
ACTIVATION_VERBS = {
    "w4a16": "qmm",
    "w4a4": "qmm_w4a4",
    "w4a8": "qmm_w4a8",
    "w4a8_fp8": "qmm_w4a8_fp8",
}

#: Sibling projections (by their last name) that a transformers decoder layer calls with the
#: same input tensor: attention's q/k/v and the gated MLP's gate/up.
FUSABLE = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _product(backend: Any, handle: Any, verb: str, x: torch.Tensor, k: int, name: str) -> Any:
    """``backend.<verb>`` of ``x [..., K]`` as float32 numpy ``[M, N]``."""
    x2 = x.detach().reshape(-1, k).to(torch.float32).contiguous().numpy()
    y = getattr(backend, verb)(backend.from_numpy(x2), handle)
    y_np = np.ascontiguousarray(backend.to_numpy(y), dtype=np.float32)
    if y_np.ndim != 2 or y_np.shape[0] != x2.shape[0]:
        raise RuntimeError(
            f"{name}: backend.{verb} returned shape {y_np.shape}, expected ({x2.shape[0]}, N)"
        )
    return y_np


class SharedProduct:
    """One backend product of fused sibling projections, computed when the first member is
    called with an input and reused by the members called with that same tensor (the same
    object, unmodified: its version counter unchanged) in the same activation mode."""

    def __init__(self, backend: Any, handle: Any, k: int, n: int, name: str) -> None:
        self.backend = backend
        self.handle = handle
        self.k = k
        self.n = n
        self.name = name
        self._key: tuple[torch.Tensor, int, str] | None = None
        self._y: Any = None

    def output(self, x: torch.Tensor, verb: str) -> Any:
        """The float32 numpy ``[M, N_total]`` product of ``x`` (cached for its members)."""
        key = self._key
        if key is not None and key[0] is x and key[1] == x._version and key[2] == verb:
            return self._y
        y = _product(self.backend, self.handle, verb, x, self.k, self.name)
        if y.shape[1] != self.n:
            raise RuntimeError(
                f"{self.name}: backend.{verb} returned shape {y.shape}, "
                f"expected {(y.shape[0], self.n)}"
            )
        self._key, self._y = (x, x._version, verb), y
        return y


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
        #: (product, first column, end column) when this linear is part of a fused product
        self.shared: tuple[SharedProduct, int, int] | None = None

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
        verb = ACTIVATION_VERBS[self._activations]
        if self.shared is not None:
            product, lo, hi = self.shared
            y_np = np.ascontiguousarray(product.output(x, verb)[:, lo:hi])
        else:
            y_np = _product(self.backend, self.handle, verb, x, self.in_features, self.name)
        if y_np.shape[1] != self.out_features:
            raise RuntimeError(
                f"{self.name}: backend.{verb} returned shape {y_np.shape}, expected "
                f"{(y_np.shape[0], self.out_features)}"
            )
        out = torch.from_numpy(y_np).reshape(*lead, self.out_features)
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return (
            f"{self.name}: {self.in_features} -> {self.out_features}, "
            f"NVFP4 {self._activations} on {self.backend.info.name}"
            + ("" if self.shared is None else f", fused as {self.shared[0].name}")
        )


def _fused_groups(planes: Mapping[str, Any]) -> list[list[str]]:
    """The groups of :data:`FUSABLE` siblings present in ``planes`` (prefix -> planes), all
    2-D with one K."""
    groups = []
    for prefix in planes:
        parent, _, last = prefix.rpartition(".")
        for names in FUSABLE:
            if last != names[0]:
                continue
            members = [f"{parent}.{n}" if parent else n for n in names]
            parts = [planes.get(m) for m in members]
            if all(p is not None and p.num_experts is None and p.k == parts[0].k for p in parts):
                groups.append(members)
    return groups


def attach_weights(
    modules: Mapping[str, NVFP4Linear], planes: Mapping[str, Any], backend: Any, *, fuse: bool
) -> int:
    """Give each linear (prefix -> module) its weight prepared from ``planes[prefix]``; with
    ``fuse``, :data:`FUSABLE` siblings share a :class:`SharedProduct`. Returns the number of
    backend products per forward (linears minus those served by a shared product)."""
    from nvfp4.fusion import fuse as fuse_planes

    done: set[str] = set()
    products = 0
    for members in _fused_groups(planes) if fuse else []:
        parts = [planes[m] for m in members]
        name = "+".join(m.rpartition(".")[2] for m in members)
        parent = members[0].rpartition(".")[0]
        fused = fuse_planes(parts, f"{parent}.{name}" if parent else name)
        product = SharedProduct(backend, backend.prepare(fused), fused.k, fused.n, fused.name)
        lo = 0
        for m, p in zip(members, parts, strict=True):
            modules[m].shared = (product, lo, lo + p.n)
            lo += p.n
        done.update(members)
        products += 1
    for prefix, module in modules.items():
        if prefix not in done:
            module.handle = backend.prepare(planes[prefix])
            products += 1
    return products
