"""The verbs as functions: :func:`prepare` on a backend (by name, or the best available),
then :func:`qmm`, :func:`gather_qmm`, :func:`dequantize`, :func:`qmm_w4a4`, the W4A8
verbs (:func:`qmm_w4a8`, :func:`gather_qmm_w4a8`, :func:`qmm_w4a8_fp8`) and
:func:`to_planes` through the backend a :class:`~nvfp4.backend.Prepared` handle came from;
raw planes go to the numpy reference. :func:`quantize_activations` takes a backend too
(default: the reference)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from .backend import Frontend, Prepared
from .contract import VERBS
from .planes import NVFP4Planes
from .reference import dequantize as reference_dequantize
from .reference_backend import backend as reference_backend
from .registry import get_backend

__all__ = [
    "dequantize",
    "gather_qmm",
    "gather_qmm_w4a8",
    "prepare",
    "qmm",
    "qmm_w4a4",
    "qmm_w4a8",
    "qmm_w4a8_fp8",
    "quantize_activations",
    "to_planes",
]


@functools.lru_cache(maxsize=1)
def _reference() -> Frontend:
    return reference_backend()


def _backend_of(w: Any) -> Frontend:
    return w.backend if isinstance(w, Prepared) else _reference()


def prepare(planes: NVFP4Planes, backend: str | Frontend | None = None) -> Prepared:
    """Prepare ``planes`` on ``backend`` (a name, a :class:`Frontend`, or ``None``: the best
    available one, as :func:`nvfp4.get_backend` picks it)."""
    if not isinstance(backend, Frontend):
        backend = get_backend(backend)
    return backend.prepare(planes)


def _on_weight_backend(name: str) -> Callable[..., Any]:
    """The module-level matmul verb ``name`` of :data:`nvfp4.contract.VERBS`: the verb of
    the backend the weight was prepared by (the reference for raw planes), called with the
    same arguments, so it takes and checks them as :class:`Frontend` does."""

    def verb(x: Any, w: Prepared | NVFP4Planes, *args: Any, **options: Any) -> Any:
        return getattr(_backend_of(w), name)(x, w, *args, **options)

    verb.__name__ = verb.__qualname__ = name
    verb.__doc__ = (
        f":meth:`Frontend.{name}` ({VERBS[name].summary}) on the weight's backend (the "
        "reference for raw planes)."
    )
    method = getattr(Frontend, name, None)
    if method is not None:  # its arguments, for help() and editors
        own = inspect.signature(method)
        verb.__signature__ = own.replace(  # type: ignore[attr-defined]
            parameters=list(own.parameters.values())[1:]
        )
    return verb


qmm = _on_weight_backend("qmm")
gather_qmm = _on_weight_backend("gather_qmm")
qmm_w4a4 = _on_weight_backend("qmm_w4a4")
qmm_w4a8 = _on_weight_backend("qmm_w4a8")
gather_qmm_w4a8 = _on_weight_backend("gather_qmm_w4a8")
qmm_w4a8_fp8 = _on_weight_backend("qmm_w4a8_fp8")


def __getattr__(name: str) -> Callable[..., Any]:
    """Every other matmul verb of :data:`nvfp4.contract.VERBS` (one added to the table
    after this module was imported) is served the same way."""
    if name in VERBS and VERBS[name].kind == "matmul":
        return _on_weight_backend(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dequantize(w: Prepared | NVFP4Planes, dtype: Any = np.float32) -> Any:
    """Decode exactly: a prepared weight on its backend; raw planes with the numpy
    reference (:func:`nvfp4.reference.dequantize`, a numpy array)."""
    if isinstance(w, Prepared):
        return w.backend.dequantize(w, dtype)
    return reference_dequantize(w, dtype)


def quantize_activations(
    x: Any, input_scale: Any = None, *, backend: str | Frontend | None = None
) -> NVFP4Planes:
    """Activation planes from ``backend`` (default: the numpy reference)."""
    if backend is None:
        chosen = _reference()
    elif isinstance(backend, Frontend):
        chosen = backend
    else:
        chosen = get_backend(backend)
    return chosen.quantize_activations(x, input_scale)


def to_planes(w: Prepared) -> NVFP4Planes:
    """The canonical planes of a prepared weight (where its backend can give them back)."""
    if not isinstance(w, Prepared):
        raise TypeError(f"to_planes: expected a Prepared weight, found {type(w).__name__}")
    return w.backend.to_planes(w)
