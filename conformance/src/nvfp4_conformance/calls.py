"""How the tiers call a backend's verbs and check what comes back: numpy arrays in
(through the backend's ``from_numpy``), numpy arrays out (``to_numpy``), the output's shape
and dtype checked before its values are (:func:`call_prepared` does both for a verb on
prepared planes); and whose activation encoder T4's references use (:func:`own_encoding`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4 import reference
from nvfp4.dtypes import OUTPUT_DTYPES


def call_verb(
    backend: Any, verb: str, x: npt.NDArray[Any], w: Any, *args: Any, **kwargs: Any
) -> npt.NDArray[Any]:
    """``backend.<verb>(x, w, *args, **kwargs)`` with ``x`` given as the backend's array,
    the result as a numpy array."""
    y = getattr(backend, verb)(backend.from_numpy(x), w, *args, **kwargs)
    return np.asarray(backend.to_numpy(y))


def assert_output(y: npt.NDArray[Any], shape: tuple[int, ...], dtype: str, what: str) -> None:
    """Fail unless ``y`` has ``shape`` and the output dtype ``dtype`` (x's dtype: the
    verbs' default)."""
    assert y.shape == shape, f"{what}: output shape {y.shape}, expected {shape}"
    assert y.dtype == OUTPUT_DTYPES[dtype], (
        f"{what}: output dtype {y.dtype}, expected {dtype} (x's dtype)"
    )


def call_prepared(
    backend: Any,
    verb: str,
    x: npt.NDArray[Any],
    planes: Any,
    *args: Any,
    shape: tuple[int, ...],
    dtype: str,
    what: str | None = None,
    **kwargs: Any,
) -> npt.NDArray[Any]:
    """``backend.<verb>(x, backend.prepare(planes), *args, **kwargs)`` as a numpy array,
    failed unless it has ``shape`` and the output dtype ``dtype`` (:func:`assert_output`;
    ``what`` names the call in the message, ``verb`` when not given)."""
    y = call_verb(backend, verb, x, backend.prepare(planes), *args, **kwargs)
    assert_output(y, shape, dtype, verb if what is None else what)
    return y


def own_encoding(backend: Any, verb: str, x: npt.NDArray[Any], *args: Any) -> Any:
    """``x`` encoded by ``backend``'s own activation encoder ``verb``
    (``quantize_activations``, ``quantize_activations_q8``, ``quantize_activations_fp8``;
    ``args``: the input scale) where it runs one - T2 judges that encoder - else by the
    reference's: a T4 reference takes the codes the backend's matmul multiplied."""
    if backend.has(verb):
        return getattr(backend, verb)(backend.from_numpy(x), *args)
    return getattr(reference, verb)(x, *args)
