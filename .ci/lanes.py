"""Run commands side by side in a few lanes, each line of their output printed as it comes.

``nox -s tests`` runs every package's test session (``package-tests(package=...)``) in its
own nox process, :func:`lane_count` of them at a time: a session alone leaves cores idle
while it creates its environment, installs, starts its pytest workers and waits on its
slowest test file, and the other lane's session fills them. Sessions start longest first
(:func:`longest_first`), the next one as soon as a lane is free, so the longest does not
start last and the lanes end close together.

Each output line is printed prefixed with its command's label (``[nvfp4-torch] nox > ...``),
so a log keeps every session's lines, timestamps included (``tools/ci_timings.py`` reads the
prefixed ``nox >`` lines as sessions run inside another).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TextIO

#: The environment variable that sets the number of lanes (1: one session after another).
LANES_ENV = "NVFP4_TEST_LANES"


def lane_count(environ: Mapping[str, str] = os.environ, cores: int | None = None) -> int:
    """How many sessions run at once: ``NVFP4_TEST_LANES``, else 2 on a machine with two or
    more cores (measured on 2 cores, where two lanes left 2-5 % of the CPU idle), else 1."""
    text = environ.get(LANES_ENV, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{LANES_ENV}={text!r}: expected a whole number of lanes >= 1")
        return int(text)
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return 2 if cores >= 2 else 1


def longest_first(names: Sequence[str], expected: Mapping[str, float]) -> list[str]:
    """``names`` ordered by expected seconds, longest first; a name without a figure goes
    first of all (it may be the longest), the names' own order breaking ties."""
    unknown = float("inf")
    return sorted(names, key=lambda n: -expected.get(n, unknown))


def run_lanes(
    commands: Sequence[tuple[str, Sequence[str]]],
    lanes: int,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    out: TextIO | None = None,
) -> dict[str, int]:
    """Run each ``(label, argv)`` in the order given, at most ``lanes`` at once, the next
    starting when one ends; every line of a command's stdout and stderr is written to
    ``out`` (standard output) as ``[label] line``. Returns ``label -> exit status`` for
    every command (a failure does not stop the others)."""
    if lanes < 1:
        raise ValueError(f"lanes must be >= 1, got {lanes}")
    labels = [label for label, _ in commands]
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must differ: {labels}")
    sink = out if out is not None else sys.stdout
    queue = list(commands)
    status: dict[str, int] = {}
    lock = threading.Lock()

    def write(text: str) -> None:
        with lock:
            sink.write(text)
            sink.flush()

    def lane() -> None:
        while True:
            with lock:
                if not queue:
                    return
                label, argv = queue.pop(0)
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                write(f"[{label}] {line if line.endswith(chr(10)) else line + chr(10)}")
            code = proc.wait()
            with lock:
                status[label] = code

    threads = [threading.Thread(target=lane, daemon=True) for _ in range(min(lanes, len(queue)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {label: status[label] for label in labels}
