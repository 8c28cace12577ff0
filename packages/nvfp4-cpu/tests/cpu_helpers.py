"""Helpers shared by the nvfp4-cpu tests: the spec's error measure against its tolerance,
with every error measured kept for the end-of-run summary."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from nvfp4.testing import assert_within
from nvfp4.tolerances import tolerance

MEASURED: dict[str, list[float]] = defaultdict(list)


def check_close(path: str, dtype: str, y: np.ndarray, ref: np.ndarray, label: str = "") -> float:
    """Assert ``y`` is within ``tolerance(path, dtype)`` of ``ref`` (``nvfp4.testing``'s
    measure) and record the error."""
    figs = assert_within(y, ref, tolerance(path, dtype), f"{path} {dtype} {label}")
    MEASURED[f"{path}/{dtype}"].append(figs["max_rel_err"])
    return float(figs["max_rel_err"])
