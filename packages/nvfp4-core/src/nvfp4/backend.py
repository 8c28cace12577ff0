"""The verbs, owned by core: :class:`Frontend` wraps a backend's kernels
(:class:`nvfp4.contract.Kernels`) and :class:`Prepared` is the handle of a prepared weight.

Three names, one meaning each: a *backend* is an installed implementation (``cpu``,
``cuda``, a third-party engine's adapter); its *kernels* are the narrow contract it implements
(:class:`nvfp4.contract.Kernels`); the *front end* (:class:`Frontend`) is what users call, the
same checked verbs over any backend's kernels. :func:`nvfp4.get_backend` returns the named
backend's front end (a backend package may subclass :class:`Frontend`, as ``CPUBackend``
does); each backend's entry-point factory, ``backend()``, returns the same. ``Backend``, the
class's name in 0.1, is a deprecated alias for one release.
 Each verb checks its arguments with
:mod:`nvfp4.frontend`, validates planes, reshapes ``[..., K]`` inputs to ``[M, K]``,
resolves the output dtype, handles ``M = 0`` itself, and only then calls the kernel, whose
result it reshapes back. A backend therefore contains no argument checking of its own, and
every backend refuses the same inputs with the same messages.

The module-level verbs (:mod:`nvfp4.verbs`) do the same through the backend a
:class:`Prepared` handle came from, or through the reference backend for raw planes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, final

import numpy as np
import numpy.typing as npt

from . import frontend
from ._moved import renamed
from .activations import FP8Activations, Q8Activations
from .contract import (
    CAPABILITIES,
    OPTIONAL_CAPABILITIES,
    VERBS,
    Availability,
    BackendInfo,
    Kernels,
)
from .dtypes import resolve_dtype
from .planes import NVFP4Planes, check_decoded_size, check_planes_size, validate
from .shapes import WeightShape

__all__ = [
    "CAPABILITIES",
    "Availability",
    "BackendInfo",
    "Frontend",
    "Kernels",
    "Prepared",
]


@final
class Prepared(WeightShape):
    """A weight prepared by one backend: opaque and immutable.

    It records what the verbs check (``name``, ``shape``, ``num_experts``, ``partitions``)
    from the validated planes it was made from; the backend's own form of the weight is
    private. Made only by :meth:`Frontend.prepare`; attributes cannot be set or deleted, so a
    handle cannot be edited into a shape its payload does not have.
    """

    __slots__ = ("_backend", "_payload", "name", "partitions", "shape")

    name: str
    shape: tuple[int, ...]
    partitions: tuple[int, ...] | None
    _backend: Frontend
    _payload: Any

    def __init__(self, *_: Any, **__: Any) -> None:
        raise TypeError("Prepared weights are made by Frontend.prepare(planes)")

    @classmethod
    def _make(cls, backend: Frontend, planes: NVFP4Planes, payload: Any) -> Prepared:
        self = object.__new__(cls)
        for attr, value in (
            ("_backend", backend),
            ("_payload", payload),
            ("name", planes.name),
            ("shape", tuple(int(d) for d in planes.shape)),
            ("partitions", planes.partitions),
        ):
            object.__setattr__(self, attr, value)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Prepared weight {self.name!r} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Prepared weight {self.name!r} is immutable")

    def __copy__(self) -> Prepared:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Prepared:
        return self

    def __reduce__(self) -> Any:
        raise TypeError(f"Prepared weight {self.name!r} cannot be pickled: pickle its planes")

    @property
    def backend(self) -> Frontend:
        """The backend that prepared it (and runs its verbs)."""
        return self._backend

    @property
    def payload(self) -> Any:
        """The backend's own form of the weight (read-only use: kernels, debugging)."""
        return self._payload

    def __repr__(self) -> str:
        return f"Prepared({self.name!r}, shape={self.shape}, backend={self._backend.info.name!r})"


def _gated(verb: str) -> bool:
    """Whether ``verb`` is the kernel of an optional capability (run only where declared)."""
    return verb in VERBS and VERBS[verb].capability in OPTIONAL_CAPABILITIES


def _matmul_verb(name: str, doc: str) -> Callable[..., Any]:
    """The front end's matmul verb ``name`` of :data:`nvfp4.contract.VERBS`, its arguments
    those its entry gives it: ``(x, w, expert_ids, *, sorted_indices=False, out_dtype=None)``
    for an expert stack, ``(x, w, *, input_scale=None, out_dtype=None)`` where it takes a
    static activation scale, else ``(x, w, *, out_dtype=None)``. Every matmul verb, a table
    entry added later too, runs the one checked path, ``_matmul``."""
    spec = VERBS[name]
    verb: Callable[..., Any]
    if spec.experts:

        def verb(
            self: Any,
            x: Any,
            w: Any,
            expert_ids: Any,
            *,
            sorted_indices: bool = False,
            out_dtype: Any = None,
        ) -> Any:
            return self._matmul(
                name, x, w, out_dtype, expert_ids=expert_ids, sorted_indices=sorted_indices
            )

    elif spec.input_scale:

        def verb(
            self: Any, x: Any, w: Any, *, input_scale: Any = None, out_dtype: Any = None
        ) -> Any:
            return self._matmul(name, x, w, out_dtype, input_scale=input_scale)

    else:

        def verb(self: Any, x: Any, w: Any, *, out_dtype: Any = None) -> Any:
            return self._matmul(name, x, w, out_dtype)

    verb.__name__ = verb.__qualname__ = name
    verb.__doc__ = doc
    return verb


#: The members every kernels object has (the kernels themselves are optional).
_REQUIRED = ("info", "availability", "prepare", "from_numpy", "to_numpy")


def _has_static(obj: object, name: str) -> bool:
    """Whether ``obj`` has ``name`` without running it (``info`` may be a property that
    detects the device: constructing a Frontend must stay cheap)."""
    try:
        inspect.getattr_static(obj, name)
    except AttributeError:
        return False
    return True


class Frontend:
    """The NVFP4 verbs over one backend's kernels.

    ``Frontend(kernels)`` accepts any object with the members of
    :class:`nvfp4.contract.Kernels`; :func:`nvfp4.get_backend` builds it from the registered
    factory. Native arrays come back from the matmul verbs; numpy arrays are accepted as
    inputs everywhere.
    """

    kernels: Kernels

    def __init__(self, kernels: Kernels) -> None:
        if isinstance(kernels, Frontend):
            kernels = kernels.kernels
        missing = [m for m in _REQUIRED if not _has_static(kernels, m)]
        if missing:
            raise TypeError(
                f"{type(kernels).__name__} is not an NVFP4 kernels object: it lacks "
                f"{', '.join(missing)} (see nvfp4.contract.Kernels)"
            )
        self.kernels = kernels
        self._available: Availability | None = None

    def __getattr__(self, name: str) -> Any:
        """A verb of :data:`nvfp4.contract.VERBS` without a method of its own is served from
        its table entry (:meth:`verb`); backend-specific facts and tools (``isa``,
        ``platform()``, ...) read through to the kernels object. The verbs are always
        core's, never the kernels object's."""
        kernels = self.__dict__.get("kernels")
        if kernels is None or name.startswith("__"):
            raise AttributeError(name)
        if name in VERBS:
            return self.verb(name)
        return getattr(kernels, name)

    def verb(self, name: str) -> Any:
        """The verb ``name`` of :data:`nvfp4.contract.VERBS` as a function, its arguments
        those of its kind: a matmul ``(x, w[, expert_ids], *, [sorted_indices,]
        [input_scale,] out_dtype=None)``, an encoder ``(x[, input_scale])``, a decoder
        ``(w, dtype="float32")``; checked as every verb of that kind is."""
        spec = VERBS[name]
        if spec.kind == "decode":
            return lambda w, dtype="float32": self._decode(name, w, dtype)
        if spec.kind == "encode":
            if spec.input_scale:
                return lambda x, input_scale=None: self._activations(
                    name, x, input_scale=input_scale
                )
            return lambda x: self._activations(name, x)
        return _matmul_verb(name, spec.summary).__get__(self)

    # ---------------------------------------------------------------- facts
    @property
    def info(self) -> BackendInfo:
        info: BackendInfo = self.kernels.info
        return info

    @property
    def name(self) -> str:
        return self.info.name

    def availability(self) -> Availability:
        return self.kernels.availability()

    def has(self, verb: str) -> bool:
        """Whether ``verb`` runs here: the kernel exists and, for an optional capability of
        the spec (``qmm_w4a4``, the W4A8 kernels), it is declared."""
        if getattr(self.kernels, verb, None) is None:
            return False
        return not _gated(verb) or VERBS[verb].capability in self.info.capabilities

    def _kernel(self, verb: str, name: str) -> Any:
        fn = getattr(self.kernels, verb, None)
        if fn is None:
            raise NotImplementedError(
                f"{verb}({name!r}): NVFP4 backend {self.name!r} has no {verb} kernel"
            )
        if _gated(verb) and VERBS[verb].capability not in self.info.capabilities:
            cap = VERBS[verb].capability
            tag = cap.split("_")[0]
            notes = "; ".join(n for n in self.info.notes if tag in n.lower())
            raise NotImplementedError(
                f"{verb}({name!r}): NVFP4 backend {self.name!r} does not declare the "
                f"{cap!r} capability here" + (f" ({notes})" if notes else "")
            )
        return fn

    def _ready(self) -> None:
        if self._available is None or not self._available.ok:
            self._available = self.availability()
        if not self._available.ok:
            raise RuntimeError(
                f"NVFP4 backend {self.name!r} cannot run here: {self._available.reason}"
            )

    # ------------------------------------------------------------- weights
    def prepare(self, planes: NVFP4Planes) -> Prepared:
        """Validate ``planes`` (structure, size, then content) and hand them to the backend
        once. Planes whose contiguous copy cannot fit in memory (broadcast or overlapping
        strides claiming terabytes) are a :class:`~nvfp4.PlaneError` before any backend
        allocates (:func:`nvfp4.planes.check_planes_size`)."""
        if isinstance(planes, Prepared):
            return self._own(planes, "prepare")
        validate(planes)  # the type and the structure first: nothing reads a malformed plane
        check_planes_size(planes)  # O(1): nothing is copied or read that cannot fit
        validate(planes, content=True)
        self._ready()
        return Prepared._make(self, planes, self.kernels.prepare(planes))

    def _own(self, w: Prepared, verb: str) -> Prepared:
        if w._backend is not self and w._backend.kernels is not self.kernels:
            raise TypeError(
                f"{verb}({w.name!r}): the weight was prepared by backend "
                f"{w._backend.name!r}, not {self.name!r}"
            )
        return w

    def _weight(self, w: Any, verb: str) -> Prepared:
        if isinstance(w, Prepared):
            return self._own(w, verb)
        if isinstance(w, NVFP4Planes):
            return self.prepare(w)
        raise TypeError(
            f"{verb}: expected a weight from Frontend.prepare() (or nvfp4.NVFP4Planes), "
            f"found {type(w).__name__}"
        )

    def to_planes(self, w: Prepared) -> NVFP4Planes:
        """The canonical planes of a prepared weight, byte for byte."""
        pw = self._weight(w, "to_planes")
        planes: NVFP4Planes = self._kernel("to_planes", pw.name)(pw.payload)
        return planes

    # -------------------------------------------------------------- helpers
    def _empty(self, lead: tuple[int, ...], n: int, dtype: str, widen: bool) -> Any:
        a = np.zeros((*lead, n), dtype=np.float64 if widen else resolve_dtype(dtype))
        return a if widen else self.kernels.from_numpy(a)

    def _finish(self, y: Any, lead: tuple[int, ...], n: int, widen: bool) -> Any:
        y = y.reshape(*lead, n)
        if widen:
            return np.asarray(self.kernels.to_numpy(y), dtype=np.float64)
        return y

    # ---------------------------------------------------------------- verbs
    def _matmul(
        self,
        verb: str,
        x: Any,
        w: Any,
        out_dtype: Any,
        *,
        expert_ids: Any = frontend.ABSENT,
        sorted_indices: bool = False,
        input_scale: Any = frontend.ABSENT,
    ) -> Any:
        """Every matmul verb: the weight and its kernel, the operands checked by
        :func:`nvfp4.frontend.matmul_operands` as the verb's table entry says, the output
        dtype; then the kernel, unless M = 0."""
        spec = VERBS[verb]
        if spec.experts != (expert_ids is not frontend.ABSENT) or spec.input_scale != (
            input_scale is not frontend.ABSENT
        ):
            raise TypeError(
                f"{verb}: arguments that do not match its entry in nvfp4.contract.VERBS"
            )
        pw = self._weight(w, verb)
        kernel = self._kernel(verb, pw.name)
        ops = frontend.matmul_operands(
            verb,
            pw.name,
            pw.shape,
            x,
            expert_ids=expert_ids,
            sorted_indices=sorted_indices,
            input_scale=input_scale,
            q8=spec.q8,
            convert=self.kernels.from_numpy,
        )
        xin = ops.x
        args: list[Any] = [xin.x, pw.payload]
        options: dict[str, Any] = {}
        if ops.expert_ids is not frontend.ABSENT:
            args.append(ops.expert_ids)
            options["sorted_indices"] = bool(sorted_indices)
        if ops.input_scale is not frontend.ABSENT:
            options["input_scale"] = ops.input_scale
        dtype, widen = frontend.output_dtype(xin.dtype, out_dtype)
        if xin.rows == 0:
            return self._empty(xin.lead, pw.n, dtype, widen)
        y = kernel(*args, out_dtype=dtype, **options)
        return self._finish(y, xin.lead, pw.n, widen)

    def _activations(self, verb: str, x: Any, **scale: Any) -> Any:
        """Every activation encoder: x as ``[M, K]`` (K % 32 for int8), the static input
        scale where the verb takes one, then the kernel."""
        what = f"{verb}('activation')"
        kernel = self._kernel(verb, "activation")
        a = frontend.activation_input(x, what, self.kernels.from_numpy)
        if VERBS[verb].q8:
            frontend.check_q8_k(int(a.shape[1]), what)
        if scale:
            scale["input_scale"] = frontend.input_scale_value(scale["input_scale"], what)
        self._ready()
        return kernel(a, **scale)

    qmm = _matmul_verb(
        "qmm",
        """W4A16 ``y = x @ decode(w).T`` with the global applied after accumulation; ``x`` is
        ``[..., K]``; ``out_dtype`` defaults to x's dtype.""",
    )

    gather_qmm = _matmul_verb(
        "gather_qmm",
        """MoE: row ``m`` of ``x [M, K]`` times expert ``expert_ids[m]``; ids outside
        ``[0, E)`` give exactly zero rows.""",
    )

    def _decode(self, verb: str, w: Any, dtype: Any) -> Any:
        """A decoder: the float32 decode must fit in memory (the reference's refusal, the
        same message), checked before the weight is prepared and before the kernel runs."""
        if isinstance(w, NVFP4Planes):
            validate(w)
            check_decoded_size(w.name, w.shape)
        pw = self._weight(w, verb)
        kernel = self._kernel(verb, pw.name)
        out = frontend.decode_dtype(dtype)
        check_decoded_size(pw.name, pw.shape)
        return kernel(pw.payload, dtype=out)

    def dequantize(self, w: Any, dtype: Any = "float32") -> Any:
        """Decode a prepared weight (or planes) to a dense native array, exactly."""
        return self._decode("dequantize", w, dtype)

    def quantize_activations(self, x: Any, input_scale: Any = None) -> NVFP4Planes:
        """Quantize ``[M, K]`` activations with the spec's block rule (canonical planes)."""
        planes: NVFP4Planes = self._activations("quantize_activations", x, input_scale=input_scale)
        return planes

    qmm_w4a4 = _matmul_verb(
        "qmm_w4a4",
        """W4A4: activations quantized with the spec's rule, then the matmul with both
        globals applied after accumulation (where ``w4a4`` is declared).""",
    )

    def quantize_activations_q8(self, x: Any) -> Q8Activations:
        """int8 W4A8 activations of ``[M, K]`` (K a multiple of 32), ggml's Q8_0 rule
        (where ``w4a8`` is declared)."""
        q: Q8Activations = self._activations("quantize_activations_q8", x)
        return q

    qmm_w4a8 = _matmul_verb(
        "qmm_w4a8",
        """W4A8 int8: activations quantized per block of 32 (ggml Q8_0), then the product
        with the weight's global applied after accumulation (where ``w4a8`` is declared).""",
    )

    gather_qmm_w4a8 = _matmul_verb(
        "gather_qmm_w4a8",
        """MoE W4A8 int8: row ``m`` times expert ``expert_ids[m]``; ids outside ``[0, E)``
        give exactly zero rows (where ``w4a8`` is declared).""",
    )

    def quantize_activations_fp8(self, x: Any, input_scale: Any = None) -> FP8Activations:
        """FP8 E4M3 W4A8 activations of ``[M, K]`` with a static or dynamic per-tensor
        input scale (where ``w4a8_fp8`` is declared)."""
        q: FP8Activations = self._activations(
            "quantize_activations_fp8", x, input_scale=input_scale
        )
        return q

    qmm_w4a8_fp8 = _matmul_verb(
        "qmm_w4a8_fp8",
        """W4A8 FP8: ``e4m3(x / input_scale)`` times the weight, ``input_scale`` and the
        weight's global applied after accumulation (where ``w4a8_fp8`` is declared).""",
    )

    # -------------------------------------------------------------- arrays
    def from_numpy(self, a: npt.NDArray[Any]) -> Any:
        return self.kernels.from_numpy(a)

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        return self.kernels.to_numpy(a)

    def __repr__(self) -> str:
        return f"nvfp4.Frontend({self.name!r})"


#: ``nvfp4.backend.Backend``: the class's old name, one release (warns).
__getattr__ = renamed(__name__, {"Backend": ("Frontend", Frontend)})
