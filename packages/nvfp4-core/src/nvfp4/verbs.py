"""The verbs as functions: :func:`prepare` on a backend (by name, or the best available),
then :func:`qmm`, :func:`gather_qmm`, :func:`dequantize`, :func:`qmm_w4a4`, the W4A8
verbs (:func:`qmm_w4a8`, :func:`gather_qmm_w4a8`, :func:`qmm_w4a8_fp8`) and
:func:`to_planes` through the backend a :class:`~nvfp4.backend.Prepared` handle came from;
raw planes go to the numpy reference. :func:`quantize_activations` takes a backend too
(default: the reference)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .backend import Frontend, Prepared
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


def qmm(x: Any, w: Prepared | NVFP4Planes, *, out_dtype: Any = None) -> Any:
    """:meth:`Frontend.qmm` on the weight's backend (the reference for raw planes)."""
    return _backend_of(w).qmm(x, w, out_dtype=out_dtype)


def gather_qmm(
    x: Any,
    w: Prepared | NVFP4Planes,
    expert_ids: Any,
    *,
    sorted_indices: bool = False,
    out_dtype: Any = None,
) -> Any:
    """:meth:`Frontend.gather_qmm` on the weight's backend (the reference for raw planes)."""
    return _backend_of(w).gather_qmm(
        x, w, expert_ids, sorted_indices=sorted_indices, out_dtype=out_dtype
    )


def dequantize(w: Prepared | NVFP4Planes, dtype: Any = np.float32) -> Any:
    """Decode exactly: a prepared weight on its backend; raw planes with the numpy
    reference (:func:`nvfp4.reference.dequantize`, a numpy array)."""
    if isinstance(w, Prepared):
        return w.backend.dequantize(w, dtype)
    return reference_dequantize(w, dtype)


def qmm_w4a4(
    x: Any, w: Prepared | NVFP4Planes, *, input_scale: Any = None, out_dtype: Any = None
) -> Any:
    """:meth:`Frontend.qmm_w4a4` on the weight's backend (the reference for raw planes)."""
    return _backend_of(w).qmm_w4a4(x, w, input_scale=input_scale, out_dtype=out_dtype)


def qmm_w4a8(x: Any, w: Prepared | NVFP4Planes, *, out_dtype: Any = None) -> Any:
    """:meth:`Frontend.qmm_w4a8` on the weight's backend (the reference for raw planes)."""
    return _backend_of(w).qmm_w4a8(x, w, out_dtype=out_dtype)


def gather_qmm_w4a8(
    x: Any,
    w: Prepared | NVFP4Planes,
    expert_ids: Any,
    *,
    sorted_indices: bool = False,
    out_dtype: Any = None,
) -> Any:
    """:meth:`Frontend.gather_qmm_w4a8` on the weight's backend (the reference for raw
    planes)."""
    return _backend_of(w).gather_qmm_w4a8(
        x, w, expert_ids, sorted_indices=sorted_indices, out_dtype=out_dtype
    )


def qmm_w4a8_fp8(
    x: Any, w: Prepared | NVFP4Planes, *, input_scale: Any = None, out_dtype: Any = None
) -> Any:
    """:meth:`Frontend.qmm_w4a8_fp8` on the weight's backend (the reference for raw planes)."""
    return _backend_of(w).qmm_w4a8_fp8(x, w, input_scale=input_scale, out_dtype=out_dtype)


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
