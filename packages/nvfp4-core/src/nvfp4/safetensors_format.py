"""The safetensors format, parsed with every check a hostile file calls for: the one
safetensors parser of the repository (nvfp4-core reads the golden fixtures with it,
nvfp4-checkpoints every checkpoint), on numpy and ml_dtypes alone.

The format (https://huggingface.co/docs/safetensors): 8 bytes little-endian header length
``n``, ``n`` bytes of UTF-8 JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {str: str}}``, then the data buffer; offsets are relative to the buffer,
which every tensor covers exactly (no holes, no overlaps, nothing after the last tensor).

:func:`parse_header` reads the header only (no tensor data) and refuses a header that lies
(length beyond the file, offsets out of range, overlapping or leaving holes, a byte size
that disagrees with dtype and shape, an unknown dtype, a shape beyond
:data:`~nvfp4.file_checks.MAX_RANK` or the file's size) or one beyond the limits of its cost
(:data:`MAX_HEADER_BYTES`, :data:`MAX_HEADER_TENSORS`, :data:`MAX_HEADER_SEPARATORS`,
counted before parsing, with the JSON limits of :mod:`nvfp4.file_checks`;
:data:`MAX_METADATA_CHARS`), with one line naming the file and the tensor. :func:`load`
reads every tensor of a file held in memory. The caller names the dtypes it accepts and the
error class it raises.

Dtypes map to numpy as the safetensors library's numpy/torch front ends do, with
``F8_E4M3`` -> ``ml_dtypes.float8_e4m3fn``, ``F8_E5M2`` -> ``ml_dtypes.float8_e5m2``,
``F8_E8M0`` -> ``ml_dtypes.float8_e8m0fnu`` and ``BF16`` -> ``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, Final

import ml_dtypes
import numpy as np
import numpy.typing as npt

from .file_checks import FileCheckError, check_shape, parse_json, refusal, short

__all__ = [
    "DTYPES",
    "MAX_HEADER_BYTES",
    "MAX_HEADER_SEPARATORS",
    "MAX_HEADER_TENSORS",
    "MAX_METADATA_CHARS",
    "Refusals",
    "TensorInfo",
    "load",
    "parse_header",
]

#: safetensors dtype string -> numpy dtype (all little-endian).
DTYPES: Final[Mapping[str, np.dtype[Any]]] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}

#: The longest header read: 256 bytes for each of :data:`MAX_HEADER_TENSORS` entries (a
#: real entry takes 100 to 150; the safetensors library's limit is 100 MB).
MAX_HEADER_BYTES: Final = 1 << 25
#: The most tensors one file may list: four times a shard of the largest MoE checkpoints
#: (tens of thousands of per-expert tensors), and more than any single-file model.
MAX_HEADER_TENSORS: Final = 1 << 17
#: The most ``,`` and ``:`` in a header: 16 per tensor (an entry of rank 8 needs 15).
MAX_HEADER_SEPARATORS: Final = 16 * MAX_HEADER_TENSORS
#: The longest ``__metadata__`` key or value (in characters).
MAX_METADATA_CHARS: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One header entry: ``start``/``end`` are absolute byte positions in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        return DTYPES[self.dtype]


class Refusals:
    """The refusals of one file: ``where`` (``safetensors file PATH``) opens each line,
    followed by ``, tensor NAME`` where one is concerned; a call returns the ``error`` for
    the caller to raise."""

    def __init__(self, where: str, error: type[ValueError]) -> None:
        self.where = where
        self.error = error

    def __call__(self, what: str, tensor: str | None = None) -> ValueError:
        place = self.where + (f", tensor {short(tensor)}" if tensor is not None else "")
        return refusal(place, what, self.error)


def parse_header(
    f: BinaryIO,
    size: int,
    where: str,
    *,
    dtypes: Mapping[str, np.dtype[Any]] = DTYPES,
    error: type[ValueError] = FileCheckError,
) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and validate the header of the safetensors file ``f`` (``size`` bytes; read
    from its start) without reading its data.

    Returns ``(tensors, metadata)``: the entries in file order (by offset) and the
    ``__metadata__`` map. Raises ``error`` (one line opening with ``where``, naming the
    tensor) for a truncated file, a header length beyond the file or
    :data:`MAX_HEADER_BYTES`, JSON that is invalid or beyond its limits, a dtype not in
    ``dtypes``, a shape that is not a list of at most ``MAX_RANK`` integers in
    ``[0, size]``, offsets out of range, overlapping or leaving holes, a byte size that
    disagrees with dtype and shape, or bytes after the last tensor.
    """
    fail = Refusals(where, error)
    f.seek(0)
    head = f.read(8)
    if len(head) < 8:
        raise fail(f"truncated: {size} bytes, too short for the 8-byte header length")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8:
        raise fail(f"header length {n} runs beyond the file ({size} bytes)")
    if n > MAX_HEADER_BYTES:
        raise fail(f"header length {n} exceeds {MAX_HEADER_BYTES} bytes")
    header = parse_json(  # tensors (and __metadata__) and values counted before parsing
        f.read(n),
        f"{where}: header",
        max_keys=MAX_HEADER_TENSORS + 1,
        max_separators=MAX_HEADER_SEPARATORS,
        error=error,
    )
    if not isinstance(header, dict):
        raise fail(f"header is a JSON {type(header).__name__}, expected an object")
    metadata = _metadata(fail, header.pop("__metadata__", {}))
    data_start = 8 + n
    data_size = size - data_start
    entries = [
        _parse_entry(fail, dtypes, name, entry, data_start, size) for name, entry in header.items()
    ]
    entries.sort(key=lambda t: (t.start, t.end))
    cursor = data_start
    for t in entries:
        if t.start != cursor:
            what = "overlaps the previous tensor" if t.start < cursor else "leaves a hole"
            raise fail(
                f"data_offsets [{t.start - data_start}, {t.end - data_start}] {what} "
                f"(expected to start at {cursor - data_start})",
                t.name,
            )
        if t.end > size:
            raise fail(
                f"data ends at byte {t.end - data_start} of the buffer but the file holds "
                f"only {data_size} data bytes (truncated?)",
                t.name,
            )
        cursor = t.end
    if cursor != size:
        raise fail(f"{size - cursor} bytes after the last tensor's data")
    return {t.name: t for t in entries}, metadata


def _metadata(fail: Refusals, meta: Any) -> dict[str, str]:
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise fail("__metadata__ must map strings to strings")
    for key, value in meta.items():
        longest = max(len(key), len(value))
        if longest > MAX_METADATA_CHARS:
            raise fail(
                f"__metadata__ {short(key)}: expected at most {MAX_METADATA_CHARS} characters "
                f"per key and value, found {longest}",
            )
    return dict(meta)


def _parse_entry(
    fail: Refusals,
    dtypes: Mapping[str, np.dtype[Any]],
    name: str,
    entry: Any,
    data_start: int,
    size: int,
) -> TensorInfo:
    if not isinstance(entry, dict):
        raise fail(f"header entry is a {type(entry).__name__}, expected an object", name)
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or dtype not in dtypes:
        raise fail(f"dtype {short(dtype)} is not one of {', '.join(dtypes)}", name)
    shape = check_shape(entry.get("shape"), size, fail.where, f"tensor {short(name)}", fail.error)
    offsets = entry.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise fail(f"data_offsets {short(offsets)} are not [begin, end] with begin <= end", name)
    expected = math.prod(shape) * dtypes[dtype].itemsize
    found = offsets[1] - offsets[0]
    if expected != found:
        raise fail(
            f"{dtype} {list(shape)} needs {expected} bytes but data_offsets {offsets} span {found}",
            name,
        )
    return TensorInfo(name, dtype, shape, data_start + offsets[0], data_start + offsets[1])


def load(
    data: bytes,
    where: str,
    *,
    dtypes: Mapping[str, np.dtype[Any]] = DTYPES,
    error: type[ValueError] = FileCheckError,
) -> dict[str, npt.NDArray[Any]]:
    """Every tensor of the safetensors file ``data`` (held in memory) as a fresh, writable
    array, by name in file order; refusals as :func:`parse_header`'s."""
    tensors, _ = parse_header(io.BytesIO(data), len(data), where, dtypes=dtypes, error=error)
    out: dict[str, npt.NDArray[Any]] = {}
    for name, t in tensors.items():
        dtype = t.numpy_dtype
        if t.nbytes == 0:  # (frombuffer refuses an offset at the very end of the data)
            out[name] = np.zeros(t.shape, dtype)
            continue
        flat = np.frombuffer(data, dtype=dtype, count=t.nbytes // dtype.itemsize, offset=t.start)
        out[name] = flat.reshape(t.shape).copy()
    return out
