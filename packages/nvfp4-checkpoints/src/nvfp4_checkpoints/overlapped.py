"""Writing a file on a background thread, so that transcoding overlaps the write.

A converter alternates two kinds of work: computing the next piece of output (numpy, which
releases the GIL in its loops) and handing the previous piece to the kernel (``write``,
which releases it too). Done in one thread they add up; :class:`OverlappedWriter` runs the
writes on a second thread, in submission order, so they overlap on a machine with two cores.

Memory stays bounded: the queue holds at most ``depth`` pieces, and chunks produced for the
writer come from a small pool of recycled buffers (:meth:`OverlappedWriter.buffer`) that the
writer thread hands back once a chunk is on its way to the file. An error on either side
stops both: a failed write is raised on the producer's next call, and leaving the ``with``
block on an exception discards what is still queued.
"""

from __future__ import annotations

import queue
import threading
from typing import IO, Any, Final

import numpy as np
import numpy.typing as npt

from .closing import Closing

__all__ = ["OverlappedWriter"]

_STOP: Final = object()  # the queue's end marker


class OverlappedWriter(Closing):
    """Appends byte pieces to ``f`` from a background thread, in the order given.

    Args:
        f: a binary file open for writing, positioned where the pieces go; the writer owns
            it until :meth:`close` (which flushes it but does not close it).
        depth: pieces queued at most before :meth:`write` blocks.

    :attr:`position` is the file offset after everything submitted so far.
    """

    def __init__(self, f: IO[bytes], *, depth: int = 4) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, found {depth}")
        self._f = f
        self.position = f.tell()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        # Pool of chunk buffers: `depth` can wait in the queue, one is being written and one
        # is being filled, so depth + 2 buffers never make the producer wait for memory.
        self._free: queue.Queue[npt.NDArray[np.uint8]] = queue.Queue()
        self._allocated = 0
        self._pool_size = depth + 2
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="nvfp4-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producer side
    def buffer(self, nbytes: int) -> npt.NDArray[np.uint8]:
        """A 1-D uint8 buffer of at least ``nbytes`` from the pool, to fill and pass to
        :meth:`write` with ``recycle=True`` (blocks while every pool buffer is in flight)."""
        self._raise_pending()
        if self._free.empty() and self._allocated < self._pool_size:
            self._allocated += 1
            return np.empty(nbytes, dtype=np.uint8)
        buf = self._get_free()
        return buf if buf.nbytes >= nbytes else np.empty(nbytes, dtype=np.uint8)

    def write(self, data: npt.NDArray[Any] | bytes, *, recycle: bool = False) -> None:
        """Queue ``data`` (bytes, or a C-contiguous array written as its raw bytes).

        With ``recycle=True`` the array must be a view of a buffer from :meth:`buffer`: that
        buffer returns to the pool once written. The caller must not modify ``data`` after
        this call.
        """
        self._raise_pending()
        if isinstance(data, np.ndarray):
            if not data.flags.c_contiguous:
                raise ValueError("OverlappedWriter.write needs a C-contiguous array")
            nbytes = int(data.nbytes)
            base = _root(data) if recycle else None
        else:
            nbytes = len(data)
            base = None
        if nbytes:
            self._put((data, base))
            self.position += nbytes

    def align(self, alignment: int) -> None:
        """Queue zero bytes up to the next multiple of ``alignment`` of :attr:`position`."""
        pad = -self.position % alignment
        if pad:
            self.write(bytes(pad))

    def close(self) -> None:
        """Wait for every queued piece to be written, flush the file, raise a write error."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
        self._raise_pending()
        self._f.flush()

    def abort(self) -> None:
        """Drop what is still queued and stop the thread (the file is left as it is)."""
        if self._closed:
            return
        self._closed = True
        while True:  # empty the queue so the end marker fits, then wait for the thread
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(_STOP)
        self._thread.join()

    # ------------------------------------------------------------------ internals
    def _put(self, item: Any) -> None:
        """Queue ``item``, waking up now and then to notice a writer thread that failed."""
        while True:
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                self._raise_pending()

    def _get_free(self) -> npt.NDArray[np.uint8]:
        while True:
            try:
                return self._free.get(timeout=0.1)
            except queue.Empty:
                self._raise_pending()

    def _raise_pending(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None:  # after a failure: drain, write nothing more
                continue
            data, base = item
            try:
                view = data.data.cast("B") if isinstance(data, np.ndarray) else data
                self._f.write(view)
            except BaseException as e:
                self._error = e
            if base is not None:
                self._free.put(base)


def _root(a: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """The pool buffer a chunk is a view of."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a
