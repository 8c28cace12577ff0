"""Checks of the activation-side inputs of the matmul verbs, shared by the reference and
the numpy-facing backends so that every one refuses the same inputs with the same words."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .dtypes import as_float32_input

__all__ = ["check_expert_ids", "check_x"]


def check_x(x: Any, k: int, what: str) -> npt.NDArray[np.float32]:
    """``x`` as float32 ``[..., K]`` (float16 / bfloat16 exact, float64 rounded), or a
    ``ValueError`` naming ``what``, the expected K and the found shape."""
    a = as_float32_input(x, what)
    if a.ndim < 1 or a.shape[-1] != k:
        raise ValueError(f"{what}: x must be [..., K] with K = {k}, found shape {a.shape}")
    return a


def check_expert_ids(
    expert_ids: Any, m: int, what: str, *, sorted_indices: bool = False
) -> npt.NDArray[Any]:
    """One integer expert id per row of ``x`` (``[M]``). Ids outside ``[0, E)`` are allowed
    (they select an exactly zero row); a ``sorted_indices=True`` hint that is false is
    refused, so a backend that trusts the hint is never handed a lie."""
    ids = np.asarray(expert_ids)
    if ids.shape != (m,) or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"{what}: expert_ids must be integer [M] with M = {m}, found {ids.dtype} {ids.shape}"
        )
    if sorted_indices and ids.size and np.any(np.diff(ids) < 0):
        raise ValueError(f"{what}: sorted_indices=True but expert_ids are not sorted")
    return ids
