"""nvfp4.safetensors_format, the one safetensors parser: files the safetensors library
writes (the oracle) read back bit for bit for every dtype, header entries at the library's
offsets, and refusals raised as the caller's error class, on one line opening with the
caller's ``where``. (Each hostile header is refused in nvfp4-core's fixture reader tests and
nvfp4-checkpoints' hostile tests, through this parser.)"""

from __future__ import annotations

import io
import json
import struct

import ml_dtypes
import numpy as np
import pytest
from nvfp4.file_checks import MAX_MESSAGE, FileCheckError
from nvfp4.safetensors_format import DTYPES, MAX_HEADER_BYTES, load, parse_header

st_numpy = pytest.importorskip("safetensors.numpy")

#: The dtypes safetensors' numpy front end writes.
NUMPY_DTYPES = ["BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64"]


class _MyError(ValueError):
    pass


def _arrays(names: list[str]) -> dict[str, np.ndarray]:
    """A [3, 5] array of random bits for each dtype (booleans: random 0/1)."""
    rng = np.random.default_rng(11)
    out = {}
    for name in names:
        dt = DTYPES[name]
        bits = rng.integers(0, 256, size=15 * dt.itemsize, dtype=np.uint8)
        out[f"t.{name}"] = (bits % 2 == 1) if name == "BOOL" else bits.view(dt).reshape(3, 5)
    out["t.BOOL"] = out["t.BOOL"].reshape(3, 5)
    return out


def test_reads_every_numpy_dtype_as_the_library_writes_it() -> None:
    arrays = _arrays(NUMPY_DTYPES)
    blob = st_numpy.save(arrays, metadata={"format": "np"})
    got = load(blob, "lib.safetensors")
    assert sorted(got) == sorted(arrays)
    for key, want in arrays.items():
        assert got[key].dtype == want.dtype, key
        assert got[key].tobytes() == want.tobytes(), key
        assert got[key].flags.writeable, key


@pytest.mark.parametrize(
    ("name", "torch_dtype"),
    [("BF16", "bfloat16"), ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")],
)
def test_reads_the_ml_dtypes_as_the_torch_front_end_writes_them(
    name: str, torch_dtype: str
) -> None:
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    raw = np.random.default_rng(5).integers(
        0, 256, size=(4, 6 * DTYPES[name].itemsize), dtype=np.uint8
    )
    tensor = torch.from_numpy(raw).view(getattr(torch, torch_dtype))
    blob = st_torch.save({"w": tensor})
    got = load(blob, "torch.safetensors")["w"]
    assert got.dtype == DTYPES[name]
    assert got.shape == tuple(tensor.shape)
    assert got.view(np.uint8).tobytes() == raw.tobytes()
    assert DTYPES["BF16"] == np.dtype(ml_dtypes.bfloat16)


def test_header_entries_are_at_the_library_offsets_in_file_order() -> None:
    arrays = {"b": np.arange(3, dtype=np.int16), "a": np.ones((2, 2), np.float32)}
    blob = st_numpy.save(arrays, metadata={"k": "v"})
    tensors, metadata = parse_header(io.BytesIO(blob), len(blob), "f")
    (n,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8 : 8 + n])
    assert metadata == {"k": "v"}
    assert list(tensors) == sorted(tensors, key=lambda k: tensors[k].start)
    for key, info in tensors.items():
        begin, end = header[key]["data_offsets"]
        assert (info.start, info.end) == (8 + n + begin, 8 + n + end)
        assert info.shape == tuple(header[key]["shape"])
        assert blob[info.start : info.end] == arrays[key].tobytes()


@pytest.mark.parametrize(
    ("blob", "fragment"),
    [
        (b"\x00" * 4, "too short for the 8-byte header length"),
        (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b" " * (MAX_HEADER_BYTES + 1),
         f"exceeds {MAX_HEADER_BYTES} bytes"),
        (struct.pack("<Q", 2) + b"[]", "header is a JSON list"),
    ],
    ids=["truncated", "header-too-long", "not-an-object"],
)  # fmt: skip
def test_refusals_are_the_callers_error_on_one_line(blob: bytes, fragment: str) -> None:
    with pytest.raises(_MyError) as info:
        load(blob, "where/it.safetensors", error=_MyError)
    message = str(info.value)
    assert message.startswith("where/it.safetensors: "), message
    assert fragment in message, message
    assert "\n" not in message
    assert len(message) <= MAX_MESSAGE


def test_the_default_error_and_the_accepted_dtypes_are_the_callers() -> None:
    blob = st_numpy.save({"x": np.zeros(2, np.float64)})
    with pytest.raises(FileCheckError, match=r"f, tensor 'x': dtype 'F64' is not one of U8$"):
        load(blob, "f", dtypes={"U8": DTYPES["U8"]})
