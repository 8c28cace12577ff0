"""nvfp4.fixtures.safetensors_reader (nvfp4.safetensors_format held to the fixture dtypes):
every committed fixture as the safetensors library reads it (the oracle), and malformed files
refused with one line naming file and tensor."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
from nvfp4.fixtures import data_files, list_cases, load_case, read_bytes
from nvfp4.fixtures.safetensors_reader import FixtureFileError, load

NAMES = [c["name"] for c in list_cases()]


def _file(header: dict[str, Any], data: bytes = b"", pad: bytes = b"") -> bytes:
    text = json.dumps(header).encode() + pad
    return struct.pack("<Q", len(text)) + text + data


def _refused(blob: bytes, *fragments: str) -> str:
    with pytest.raises(FixtureFileError) as info:
        load(blob, "case.safetensors")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(("case.safetensors: ", "case.safetensors, tensor ")), message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize("name", NAMES)
def test_every_fixture_reads_as_the_safetensors_library_reads_it(name: str) -> None:
    st_numpy = pytest.importorskip("safetensors.numpy")
    want = st_numpy.load(read_bytes(name))
    got = load_case(name)
    assert sorted(got) == sorted(want)
    for key, array in want.items():
        assert got[key].dtype == array.dtype, key
        assert got[key].shape == array.shape, key
        assert got[key].tobytes() == array.tobytes(), key
        assert got[key].flags.writeable, key


def test_every_committed_file_is_a_fixture() -> None:
    files = {p.name for p in data_files().iterdir() if p.name.endswith(".safetensors")}
    assert files == {c["file"] for c in list_cases()}


def test_reads_a_small_file_in_header_order() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([7, 8], dtype=np.uint16)
    header = {
        "__metadata__": {"format": "np"},
        "b": {"dtype": "U16", "shape": [2], "data_offsets": [0, 4]},
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [4, 28]},
    }
    out = load(_file(header, b.tobytes() + a.tobytes(), pad=b"   "), "small")
    assert list(out) == ["b", "a"]
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], b)


def test_refuses_a_file_shorter_than_the_length_field() -> None:
    _refused(b"\x01\x02", "8-byte header length", "2 bytes")


def test_refuses_a_header_length_past_the_end() -> None:
    _refused(struct.pack("<Q", 1000) + b"{}", "header length 1000", "(10 bytes)")


def test_refuses_a_header_that_is_not_json() -> None:
    _refused(
        struct.pack("<Q", 3) + b"{no",
        "case.safetensors: header: expected UTF-8 JSON, found text that is not valid UTF-8 JSON",
    )


def test_refuses_a_header_that_is_not_an_object() -> None:
    _refused(_file([1, 2]), "header is a JSON list, expected an object")  # type: ignore[arg-type]


def test_refuses_bad_metadata() -> None:
    _refused(_file({"__metadata__": {"k": 1}}), "__metadata__")


def test_refuses_an_entry_with_a_missing_field() -> None:
    _refused(_file({"t": {"dtype": "U8", "shape": [1]}}, b"\0"), "tensor 't'", "data_offsets None")


def test_refuses_a_dtype_fixtures_never_hold() -> None:
    header = {"t": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}
    _refused(
        _file(header, b"\0\0"),
        "tensor 't'",
        "dtype 'BF16' is not one of U8, I8, U16, U32, I32, F32",
    )


@pytest.mark.parametrize("shape", [[-1], [1.5], "3", [True], [1] * 9, [10**6]])
def test_refuses_a_bad_shape(shape: Any) -> None:
    header = {"t": {"dtype": "U8", "shape": shape, "data_offsets": [0, 1]}}
    _refused(_file(header, b"\0"), "tensor 't': shape", "at most 8 non-negative integers")


def test_refuses_a_header_nested_beyond_the_json_limit() -> None:
    nested = b'{"t": ' + b"[" * 70 + b"]" * 70 + b"}"
    _refused(struct.pack("<Q", len(nested)) + nested, "JSON nested 71 levels deep", "64 read")


@pytest.mark.parametrize("offsets", [[0], [0, "1"], [1, 0], [-1, 0], [0, 9]])
def test_refuses_offsets_outside_the_buffer(offsets: Any) -> None:
    header = {"t": {"dtype": "U8", "shape": [1], "data_offsets": offsets}}
    _refused(_file(header, b"\0"), "tensor 't'", "data_offsets")


def test_refuses_a_size_that_disagrees_with_dtype_and_shape() -> None:
    header = {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}
    _refused(
        _file(header, b"\0" * 4),
        "tensor 't'",
        "F32 [2] needs 8 bytes but data_offsets [0, 4] span 4",
    )


def test_refuses_overlapping_tensors() -> None:
    header = {
        "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
        "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
    }
    _refused(_file(header, b"\0" * 3), "tensor 'b'", "[1, 3] overlaps", "start at 2")


def test_refuses_a_hole_between_tensors() -> None:
    header = {
        "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "b": {"dtype": "U8", "shape": [1], "data_offsets": [2, 3]},
    }
    _refused(_file(header, b"\0" * 3), "tensor 'b'", "[2, 3] leaves a hole", "start at 1")


def test_refuses_bytes_after_the_last_tensor() -> None:
    header = {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}
    _refused(_file(header, b"\0" * 3), "2 bytes after the last tensor's data")


def test_load_case_names_the_fixture_in_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import nvfp4.fixtures as fixtures

    name = NAMES[0]
    monkeypatch.setattr(fixtures, "read_bytes", lambda _: struct.pack("<Q", 99))
    with pytest.raises(FixtureFileError, match=f"golden fixture {name!r}"):
        fixtures.load_case(name)
