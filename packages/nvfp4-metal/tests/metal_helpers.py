"""Helpers for the nvfp4-metal tests: this suite's realistic weights, conversions from mx
arrays and the spec's error measure against its tolerance (random planes and activations:
:mod:`nvfp4.testing`)."""

from __future__ import annotations

import functools
from typing import Any

import ml_dtypes
import mlx.core as mx
import numpy as np
import numpy.typing as npt
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.testing import assert_within, realistic_weight
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


#: This suite's weights: :func:`nvfp4.testing.realistic_weight` without outliers, partition
#: ``i`` scaled by ``3 ** i`` and expert ``e`` by ``2 ** e``.
realistic_planes = functools.partial(
    realistic_weight, outliers=False, partition_step=3.0, expert_base=1.0
)
