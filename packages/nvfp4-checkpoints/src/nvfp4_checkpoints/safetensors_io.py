"""Safetensors files, read lazily and written as a stream.

The format (https://huggingface.co/docs/safetensors): 8 bytes little-endian header length
``n``, ``n`` bytes of UTF-8 JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {str: str}}``, then the data buffer; offsets are relative to the buffer,
which every tensor covers exactly (no holes, no overlaps, nothing after the last tensor).

* :class:`SafetensorsFile` parses and validates the header only (reading no tensor data),
  and hands out one tensor at a time as a read-only ``numpy.memmap``: a checkpoint of any
  size is read with the memory of the tensor in use. The header is parsed by nvfp4-core's
  :mod:`nvfp4.safetensors_format` (the one safetensors parser, which the golden fixtures
  share): a header that lies (length beyond the file, offsets out of range, overlapping or
  leaving holes, a byte size that disagrees with dtype and shape, an unknown dtype) is
  refused with :class:`SafetensorsError` naming the file and the tensor; so is a header
  beyond the limits of its cost (:data:`MAX_HEADER_BYTES`, :data:`MAX_HEADER_TENSORS`,
  :data:`MAX_HEADER_SEPARATORS`, counted before parsing; :data:`MAX_METADATA_CHARS`).
* :class:`SafetensorsWriter` writes the header first, from the names, dtypes and shapes
  given up front, then takes the tensors one by one in that order, so a file is written
  without holding its tensors together in memory. :func:`save_file` is the one-call form.

Dtypes map to numpy by :data:`DTYPES` (:mod:`nvfp4.safetensors_format`'s table).
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import struct
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO, Final

import numpy as np
import numpy.typing as npt
from nvfp4.safetensors_format import DTYPES as DTYPES
from nvfp4.safetensors_format import MAX_HEADER_BYTES as MAX_HEADER_BYTES
from nvfp4.safetensors_format import MAX_HEADER_SEPARATORS as MAX_HEADER_SEPARATORS
from nvfp4.safetensors_format import MAX_HEADER_TENSORS as MAX_HEADER_TENSORS
from nvfp4.safetensors_format import MAX_METADATA_CHARS as MAX_METADATA_CHARS
from nvfp4.safetensors_format import Refusals, parse_header
from nvfp4.safetensors_format import TensorInfo as TensorInfo

from .closing import Closing
from .folder import CheckpointError

# (and the names of nvfp4.safetensors_format imported "as" themselves above, public here too)
__all__ = [
    "SafetensorsError",
    "SafetensorsFile",
    "SafetensorsWriter",
    "read_header",
    "safetensors_dtype",
    "save_file",
]

_ALIGN: Final = 8


class SafetensorsError(CheckpointError):
    """A malformed or unreadable safetensors file; the message names the file (and the
    tensor where one is concerned)."""


def safetensors_dtype(dtype: npt.DTypeLike) -> str:
    """The safetensors dtype string of a numpy dtype (``float32`` -> ``"F32"``)."""
    dt = np.dtype(dtype)
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    for name, known in DTYPES.items():
        if known == dt:
            return name
    raise SafetensorsError(f"dtype {dt} has no safetensors equivalent")


def read_header(
    path: str | os.PathLike[str], opened: BinaryIO | None = None
) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and validate the header of a safetensors file without reading its data.

    Returns ``(tensors, metadata)``: the entries in file order (by offset) and the
    ``__metadata__`` map. Raises :class:`SafetensorsError` (naming the file and the tensor)
    for a truncated file, a header length beyond the file, invalid JSON, an unknown dtype,
    a negative or non-integer shape, offsets out of range, overlapping or leaving holes,
    a byte size that disagrees with dtype and shape, or bytes after the last tensor
    (:func:`nvfp4.safetensors_format.parse_header`); :class:`FileNotFoundError` when the
    file is missing. ``opened``: the file, already opened (read from where it stands;
    ``path`` names it in messages).
    """
    p = Path(path)
    with contextlib.nullcontext(opened) if opened is not None else open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return parse_header(f, size, f"safetensors file {p}", error=SafetensorsError)


class SafetensorsFile(Closing):
    """A safetensors file opened lazily: the header is parsed (and validated) on open,
    tensors are memory-mapped one at a time by :meth:`get`.

    Usable as a context manager. The arrays returned stay valid after :meth:`close` (each
    holds its own map, released when the array is garbage-collected).
    """

    def __init__(
        self, path: str | os.PathLike[str], opener: Callable[[], BinaryIO] | None = None
    ) -> None:
        """``opener``: how to open the file each time it is read (a checkpoint folder's
        :meth:`~.folder.CheckpointFolder.open_member`, which refuses a file swapped for a
        symlink); by default ``open(path, "rb")``. Every later open must find the file
        whose header was read (same device and inode), or the read is refused."""
        self.path = Path(path)
        self._opener = opener if opener is not None else self._open_path
        with self._opener() as f:
            st = os.fstat(f.fileno())
            self._node = (st.st_dev, st.st_ino)
            self._tensors, self.metadata = read_header(self.path, f)

    def _open_path(self) -> BinaryIO:
        return open(self.path, "rb")

    def names(self) -> list[str]:
        """Tensor names in file order."""
        return list(self._tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def info(self, name: str) -> TensorInfo:
        """The header entry of ``name`` (KeyError naming the file when absent)."""
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"tensor {name!r} not in {self.path}") from None

    def get(self, name: str) -> npt.NDArray[Any]:
        """Tensor ``name`` as a read-only memory-mapped array (a plain empty array for a
        tensor of zero bytes)."""
        t = self.info(name)
        dt = t.numpy_dtype
        if t.nbytes == 0:
            return np.zeros(t.shape, dtype=dt)
        fail = Refusals(f"safetensors file {self.path}", SafetensorsError)
        try:
            with self._opener() as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != self._node:
                    raise fail("replaced since its header was read (another file now)", name)
                arr: npt.NDArray[Any] = np.memmap(
                    f, dtype=dt, mode="r", offset=t.start, shape=t.shape
                )
        except CheckpointError:
            raise
        except (OSError, ValueError) as e:
            raise fail(f"cannot map the tensor's data ({e})", name) from None
        return arr

    def read(
        self, name: str, *, axis: int | None = None, start: int = 0, stop: int | None = None
    ) -> npt.NDArray[Any]:
        """Tensor ``name``, or its range ``[start, stop)`` along ``axis``, read into a fresh
        writable array by positioned reads of those bytes only: nothing is memory-mapped,
        so the process holds the result and nothing else (a rank loading its shard,
        :mod:`.rank_loading`). A range of an axis whose outer indices are contiguous (the
        first axis, or the whole axis) is one read; any other, a range of the last axis of
        ``[R, C]`` for instance, is one slice a row, ``C`` bytes apart, copied out of bounded
        windows of the file (:func:`_read_strided`).

        Raises:
            SafetensorsError: the file was replaced since its header was read, or it ends
                before the tensor's bytes (naming the file and the tensor).
            ValueError: an axis or range outside the tensor's shape (a caller's error).
        """
        t = self.info(name)
        shape = list(t.shape)
        dt = t.numpy_dtype
        if axis is None:
            axis, start, stop = 0, 0, (shape[0] if shape else 1)
            shape = shape or [1]
        else:
            if not -len(shape) <= axis < len(shape):
                raise ValueError(f"{self.path}: tensor {name!r}: no axis {axis} in {t.shape}")
            axis %= len(shape)
        stop = shape[axis] if stop is None else stop
        if not 0 <= start <= stop <= shape[axis]:
            raise ValueError(
                f"{self.path}: tensor {name!r}: range [{start}, {stop}) outside axis {axis} "
                f"of {t.shape}"
            )
        inner = math.prod(shape[axis + 1 :]) * dt.itemsize
        span, piece = shape[axis] * inner, (stop - start) * inner
        outer = math.prod(shape[:axis])
        out = np.empty((*shape[:axis], stop - start, *shape[axis + 1 :]), dtype=dt)
        flat = out.reshape(-1).view(np.uint8).data
        if piece:
            fail = Refusals(f"safetensors file {self.path}", SafetensorsError)
            with self._opener() as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != self._node:
                    raise fail("replaced since its header was read (another file now)", name)
                first = t.start + start * inner
                if piece == span or outer == 1:  # one contiguous range
                    _read_exactly(f, flat, first, fail, name)
                else:
                    rows = out.reshape(-1).view(np.uint8).reshape(outer, piece)
                    _read_strided(f, rows, first, span - piece, fail, name)
        return out.reshape(t.shape) if not t.shape else out


#: The largest single read (Linux moves at most about 2 GiB a call).
_MAX_READ: Final = 1 << 30


#: The bytes of the file one window of a strided read maps at most.
_STRIDED_CHUNK: Final = 8 << 20


def _read_strided(
    f: BinaryIO,
    into: npt.NDArray[np.uint8],
    offset: int,
    gap: int,
    fail: Refusals,
    name: str,
) -> None:
    """Fill ``into`` (``[count, piece]`` bytes) with ``count`` slices of ``piece`` bytes of
    ``f``, the first at byte ``offset`` and each ``gap`` bytes after the previous one's end
    (a rank's columns of every row). The rows are mapped a window of at most
    :data:`_STRIDED_CHUNK` bytes (or one row) at a time and the slices copied out by numpy,
    then the window is unmapped: only the slices' bytes are copied, and the process never
    holds more than one window of the file (a read a row costs a system call each, a
    read of whole rows copies every rank's columns)."""
    count, piece = into.shape
    row = piece + gap
    per_chunk = max(1, _STRIDED_CHUNK // row)
    grain = mmap.ALLOCATIONGRANULARITY
    for first in range(0, count, per_chunk):
        n = min(count, first + per_chunk) - first
        start = offset + first * row
        base = start - start % grain
        size = n * row - gap
        try:
            window = mmap.mmap(
                f.fileno(), start - base + size, access=mmap.ACCESS_READ, offset=base
            )
        except (OSError, ValueError) as e:
            raise fail(f"cannot map the tensor's data ({e})", name) from None
        with window:
            rows = np.frombuffer(window, dtype=np.uint8, count=size, offset=start - base)
            into[first : first + n] = np.lib.stride_tricks.as_strided(
                rows, shape=(n, piece), strides=(row, 1), writeable=False
            )
            del rows  # the window closes only once no array refers to it


def _read_exactly(f: BinaryIO, into: memoryview, offset: int, fail: Refusals, name: str) -> None:
    """Fill ``into`` from byte ``offset`` of ``f`` (positioned reads where the platform
    has them, else seek and read), or refuse a file that ends first."""
    done = 0
    while done < len(into):
        chunk = into[done : done + _MAX_READ]
        if hasattr(os, "preadv"):
            got = os.preadv(f.fileno(), [chunk], offset + done)
        else:  # pragma: no cover - Windows
            f.seek(offset + done)
            got = f.readinto(chunk) or 0  # type: ignore[attr-defined]
        if got <= 0:
            raise fail(f"ends at byte {offset + done}, inside the tensor's data (truncated?)", name)
        done += got


def _header_bytes(
    entries: Sequence[tuple[str, str, tuple[int, ...]]], metadata: Mapping[str, str] | None
) -> tuple[bytes, list[int]]:
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    sizes = []
    for name, dtype, shape in entries:
        if dtype not in DTYPES:
            raise SafetensorsError(f"tensor {name!r}: dtype {dtype!r} is not a safetensors dtype")
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        header[name] = {
            "dtype": dtype,
            "shape": [int(d) for d in shape],
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
        sizes.append(nbytes)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % _ALIGN)  # the library pads so the data starts aligned
    return struct.pack("<Q", len(raw)) + raw, sizes


class SafetensorsWriter(Closing):
    """Write a safetensors file as a stream.

    ``entries`` fixes the names, dtypes (safetensors strings) and shapes up front; the
    header is written on open, and :meth:`write` must then be called once per entry, in
    order, with an array of exactly that dtype and shape. :meth:`close` checks that every
    entry was written. Nothing is kept in memory but the array being written.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        entries: Iterable[tuple[str, str, Sequence[int]]],
        metadata: Mapping[str, str] | None = None,
        *,
        fsync: bool = True,
    ) -> None:
        self.path = Path(path)
        self._entries = [(n, d, tuple(int(x) for x in s)) for n, d, s in entries]
        names = [e[0] for e in self._entries]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SafetensorsError(f"{self.path}: tensor {dup!r} listed twice")
        head, self._sizes = _header_bytes(self._entries, metadata)
        self._fsync = fsync
        self._next = 0
        self._f: IO[bytes] | None = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._f.write(head)

    @property
    def nbytes(self) -> int:
        """Total data bytes of the file."""
        return sum(self._sizes)

    def write(self, name: str, array: npt.ArrayLike) -> int:
        """Write the next entry's data; returns its byte count."""
        if self._f is None:
            raise SafetensorsError(f"{self.path}: writer is closed")
        if self._next >= len(self._entries):
            raise SafetensorsError(f"{self.path}: tensor {name!r} is not in the header")
        ename, edtype, eshape = self._entries[self._next]
        if name != ename:
            raise SafetensorsError(
                f"{self.path}: tensor {name!r} written out of order (expected {ename!r})"
            )
        a = np.asarray(array)
        want = DTYPES[edtype]
        if a.dtype != want:
            if a.dtype.newbyteorder("<") == want:
                a = a.astype(want)
            else:
                raise SafetensorsError(
                    f"{self.path}, tensor {name!r}: dtype {a.dtype}, header says {edtype}"
                )
        if tuple(a.shape) != eshape:
            raise SafetensorsError(
                f"{self.path}, tensor {name!r}: shape {tuple(a.shape)}, header says {eshape}"
            )
        flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        self._f.write(flat.data)
        self._next += 1
        return int(flat.nbytes)

    def close(self) -> None:
        """Finish the file; refuses when entries are still unwritten."""
        if self._f is None:
            return
        if self._next != len(self._entries):
            missing = self._entries[self._next][0]
            self.abort()
            raise SafetensorsError(f"{self.path}: closed before tensor {missing!r} was written")
        self._f.flush()
        if self._fsync:
            os.fsync(self._f.fileno())
        self._f.close()
        self._f = None

    def abort(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def save_file(
    path: str | os.PathLike[str],
    tensors: Mapping[str, npt.ArrayLike],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write ``tensors`` (name -> array) to a safetensors file, in the mapping's order."""
    arrays = {k: np.asarray(v) for k, v in tensors.items()}
    entries = [(k, safetensors_dtype(a.dtype), a.shape) for k, a in arrays.items()]
    with SafetensorsWriter(path, entries, metadata) as w:
        for k, a in arrays.items():
            w.write(k, a)


def __getattr__(name: str) -> Any:
    """``dtype_name``, :func:`safetensors_dtype`'s name until this release (core's
    ``nvfp4.dtypes.dtype_name`` names dtypes as the verbs take them): one release, warns."""
    if name == "dtype_name":
        warnings.warn(
            "nvfp4_checkpoints.safetensors_io.dtype_name is renamed safetensors_dtype; the "
            "alias dtype_name is removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return safetensors_dtype
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
