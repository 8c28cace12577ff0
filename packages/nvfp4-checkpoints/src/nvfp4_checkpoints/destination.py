"""The destination's life cycle: every writer writes into a temporary sibling of the
destination, and one rename at the end makes the output appear complete or not at all.

``with destination(dst, force=..., source=...) as tmp:`` yields a fresh path
next to ``dst`` (``.<name>.nvfp4-tmp.<pid>.<random>``, on the same filesystem); the caller
writes a directory or a file there. Nothing a user owns is ever deleted or overwritten
without being asked for:

* ``dst`` may not be the source, inside it, or a parent of it (:func:`check_apart`);
* an existing ``dst`` is refused without ``force``; with ``force`` it is replaced only when
  it is itself a checkpoint this package reads (a folder of a known flavour, a GGUF file) or
  an empty folder (:func:`check_replaceable`), never an arbitrary folder or file;
* the final rename never replaces what it was not asked to: a ``dst`` that appeared during
  the run is refused (``renameat2(RENAME_NOREPLACE)`` where the OS has it, ``os.link`` for
  a file, a last check otherwise), as is a forced ``dst`` that was swapped for another;
* a forced replace is one ``renameat2(RENAME_EXCHANGE)`` where the OS has it, so ``dst``
  always holds the complete old or the complete new output; elsewhere the old one is moved
  aside first, and restored if the new one does not land;
* every run leaves a marker (``.<name>.nvfp4-run.<pid>.<random>``: its pid, the process's
  start time and the names of its temporaries) until it is done. A run killed with
  ``SIGKILL`` leaves its marker: the next run for the same ``dst`` restores an old copy that
  was moved aside when the new one did not land, removes the temporaries the marker names
  (provably ours: the pid with that start time no longer runs) and reports it. Temporaries
  without a marker are reported and left alone.

:func:`interrupt_on_signals` turns ``SIGTERM`` / ``SIGHUP`` into ``KeyboardInterrupt`` so
that the clean-up also runs when a process is terminated (the CLI uses it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import logging
import os
import secrets
import shutil
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, Final

from .flavours import GGUF_MAGIC, CheckpointError, detect_flavour

__all__ = [
    "OLD_MARK",
    "RUN_MARK",
    "TMP_MARK",
    "check_apart",
    "check_replaceable",
    "destination",
    "interrupt_on_signals",
    "recover",
    "rename_noreplace",
]

#: The marker in temporary names: ``.<name>.nvfp4-tmp.<pid>.<random>``.
TMP_MARK: Final = ".nvfp4-tmp."
#: An old destination moved aside during a replace without ``RENAME_EXCHANGE``.
OLD_MARK: Final = ".nvfp4-old."
#: A run's marker file.
RUN_MARK: Final = ".nvfp4-run."
_RENAME_NOREPLACE: Final = 1
_RENAME_EXCHANGE: Final = 2
_AT_FDCWD: Final = -100
logger = logging.getLogger(__name__)


# ============================================================================ renames
def _renameat2() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2: Final = _renameat2()


def _rename2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``; ``False`` where the OS or filesystem lacks it."""
    if _RENAMEAT2 is None:
        return False
    rc = _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, raising :class:`FileExistsError` when ``dst`` exists."""
    if _rename2(src, dst, _RENAME_NOREPLACE):
        return
    if not src.is_dir() or src.is_symlink():
        os.link(src, dst, follow_symlinks=False)  # FileExistsError when dst exists
        os.unlink(src)
        return
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "File exists", str(dst))
    os.rename(src, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ============================================================================ checks
def check_apart(source: Path, dst: Path) -> None:
    """Refuse a destination that is the source, inside it, or a parent of it."""
    s, d = source.resolve(), dst.resolve()
    if d == s:
        raise CheckpointError(f"{dst}: the destination is the source {source}")
    if d.is_relative_to(s):
        raise CheckpointError(f"{dst}: the destination is inside the source {source}")
    if s.is_relative_to(d):
        raise CheckpointError(f"{dst}: the destination holds the source {source}")


def check_replaceable(dst: Path) -> None:
    """With ``--force``: refuse to replace anything but a checkpoint this package reads
    (a Hugging Face folder of a known flavour, a GGUF file) or an empty folder."""
    st = os.lstat(dst)
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointError(f"{dst}: is a symlink; --force does not replace it")
    if stat.S_ISDIR(st.st_mode):
        with os.scandir(dst) as it:
            if next(it, None) is None:
                return
        with contextlib.suppress(CheckpointError):
            detect_flavour(dst)
            return
    elif stat.S_ISREG(st.st_mode):
        with open(dst, "rb") as f:
            if f.read(4) == GGUF_MAGIC:
                return
    raise CheckpointError(
        f"{dst}: exists and is not a checkpoint this tool reads; --force replaces only a "
        "checkpoint or an empty folder, so remove it yourself"
    )


# ============================================================================ markers
def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux: field 22 of ``/proc/<pid>/stat``), or
    ``None`` where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def _running(pid: int, start: object) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = process_start(pid)
    return now is None or start is None or now == start


def _ours(parent: Path, dst: Path, name: object, mark: str) -> Path | None:
    """``parent / name`` when ``name`` is one of our temporaries of ``dst``."""
    if (
        isinstance(name, str)
        and name.startswith(f".{dst.name}{mark}")
        and "/" not in name
        and os.sep not in name
    ):
        return parent / name
    return None


def recover(dst: Path) -> list[str]:
    """Finish what killed runs for ``dst`` left (see the module docstring); returns the
    notes to report."""
    notes: list[str] = []
    parent = dst.parent
    markers, leftovers = [], []
    for p in parent.iterdir():
        if p.name.startswith(f".{dst.name}{RUN_MARK}"):
            markers.append(p)
        elif p.name.startswith((f".{dst.name}{TMP_MARK}", f".{dst.name}{OLD_MARK}")):
            leftovers.append(p)
    claimed: set[str] = set()
    for marker in markers:
        try:
            info = json.loads(marker.read_bytes()[:4096].decode("utf-8"))
            pid, start = int(info["pid"]), info.get("start")
        except (OSError, ValueError, KeyError, TypeError):
            notes.append(f"nvfp4: note: {marker} is not a marker this tool wrote; left as is")
            continue
        tmp = _ours(parent, dst, info.get("tmp"), TMP_MARK)
        old = _ours(parent, dst, info.get("old"), OLD_MARK)
        claimed.update(p.name for p in (tmp, old) if p is not None)
        if _running(pid, start):
            continue
        if old is not None and os.path.lexists(old):
            if not os.path.lexists(dst):
                rename_noreplace(old, dst)
                notes.append(f"nvfp4: note: restored {dst} from a run killed while replacing it")
            else:
                _remove(old)
        if tmp is not None and os.path.lexists(tmp):
            _remove(tmp)
            notes.append(f"nvfp4: note: removed {tmp.name}, the temporary of a killed run")
        marker.unlink()
    for p in leftovers:
        if p.name not in claimed:
            notes.append(f"nvfp4: note: {p} looks like a temporary but has no marker; left as is")
    return notes


def _write_marker(marker: Path, tmp: Path, old: Path) -> None:
    pid = os.getpid()
    info = {"pid": pid, "start": process_start(pid), "tmp": tmp.name, "old": old.name}
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, json.dumps(info).encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(marker.parent)


# ============================================================================ the life cycle
def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _commit(target: Path, tmp: Path, old: Path, replaced: tuple[int, int] | None) -> None:
    if replaced is None:
        try:
            rename_noreplace(tmp, target)
        except FileExistsError:
            raise CheckpointError(
                f"{target}: appeared while this conversion ran; not replaced (pass --force "
                "and run again to replace it)"
            ) from None
        return
    now = _identity(target)
    if now != replaced:
        what = "was removed" if now is None else "was replaced by something else"
        raise CheckpointError(f"{target}: {what} while this conversion ran; left as it is")
    if _rename2(tmp, target, _RENAME_EXCHANGE):
        _remove(tmp)  # the old output, swapped out
        return
    os.rename(target, old)
    try:
        rename_noreplace(tmp, target)
    except BaseException:
        rename_noreplace(old, target)
        raise
    _remove(old)


@contextlib.contextmanager
def destination(
    dst: str | os.PathLike[str],
    *,
    force: bool = False,
    source: Path | None = None,
) -> Iterator[Path]:
    """Yield a temporary sibling path of ``dst`` and rename it onto ``dst`` on success
    (see the module docstring). The yielded path does not exist yet.

    Raises :class:`CheckpointError` for a missing parent, a destination that overlaps
    ``source``, an existing destination without ``force`` (or one ``force`` may not
    replace), and a destination that appeared or changed during the run.
    """
    target = Path(dst)
    if not target.parent.is_dir():
        raise CheckpointError(f"{target}: parent directory {target.parent} does not exist")
    if source is not None:
        check_apart(source, target)
    for note in recover(target):
        logger.warning("%s", note)
    replaced = _identity(target)
    if replaced is not None:
        if not force:
            raise CheckpointError(
                f"{target}: already exists (pass --force / force=True to replace)"
            )
        check_replaceable(target)
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    tmp = target.parent / f".{target.name}{TMP_MARK}{token}"
    old = target.parent / f".{target.name}{OLD_MARK}{token}"
    marker = target.parent / f".{target.name}{RUN_MARK}{token}"
    _write_marker(marker, tmp, old)
    try:
        yield tmp
        if not os.path.lexists(tmp):
            raise CheckpointError(f"{target}: nothing was written")
        _commit(target, tmp, old, replaced)
        _fsync_dir(target.parent)
    except BaseException:
        _remove(tmp)
        raise
    finally:
        if not (os.path.lexists(old) and not os.path.lexists(target)):
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """While active, ``SIGTERM`` and ``SIGHUP`` raise ``KeyboardInterrupt`` in the main
    thread, so :func:`destination` cleans up when a conversion is terminated. The previous
    handlers are restored on exit; outside the main thread this does nothing."""
    previous: dict[int, Any] = {}
    try:
        for name in ("SIGTERM", "SIGHUP"):
            sig = getattr(signal, name, None)
            if sig is not None:
                previous[sig] = signal.signal(sig, _raise_interrupt)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
