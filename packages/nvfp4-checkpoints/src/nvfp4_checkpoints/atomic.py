"""Atomic outputs: write into a temporary sibling, rename onto the destination at the end.

``with atomic_output(dst, force=...) as tmp:`` yields a fresh path next to ``dst``
(``.<name>.nvfp4-tmp.<pid>.<random>``, on the same filesystem so the final rename is
atomic). The caller writes a directory or a file there; on success it is renamed to
``dst``. On any exception, ``KeyboardInterrupt`` included, the temporary is removed and
``dst`` is untouched, so a failed or interrupted conversion never leaves a half-written
output under the destination's name.

* An existing ``dst`` is refused unless ``force=True``; with ``force`` the old one is moved
  aside, the new one renamed in, and only then the old one deleted.
* ``SIGKILL`` (or a power cut) cannot be caught: it leaves the temporary sibling behind,
  never ``dst``. The next ``atomic_output`` for the same ``dst`` removes the stale
  temporaries of processes that no longer exist (:func:`clean_stale`).
* :func:`interrupt_on_signals` turns ``SIGTERM`` / ``SIGHUP`` into ``KeyboardInterrupt``
  so that the cleanup above also runs when a process is terminated (the CLI uses it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from .flavours import CheckpointError

__all__ = ["TMP_MARK", "atomic_output", "clean_stale", "interrupt_on_signals"]

#: The marker in temporary names: ``.<name>.nvfp4-tmp.<pid>.<random>``.
TMP_MARK = ".nvfp4-tmp."
_OLD_MARK = ".nvfp4-old."


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clean_stale(dst: Path) -> list[Path]:
    """Remove temporaries left next to ``dst`` by processes that no longer run (killed
    with ``SIGKILL``, say). Returns what was removed."""
    removed: list[Path] = []
    parent = dst.parent
    if not parent.is_dir():
        return removed
    for mark in (TMP_MARK, _OLD_MARK):
        prefix = f".{dst.name}{mark}"
        for p in parent.iterdir():
            if not p.name.startswith(prefix):
                continue
            pid_text = p.name[len(prefix) :].split(".", 1)[0]
            if pid_text.isdigit() and not _pid_alive(int(pid_text)):
                _remove(p)
                removed.append(p)
    return removed


@contextlib.contextmanager
def atomic_output(dst: str | os.PathLike[str], *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling path of ``dst`` and rename it onto ``dst`` on success.

    The yielded path does not exist yet: create a directory or a file there. Raises
    :class:`CheckpointError` when ``dst`` exists and ``force`` is false, or when its parent
    directory is missing.
    """
    target = Path(dst)
    if not target.parent.is_dir():
        raise CheckpointError(f"{target}: parent directory {target.parent} does not exist")
    if (target.exists() or target.is_symlink()) and not force:
        raise CheckpointError(f"{target}: already exists (pass --force / force=True to replace)")
    clean_stale(target)
    tmp = target.parent / f".{target.name}{TMP_MARK}{os.getpid()}.{secrets.token_hex(4)}"
    try:
        yield tmp
        if not tmp.exists():
            raise CheckpointError(f"{target}: nothing was written")
        if target.exists() or target.is_symlink():
            old = target.parent / f".{target.name}{_OLD_MARK}{os.getpid()}.{secrets.token_hex(4)}"
            os.rename(target, old)
            try:
                os.rename(tmp, target)
            except BaseException:
                os.rename(old, target)
                raise
            _remove(old)
        else:
            os.rename(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        _remove(tmp)
        raise


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """While active, ``SIGTERM`` and ``SIGHUP`` raise ``KeyboardInterrupt`` in the main
    thread, so :func:`atomic_output` cleans up when a conversion is terminated. The previous
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
