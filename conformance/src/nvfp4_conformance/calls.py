"""How the tiers call a backend's verbs and check what comes back: numpy arrays in
(through the backend's ``from_numpy``), numpy arrays out (``to_numpy``), the output's shape
and dtype checked before its values are (:func:`call_prepared` does both for a verb on
prepared planes); a T4 matmul case called, recorded and held to its tolerance
(:func:`check_qmm`; some of its rows only, :func:`check_rows`); and whose activation
encoder T4's references use (:func:`own_encoding`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4 import reference
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes

from nvfp4_conformance.checks import record_within


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


def check_qmm(
    backend: Any,
    record: Callable[..., None],
    tolerance: Callable[[str, str], Any],
    verb: str,
    case: str,
    x: npt.NDArray[Any],
    planes: NVFP4Planes,
    ref: npt.NDArray[np.float64],
    dtype: str,
    *,
    what: str | None = None,
    for_information: Mapping[str, Any] | None = None,
    figures: Mapping[str, Any] | None = None,
    a: Any = None,
    **kwargs: Any,
) -> None:
    """One T4 case of a matmul verb (``qmm``, ``qmm_w4a8``, ``qmm_w4a4``,
    ``qmm_w4a8_fp8``): ``backend.<verb>(x, backend.prepare(planes), **kwargs)`` must have
    shape ``[M, N]`` and dtype ``dtype`` (:func:`call_prepared`), then is recorded as
    ``case`` - its dtype, shape ``[M, K, N]``, ``kwargs`` (the input scale the verb was
    given), ``figures`` and ``for_information`` - and held within ``tolerance(path, dtype)``
    of ``ref``, ``path`` being the verb less its ``qmm_`` (:func:`record_within`; a failure
    names ``"<verb> <what> <dtype>"``, ``what`` being ``case`` when not given). From spec
    1.3 an output also conforms within its accumulation floor, over ``a``: what the path
    multiplied (x when not given; the activations the backend's encoder gave for W4A4 and
    W4A8)."""
    (m, k), n = x.shape, planes.n
    y = call_prepared(backend, verb, x, planes, shape=(m, n), dtype=dtype, **kwargs)
    path = verb.removeprefix("qmm_")
    tol = float(tolerance(path, dtype))
    record_within(
        record,
        case,
        y,
        ref,
        tol,
        f"{verb} {case if what is None else what} {dtype}",
        for_information=for_information,
        allowance=floor_of(tolerance, path, x if a is None else a, planes, ref, dtype),
        dtype=dtype,
        shape=[m, k, n],
        **kwargs,
        **(figures or {}),
    )


def floor_of(
    tolerance: Any, path: str, a: Any, w: Any, ref: Any, dtype: str, expert_ids: Any = None
) -> npt.NDArray[np.float64] | None:
    """The accumulation floor of every output (``tolerance``: the ``nvfp4_tolerance``
    fixture, :class:`~nvfp4_conformance.spec_tolerances.SpecBounds`), ``None`` where the
    version certified has none; a plain ``(path, dtype)`` callable has none either."""
    allowance = getattr(tolerance, "allowance", None)
    if allowance is None:
        return None
    floor: npt.NDArray[np.float64] | None = allowance(path, a, w, ref, dtype, expert_ids)
    return floor


def check_rows(
    record: Callable[..., None],
    tolerance: Any,
    path: str,
    case: str,
    y: npt.NDArray[Any],
    ref: npt.NDArray[np.float64],
    rows: npt.NDArray[np.intp],
    what: str,
    *,
    a: Any,
    planes: NVFP4Planes,
) -> None:
    """The float32 outputs of ``rows`` only (the other rows non-finite, or exact, by their
    own rule), recorded as ``case`` and held within ``tolerance(path, "float32")`` of
    ``ref`` - each output within its accumulation floor over ``a`` too, from spec 1.3
    (:func:`record_within`, :func:`floor_of`)."""
    floor = floor_of(tolerance, path, a, planes, ref, "float32")
    record_within(
        record,
        case,
        y[rows],
        ref[rows],
        float(tolerance(path, "float32")),
        what,
        allowance=None if floor is None else floor[rows],
        dtype="float32",
    )


def own_encoding(backend: Any, verb: str, x: npt.NDArray[Any], *args: Any) -> Any:
    """``x`` encoded by ``backend``'s own activation encoder ``verb``
    (``quantize_activations``, ``quantize_activations_q8``, ``quantize_activations_fp8``;
    ``args``: the input scale) where it runs one - T2 judges that encoder - else by the
    reference's: a T4 reference takes the codes the backend's matmul multiplied."""
    if backend.has(verb):
        return getattr(backend, verb)(backend.from_numpy(x), *args)
    return getattr(reference, verb)(x, *args)
