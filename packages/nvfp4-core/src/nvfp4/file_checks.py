"""How a value read from a file nobody here wrote is checked before it is used.

The one home of the limits every reader of a downloaded file applies (the safetensors
header parser :mod:`nvfp4.safetensors_format`, the golden fixtures, and nvfp4-checkpoints'
readers of config, tokenizer and GGUF files), so that a hostile file is refused with one
line naming the file, the key or tensor, the expected and the found, before anything large
is built:

* JSON is refused above :data:`MAX_JSON_BYTES` bytes or :data:`MAX_JSON_DEPTH` levels of
  nesting (counted before parsing, :func:`json_outline`), with integers of more than
  :data:`MAX_INT_DIGITS` digits or the non-standard constants ``NaN`` / ``Infinity``
  (:func:`parse_json`);
* tensor shapes have rank at most :data:`MAX_RANK` and no dimension beyond the file's size
  (:func:`check_shape`);
* messages are cut to one line of at most :data:`MAX_MESSAGE` characters (:func:`one_line`),
  and a value quoted in one to a few dozen characters (:func:`short`).

Each check raises the error class its caller names (``error``: a ``ValueError`` subclass
taking the message; :class:`FileCheckError` by default), so a package keeps its own
exception type (nvfp4-checkpoints' ``CheckpointError``) while the checks are written once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import numpy as np

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_MESSAGE",
    "MAX_RANK",
    "FileCheckError",
    "Outline",
    "check_shape",
    "json_outline",
    "one_line",
    "parse_json",
    "refusal",
    "short",
]

#: The largest JSON document read (the safetensors library's header limit).
MAX_JSON_BYTES: Final = 100_000_000
#: The deepest nesting of JSON arrays and objects read.
MAX_JSON_DEPTH: Final = 64
#: The longest integer literal read from JSON.
MAX_INT_DIGITS: Final = 40
#: The highest tensor rank read.
MAX_RANK: Final = 8
#: The longest error message printed.
MAX_MESSAGE: Final = 300


class FileCheckError(ValueError):
    """A file's content refused by a check of this module (one line naming the file, the
    key or tensor concerned, the expected and the found)."""


#: The bytes :func:`json_outline` looks at in one go (its temporaries: a few times this).
_CHUNK: Final = 1 << 22
_QUOTE, _OPEN, _CLOSE, _COLON, _COMMA = 1, 2, 3, 4, 5
#: byte -> what it is to :func:`json_outline` (0: nothing).
_KIND: Final = np.zeros(256, dtype=np.uint8)
_KIND[ord('"')] = _QUOTE
_KIND[[ord("{"), ord("[")]] = _OPEN
_KIND[[ord("}"), ord("]")]] = _CLOSE
_KIND[ord(":")] = _COLON
_KIND[ord(",")] = _COMMA


def short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a hostile value may be huge)."""
    if isinstance(value, (list, tuple, dict)) and len(value) > 64:
        kind = type(value).__name__
        return f"a {kind} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str) -> str:
    """``text`` on one line of at most :data:`MAX_MESSAGE` characters. A long path the line
    opens with (``/a/b/.../file: what``) gives up its middle first, so a deep folder does
    not push the expected and found values off the end of the line."""
    flat = " ".join(text[: MAX_MESSAGE * 4].split())
    if len(flat) > MAX_MESSAGE:
        flat = _shorten_leading_path(flat, len(flat) - MAX_MESSAGE)
    return flat if len(flat) <= MAX_MESSAGE else flat[: MAX_MESSAGE - 3] + "..."


#: What a shortened leading path keeps of its start (its last component is always kept).
_PATH_HEAD: Final = 16
_LEADING_PATH: Final = re.compile(r"^(/[^\s:]+)(:\s)")


def _shorten_leading_path(line: str, excess: int) -> str:
    """``line`` with ``excess + 3`` characters (or as many as it can spare) taken out of the
    middle of the absolute path it opens with, replaced by ``...``."""
    m = _LEADING_PATH.match(line)
    if not m:
        return line
    path = m.group(1)
    last = path.rsplit("/", 1)[1]
    spare = len(path) - _PATH_HEAD - len(last) - 1  # what lies between head and "/last"
    cut = min(excess + 3, spare)
    if cut <= 3:
        return line
    keep_tail = len(path) - _PATH_HEAD - cut
    shortened = path[:_PATH_HEAD] + "..." + path[len(path) - keep_tail :]
    return shortened + line[len(path) :]


def refusal(where: object, what: str, error: type[ValueError] = FileCheckError) -> ValueError:
    """The ``error`` (for the caller to raise) whose message is the one line
    ``"{where}: {what}"``."""
    return error(one_line(f"{where}: {what}"))


# ============================================================================== JSON
def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"the non-standard constant {name}")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


@dataclass(frozen=True, slots=True)
class Outline:
    """What parsing a JSON document would build, counted without parsing it."""

    depth: int  # the deepest nesting of arrays and objects
    top_keys: int  # the keys of the top-level object
    separators: int  # ``,`` and ``:`` outside strings: a bound on the values built


def json_outline(raw: bytes) -> Outline:
    """The :class:`Outline` of ``raw`` in linear time and bounded memory (numpy,
    :data:`_CHUNK` bytes at a time): escapes are dropped (backslash pairs, then escaped
    quotes) so that every quote left opens or closes a string; then only quotes, brackets,
    ``,`` and ``:`` are looked at, the last four outside strings only."""
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    data = np.frombuffer(text, dtype=np.uint8)
    inside, depth, deepest, top_keys, separators = False, 0, 0, 0, 0
    for start in range(0, data.size, _CHUNK):
        kind = _KIND[data[start : start + _CHUNK]]
        kind = kind[kind != 0]  # the bytes that matter, in order
        if kind.size == 0:
            continue
        within = np.logical_xor.accumulate(kind == _QUOTE)
        if inside:
            within = ~within
        outside = kind[~within]
        step = (outside == _OPEN).astype(np.int32) - (outside == _CLOSE)
        level = np.cumsum(step, dtype=np.int32) + depth
        colon = outside == _COLON
        if level.size:
            deepest = max(deepest, int(level.max()))
            depth = int(level[-1])
        top_keys += int(np.count_nonzero(colon & (level == 1)))
        separators += int(np.count_nonzero(colon)) + int(np.count_nonzero(outside == _COMMA))
        inside = bool(within[-1])
    return Outline(deepest, top_keys, separators)


def parse_json(
    raw: bytes,
    where: object,
    *,
    max_keys: int | None = None,
    max_separators: int | None = None,
    error: type[ValueError] = FileCheckError,
) -> Any:
    """Parse ``raw`` (UTF-8 JSON) within the limits of the module docstring and, when
    given, with at most ``max_keys`` keys in its top-level object and ``max_separators``
    separators (a bound on the values built), all counted before parsing; or raise
    ``error`` naming ``where``."""
    if len(raw) > MAX_JSON_BYTES:
        raise refusal(
            where, f"JSON of {len(raw)} bytes, more than the {MAX_JSON_BYTES} read", error
        )
    outline = json_outline(raw)
    if outline.depth > MAX_JSON_DEPTH:
        raise refusal(
            where,
            f"JSON nested {outline.depth} levels deep, more than the {MAX_JSON_DEPTH} read",
            error,
        )
    if max_keys is not None and outline.top_keys > max_keys:
        raise refusal(
            where, f"a JSON object of {outline.top_keys} keys, more than the {max_keys} read", error
        )
    if max_separators is not None and outline.separators > max_separators:
        raise refusal(
            where,
            f"JSON of {outline.separators} separators (',' and ':'), more than the "
            f"{max_separators} read",
            error,
        )
    try:
        return json.loads(raw.decode("utf-8"), parse_int=_int, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise refusal(
            where, f"expected UTF-8 JSON, found text that is not valid UTF-8 JSON ({e})", error
        ) from None


def check_shape(
    shape: object,
    limit: int,
    where: object,
    what: str,
    error: type[ValueError] = FileCheckError,
) -> tuple[int, ...]:
    """A tensor shape: a list of at most :data:`MAX_RANK` integers in ``[0, limit]``
    (``limit``: the file's size, which no dimension of a tensor it holds can exceed)."""
    if (
        not isinstance(shape, (list, tuple))
        or len(shape) > MAX_RANK
        or not all(
            (type(d) is int or (isinstance(d, (int, np.integer)) and not isinstance(d, bool)))
            and 0 <= d <= limit
            for d in shape
        )
    ):
        raise refusal(
            where,
            f"{what}: shape {short(shape)} is not a list of at most {MAX_RANK} non-negative integers in "
            f"[0, {limit}]",
            error,
        )
    return tuple(int(d) for d in shape)
