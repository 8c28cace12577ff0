"""nvfp4_checkpoints.safetensors_io against the safetensors library (the oracle) and malformed files."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from nvfp4_checkpoints.safetensors_io import (
    SafetensorsError,
    SafetensorsFile,
    SafetensorsWriter,
    read_header,
    safetensors_dtype,
    save_file,
)

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
st_numpy = pytest.importorskip("safetensors.numpy")


def _arrays() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    return {
        "w.f32": rng.standard_normal((5, 3)).astype(np.float32),
        "w.f16": rng.standard_normal((4,)).astype(np.float16),
        "w.bf16": rng.standard_normal((2, 8)).astype(ml_dtypes.bfloat16),
        "w.u8": rng.integers(0, 256, (7, 4), dtype=np.uint8),
        "w.e4m3": rng.integers(0, 0x7F, (3, 2), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn),
        "w.i64": np.arange(5, dtype=np.int64),
        "w.u32": rng.integers(0, 2**32, (2, 2), dtype=np.uint32),
        "scalar": np.asarray(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "flag": np.array([True, False]),
    }


def _bytes_of(t: Any) -> bytes:
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t).tobytes()
    return bytes(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())


def test_our_files_load_in_the_safetensors_library(tmp_path: Path) -> None:
    arrays = _arrays()
    path = tmp_path / "ours.safetensors"
    save_file(path, arrays, {"format": "pt", "note": "x"})
    loaded = st_torch.load_file(str(path))
    assert set(loaded) == set(arrays)
    for name, a in arrays.items():
        assert tuple(loaded[name].shape) == a.shape, name
        assert _bytes_of(loaded[name]) == a.tobytes(), name
    assert loaded["w.e4m3"].dtype == torch.float8_e4m3fn
    assert loaded["w.bf16"].dtype == torch.bfloat16
    # safetensors.numpy has no bf16 / f8: check the numpy front end on the other dtypes
    plain = {k: v for k, v in arrays.items() if k not in ("w.bf16", "w.e4m3")}
    only_plain = tmp_path / "plain.safetensors"
    save_file(only_plain, plain)
    for name, a in st_numpy.load_file(str(only_plain)).items():
        np.testing.assert_array_equal(a, plain[name])
        assert a.dtype == plain[name].dtype
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "note": "x"}


def test_library_files_read_identically(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(3)
    tensors = {
        "a": torch.randn(6, 5, generator=g),
        "b": torch.randn(3, 16, generator=g).to(torch.bfloat16),
        "c": torch.randint(0, 255, (4, 8), generator=g, dtype=torch.uint8),
        "d": (torch.rand(4, 2, generator=g) * 100).to(torch.float8_e4m3fn),
        "e": torch.tensor(0.25),
        "f": torch.randn(9, generator=g).half(),
    }
    path = tmp_path / "lib.safetensors"
    st_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    f = SafetensorsFile(path)
    assert f.metadata == {"format": "pt"}
    assert sorted(f.names()) == sorted(tensors)
    for name, t in tensors.items():
        a = f.get(name)
        assert a.shape == tuple(t.shape)
        assert a.tobytes() == _bytes_of(t), name
    assert f.get("b").dtype == ml_dtypes.bfloat16
    assert f.get("d").dtype == ml_dtypes.float8_e4m3fn
    assert float(f.get("e")) == 0.25


def test_reads_are_memory_mapped_and_read_only(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file(path, {"x": np.arange(12, dtype=np.float32).reshape(3, 4)})
    a = SafetensorsFile(path).get("x")
    assert isinstance(a, np.memmap)
    assert not a.flags.writeable
    np.testing.assert_array_equal(a, np.arange(12, dtype=np.float32).reshape(3, 4))


def test_streaming_writer_checks_order_dtype_shape_and_completion(tmp_path: Path) -> None:
    entries = [("a", "F32", (2,)), ("b", "U8", (3,))]
    bad_writes = [
        ("out of order", "b", np.zeros(3, np.uint8)),
        ("dtype", "a", np.zeros(2, np.float64)),
        ("shape", "a", np.zeros(3, np.float32)),
    ]
    for i, (message, name, array) in enumerate(bad_writes):
        w = SafetensorsWriter(tmp_path / f"{i}.safetensors", entries)
        with pytest.raises(SafetensorsError, match=message):
            w.write(name, array)
        w.abort()
    w = SafetensorsWriter(tmp_path / "short.safetensors", entries)
    w.write("a", np.zeros(2, np.float32))
    with pytest.raises(SafetensorsError, match="before tensor 'b'"):
        w.close()
    with pytest.raises(SafetensorsError, match="twice"):
        SafetensorsWriter(tmp_path / "5.safetensors", [*entries, ("a", "F32", (1,))])
    path = tmp_path / "ok.safetensors"
    with SafetensorsWriter(path, entries) as w:
        assert w.write("a", np.array([1, 2], np.float32)) == 8
        # a big-endian array of the same kind is converted, not refused
        w.write("b", np.array([7, 8, 9], np.uint8))
    header, _ = read_header(path)
    assert (8 + struct.unpack("<Q", path.read_bytes()[:8])[0]) % 8 == 0  # data aligned
    assert [t.name for t in header.values()] == ["a", "b"]
    np.testing.assert_array_equal(st_numpy.load_file(str(path))["a"], [1, 2])


def test_dtype_names() -> None:
    assert safetensors_dtype(np.float32) == "F32"
    assert safetensors_dtype(ml_dtypes.bfloat16) == "BF16"
    assert safetensors_dtype(ml_dtypes.float8_e4m3fn) == "F8_E4M3"
    assert safetensors_dtype(np.dtype(">f4")) == "F32"
    with pytest.raises(SafetensorsError):
        safetensors_dtype(np.complex64)


# ------------------------------------------------------------------ malformed headers
def _raw_file(path: Path, header: dict[str, Any], data: bytes, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    n = len(raw) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


GOOD = {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}


@pytest.mark.parametrize(
    ("header", "data", "length", "message"),
    [
        (GOOD, b"\0" * 8, 10_000, "header length 10000 runs beyond the file"),
        (GOOD, b"\0" * 4, None, "truncated"),
        (GOOD, b"\0" * 12, None, "4 bytes after the last tensor"),
        (
            {"t": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}},
            b"\0" * 8,
            None,
            "dtype 'F33'",
        ),
        (
            {"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
            b"\0" * 8,
            None,
            "needs 12 bytes",
        ),
        (
            {"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}},
            b"\0" * 8,
            None,
            "non-negative",
        ),
        (
            {"t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}},
            b"\0" * 8,
            None,
            "begin <= end",
        ),
        (
            {
                "t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "u": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
            None,
            "overlaps",
        ),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, None, "hole"),
        ({"t": [1, 2]}, b"", None, "expected an object"),
    ],
)
def test_lying_headers_are_refused_naming_file_and_tensor(
    tmp_path: Path, header: dict[str, Any], data: bytes, length: int | None, message: str
) -> None:
    path = _raw_file(tmp_path / "bad.safetensors", header, data, length)
    with pytest.raises(SafetensorsError, match=message) as info:
        SafetensorsFile(path)
    assert str(path) in str(info.value)
    if not any(whole_file in message for whole_file in ("beyond", "after the last")):
        assert "tensor 't'" in str(info.value) or "tensor 'u'" in str(info.value)
    with pytest.raises(Exception):  # noqa: B017 - the library refuses these files too
        st_torch.load_file(str(path))


def test_too_short_and_non_json(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\1\0")
    with pytest.raises(SafetensorsError, match="too short"):
        read_header(short)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(SafetensorsError, match="not valid UTF-8 JSON"):
        read_header(junk)
    with pytest.raises(FileNotFoundError):
        read_header(tmp_path / "missing.safetensors")


def test_modelopt_export_reads_identically(modelopt_exports: dict[str, Path]) -> None:
    for name in ("llama", "moe"):
        path = modelopt_exports[name] / "model.safetensors"
        ours = SafetensorsFile(path)
        theirs = st_torch.load_file(str(path))
        assert sorted(ours.names()) == sorted(theirs)
        for n, t in theirs.items():
            assert ours.get(n).tobytes() == _bytes_of(t), n


def test_the_old_name_of_safetensors_dtype_warns() -> None:
    import nvfp4_checkpoints.safetensors_io as io

    with pytest.warns(DeprecationWarning, match="renamed safetensors_dtype"):
        old = io.dtype_name
    assert old is safetensors_dtype
    with pytest.raises(AttributeError, match="no attribute 'dtype_nam'"):
        io.dtype_nam
