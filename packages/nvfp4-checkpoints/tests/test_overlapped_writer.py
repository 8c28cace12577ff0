"""The background writer behind the GGUF converter: order, alignment, bounded memory, and
errors from either thread reaching the caller."""

from __future__ import annotations

import errno
import io
import threading
from typing import Any

import numpy as np
import pytest
from nvfp4_checkpoints.overlapped import OverlappedWriter


def test_pieces_land_in_order_with_alignment() -> None:
    rng = np.random.default_rng(0)
    f = io.BytesIO()
    f.write(b"head")  # the writer starts where the file is
    expected = bytearray(b"head")
    with OverlappedWriter(f, depth=2) as out:
        assert out.position == 4
        for i in range(200):
            kind = i % 4
            if kind == 0:
                piece = rng.integers(0, 256, size=int(rng.integers(1, 3000)), dtype=np.uint8)
                buf = out.buffer(piece.nbytes)
                chunk = buf[: piece.nbytes]
                chunk[...] = piece
                out.write(chunk, recycle=True)
                expected += piece.tobytes()
            elif kind == 1:
                b = bytes(rng.integers(0, 256, size=7, dtype=np.uint8))
                out.write(b)
                expected += b
            elif kind == 2:
                a = rng.standard_normal((3, 5)).astype(np.float32)  # any dtype: raw bytes
                out.write(a)
                expected += a.tobytes()
            else:
                out.align(32)
                expected += bytes(-len(expected) % 32)
                assert out.position % 32 == 0
            assert out.position == len(expected)
    assert f.getvalue() == bytes(expected)


def test_recycled_buffers_stay_a_small_pool() -> None:
    f = io.BytesIO()
    seen: set[int] = set()
    with OverlappedWriter(f, depth=3) as out:
        for i in range(500):
            buf = out.buffer(1024)
            seen.add(id(buf))
            buf[:1024] = i % 256
            out.write(buf[:1024], recycle=True)
    assert len(seen) <= 3 + 2  # depth queued + one writing + one filling
    data = np.frombuffer(f.getvalue(), dtype=np.uint8).reshape(500, 1024)
    assert np.array_equal(data[:, 0], np.arange(500) % 256)  # no buffer reused too early
    assert (data == data[:, :1]).all()


def test_a_larger_request_than_the_pool_holds_gets_a_larger_buffer() -> None:
    f = io.BytesIO()
    with OverlappedWriter(f, depth=1) as out:
        for n in (10, 10, 10, 5000, 10):
            buf = out.buffer(n)
            assert buf.nbytes >= n
            buf[:n] = 1
            out.write(buf[:n], recycle=True)
    assert f.getvalue() == b"\x01" * 5040


class _FullDisk(io.RawIOBase):
    """A file that takes ``room`` bytes, then fails as a full disk does."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.written = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def write(self, b: Any) -> int:
        n = memoryview(b).nbytes
        if self.written + n > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.written += n
        return n


def test_a_failed_write_reaches_the_producer() -> None:
    f = _FullDisk(room=10_000)
    out = OverlappedWriter(f, depth=2)  # type: ignore[arg-type]

    def produce() -> None:
        for _ in range(1000):  # fails long before the end: the error stops the producer
            buf = out.buffer(1000)
            out.write(buf[:1000], recycle=True)
        out.close()

    with pytest.raises(OSError, match="No space left") as info:
        produce()
    assert info.value.errno == errno.ENOSPC
    out.abort()
    assert not out._thread.is_alive()
    assert f.written <= 10_000


def test_close_reports_an_error_of_the_last_write() -> None:
    f = _FullDisk(room=10)
    out = OverlappedWriter(f)  # type: ignore[arg-type]
    out.write(b"x" * 11)
    with pytest.raises(OSError, match="No space left"):
        out.close()


def test_an_error_in_the_producer_stops_the_thread_and_propagates() -> None:
    f = io.BytesIO()
    before = threading.active_count()
    out = OverlappedWriter(f, depth=1)

    def produce() -> None:
        with out:
            out.write(b"abc")
            raise ValueError("bad planes")

    with pytest.raises(ValueError, match="bad planes"):
        produce()
    assert threading.active_count() == before
    assert not out._thread.is_alive()


def test_refusals() -> None:
    with pytest.raises(ValueError, match="depth"):
        OverlappedWriter(io.BytesIO(), depth=0)
    with OverlappedWriter(io.BytesIO()) as out, pytest.raises(ValueError, match="contiguous"):
        out.write(np.zeros((4, 4), dtype=np.uint8)[:, ::2])
