"""Every check of a verb's arguments, and its error message, written once.

The verbs of :class:`nvfp4.Frontend` and the public functions of :mod:`nvfp4.reference` call
these before any kernel runs, so every backend refuses the same inputs with the same words
and a kernel only sees what :mod:`nvfp4.contract` promises it.

Arrays are numpy arrays or a backend's native arrays (``torch.Tensor``, ``mx.array``),
handled through what they share: ``.shape``, ``.dtype`` (named by the last component of
``str(dtype)``: ``torch.float16`` and ``mlx.core.float16`` are ``float16``) and
``.reshape``. Numpy input is accepted by every backend: it is checked here, then converted
with the backend's ``from_numpy``. float64 is accepted as numpy only (rounded once to
float32; the default output is then float64, widened from the float32 result).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .dtypes import OUTPUT_DTYPES, dtype_name
from .spec import BLOCK_SIZE, Q8_BLOCK_SIZE

__all__ = [
    "ABSENT",
    "INPUT_DTYPES",
    "MatmulInput",
    "MatmulOperands",
    "activation_input",
    "array_dtype_name",
    "check_q8_k",
    "check_weight_kind",
    "decode_dtype",
    "expert_ids_input",
    "input_scale_value",
    "matmul_input",
    "matmul_operands",
    "output_dtype",
]

#: Dtypes a verb accepts for x: the output dtypes, and float64 as numpy only.
INPUT_DTYPES = (*OUTPUT_DTYPES, "float64")
_INTEGER_DTYPES = frozenset(
    ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
)

Convert = Callable[[npt.NDArray[Any]], Any]


#: dtype object -> plain name, filled as dtypes are met (a numpy dtype's ``str`` runs Python
#: code in numpy, a cost every verb call paid at decode).
_DTYPE_NAMES: dict[Any, str] = {}


def array_dtype_name(a: Any) -> str:
    """The dtype of a numpy, torch or MLX array by its plain name (``"bfloat16"``)."""
    dt = a.dtype
    try:
        return _DTYPE_NAMES[dt]
    except KeyError:
        name = _DTYPE_NAMES[dt] = str(dt).rsplit(".", 1)[-1]
        return name
    except TypeError:  # an unhashable dtype object
        return str(dt).rsplit(".", 1)[-1]


def _shape(a: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in a.shape)


def _as_array(a: Any) -> Any:
    """A native array as is; anything else (lists, scalars) as numpy."""
    return a if hasattr(a, "shape") and hasattr(a, "dtype") else np.asarray(a)


def _contiguous(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a)
    contiguous = getattr(a, "contiguous", None)  # torch; MLX arrays are always row-major
    return contiguous() if callable(contiguous) else a


def _dtype_error(what: str, name: str) -> ValueError:
    return ValueError(
        f"{what}: expected a float32, float16, bfloat16 or float64 array, found dtype {name}"
    )


def _float_input(x: Any, what: str, convert: Convert | None) -> tuple[Any, str]:
    """``x`` (numpy or native) checked for dtype; numpy float64 rounded to float32; numpy
    converted with ``convert``. Returns the array and the caller's dtype name."""
    a = _as_array(x)
    name = array_dtype_name(a)
    if isinstance(a, np.ndarray):
        if name not in INPUT_DTYPES:
            raise _dtype_error(what, name)
        if name == "float64":
            a = a.astype(np.float32)
        return a, name
    if name not in OUTPUT_DTYPES:
        raise _dtype_error(what, f"{name} (float64 is accepted as a numpy array only)")
    return a, name


@dataclass(frozen=True)
class MatmulInput:
    """A checked matmul input: ``x`` as 2-D ``[M, K]`` (contiguous, native when a converter
    was given), the caller's leading axes and dtype name."""

    x: Any
    lead: tuple[int, ...]
    dtype: str

    @property
    def rows(self) -> int:
        return int(self.x.shape[0])


def matmul_input(
    x: Any, k: int, what: str, convert: Convert | None = None, *, rows: bool = False
) -> MatmulInput:
    """``x [..., K]`` as ``[M, K]``, or a ``ValueError`` naming ``what``, the expected K and
    the found shape. ``rows``: x must already be ``[M, K]`` (the MoE verbs: one expert id
    per row)."""
    a, name = _float_input(x, what, convert)
    shape = _shape(a)
    if len(shape) < 1 or shape[-1] != k:
        raise ValueError(f"{what}: x must be [..., K] with K = {k}, found shape {shape}")
    if rows and len(shape) != 2:
        raise ValueError(f"{what}: x must be [M, K], found shape {shape}")
    lead = shape[:-1]
    a = _contiguous(a.reshape(math.prod(lead), k))
    if convert is not None and isinstance(a, np.ndarray):
        a = convert(a)
    return MatmulInput(a, lead, name)


def decode_dtype(dtype: Any) -> str:
    """An output dtype of spec 1.0 by name, or the one ``ValueError`` for anything else."""
    name = dtype_name(dtype)
    if name not in OUTPUT_DTYPES:
        raise ValueError(f"output dtype: expected one of {sorted(OUTPUT_DTYPES)}, found {dtype!r}")
    return name


def output_dtype(in_dtype: str, out_dtype: Any) -> tuple[str, bool]:
    """The kernel's output dtype name for ``out_dtype`` (``None``: the input's), and whether
    core widens the float32 result to float64 afterwards (float64 asked, numpy only)."""
    name = in_dtype if out_dtype is None else dtype_name(out_dtype)
    if name == "float64":
        return "float32", True
    return decode_dtype(name if out_dtype is None else out_dtype), False


def check_weight_kind(op: str, name: str, shape: tuple[int, ...], *, experts: bool) -> None:
    """``qmm``-like verbs take 2-D weights, ``gather_qmm`` an expert stack ``[E, N, K]``."""
    stacked = len(shape) == 3
    if experts and not stacked:
        raise ValueError(f"{op}({name!r}): weights must be [E, N, K], found {shape}")
    if not experts and stacked:
        if op == "qmm":
            raise ValueError(f"qmm({name!r}): expert-stacked weights go through gather_qmm")
        raise ValueError(f"{op}({name!r}): expert-stacked weights are not supported here")


def check_q8_k(k: int, what: str) -> None:
    """W4A8 int8 activations come in blocks of 32 along K: K must be a multiple of 32."""
    if k % Q8_BLOCK_SIZE:
        raise ValueError(
            f"{what}: K must be a multiple of {Q8_BLOCK_SIZE} for W4A8 (int8 activation "
            f"blocks of {Q8_BLOCK_SIZE}), found {k}"
        )


def expert_ids_input(
    expert_ids: Any,
    m: int,
    what: str,
    *,
    sorted_indices: bool = False,
    convert: Convert | None = None,
) -> Any:
    """One integer expert id per row of ``x`` (``[M]``). Ids outside ``[0, E)`` are allowed
    (they select an exactly zero row). Numpy ids are checked against a ``sorted_indices``
    hint (a false hint is refused, so a kernel that trusts it is never handed a lie) and
    passed as int64, with uint64 ids beyond int64 mapped to -1 (out of range, whatever they
    would wrap to); native ids are passed as they are."""
    ids = _as_array(expert_ids)
    name = array_dtype_name(ids)
    shape = _shape(ids)
    if shape != (m,) or name not in _INTEGER_DTYPES:
        raise ValueError(
            f"{what}: expert_ids must be integer [M] with M = {m}, found {name} {shape}"
        )
    if not isinstance(ids, np.ndarray):
        return ids
    if sorted_indices and ids.size and np.any(np.diff(ids.astype(np.int64)) < 0):
        raise ValueError(f"{what}: sorted_indices=True but expert_ids are not sorted")
    if ids.dtype == np.uint64:
        ids = np.where(ids > np.iinfo(np.int64).max, -1, ids.astype(np.int64, copy=False))
    ids64 = np.ascontiguousarray(ids, dtype=np.int64)
    return convert(ids64) if convert is not None else ids64


def activation_input(x: Any, what: str, convert: Convert | None = None) -> Any:
    """Activations for the encoder: 2-D ``[M, K]``, ``M >= 1``, K a positive multiple of 16."""
    a, _ = _float_input(x, what, convert)
    shape = _shape(a)
    if len(shape) != 2:
        raise ValueError(f"{what}: x must be [M, K], found shape {shape}")
    m, k = shape
    if k == 0 or k % BLOCK_SIZE:
        raise ValueError(f"{what}: K must be a positive multiple of 16, found {k}")
    if m == 0:
        raise ValueError(f"{what}: expected at least one row, found shape {shape}")
    a = _contiguous(a)
    if convert is not None and isinstance(a, np.ndarray):
        a = convert(a)
    return a


def input_scale_value(input_scale: Any, what: str) -> float | None:
    """A static activation global (a decode multiplier): ``None``, or finite and > 0."""
    if input_scale is None:
        return None
    if hasattr(input_scale, "detach"):  # a torch scalar on any device
        input_scale = input_scale.detach().cpu().numpy()
    g = np.asarray(input_scale, dtype=np.float32)
    if g.size != 1 or not (np.isfinite(g.reshape(())) and g.reshape(()) > 0):
        raise ValueError(f"{what}: input_scale must be finite and > 0, found {g!r}")
    return float(g.reshape(()))


#: Marks an argument a verb does not take (``None`` is a value: a dynamic input scale).
ABSENT: Any = object()


@dataclass(frozen=True)
class MatmulOperands:
    """A matmul verb's checked operands: ``x`` (see :class:`MatmulInput`), the expert ids
    (``ABSENT`` where the verb takes none) and the static input scale (``ABSENT`` where the
    verb takes none; ``None`` for a dynamic one)."""

    x: MatmulInput
    expert_ids: Any
    input_scale: Any


def matmul_operands(
    verb: str,
    name: str,
    shape: tuple[int, ...],
    x: Any,
    *,
    expert_ids: Any = ABSENT,
    sorted_indices: bool = False,
    input_scale: Any = ABSENT,
    q8: bool = False,
    convert: Convert | None = None,
) -> MatmulOperands:
    """Every check of a matmul verb, in order: the weight's kind (an expert stack when the
    verb takes ``expert_ids``), K % 32 for the int8 W4A8 verbs, x as ``[M, K]``, the ids, the
    static input scale. Shared by core's verbs and the reference's public functions."""
    what = f"{verb}({name!r})"
    experts = expert_ids is not ABSENT
    check_weight_kind(verb, name, shape, experts=experts)
    if q8:
        check_q8_k(shape[-1], what)
    xin = matmul_input(x, shape[-1], what, convert, rows=experts)
    ids = (
        expert_ids_input(expert_ids, xin.rows, what, sorted_indices=sorted_indices, convert=convert)
        if experts
        else ABSENT
    )
    scale = input_scale if input_scale is ABSENT else input_scale_value(input_scale, what)
    return MatmulOperands(xin, ids, scale)
