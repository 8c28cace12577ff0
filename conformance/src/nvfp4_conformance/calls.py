"""How the tiers call a backend's verbs and check what comes back: numpy arrays in
(through the backend's ``from_numpy``), numpy arrays out (``to_numpy``), the output's shape
and dtype checked before its values are; :class:`MatmulCheck` is T4's check of a matmul case."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes

from nvfp4_conformance.checks import assert_within, error_figures


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


@dataclass(frozen=True)
class MatmulCheck:
    """T4's check of matmul cases, bound to one test's backend, ``nvfp4_record`` and
    ``tolerance(path, dtype)`` lookup."""

    backend: Any
    record: Any
    tolerance: Any

    def __call__(
        self,
        verb: str,
        x: npt.NDArray[Any],
        planes: NVFP4Planes,
        ref: npt.NDArray[Any],
        *,
        case: str,
        dtype: str,
        path: str,
        what: str,
        output_of: str | None = None,
        fields: Mapping[str, Any] | None = None,
        after: Mapping[str, Any] | None = None,
        groups: Any = None,
        **verb_kwargs: Any,
    ) -> None:
        """One case: ``backend.<verb>(x, prepare(planes), **verb_kwargs)`` has x's rows, the
        planes' N columns and x's dtype (``output_of`` names it, default ``verb``), and
        ``max|y - ref| / max|ref|`` is within ``tolerance(path, dtype)``
        (:func:`~nvfp4_conformance.checks.assert_within`: ``what`` and ``groups``). The
        figures go into the certificate as ``case``, pass or fail: the dtype, ``[M, K, N]``,
        ``fields``, the tolerance, ``after``, then the error figures."""
        backend = self.backend
        y = call_verb(backend, verb, x, backend.prepare(planes), **verb_kwargs)
        m = x.shape[0]
        assert_output(y, (m, planes.n), dtype, output_of or verb)
        tol = float(self.tolerance(path, dtype))
        figs = error_figures(y, ref)
        self.record(
            case,
            dtype=dtype,
            shape=[m, planes.k, planes.n],
            **(fields or {}),
            tolerance=tol,
            **(after or {}),
            **figs,
        )
        assert_within(y, ref, tol, what, groups=groups)
