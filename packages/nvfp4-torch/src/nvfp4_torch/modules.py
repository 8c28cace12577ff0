"""``torch.nn`` modules whose weights are NVFP4: the one place they are defined.

* :class:`NVFP4Linear` - ``y = x @ decode(W).T (+ bias)``, the weight's canonical planes held
  as buffers (so ``state_dict``, ``.to(device)`` and ``torch.compile`` see ordinary tensors);
* :class:`NVFP4Experts` - a stack of expert weights ``[E, N, K]`` for MoE layers: row ``m``
  of x goes through expert ``expert_ids[m]`` (ids outside ``[0, E)`` give zero rows).

A module computes its product in one of two ways, with the same numbers:

* **through the torch operators** (the default): ``torch.ops.nvfp4.*`` (:mod:`nvfp4_torch.ops`)
  pick the backend for x's device, prepare the planes once (cached) and have fake
  implementations, so ``torch.compile(fullgraph=True)`` traces the module without a break;
* **bound to one backend object** (:meth:`NVFP4Linear.bind`, :func:`bind_linears`): the
  product is that backend's verb on a handle it prepared once, in eager mode. This is how the
  conformance suite puts the backend under test (which need not be registered, or wrapped to
  time its calls) into a model, and how ``generate`` shares one product between sibling
  projections: with ``fuse=True``, q/k/v and gate/up (:data:`FUSABLE`) are concatenated
  along N (:func:`nvfp4.fusion.fuse`, lossless, each part keeping its own global) and the
  first member called with an input computes the :class:`SharedProduct` the others take
  their columns of. Each output row depends only on its own weight row, so the results are
  those of the separate calls (bit for bit on the reference and cpu backends: tested).

``activations`` selects the activation path (:data:`ACTIVATION_VERBS`): ``"w4a16"`` (float
activations, the default, what greedy parity certifies), ``"w4a8"`` (int8 Q8_0 blocks),
``"w4a8_fp8"`` and ``"w4a4"`` (the static ``input_scale`` when given, else the dynamic
per-tensor one), where the backend declares the capability of that name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from nvfp4.planes import NVFP4Planes

from . import ops

__all__ = [
    "ACTIVATION_MODES",
    "ACTIVATION_VERBS",
    "EXPERT_VERBS",
    "FUSABLE",
    "NVFP4Experts",
    "NVFP4Linear",
    "SharedProduct",
    "bind_linears",
]

#: activation mode -> the backend verb (and ``torch.ops.nvfp4`` op) that computes a linear's
#: product; each quantized mode is also the name of the capability that declares the verb.
ACTIVATION_VERBS: dict[str, str] = {
    "w4a16": "qmm",
    "w4a4": "qmm_w4a4",
    "w4a8": "qmm_w4a8",
    "w4a8_fp8": "qmm_w4a8_fp8",
}
#: The activation modes of a linear, ``w4a16`` (the default) first.
ACTIVATION_MODES: tuple[str, ...] = tuple(ACTIVATION_VERBS)
#: activation mode -> the verb of an expert stack.
EXPERT_VERBS: dict[str, str] = {"w4a16": "gather_qmm", "w4a8": "gather_qmm_w4a8"}
#: The verbs that take a static activation scale (``input_scale``).
_SCALED_VERBS = frozenset({"qmm_w4a4", "qmm_w4a8_fp8"})

#: Sibling projections (by their last name) that a transformers decoder layer calls with the
#: same input tensor: attention's q/k/v and the gated MLP's gate/up.
FUSABLE = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _check_mode(mode: str, allowed: Mapping[str, str] | tuple[str, ...], name: str) -> str:
    if mode not in allowed:
        raise ValueError(
            f"{name}: activations: expected one of {', '.join(allowed)}, found {mode!r}"
        )
    return mode


def _hold_planes(module: torch.nn.Module, planes: NVFP4Planes) -> None:
    """Register the planes as the module's buffers ``codes``, ``scales`` and
    ``global_scale`` (copies), with ``in_features``, ``out_features`` and ``name``."""
    codes, scales, global_scale = ops.plane_tensors(planes)
    module.register_buffer("codes", codes)
    module.register_buffer("scales", scales)
    module.register_buffer("global_scale", global_scale)
    module.in_features = planes.k
    module.out_features = planes.n
    module.name = planes.name


def _planes_of(module: Any) -> NVFP4Planes:
    """The canonical planes a module's buffers hold (numpy views of them, on the CPU)."""
    return NVFP4Planes(
        module.codes.detach().cpu().numpy(),
        module.scales.detach().cpu().numpy(),
        module.global_scale.detach().cpu().numpy(),
        partitions=None if module.partitions is None else tuple(module.partitions),
        name=module.name,
    )


def _product(
    backend: Any, handle: Any, verb: str, x: torch.Tensor, k: int, name: str, **kw: Any
) -> Any:
    """``backend.<verb>`` of ``x [..., K]`` as float32 numpy ``[M, N]`` (activations cross as
    float32 numpy through ``from_numpy`` / ``to_numpy``, so any backend plugs in)."""
    x2 = x.detach().reshape(-1, k).to(torch.float32).contiguous().numpy()
    y = getattr(backend, verb)(backend.from_numpy(x2), handle, **kw)
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


class NVFP4Linear(torch.nn.Module):  # type: ignore[misc]
    """``y = x @ decode(W).T (+ bias)``.

    Args:
        planes: the weight's canonical planes (2-D ``[N, K]``; fused partitions allowed).
        bias: an optional ``[N]`` tensor.
        activations: one of :data:`ACTIVATION_MODES`.
        input_scale: the static activation scale of ``w4a4`` / ``w4a8_fp8`` (a checkpoint's
            ``input_scale``), or ``None`` for the dynamic one.
        backend: bind the module to this backend object at once (:meth:`bind`).
    """

    def __init__(
        self,
        planes: NVFP4Planes,
        bias: torch.Tensor | None = None,
        *,
        activations: str = "w4a16",
        input_scale: float | None = None,
        backend: Any = None,
    ) -> None:
        super().__init__()
        if planes.num_experts is not None:
            raise ValueError(
                f"NVFP4Linear({planes.name!r}): expected a 2-D weight, found expert stack "
                f"{planes.shape} (use NVFP4Experts)"
            )
        _hold_planes(self, planes)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.partitions = None if planes.partitions is None else list(planes.partitions)
        self.activations = activations
        self.input_scale = None if input_scale is None else float(input_scale)
        #: (backend, its prepared handle) when bound, else None: the torch operators
        self.bound: tuple[Any, Any] | None = None
        #: (product, first column, end column) when part of a fused product (bound only)
        self.shared: tuple[SharedProduct, int, int] | None = None
        if backend is not None:
            self.bind(backend)

    @property
    def activations(self) -> str:
        """The activation mode (a key of :data:`ACTIVATION_VERBS`)."""
        return self._activations

    @activations.setter
    def activations(self, mode: str) -> None:
        self._activations = _check_mode(mode, ACTIVATION_VERBS, self.name)

    def planes(self) -> NVFP4Planes:
        """The weight's canonical planes (views of the buffers, on the CPU)."""
        return _planes_of(self)

    def bind(self, backend: Any) -> None:
        """Compute this linear's products with ``backend`` (any object with the verbs of
        :class:`nvfp4.Frontend`) on a handle it prepares now, in eager mode; ``bind(None)``
        goes back to the torch operators."""
        self.shared = None
        self.bound = None if backend is None else (backend, backend.prepare(self.planes()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        verb = ACTIVATION_VERBS[self._activations]
        if self.bound is None and self.shared is None:
            w = (self.codes, self.scales, self.global_scale)
            op = getattr(torch.ops.nvfp4, verb)
            if verb in _SCALED_VERBS:
                y = op(x, *w, self.input_scale, self.partitions)
            else:
                y = op(x, *w, self.partitions)
            return y if self.bias is None else y + self.bias.to(y.dtype)
        lead = tuple(x.shape[:-1])
        if self.shared is not None:
            product, lo, hi = self.shared
            y_np = np.ascontiguousarray(product.output(x, verb)[:, lo:hi])
        else:
            backend, handle = self.bound  # type: ignore[misc]
            kw = {"input_scale": self.input_scale} if verb in _SCALED_VERBS else {}
            y_np = _product(backend, handle, verb, x, self.in_features, self.name, **kw)
        if y_np.shape[1] != self.out_features:
            raise RuntimeError(
                f"{self.name}: backend.{verb} returned shape {y_np.shape}, expected "
                f"{(y_np.shape[0], self.out_features)}"
            )
        out = torch.from_numpy(y_np).reshape(*lead, self.out_features).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        if self.shared is not None:
            on = f" on {self.shared[0].backend.info.name}, fused as {self.shared[0].name}"
        elif self.bound is not None:
            on = f" on {self.bound[0].info.name}"
        else:
            on = ""
        return (
            f"{self.name}: {self.in_features} -> {self.out_features}, NVFP4 "
            f"{self._activations}{on}, bias={self.bias is not None}"
        )


class NVFP4Experts(torch.nn.Module):  # type: ignore[misc]
    """A stack of NVFP4 expert weights ``[E, N, K]`` (per-expert globals allowed):
    ``forward(x [M, K], expert_ids [M]) -> [M, N]`` through ``torch.ops.nvfp4``; ids outside
    ``[0, E)`` give zero rows.

    Args:
        planes: the stacked planes.
        activations: a key of :data:`EXPERT_VERBS` (``"w4a16"`` or ``"w4a8"``).
    """

    def __init__(self, planes: NVFP4Planes, *, activations: str = "w4a16") -> None:
        super().__init__()
        if planes.num_experts is None:
            raise ValueError(
                f"NVFP4Experts({planes.name!r}): expected an expert stack [E, N, K], found "
                f"shape {planes.shape}"
            )
        _hold_planes(self, planes)
        self.num_experts = planes.num_experts
        self.activations = _check_mode(activations, EXPERT_VERBS, self.name)

    def forward(
        self, x: torch.Tensor, expert_ids: torch.Tensor, sorted_indices: bool = False
    ) -> torch.Tensor:
        op: Any = getattr(torch.ops.nvfp4, EXPERT_VERBS[self.activations])
        return op(x, self.codes, self.scales, self.global_scale, expert_ids, sorted_indices)

    def extra_repr(self) -> str:
        return (
            f"{self.name}: {self.num_experts} experts, {self.in_features} -> "
            f"{self.out_features}, NVFP4 {self.activations}"
        )


def _fused_groups(linears: Mapping[str, NVFP4Linear]) -> list[list[str]]:
    """The groups of :data:`FUSABLE` siblings present in ``linears`` (prefix -> module), all
    unfused 2-D weights with one K."""
    groups = []
    for prefix in linears:
        parent, _, last = prefix.rpartition(".")
        for names in FUSABLE:
            if last != names[0]:
                continue
            members = [f"{parent}.{n}" if parent else n for n in names]
            parts = [linears.get(m) for m in members]
            present = [p for p in parts if p is not None and p.partitions is None]
            if len(present) == len(parts) and len({p.in_features for p in present}) == 1:
                groups.append(members)
    return groups


def bind_linears(linears: Mapping[str, NVFP4Linear], backend: Any, *, fuse: bool) -> int:
    """Bind every linear (prefix -> module) to ``backend`` (:meth:`NVFP4Linear.bind`); with
    ``fuse``, :data:`FUSABLE` siblings share a :class:`SharedProduct` on their fused planes.
    Returns the number of backend products per forward (linears minus those served by a
    shared product)."""
    from nvfp4.fusion import fuse as fuse_planes

    done: set[str] = set()
    products = 0
    for members in _fused_groups(linears) if fuse else []:
        parts = [linears[m].planes() for m in members]
        name = "+".join(m.rpartition(".")[2] for m in members)
        parent = members[0].rpartition(".")[0]
        fused = fuse_planes(parts, f"{parent}.{name}" if parent else name)
        product = SharedProduct(backend, backend.prepare(fused), fused.k, fused.n, fused.name)
        lo = 0
        for m, p in zip(members, parts, strict=True):
            linears[m].bound = None
            linears[m].shared = (product, lo, lo + p.n)
            lo += p.n
        done.update(members)
        products += 1
    for prefix, module in linears.items():
        if prefix not in done:
            module.bind(backend)
            products += 1
    return products
