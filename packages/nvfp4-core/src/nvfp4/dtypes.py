"""The output dtypes of spec 1.0 (float32, float16, bfloat16), and the name of any dtype
(:func:`dtype_name`, the one function core names dtypes with)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

__all__ = ["OUTPUT_DTYPES", "as_float32_input", "dtype_name", "resolve_dtype"]

#: The output dtypes a decoder or matmul produces, by their spec names.
OUTPUT_DTYPES: dict[str, np.dtype[Any]] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}


def resolve_dtype(dtype: Any) -> np.dtype[Any]:
    """``"bfloat16"``, ``np.float16``, ``ml_dtypes.bfloat16``... -> one of :data:`OUTPUT_DTYPES`."""
    if isinstance(dtype, str):
        if dtype in OUTPUT_DTYPES:
            return OUTPUT_DTYPES[dtype]
    else:
        try:
            d = np.dtype(dtype)
        except TypeError:
            d = None
        for known in OUTPUT_DTYPES.values():
            if d == known:
                return known
    raise ValueError(f"output dtype: expected one of {sorted(OUTPUT_DTYPES)}, found {dtype!r}")


def dtype_name(dtype: Any) -> str:
    """A dtype given as a name, a numpy / ml_dtypes dtype or type, or a torch / MLX dtype
    object, by its plain name (``"float16"``)."""
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, (np.dtype, type)):
        try:
            return np.dtype(dtype).name
        except TypeError:
            return repr(dtype)
    return str(dtype).rsplit(".", 1)[-1]  # torch.float16, mlx.core.float16


def as_float32_input(x: Any, what: str) -> npt.NDArray[np.float32]:
    """An input tensor as float32. float16 and bfloat16 convert exactly; float64 is rounded
    to nearest-even float32 (documented); anything else is refused."""
    a = np.asarray(x)
    if a.dtype in (np.float32, np.float16, np.dtype(ml_dtypes.bfloat16), np.float64):
        return a.astype(np.float32, copy=False)
    raise ValueError(
        f"{what}: expected a float32, float16, bfloat16 or float64 array, found dtype {a.dtype}"
    )
