"""The backend contract: a :class:`typing.Protocol`, and the frozen dataclasses passed
across it.

A backend is any object with the attributes and methods of :class:`Backend`; it does not
inherit from anything in core. It is published under the entry-point group
``nvfp4.backends`` as a zero-argument factory::

    [project.entry-points."nvfp4.backends"]
    cuda = "nvfp4_cuda:backend"

Importing the module behind an entry point and calling the factory must be cheap and must
never fail for lack of hardware: heavy imports (torch, triton, mlx) happen lazily, and
:meth:`Backend.availability` says whether the backend can run here and, if not, why.

What a backend cannot do natively it leaves out of :attr:`BackendInfo.capabilities`; the
conformance certificate then lists that capability as "not certified" instead of hiding
it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy.typing as npt

from .planes import NVFP4Planes

__all__ = [
    "CAPABILITIES",
    "Availability",
    "Backend",
    "BackendInfo",
]

#: Every capability name a backend may declare, with what it promises.
CAPABILITIES: dict[str, str] = {
    "dequantize": "dequantize(w, dtype) exact per spec for float32, float16, bfloat16",
    "qmm": "W4A16 qmm(x, w) within spec/1.0/tolerances.toml",
    "gather_qmm": "MoE W4A16 gather_qmm with per-expert globals, sorted and unsorted ids",
    "fused_partitions": "per-partition globals applied per output row",
    "quantize_activations": "activation encoder (W4A4 input side)",
    "w4a4": "qmm with NVFP4-quantized activations (native or declared emulated)",
    "w4a8": "qmm with 8-bit activations (its own tolerance)",
}


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on this machine. ``reason`` is required when ``ok`` is
    false and says what is missing and what to install or set."""

    ok: bool
    reason: str = ""
    device: str = ""

    def __post_init__(self) -> None:
        if not self.ok and not self.reason:
            raise ValueError("Availability(ok=False) needs a reason")


@dataclass(frozen=True)
class BackendInfo:
    """Static facts about a backend.

    Attributes:
        name: equal to its entry-point name (``reference``, ``cpu``, ``cuda``, ...).
        spec_versions: spec versions it implements, e.g. ``("1.0",)``.
        priority: automatic selection picks the available backend with the highest one.
        capabilities: names from :data:`CAPABILITIES`.
        version: the distribution's version.
        package: the distribution to install to get it (used in error messages).
        notes: free-form facts the certificate repeats (for instance "W4A4 emulated").
    """

    name: str
    spec_versions: tuple[str, ...]
    priority: int
    capabilities: frozenset[str]
    version: str = ""
    package: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)


@runtime_checkable
class Backend(Protocol):
    """What every NVFP4 backend offers.

    Native arrays (``torch.Tensor``, ``mx.array``, numpy) go in and come out of the
    matmul verbs; :meth:`from_numpy` / :meth:`to_numpy` convert for the suite. Every verb
    validates the planes it is given (O(1)) before any kernel reads them.
    """

    info: BackendInfo

    def availability(self) -> Availability:
        """Cheap, never raises, needs no device to import."""
        ...

    def prepare(self, planes: NVFP4Planes) -> Any:
        """A backend weight handle (its native arrays, its layout), made once per weight."""
        ...

    def qmm(self, x: Any, w: Any, *, out_dtype: Any = None) -> Any:
        """W4A16 ``y = x @ decode(w).T`` with the global applied after accumulation.
        ``w`` is a handle from :meth:`prepare`. ``out_dtype`` defaults to x's dtype."""
        ...

    def gather_qmm(
        self,
        x: Any,
        w: Any,
        expert_ids: Any,
        *,
        sorted_indices: bool = False,
        out_dtype: Any = None,
    ) -> Any:
        """MoE: row ``m`` of ``x`` times expert ``expert_ids[m]``; ids outside ``[0, E)``
        give exactly zero rows."""
        ...

    def dequantize(self, w: Any, dtype: Any = "float32") -> Any:
        """Decode a prepared weight to a dense native array."""
        ...

    def quantize_activations(self, x: Any, input_scale: Any = None) -> NVFP4Planes:
        """Quantize ``[M, K]`` activations with the spec's block rule (canonical planes)."""
        ...

    def qmm_w4a4(self, x: Any, w: Any, *, input_scale: Any = None, out_dtype: Any = None) -> Any:
        """W4A4 matmul, where the ``w4a4`` capability is declared."""
        ...

    def from_numpy(self, a: npt.NDArray[Any]) -> Any:
        """A numpy array as this backend's native array."""
        ...

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        """A native array as numpy (dtype preserved; bfloat16 as ``ml_dtypes.bfloat16``)."""
        ...
