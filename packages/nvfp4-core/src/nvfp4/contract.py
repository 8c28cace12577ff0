"""The kernel contract: what a backend (ours or a third party's) implements.

Core owns the verbs (:class:`nvfp4.Frontend`): it checks every argument, validates planes,
reshapes leading axes, resolves dtypes, applies the expert-id rules and writes every error
message, once. A backend implements only kernels, on operands core has already checked:

* ``x`` is the backend's native array (numpy, ``torch.Tensor``, ``mx.array``; numpy input is
  converted with :meth:`Kernels.from_numpy` first), 2-D ``[M, K]`` with ``M >= 1``,
  contiguous, of dtype float32, float16 or bfloat16;
* ``w`` is what :meth:`Kernels.prepare` returned for planes that passed
  :func:`nvfp4.validate` with ``content=True``; core wraps it in an immutable
  :class:`nvfp4.Prepared` handle that records the weight's shape, and unwraps it before the
  call (a ``qmm`` kernel only ever sees a 2-D weight, ``gather_qmm`` an expert stack);
* dtypes are spec names: ``"float32"``, ``"float16"``, ``"bfloat16"``;
* ``expert_ids`` is a native integer array ``[M]``; an id outside ``[0, E)`` must give an
  exactly zero row and read nothing; ``sorted_indices`` is a hint the result must not depend
  on (core refuses a false hint it can see, on host ids);
* ``input_scale`` is ``None`` (dynamic) or a finite positive Python float;
* for the W4A8 int8 kernels (``qmm_w4a8``, ``gather_qmm_w4a8``, ``quantize_activations_q8``)
  K is a multiple of 32.

A kernel the backend does not have is simply not defined (core then raises
``NotImplementedError`` naming the backend and the verb). What a backend claims is
:attr:`BackendInfo.capabilities`; the conformance suite certifies exactly those, and core
runs the kernels of an optional capability (``qmm_w4a4``: ``w4a4``, spec 1.0; the W4A8
kernels: ``w4a8`` and ``w4a8_fp8``, spec 1.1) only where it is declared
(:data:`OPTIONAL_CAPABILITIES`).

A backend is published under the entry-point group ``nvfp4.backends`` as a zero-argument
factory returning its kernels object::

    [project.entry-points."nvfp4.backends"]
    cuda = "nvfp4_cuda:backend"

Importing the module behind an entry point and calling the factory must be cheap and must
never fail for lack of hardware: heavy imports (torch, triton, mlx) happen lazily, and
:meth:`Kernels.availability` says whether the kernels can run here and, if not, why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy.typing as npt

from .planes import NVFP4Planes

__all__ = [
    "CAPABILITIES",
    "KERNELS",
    "OPTIONAL_CAPABILITIES",
    "VERBS",
    "Availability",
    "BackendInfo",
    "Kernels",
    "Verb",
]

#: Every capability name a backend may declare, with what it promises.
CAPABILITIES: dict[str, str] = {
    "dequantize": "dequantize(w, dtype) exact per spec for float32, float16, bfloat16",
    "qmm": "W4A16 qmm(x, w) within spec/1.0/tolerances.toml",
    "gather_qmm": "MoE W4A16 gather_qmm with per-expert globals, sorted and unsorted ids",
    "fused_partitions": "per-partition globals applied per output row",
    "quantize_activations": "activation encoder (W4A4 input side)",
    "w4a4": "qmm with NVFP4-quantized activations (native or declared emulated)",
    "w4a8": "W4A8 with int8 activations in blocks of 32 (ggml Q8_0), spec 1.1",
    "w4a8_fp8": "W4A8 with FP8 E4M3 activations and a per-tensor input scale, spec 1.1",
}

#: Capabilities the spec makes optional: core runs their kernels only where declared.
OPTIONAL_CAPABILITIES: frozenset[str] = frozenset({"w4a4", "w4a8", "w4a8_fp8"})


@dataclass(frozen=True)
class Verb:
    """One verb of the standard, the one place its facts are written: the kernel a backend
    implements under ``name``, the capability that certifies it, and the shape of its
    arguments, from which :class:`nvfp4.Frontend` checks them, ``nvfp4_torch.ops`` writes its
    operator's schema and the conformance suite marks its tests.

    Attributes:
        name: the verb, the kernel's name and the :class:`nvfp4.Frontend` method's.
        capability: the name in :data:`CAPABILITIES` a backend declares to have it certified.
        kind: ``"matmul"`` (``x`` times a prepared weight), ``"encode"`` (activations to an
            encoded form) or ``"decode"`` (a prepared weight to a dense array).
        experts: a matmul over an expert stack, with ``expert_ids`` and ``sorted_indices``.
        q8: int8 activations in blocks of 32 (K a multiple of 32).
        input_scale: takes a static activation scale (``None``: dynamic).
        summary: one line on what it computes.
    """

    name: str
    capability: str
    kind: str
    experts: bool = False
    q8: bool = False
    input_scale: bool = False
    summary: str = ""


#: Every verb, by name. Adding a verb is one entry here, its reference, and its kernel in
#: the backends that have it (core's :class:`nvfp4.Frontend` serves a verb without a method of
#: its own from this table, and nvfp4-torch registers an operator for every matmul verb).
VERBS: dict[str, Verb] = {
    v.name: v
    for v in (
        Verb("qmm", "qmm", "matmul", summary="W4A16 x @ decode(W).T"),
        Verb("gather_qmm", "gather_qmm", "matmul", experts=True, summary="MoE W4A16"),
        Verb("dequantize", "dequantize", "decode", summary="decode(W), exact"),
        Verb(
            "quantize_activations",
            "quantize_activations",
            "encode",
            input_scale=True,
            summary="activations to NVFP4 planes",
        ),
        Verb("qmm_w4a4", "w4a4", "matmul", input_scale=True, summary="W4A4"),
        Verb("quantize_activations_q8", "w4a8", "encode", q8=True, summary="int8 Q8_0 blocks"),
        Verb("qmm_w4a8", "w4a8", "matmul", q8=True, summary="W4A8 int8"),
        Verb("gather_qmm_w4a8", "w4a8", "matmul", experts=True, q8=True, summary="MoE W4A8 int8"),
        Verb(
            "quantize_activations_fp8",
            "w4a8_fp8",
            "encode",
            input_scale=True,
            summary="FP8 E4M3 activations",
        ),
        Verb("qmm_w4a8_fp8", "w4a8_fp8", "matmul", input_scale=True, summary="W4A8 FP8"),
    )
}

#: The kernels a backend may implement, each with the capability that certifies it (derived
#: from :data:`VERBS`).
KERNELS: dict[str, str] = {name: v.capability for name, v in VERBS.items()}


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
        deviations: ids of the spec's deviation registry (1.2) this backend declares;
            with those whose ``seen_in`` names it, the only ones that may explain its
            failing tests.
    """

    name: str
    spec_versions: tuple[str, ...]
    priority: int
    capabilities: frozenset[str]
    version: str = ""
    package: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    deviations: tuple[str, ...] = field(default_factory=tuple)


@runtime_checkable
class Kernels(Protocol):
    """The narrow contract. Only the members below are required; the kernels named in
    :data:`KERNELS` (``qmm``, ``gather_qmm``, ``dequantize``, ``quantize_activations``,
    ``qmm_w4a4`` and the W4A8 kernels) and ``to_planes`` are each optional, with these signatures::

        qmm(x, w, *, out_dtype: str) -> native [M, N]
        gather_qmm(x, w, expert_ids, *, sorted_indices: bool, out_dtype: str) -> [M, N]
        dequantize(w, *, dtype: str) -> native [E?, N, K]
        quantize_activations(x, *, input_scale: float | None) -> NVFP4Planes
        qmm_w4a4(x, w, *, input_scale: float | None, out_dtype: str) -> [M, N]
        quantize_activations_q8(x) -> nvfp4.activations.Q8Activations
        qmm_w4a8(x, w, *, out_dtype: str) -> [M, N]
        gather_qmm_w4a8(x, w, expert_ids, *, sorted_indices: bool, out_dtype: str) -> [M, N]
        quantize_activations_fp8(x, *, input_scale: float | None) -> FP8Activations
        qmm_w4a8_fp8(x, w, *, input_scale: float | None, out_dtype: str) -> [M, N]
        to_planes(w) -> NVFP4Planes          # the canonical planes back, byte for byte
    """

    info: BackendInfo

    def availability(self) -> Availability:
        """Cheap, never raises, needs no device to import."""
        ...

    def prepare(self, planes: NVFP4Planes) -> Any:
        """The backend's form of validated planes (its native arrays, its layout), made once
        per weight."""
        ...

    def from_numpy(self, a: npt.NDArray[Any]) -> Any:
        """A numpy array as this backend's native array (bfloat16 from ``ml_dtypes``)."""
        ...

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        """A native array as numpy (dtype preserved; bfloat16 as ``ml_dtypes.bfloat16``)."""
        ...
