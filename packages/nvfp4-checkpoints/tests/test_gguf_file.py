"""Our GGUF header reader (:mod:`nvfp4_checkpoints.gguf.file`) against gguf-py's own
``GGUFReader`` on a file gguf-py wrote with every value type and several tensor types, and
on malformed files: every one a :class:`CheckpointError` naming the file, never another
exception."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nvfp4_checkpoints import CheckpointError
from nvfp4_checkpoints.gguf.file import GGUFFile

gguf = pytest.importorskip("gguf")


def _write_sample(path: Path, alignment: int = 64) -> None:
    """Every GGUF value type, strings with non-ASCII text, empty strings, a 49-string array,
    and tensors of plain, BF16, block (Q8_0) and NVFP4 types with a custom alignment."""
    vt = gguf.GGUFValueType
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("general.alignment", alignment)
    w.data_alignment = alignment
    w.add_key_value("t.u8", 200, vt.UINT8)
    w.add_key_value("t.i8", -100, vt.INT8)
    w.add_key_value("t.u16", 60000, vt.UINT16)
    w.add_key_value("t.i16", -30000, vt.INT16)
    w.add_key_value("t.u32", 4_000_000_000, vt.UINT32)
    w.add_key_value("t.i32", -2_000_000_000, vt.INT32)
    w.add_key_value("t.f32", 0.1, vt.FLOAT32)
    w.add_key_value("t.bool", True, vt.BOOL)
    w.add_key_value("t.str", "naïve – ünïcode", vt.STRING)
    w.add_key_value("t.u64", 2**63 + 5, vt.UINT64)
    w.add_key_value("t.i64", -(2**62), vt.INT64)
    w.add_key_value("t.f64", 1e-300, vt.FLOAT64)
    w.add_key_value("t.arr_i32", [1, -2, 3], vt.ARRAY, vt.INT32)
    w.add_key_value("t.arr_f32", [0.5, -1.25], vt.ARRAY, vt.FLOAT32)
    w.add_key_value("t.arr_bool", [True, False, True], vt.ARRAY, vt.BOOL)
    w.add_key_value("tokenizer.ggml.tokens", [f"tok{i}é" for i in range(49)], vt.ARRAY, vt.STRING)
    w.add_key_value("t.arr_str_empty", ["", "x", ""], vt.ARRAY, vt.STRING)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((7,)).astype(np.float16))
    w.add_tensor("i32", rng.integers(-9, 9, (2, 2, 3), dtype=np.int32))
    w.add_tensor(
        "bf16",
        rng.integers(0, 2**16, (4, 8), dtype=np.uint16),
        raw_dtype=gguf.GGMLQuantizationType.BF16,
    )
    q8 = rng.integers(0, 256, (2, 2 * 34), dtype=np.uint8)  # 2 rows x 64 elements of Q8_0
    w.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    fp4 = rng.integers(0, 256, (2, 3, 2 * 36), dtype=np.uint8)  # [E, N, K=128] NVFP4
    w.add_tensor("fp4.weight", fp4, raw_dtype=gguf.GGMLQuantizationType.NVFP4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "sample.gguf"
    _write_sample(path)
    return path


def _expected(field: Any) -> Any:
    v = field.contents()
    return v.tolist() if isinstance(v, np.ndarray) else v


def test_fields_and_tensors_match_gguf_py(sample: Path) -> None:
    theirs = gguf.GGUFReader(sample)
    with GGUFFile(sample) as ours:
        # gguf-py adds the header's counts as pseudo-fields "GGUF.*"
        keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
        assert list(ours.fields) == keys
        for name in keys:
            field = theirs.fields[name]
            mine = ours.fields[name]
            assert mine.type == int(field.types[0]), name
            if mine.sub_type is not None:
                assert mine.sub_type == int(field.types[-1]), name
            want = _expected(field)
            got = mine.value()
            if isinstance(want, float):
                assert np.float32(got) == np.float32(want) or got == want, name
            elif isinstance(want, list) and want and isinstance(want[0], float):
                np.testing.assert_array_equal(np.float32(got), np.float32(want))
            else:
                assert got == want, name
        assert ours.value("t.str") == "naïve – ünïcode"
        assert ours.fields["t.str"].raw() == "naïve – ünïcode".encode()
        assert ours.value("missing", "default") == "default"
        assert [t.name for t in theirs.tensors] == list(ours.tensors)
        for t in theirs.tensors:
            mine_t = ours.tensors[t.name]
            assert mine_t.shape == tuple(int(d) for d in reversed(t.shape.tolist())), t.name
            assert mine_t.ggml_type == int(t.tensor_type), t.name
            assert mine_t.offset == int(t.data_offset), t.name
            assert mine_t.nbytes == int(t.n_bytes), t.name
            assert mine_t.offset % 64 == 0, t.name  # general.alignment was honoured
            a = ours.array(mine_t)
            assert a.tobytes() == np.asarray(t.data).tobytes(), t.name
        assert ours.array(ours.tensors["f32"]).dtype == np.float32
        assert ours.array(ours.tensors["bf16"]).dtype == np.uint16
        assert ours.array(ours.tensors["fp4.weight"]).shape == (2, 3, 72)  # [E, N, row bytes]
        assert ours.tensors["fp4.weight"].shape == (2, 3, 128)  # elements


def _header(version: int = 3, n_tensors: int = 0, n_kv: int = 0, magic: bytes = b"GGUF") -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def _kv_string(key: str, value: bytes) -> bytes:
    k = key.encode()
    return (
        struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(value)) + value
    )


def test_crafted_file_with_an_empty_array_and_no_tensors(tmp_path: Path) -> None:
    """What gguf-py's writer refuses to write but the format allows: an empty array."""
    k = b"t.empty"
    body = struct.pack("<Q", len(k)) + k + struct.pack("<IIQ", 9, 5, 0)  # ARRAY of INT32, 0
    path = tmp_path / "empty.gguf"
    path.write_bytes(_header(n_kv=1) + body)
    with GGUFFile(path) as f:
        assert f.value("t.empty") == []
        assert f.tensors == {}


MALFORMED = {
    "empty": (b"", "24 bytes"),
    "bad magic": (_header(magic=b"GGML") + b"\0" * 8, "magic"),
    "version 1": (_header(version=1) + b"\0" * 8, "version"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    "absurd key count": (_header(n_kv=2**60), "count of keys"),
    "key length past the end": (_header(n_kv=1) + struct.pack("<Q", 10**9), "key 0"),
    "string value past the end": (
        _header(n_kv=1) + _kv_string("a", b"xyz")[:-3] + b"x",
        "'a'",
    ),
    "unknown value type": (
        _header(n_kv=1) + struct.pack("<Q", 1) + b"a" + struct.pack("<I", 99),
        "value type",
    ),
    "duplicate key": (_header(n_kv=2) + _kv_string("a", b"1") + _kv_string("a", b"2"), "twice"),
    "key not UTF-8": (_header(n_kv=1) + _kv_string("a", b"1").replace(b"a", b"\xff", 1), "UTF-8"),
    "tensor data past the end": (
        _header(n_tensors=1)
        + struct.pack("<Q", 1)
        + b"t"
        + struct.pack("<IQIQ", 1, 1000, 0, 0),  # 1000 float32 at offset 0, no data
        "'t'",
    ),
    "unknown tensor type": (
        _header(n_tensors=1) + struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 4, 9999, 0),
        "ggml type",
    ),
    "rank 9": (
        _header(n_tensors=1) + struct.pack("<Q", 1) + b"t" + struct.pack("<I", 9) + b"\0" * 90,
        "rank",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_files_are_refused_with_a_reason(tmp_path: Path, case: str) -> None:
    data, expected = MALFORMED[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        GGUFFile(path)
    msg = str(info.value)
    assert str(path) in msg
    assert expected in msg, msg


def test_every_truncation_is_refused(sample: Path, tmp_path: Path) -> None:
    """Cut the sample at every byte of its header and at points in its data: the reader
    refuses each with a CheckpointError (the file may lose only trailing padding)."""
    data = sample.read_bytes()
    last = max(GGUFFile(sample).tensors.values(), key=lambda t: t.offset)
    header_end = min(t.offset for t in GGUFFile(sample).tensors.values())
    cuts = [*range(0, header_end, 7), last.offset, last.offset + last.nbytes - 1]
    path = tmp_path / "cut.gguf"
    for cut in cuts:
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError):
            GGUFFile(path)


def test_random_corruption_never_escapes_as_another_error(sample: Path, tmp_path: Path) -> None:
    """Flip random header bytes: the file either still parses or is refused with a
    CheckpointError; no IndexError, struct.error, UnicodeDecodeError or MemoryError."""
    data = bytearray(sample.read_bytes())
    header_end = min(t.offset for t in GGUFFile(sample).tensors.values())
    rng = np.random.default_rng(5)
    path = tmp_path / "flip.gguf"
    refused = 0
    for _ in range(400):
        bad = bytearray(data)
        for pos in rng.integers(0, header_end, size=int(rng.integers(1, 4))):
            bad[pos] = int(rng.integers(0, 256))
        path.write_bytes(bytes(bad))
        try:
            f = GGUFFile(path)
            for field in f.fields.values():
                try:
                    field.value()
                except CheckpointError:
                    refused += 1
        except CheckpointError:
            refused += 1
    assert refused > 50  # most flips in counts, lengths and types are caught
