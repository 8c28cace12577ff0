"""Helpers for the nvfp4-metal tests: this suite's realistic weights, conversions from mx
arrays and the spec's error measure against its tolerance (random planes and activations:
:mod:`nvfp4.testing`)."""

from __future__ import annotations

import itertools
from typing import Any

import ml_dtypes
import mlx.core as mx
import numpy as np
import numpy.typing as npt
from nvfp4 import reference
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes
from nvfp4.testing import assert_within
from nvfp4.tolerances import tolerance

NP_DTYPES = OUTPUT_DTYPES


def to_np(a: Any) -> npt.NDArray[Any]:
    """An mx array (or anything numpy reads) as numpy, bfloat16 as ml_dtypes.bfloat16."""
    if isinstance(a, mx.array) and a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).view(ml_dtypes.bfloat16)
    return np.array(a)


def check_close(found: Any, ref: npt.NDArray[Any], path: str, dtype: str, what: str) -> float:
    """Assert ``max|found - ref| / max|ref| <= tolerance(path, dtype)`` (the measure and its
    rules: :mod:`nvfp4.testing.errors`); return it."""
    figs = assert_within(to_np(found), ref, tolerance(path, dtype), f"{what} ({path}, {dtype})")
    return float(figs["max_rel_err"])


def realistic_planes(
    rng: np.random.Generator,
    n: int,
    k: int,
    *,
    experts: int | None = None,
    partitions: tuple[int, ...] | None = None,
    name: str = "w",
) -> NVFP4Planes:
    """Gaussian weights quantized by the reference encoder (own global per expert/partition;
    no outliers, unlike :func:`nvfp4.testing.realistic_weight`)."""
    lead = (experts, n) if experts else (n,)
    w = rng.standard_normal((*lead, k)).astype(np.float32)
    w *= np.exp(rng.normal(0.0, 0.7, size=(*lead, 1))).astype(np.float32)
    if partitions is not None:
        for i, (a, b) in enumerate(itertools.pairwise(partitions)):
            w[..., a:b, :] *= np.float32(3.0**i)
    if experts:
        w *= (2.0 ** np.arange(experts, dtype=np.float32))[:, None, None]
    return reference.quantize(w, partitions=partitions, name=name)
