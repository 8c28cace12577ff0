"""Reading a GGUF file: its key-value metadata and tensor infos, parsed once and checked,
values decoded only when asked for, tensor data as memory-mapped numpy views.

Why not gguf-py's ``GGUFReader``: it builds several numpy views for every part of every
field, so opening a file with a 49k-token vocabulary (three arrays of 49k strings) takes
seconds before anything is read (2.6 s for SmolLM2-135M here, most of ``nvfp4 inspect``).
This parser walks the header with :mod:`struct` over a memory map and keeps each field as
its type and offset; a value is decoded when :meth:`GGUFField.value` is called. gguf-py
stays the oracle: the tests compare both readers field by field and tensor by tensor.

The format (GGUF versions 2 and 3, little-endian; all counts and lengths are uint64)::

    "GGUF"  uint32 version  uint64 n_tensors  uint64 n_kv
    n_kv x      string key, uint32 value type, value
                    (an array: uint32 element type, uint64 count, the elements)
    n_tensors x string name, uint32 n_dims, uint64 ne[n_dims] (innermost first),
                    uint32 ggml type, uint64 offset (relative to the data section)
    padding to ``general.alignment`` (default 32), then the data section

where a string is a uint64 byte length and UTF-8 bytes. Everything malformed - a bad magic,
an unsupported version or byte order, a count or length that runs past the end of the
file, an unknown value or tensor type, tensor data outside the file - is a
:class:`~nvfp4_checkpoints.CheckpointError` naming the file, what was expected and what was
found.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..flavours import CheckpointError, import_gguf
from ..folder import one_line, short

__all__ = [
    "GGML_BF16",
    "PLAIN_TYPES",
    "GGUFField",
    "GGUFFile",
    "GGUFTensorInfo",
    "ValueType",
    "ggml_type_name",
]

_MAGIC: Final = b"GGUF"
_VERSIONS: Final = (2, 3)
_DEFAULT_ALIGNMENT: Final = 32


class ValueType:
    """GGUF metadata value types (the numbers of the format)."""

    UINT8: Final = 0
    INT8: Final = 1
    UINT16: Final = 2
    INT16: Final = 3
    UINT32: Final = 4
    INT32: Final = 5
    FLOAT32: Final = 6
    BOOL: Final = 7
    STRING: Final = 8
    ARRAY: Final = 9
    UINT64: Final = 10
    INT64: Final = 11
    FLOAT64: Final = 12


# Fixed-size value types: struct format (little-endian) of one value.
_SCALAR_FORMATS: Final[dict[int, str]] = {
    ValueType.UINT8: "<B",
    ValueType.INT8: "<b",
    ValueType.UINT16: "<H",
    ValueType.INT16: "<h",
    ValueType.UINT32: "<I",
    ValueType.INT32: "<i",
    ValueType.FLOAT32: "<f",
    ValueType.BOOL: "<?",
    ValueType.UINT64: "<Q",
    ValueType.INT64: "<q",
    ValueType.FLOAT64: "<d",
}

#: The plain (not block-quantized) ggml tensor types: type number -> (its name, which is
#: also the safetensors dtype name, and the numpy dtype this reader presents it as; BF16 as
#: uint16 bits, numpy having no bfloat16). Every other type - quantized blocks, NVFP4 (40)
#: among them - is presented as uint8 rows of its blocks' bytes. The GGUF writer holds
#: exactly these besides NVFP4.
PLAIN_TYPES: Final[dict[int, tuple[str, str]]] = {
    0: ("F32", "<f4"),
    1: ("F16", "<f2"),
    24: ("I8", "<i1"),
    25: ("I16", "<i2"),
    26: ("I32", "<i4"),
    27: ("I64", "<i8"),
    28: ("F64", "<f8"),
    30: ("BF16", "<u2"),
}
#: ggml's BF16 type (presented as uint16 bits).
GGML_BF16: Final = 30


def ggml_type_name(ggml_type: int) -> str:
    """gguf-py's name of a ggml type number (``"Q4_K"``), or the number when unknown."""
    gguf = import_gguf()
    try:
        return str(gguf.GGMLQuantizationType(ggml_type).name)
    except ValueError:
        return f"type {ggml_type}"


@dataclass(frozen=True)
class GGUFField:
    """One metadata key: its value type, for an array the element type and count, and
    where its value starts in the file."""

    name: str
    type: int
    sub_type: int | None  # arrays: the element type
    count: int  # arrays: the number of elements; otherwise 1
    offset: int  # file offset of the value (an array's first element)
    file: GGUFFile

    def value(self) -> Any:
        """The value as Python data: numbers, ``bool``, ``str`` (UTF-8), or a list of them."""
        return self.file._decode(self, raw=False)

    def raw(self) -> Any:
        """As :meth:`value`, but strings as their ``bytes`` (for copying a field as it is)."""
        return self.file._decode(self, raw=True)


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor: name, shape (numpy order: outermost first), ggml type, absolute file
    offset of its data and its size in bytes."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int


class GGUFFile:
    """A GGUF file opened for reading (memory-mapped; :meth:`close` releases it).

    :attr:`fields` maps each key to its :class:`GGUFField`, :attr:`tensors` each tensor
    name to its :class:`GGUFTensorInfo`, both in file order.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 24:
                    raise self._error("a GGUF header (24 bytes at least)", f"{size} bytes")
                self._map: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot read ({e.strerror or e})") from None
        self.size = size
        self.fields: dict[str, GGUFField] = {}
        self.tensors: dict[str, GGUFTensorInfo] = {}
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- public
    def value(self, key: str, default: Any = None) -> Any:
        """The decoded value of ``key``, or ``default`` when the file has no such key."""
        f = self.fields.get(key)
        return default if f is None else f.value()

    def array(self, t: GGUFTensorInfo) -> npt.NDArray[Any]:
        """The data of tensor ``t`` as a read-only view of the file: its numpy dtype and shape
        for plain types, uint8 ``[..., row bytes]`` for block types (NVFP4 among them)."""
        assert self._map is not None, "GGUF file is closed"
        if t.ggml_type in PLAIN_TYPES:
            dtype = np.dtype(PLAIN_TYPES[t.ggml_type][1])
            shape = t.shape
        else:
            dtype = np.dtype(np.uint8)
            rows = t.shape[:-1]
            shape = (*rows, t.nbytes // max(1, int(np.prod(rows, dtype=np.int64))))
        return np.ndarray(shape, dtype=dtype, buffer=self._map, offset=t.offset)

    def close(self) -> None:
        """Release the memory map (arrays handed out keep it alive until they are gone)."""
        self._map = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- parsing
    def _error(self, expected: str, found: str) -> CheckpointError:
        return CheckpointError(
            one_line(f"{self.path}: not a readable GGUF file: expected {expected}, found {found}")
        )

    def _unpack(self, fmt: str, pos: int, what: str) -> tuple[Any, int]:
        n = struct.calcsize(fmt)
        if pos + n > self.size:
            raise self._error(f"{what} at byte {pos}", f"the end of the file ({self.size} bytes)")
        assert self._map is not None
        return struct.unpack_from(fmt, self._map, pos)[0], pos + n

    def _string(self, pos: int, what: str) -> tuple[bytes, int]:
        n, pos = self._unpack("<Q", pos, f"the length of {what}")
        if n > self.size - pos:
            raise self._error(f"{what} of {n} bytes at byte {pos}", f"a file of {self.size} bytes")
        assert self._map is not None
        return self._map[pos : pos + n], pos + n

    def _skip_string(self, pos: int, what: str) -> int:
        n, pos = self._unpack("<Q", pos, f"the length of {what}")
        if n > self.size - pos:
            raise self._error(f"{what} of {n} bytes at byte {pos}", f"a file of {self.size} bytes")
        return int(pos + n)

    def _text(self, b: bytes, what: str) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise self._error(f"UTF-8 for {what}", repr(b[:40])) from None

    def _skip_value(self, vtype: int, pos: int, what: str) -> int:
        """The position after one value of ``vtype`` (not an array) at ``pos``."""
        if vtype == ValueType.STRING:
            return self._skip_string(pos, what)
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is None:
            raise self._error(f"a GGUF value type (0..12) for {what}", str(vtype))
        end = pos + struct.calcsize(fmt)
        if end > self.size:
            raise self._error(f"{what} at byte {pos}", f"the end of the file ({self.size} bytes)")
        return end

    def _parse(self) -> None:
        assert self._map is not None
        magic = bytes(self._map[:4])
        if magic != _MAGIC:
            raise self._error("the magic b'GGUF'", repr(magic))
        version, pos = self._unpack("<I", 4, "the version")
        if version not in _VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in _VERSIONS:
                raise self._error("a little-endian GGUF file", "a big-endian one")
            raise self._error(f"GGUF version {' or '.join(map(str, _VERSIONS))}", str(version))
        n_tensors, pos = self._unpack("<Q", pos, "the tensor count")
        n_kv, pos = self._unpack("<Q", pos, "the key count")
        # Every key and tensor info takes at least 8 bytes: a larger count is a lie.
        for count, what in ((n_kv, "keys"), (n_tensors, "tensors")):
            if count > self.size // 8:
                raise self._error(f"a count of {what} that fits the file", str(count))

        for i in range(n_kv):
            raw_key, pos = self._string(pos, f"key {i}")
            key = self._text(raw_key, f"key {i}")
            vtype, pos = self._unpack("<I", pos, f"the type of {key!r}")
            if vtype == ValueType.ARRAY:
                sub, pos = self._unpack("<I", pos, f"the element type of {key!r}")
                count, pos = self._unpack("<Q", pos, f"the length of {key!r}")
                start = pos
                if sub in _SCALAR_FORMATS:
                    pos += count * struct.calcsize(_SCALAR_FORMATS[sub])
                    if pos > self.size:
                        raise self._error(
                            f"{count} elements of {key!r}", f"a file of {self.size} bytes"
                        )
                elif sub == ValueType.STRING:
                    for j in range(count):
                        pos = self._skip_string(pos, f"element {j} of {key!r}")
                else:  # nested arrays: no known writer produces them
                    raise self._error(f"an array of numbers or strings for {key!r}", f"type {sub}")
                field = GGUFField(key, vtype, sub, count, start, self)
            else:
                start = pos
                pos = self._skip_value(vtype, pos, repr(key))
                field = GGUFField(key, vtype, None, 1, start, self)
            if key in self.fields:
                raise self._error(f"each key once ({key!r})", "it twice")
            self.fields[key] = field

        alignment = self.value("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment % 8:
            raise self._error("general.alignment a positive multiple of 8", repr(alignment))
        infos: list[tuple[str, tuple[int, ...], int, int]] = []
        for i in range(n_tensors):
            raw_name, pos = self._string(pos, f"the name of tensor {i}")
            name = self._text(raw_name, f"tensor {i}")
            n_dims, pos = self._unpack("<I", pos, f"the rank of {name!r}")
            if n_dims > 8:
                raise self._error(f"a rank of at most 8 for {name!r}", str(n_dims))
            ne = []
            for _ in range(n_dims):
                d, pos = self._unpack("<Q", pos, f"the shape of {name!r}")
                if d > self.size:
                    raise self._error(
                        f"dimensions of {short(name)} no larger than the file", str(d)
                    )
                ne.append(d)
            ggml_type, pos = self._unpack("<I", pos, f"the type of {name!r}")
            rel, pos = self._unpack("<Q", pos, f"the data offset of {name!r}")
            infos.append((name, tuple(reversed(ne)), ggml_type, rel))
        data_start = pos + (-pos % alignment)

        for name, shape, ggml_type, rel in infos:
            if rel % alignment:  # the spec, gguf-py's writer and llama.cpp's loader agree
                raise self._error(
                    f"the data offset of {short(name)} a multiple of general.alignment "
                    f"({alignment})",
                    str(rel),
                )
            nbytes = self._nbytes(name, shape, ggml_type)
            offset = data_start + rel
            if offset + nbytes > self.size:
                raise self._error(
                    f"the {nbytes} bytes of {short(name)} at byte {offset}",
                    f"a file of {self.size} bytes (truncated?)",
                )
            if name in self.tensors:
                raise self._error(f"each tensor name once ({short(name)})", "it twice")
            self.tensors[name] = GGUFTensorInfo(name, shape, ggml_type, offset, nbytes)
        end, previous = data_start, ""
        for t in sorted(self.tensors.values(), key=lambda t: (t.offset, t.nbytes)):
            if t.nbytes and t.offset < end:
                raise self._error(
                    f"the data of {short(t.name)} after that of {short(previous)}",
                    f"an overlap at byte {t.offset}",
                )
            if t.nbytes:
                end, previous = t.offset + t.nbytes, t.name

    def _nbytes(self, name: str, shape: tuple[int, ...], ggml_type: int) -> int:
        elements = 1
        for d in shape:
            elements *= d
        if ggml_type in PLAIN_TYPES:
            return elements * np.dtype(PLAIN_TYPES[ggml_type][1]).itemsize
        # Block types: sizes from gguf-py's table (the one list of every ggml type).
        gguf = import_gguf()
        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise self._error(f"a known ggml type for {name!r}", str(ggml_type)) from None
        if not shape or shape[-1] % block:
            raise self._error(f"a row length of {name!r} that is a multiple of {block}", str(shape))
        return int(elements // block * type_size)

    # ----------------------------------------------------------------- values
    def _decode(self, f: GGUFField, *, raw: bool) -> Any:
        assert self._map is not None, "GGUF file is closed"
        if f.type == ValueType.ARRAY:
            assert f.sub_type is not None
            if f.sub_type == ValueType.STRING:
                out: list[Any] = []
                pos = f.offset
                for _ in range(f.count):
                    b, pos = self._string(pos, f"an element of {f.name!r}")
                    out.append(b if raw else self._text(b, f.name))
                return out
            fmt = _SCALAR_FORMATS[f.sub_type]
            values = np.frombuffer(self._map, dtype=np.dtype(fmt), count=f.count, offset=f.offset)
            return values.tolist()
        if f.type == ValueType.STRING:
            b, _ = self._string(f.offset, repr(f.name))
            return b if raw else self._text(b, f.name)
        return struct.unpack_from(_SCALAR_FORMATS[f.type], self._map, f.offset)[0]
