"""What a checkpoint folder may contain, and how every value read from it is checked.

A checkpoint is the regular files inside its folder. Every reader goes through
:class:`CheckpointFolder` for the files it opens and through :func:`parse_json` /
:class:`Fields` for the values it reads, so that a hostile download is refused with one
:class:`~nvfp4_checkpoints.CheckpointError` naming the file, the key and the expected and
found values, before anything is read outside the folder or anything large is built:

* a member is named by a relative path without ``..``; a symlink, or a path that resolves
  outside the folder, is refused (:meth:`CheckpointFolder.member`);
* JSON is refused above :data:`MAX_JSON_BYTES` bytes or :data:`MAX_JSON_DEPTH` levels of
  nesting (counted before parsing), with integers of more than
  :data:`~nvfp4.file_checks.MAX_INT_DIGITS` digits or the non-standard constants ``NaN`` /
  ``Infinity``;
* a value is checked for type and range where it is read (:class:`Fields`);
* tensor shapes have rank at most :data:`MAX_RANK` and no dimension beyond the file's size
  (:func:`check_shape`);
* messages are cut to one line of at most :data:`MAX_MESSAGE` characters (:func:`one_line`).

These limits and checks are written once, in nvfp4-core's :mod:`nvfp4.file_checks` (which
the golden fixtures' reader shares); this module raises them as :class:`CheckpointError`.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Final, NoReturn

import numpy as np
from nvfp4 import file_checks
from nvfp4.file_checks import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_MESSAGE,
    MAX_RANK,
    one_line,
    refusal,
    short,
)

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_MESSAGE",
    "MAX_RANK",
    "CheckpointError",
    "CheckpointFolder",
    "Fields",
    "check_shape",
    "one_line",
    "parse_json",
    "short",
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or written as asked (missing files, unknown
    flavour, inconsistent config or tensors, an existing destination). The message is one
    line naming the path or tensor concerned."""


def _fail(where: object, what: str) -> NoReturn:
    raise refusal(where, what, CheckpointError)


def parse_json(
    raw: bytes, where: object, *, max_keys: int | None = None, max_separators: int | None = None
) -> Any:
    """Parse ``raw`` (UTF-8 JSON) within the limits of :mod:`nvfp4.file_checks` and, when
    given, with at most ``max_keys`` keys in its top-level object and ``max_separators``
    separators (a bound on the values built), all counted before parsing; or raise
    :class:`CheckpointError` naming ``where``."""
    return file_checks.parse_json(
        raw, where, max_keys=max_keys, max_separators=max_separators, error=CheckpointError
    )


def read_json_file(path: Path, opened: BinaryIO | None = None) -> dict[str, Any]:
    """A JSON object from the file ``path``, or from ``opened`` (that file, already opened:
    :meth:`CheckpointFolder.open_member`), its size checked before reading."""
    try:
        with contextlib.nullcontext(opened) if opened is not None else open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_JSON_BYTES:
                _fail(path, f"JSON of {size} bytes, more than the {MAX_JSON_BYTES} read")
            raw = f.read(MAX_JSON_BYTES + 1)
            if len(raw) > MAX_JSON_BYTES:
                _fail(path, f"JSON of more than the {MAX_JSON_BYTES} bytes read")
    except FileNotFoundError:
        _fail(path, "no such file")
    except OSError as e:
        _fail(path, f"cannot read ({e.strerror or e})")
    data = parse_json(raw, path)
    if not isinstance(data, dict):
        _fail(path, f"expected a JSON object, found a {_kind(data)}")
    return data


def _kind(v: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(v), "null" if v is None else "number"
    )


class _Missing:
    pass


MISSING: Final = _Missing()


class Fields:
    """A JSON object read from ``where`` (a file), each value checked where it is read.

    ``key`` is the dotted path of this object in the file (for messages)."""

    def __init__(self, data: object, where: object, key: str = "") -> None:
        if not isinstance(data, dict):
            _fail(where, f"{key or 'the top level'}: expected a JSON object, found {short(data)}")
        self.data: dict[str, Any] = data
        self.where = where
        self.key = key

    def _name(self, key: str) -> str:
        return f"{self.key}.{key}" if self.key else key

    def fail(self, key: str, expected: str, found: object) -> NoReturn:
        _fail(self.where, f"key {self._name(key)!r}: expected {expected}, found {short(found)}")

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def obj(self, key: str, *, required: bool = False) -> Fields | None:
        """A nested object (``None`` when absent or null and not ``required``)."""
        v = self.data.get(key)
        if v is None and not required:
            return None
        if not isinstance(v, dict):
            self.fail(key, "a JSON object", v)
        return Fields(v, self.where, self._name(key))

    def text(self, key: str, *, choices: frozenset[str] | None = None) -> str | None:
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, str) or (choices is not None and v not in choices):
            self.fail(key, "one of " + ", ".join(sorted(choices)) if choices else "a string", v)
        return v

    def integer(self, key: str, lo: int = 0, hi: int = 2**31 - 1) -> int | None:
        """An integer in ``[lo, hi]``, or ``None`` when absent or null."""
        v = self.data.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            self.fail(key, f"an integer in [{lo}, {hi}]", v)
        return v

    def num(self, key: str, *, positive: bool = False, float32: bool = False) -> float | None:
        """A finite number (``> 0`` when ``positive``; finite, and non-zero when positive,
        once rounded to float32 when ``float32``: a value a file stores as F32), or ``None``
        when absent or null."""
        v = self.data.get(key)
        if v is None:
            return None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if ok and float32:
            with np.errstate(over="ignore"):
                v32 = float(np.float32(v))
            ok = math.isfinite(v32) and (v32 > 0 or not positive)
        if not ok or (positive and v <= 0):
            sign = "positive " if positive else ""
            kind = "float32 number" if float32 else "number"
            self.fail(key, f"a finite {sign}{kind}", v)
        return float(v)

    def str_list(self, key: str) -> list[str] | None:
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            self.fail(key, "a list of strings", v)
        return v

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(self.data.items())


def check_shape(shape: object, limit: int, where: object, what: str) -> tuple[int, ...]:
    """A tensor shape: a list of at most :data:`MAX_RANK` integers in ``[0, limit]``
    (``limit``: the file's size, which no dimension of a tensor it holds can exceed)."""
    return file_checks.check_shape(shape, limit, where, what, CheckpointError)


# ============================================================================ folder
def _node(st: os.stat_result) -> str:
    """What a file system entry that is not a regular file is, in words."""
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    if stat.S_ISFIFO(st.st_mode):
        return "a named pipe"
    if stat.S_ISSOCK(st.st_mode):
        return "a socket"
    return "a device" if stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode) else "a special file"


class CheckpointFolder:
    """The regular files inside a checkpoint folder, and nothing else.

    ``root`` is the folder the user named (itself trusted, symlink or not); what it
    contains is not: :meth:`member` refuses names with ``..`` or absolute names, symlinks
    and anything that is not a regular file, naming the entry.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.real = root.resolve()

    def has(self, name: str) -> bool:
        """Whether the folder has an entry ``name`` (of any kind, a symlink included)."""
        return os.path.lexists(self.root / name)

    def member(self, name: object, *, what: str = "entry") -> Path:
        """The path of the regular file ``name`` inside the folder, or
        :class:`CheckpointError` naming it."""
        return self._checked(name, what)[0]

    def open_member(self, name: object, *, what: str = "entry") -> BinaryIO:
        """The regular file ``name`` inside the folder, checked as :meth:`member` checks
        it and then opened as that very file: component by component from the folder with
        ``O_NOFOLLOW`` (a file or folder swapped for a symlink after the check is refused,
        not followed), non-blocking (a named pipe swapped in is not waited on), and its
        device and inode compared with the ones checked (a file swapped for another after
        the check is refused). Read what a check allowed through this, never by its path
        again."""
        _, checked = self._checked(name, what)
        assert isinstance(name, str)
        fd = self._open_nofollow(name, what)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino) or not stat.S_ISREG(
                st.st_mode
            ):
                _fail(
                    self.root,
                    f"{what} {short(name)}: expected the regular file checked a moment before, "
                    f"found {'another file' if stat.S_ISREG(st.st_mode) else _node(st)} "
                    "(replaced during the read)",
                )
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb")

    def copy_member(self, name: str, dst: Path, *, what: str = "file") -> None:
        """Copy the member ``name`` (opened by :meth:`open_member`) to the new file ``dst``."""
        with self.open_member(name, what=what) as f, open(dst, "xb") as out:
            shutil.copyfileobj(f, out)

    def _open_nofollow(self, name: str, what: str) -> int:
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        nofollow = getattr(os, "O_NOFOLLOW", 0)
        parts = PurePosixPath(name).parts
        try:
            dirfd = os.open(self.root, flags | getattr(os, "O_DIRECTORY", 0))
        except OSError as e:
            _fail(self.root, f"cannot open the checkpoint folder ({e.strerror or e})")
        try:
            for part in parts[:-1]:
                nxt = os.open(part, flags | nofollow | getattr(os, "O_DIRECTORY", 0), dir_fd=dirfd)
                os.close(dirfd)
                dirfd = nxt
            return os.open(parts[-1], flags | nofollow | getattr(os, "O_NONBLOCK", 0), dir_fd=dirfd)
        except OSError as e:
            found = "a symlink" if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror
            _fail(
                self.root,
                f"{what} {short(name)}: expected the regular file checked a moment before, "
                f"found {found or e} (replaced during the read)",
            )
        finally:
            os.close(dirfd)

    def _checked(self, name: object, what: str) -> tuple[Path, os.stat_result]:
        """:meth:`member`'s checks; the path and the ``lstat`` of the file checked."""
        if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
            _fail(self.root, f"{what} {short(name)}: not a file name inside the checkpoint")
        parts = PurePosixPath(name).parts
        if not parts:  # ".", "./": the folder itself
            _fail(
                self.root,
                f"{what} {short(name)}: expected a regular file inside the checkpoint, found "
                "a directory (the checkpoint folder itself)",
            )
        if PurePosixPath(name).is_absolute() or any(p in ("..", ".") for p in parts):
            _fail(
                self.root,
                f"{what} {short(name)}: points outside the checkpoint (a checkpoint is the "
                "regular files inside its folder)",
            )
        path = self.root
        for part in parts:
            path = path / part
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                _fail(self.root, f"{what} {short(name)}: is missing (no such file)")
            except OSError as e:
                _fail(self.root, f"{what} {short(name)}: cannot read ({e.strerror or e})")
            if stat.S_ISLNK(st.st_mode):
                _fail(
                    self.root,
                    f"{what} {short(name)}: is a symlink (a checkpoint is the regular files "
                    "inside its folder)",
                )
        if not stat.S_ISREG(st.st_mode):
            _fail(self.root, f"{what} {short(name)}: expected a regular file, found {_node(st)}")
        if not path.resolve().is_relative_to(self.real):  # pragma: no cover - belt and braces
            _fail(self.root, f"{what} {short(name)}: resolves outside the checkpoint")
        return path, st

    def present(self, names: Iterable[str]) -> list[Path]:
        """The members among ``names`` that the folder has (:meth:`has`), each checked by
        :meth:`member`: the one containment check of every auxiliary file an output reads or
        copies (tokenizer files, chat templates, generation config...)."""
        return [self.member(name, what="file") for name in names if self.has(name)]

    def json(self, name: str) -> dict[str, Any]:
        """The JSON object in member ``name`` (read through :meth:`open_member`)."""
        with self.open_member(name, what="file") as f:
            return read_json_file(self.root / name, f)

    def fields(self, name: str) -> Fields | None:
        """The JSON object in member ``name`` as :class:`Fields`, ``None`` when absent."""
        if not self.has(name):
            return None
        return Fields(self.json(name), self.root / name)

    def listing(self) -> list[str]:
        """The names of the folder's visible (not dot) entries that are files or symlinks,
        sorted: what a reader may glob or a writer copy (each then goes through
        :meth:`member`)."""
        out = []
        with os.scandir(self.root) as it:
            for entry in it:
                if entry.name.startswith("."):
                    continue
                if entry.is_symlink() or entry.is_file(follow_symlinks=False):
                    out.append(entry.name)
        return sorted(out)
