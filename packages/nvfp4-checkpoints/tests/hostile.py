"""Running the ``nvfp4`` CLI on a hostile checkpoint and checking what it promises.

:func:`run_guarded` runs ``main(argv)`` in-process under an audit hook that records every
file opened, with ``tracemalloc`` for the peak memory, and returns an :class:`Outcome`;
:func:`assert_clean_refusal` asserts the promises of the README's "Safety" section: exit 2,
one line of at most 300 characters on stderr, no traceback, the source untouched (hashed
before and after), nothing left next to the destination, no file outside the given paths
opened, and the case's time and peak memory within bounds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import sys
import time
import traceback
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvfp4_checkpoints.cli import main

#: Bounds of one case.
MAX_SECONDS = 20.0
MAX_PEAK_BYTES = 256 * 2**20

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, Path)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


@dataclass
class Outcome:
    status: int | None
    stderr: str
    stdout: str
    error: str | None  # a traceback, when main raised
    seconds: float
    peak: int
    opened: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _recording() -> Iterator[list[str]]:
    global _OPENED
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


def run_guarded(argv: list[str], *, trace_memory: bool = True) -> Outcome:
    """``main(argv)`` with its stdout, stderr, opens, time and peak traced memory (0 with
    ``trace_memory=False``: tracing makes a small run about three times slower)."""
    out, err = io.StringIO(), io.StringIO()
    error = None
    status: int | None = None
    if trace_memory:
        tracemalloc.start()
    start = time.perf_counter()
    with (
        _recording() as opened,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            status = main(argv)
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 2
        except BaseException:
            error = traceback.format_exc()
    seconds = time.perf_counter() - start
    peak = 0
    if trace_memory:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return Outcome(status, err.getvalue(), out.getvalue(), error, seconds, peak, list(opened))


def tree_hash(path: Path) -> str:
    """A hash of every name, link target and byte under ``path`` (links not followed)."""
    h = hashlib.sha256()
    paths = [path] if not path.is_dir() or path.is_symlink() else sorted(path.rglob("*"))
    for p in paths:
        h.update(os.fsencode(p.relative_to(path.parent)))
        if p.is_symlink():
            h.update(b"->" + os.fsencode(os.readlink(p)))
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def outside_reads(opened: list[str], allowed: list[Path], watched: list[Path]) -> list[str]:
    """Opens of a file under ``watched`` (the test's folders) but not under ``allowed``
    (the source and the destination's folder), or of ``/proc/*/environ`` and ``/etc``."""
    bad = []
    for name in opened:
        real = Path(os.path.realpath(name))
        if (
            name.startswith("/etc/")
            or (name.startswith("/proc/") and "environ" in name)
            or (
                any(real.is_relative_to(w) for w in watched)
                and not any(real.is_relative_to(a) for a in allowed)
            )
        ):
            bad.append(name)
    return bad


def assert_names(stderr: str, path: Path, rest: str) -> None:
    """``stderr`` says ``path: rest``, the path whole or shortened as ``folder.one_line``
    shortens a deep one (its first 16 characters, ``...``, its end): how deep the test's
    temporary folder lies decides which, so both are accepted, and never a line without the
    file's own name."""
    if f"{path}: {rest}" in stderr:
        return
    said = f"expected {path}: {rest!r} (its path whole or shortened), found {stderr!r}"
    assert f"/{path.name}: {rest}" in stderr, said
    assert f"{str(path)[:16]}..." in stderr, said


def assert_clean_refusal(
    outcome: Outcome, *, source: Path, source_hash: str, work: Path, what: str
) -> None:
    """The promises of a refusal for a case run in the folder ``work``: the destination's
    folder ``work / "dst"`` left empty, no file under ``work`` opened but the source and that
    folder."""
    dst_parent = work / "dst"
    assert outcome.error is None, f"{what}: a traceback\n{outcome.error}"
    assert outcome.status == 2, f"{what}: exit {outcome.status}, stderr {outcome.stderr!r}"
    lines = [ln for ln in outcome.stderr.splitlines() if not ln.startswith("[")]
    assert len(lines) == 1, f"{what}: {outcome.stderr!r}"
    assert lines[0].startswith("nvfp4: error: "), lines[0]
    assert len(lines[0]) <= 300 + len("nvfp4: error: "), f"{what}: {len(lines[0])} characters"
    assert "Traceback" not in outcome.stderr
    assert tree_hash(source) == source_hash, f"{what}: the source changed"
    assert os.listdir(dst_parent) == [], f"{what}: left something behind"
    allowed = [source if source.is_dir() else source.parent, dst_parent]
    bad = outside_reads(outcome.opened, allowed, [work])
    assert not bad, f"{what}: read outside the checkpoint: {bad}"
    assert outcome.seconds < MAX_SECONDS, f"{what}: {outcome.seconds:.1f} s"
    assert outcome.peak < MAX_PEAK_BYTES, f"{what}: peak {outcome.peak / 2**20:.0f} MiB"
